"""Eliminate Exception-or-Pass: drop guards `if cond: raise ...` that the compiled input shapes pass.

A guard is a prim::If with no outputs where one branch raises and the other is empty (BatchNorm's
`if input.dim() != 4: raise ValueError`, a model's own input checks). Torch-TensorRT removes every
such guard. Here a guard goes only when its condition is computed from constants and the method
inputs' shapes and dtypes (aten::dim, aten::size, len, int arithmetic, comparisons) and takes the
empty branch for the shapes being compiled. A guard that would raise for those shapes stays (the
module raises, as eager does); a guard on run-time data stays; a guard on an intermediate tensor's
shape stays until partitioning, which folds it once shape analysis has run.
"""
from __future__ import annotations

import torch

from torchkiln.analysis.resolve import NotStatic, Resolver
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.static_values import input_resolver
from torchkiln.torchscript import Graph, Node


def _raises(block: torch._C.Block) -> bool:
    return any(n.kind() == "prim::RaiseException" or any(_raises(b) for b in n.blocks()) for n in block.nodes())


def _passes(node: Node, resolver: Resolver) -> bool:
    """A guard whose empty branch is the one taken."""
    if node.kind() != "prim::If" or node.outputsSize() != 0:
        return False
    then_block, else_block = node.blocks()
    for raising, empty, taken_when in ((then_block, else_block, False), (else_block, then_block, True)):
        if _raises(raising) and not list(empty.nodes()):
            try:
                return resolver.resolve(node.inputsAt(0)) is taken_when
            except NotStatic:
                return False
    return False


def _eliminate(block: torch._C.Block, resolver: Resolver) -> bool:
    changed = False
    for node in list(block.nodes()):
        if _passes(node, resolver):
            node.destroy()
            changed = True
            continue
        for inner in node.blocks():
            changed |= _eliminate(inner, resolver)
    return changed


@lowering_pass()
def eliminate_exception_or_pass(graph: Graph, ctx: LoweringContext) -> bool:
    """Remove `if cond: raise` guards that the compiled input shapes are known to pass."""
    return _eliminate(graph.block(), input_resolver(graph, ctx.settings))
