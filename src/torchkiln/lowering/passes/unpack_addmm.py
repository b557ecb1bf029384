"""Unpack AddMM: addmm(b, x, w) is matmul(x, w) + b."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph


@lowering_pass(replaces=("aten::addmm",))
def unpack_addmm(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::addmm(b, x, w, beta=1, alpha=1) by aten::matmul(x, w) + b.

    Other beta/alpha stay addmm: beta=0 must ignore nan and inf in b, which b * 0 would not.
    """
    return rewrite(graph, """
        graph(%b, %x, %w):
            %beta : int = prim::Constant[value=1]()
            %alpha : int = prim::Constant[value=1]()
            %y = aten::addmm(%b, %x, %w, %beta, %alpha)
            return (%y)""", """
        graph(%b, %x, %w):
            %one : int = prim::Constant[value=1]()
            %product = aten::matmul(%x, %w)
            %y = aten::add(%product, %b, %one)
            return (%y)""")
