"""Unpack SiLU: x * sigmoid(x)."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph


@lowering_pass(replaces=("aten::silu",), decomposition=True)
def unpack_silu(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::silu(x) by x * sigmoid(x)."""
    return rewrite(graph, """
        graph(%x):
            %y = aten::silu(%x)
            return (%y)""", """
        graph(%x):
            %gate = aten::sigmoid(%x)
            %y = aten::mul(%x, %gate)
            return (%y)""")
