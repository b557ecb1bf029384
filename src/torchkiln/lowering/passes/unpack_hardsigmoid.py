"""Unpack Hardsigmoid: clamp(x + 3, 0, 6) / 6, in eager's order of operations."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph


@lowering_pass(replaces=("aten::hardsigmoid",), decomposition=True)
def unpack_hardsigmoid(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::hardsigmoid(x) by clamp(x + 3, 0, 6) / 6."""
    return rewrite(graph, """
        graph(%x):
            %y = aten::hardsigmoid(%x)
            return (%y)""", """
        graph(%x):
            %one : int = prim::Constant[value=1]()
            %zero : float = prim::Constant[value=0.]()
            %three : float = prim::Constant[value=3.]()
            %six : float = prim::Constant[value=6.]()
            %shifted = aten::add(%x, %three, %one)
            %gate = aten::clamp(%shifted, %zero, %six)
            %y = aten::div(%gate, %six)
            return (%y)""")
