"""Unpack Rsqrt: 1 / sqrt(x), as eager computes it."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph


@lowering_pass(replaces=("aten::rsqrt",), decomposition=True)
def unpack_rsqrt(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::rsqrt(x) by reciprocal(sqrt(x))."""
    return rewrite(graph, """
        graph(%x):
            %y = aten::rsqrt(%x)
            return (%y)""", """
        graph(%x):
            %root = aten::sqrt(%x)
            %y = aten::reciprocal(%root)
            return (%y)""")
