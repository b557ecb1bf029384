"""Static control flow: after shape analysis, a prim::If whose condition is known at build time is replaced
by its taken branch, and a short for-loop whose trip count is known is unrolled."""
from __future__ import annotations

import logging

import torch

from torchkiln.analysis.resolve import NotStatic, Resolver
from torchkiln.lowering.passes.unroll_loops import unroll_static_loops
from torchkiln.torchscript import Graph, inline_branch

logger = logging.getLogger("torchkiln.partitioning")


def _raises(block: torch._C.Block) -> bool:
    """Whether the block always raises (a check inside it that may raise is folded in a later round)."""
    return any(n.kind() == "prim::RaiseException" for n in block.nodes())


def fold_static_conditionals(graph: Graph, resolver: Resolver) -> bool:
    """Inline the taken branch of every top-level If with a static condition. True if any was.

    A taken branch that raises is left alone: the module raises at run time, as eager PyTorch does.
    """
    changed = False
    pending = [n for n in graph.nodes() if n.kind() == "prim::If"]
    while pending:  # a taken branch's own Ifs come to the top level: they are tried in the same round
        node = pending.pop(0)
        try:
            condition = resolver.resolve(node.inputsAt(0))
        except NotStatic:
            continue
        if not isinstance(condition, bool):
            continue
        if _raises(list(node.blocks())[0 if condition else 1]):
            continue
        pending[:0] = inline_branch(node, condition)
        logger.debug("folded a static prim::If (condition %s)", condition)
        changed = True
    return changed


def fold_static_control_flow(graph: Graph, resolver: Resolver) -> bool:
    """Fold static conditionals and unroll static loops at the top level; True if the graph changed."""
    changed = fold_static_conditionals(graph, resolver)
    return unroll_static_loops(graph, resolver) or changed
