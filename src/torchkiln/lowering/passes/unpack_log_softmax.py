"""Unpack LogSoftmax into primitive ops, in the numerically safe form x - logsumexp(x)."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph


def _x_minus_logsumexp(x: str) -> str:
    return f"""
            %true : bool = prim::Constant[value=1]()
            %one : int = prim::Constant[value=1]()
            %dims : int[] = prim::ListConstruct(%dim)
            %lse = aten::logsumexp({x}, %dims, %true)
            %y = aten::sub({x}, %lse, %one)
            return (%y)"""


@lowering_pass(replaces=("aten::log_softmax.int",), decomposition=True)
def unpack_log_softmax(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::log_softmax(x, dim) by x - logsumexp(x, [dim], keepdim=True).

    log(softmax(x)) would give -inf where softmax underflows; this form matches eager everywhere.
    """
    changed = rewrite(graph, """
        graph(%x, %dim):
            %none : NoneType = prim::Constant()
            %y = aten::log_softmax(%x, %dim, %none)
            return (%y)""", """
        graph(%x, %dim):""" + _x_minus_logsumexp("%x"))
    changed |= rewrite(graph, """
        graph(%x, %dim, %dtype):
            %y = aten::log_softmax(%x, %dim, %dtype)
            return (%y)""", """
        graph(%x, %dim, %dtype):
            %false : bool = prim::Constant[value=0]()
            %none : NoneType = prim::Constant()
            %xc = aten::to(%x, %dtype, %false, %false, %none)""" + _x_minus_logsumexp("%xc"))
    return changed
