"""Unpack Hardswish: x * clamp(x + 3, 0, 6) / 6, in eager's order of operations."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph


@lowering_pass(replaces=("aten::hardswish",), decomposition=True)
def unpack_hardswish(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::hardswish(x) by x * clamp(x + 3, 0, 6) / 6."""
    return rewrite(graph, """
        graph(%x):
            %y = aten::hardswish(%x)
            return (%y)""", """
        graph(%x):
            %one : int = prim::Constant[value=1]()
            %zero : float = prim::Constant[value=0.]()
            %three : float = prim::Constant[value=3.]()
            %six : float = prim::Constant[value=6.]()
            %shifted = aten::add(%x, %three, %one)
            %gate = aten::clamp(%shifted, %zero, %six)
            %scaled = aten::mul(%x, %gate)
            %y = aten::div(%scaled, %six)
            return (%y)""")
