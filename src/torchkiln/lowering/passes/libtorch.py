"""LibTorch's own graph passes, wrapped so the pipeline can log whether each changed the graph."""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, changes, lowering_pass
from torchkiln.torchscript import Graph


@lowering_pass()
def eliminate_dead_code(graph: Graph, ctx: LoweringContext) -> bool:
    """EliminateDeadCode: drop nodes whose outputs nobody reads and that have no side effects."""
    return changes(graph, lambda: torch._C._jit_pass_dce(graph))


@lowering_pass()
def eliminate_common_subexpression(graph: Graph, ctx: LoweringContext) -> bool:
    """EliminateCommonSubexpression: compute identical pure expressions once."""
    return changes(graph, lambda: torch._C._jit_pass_cse(graph))


@lowering_pass()
def peephole_optimize(graph: Graph, ctx: LoweringContext) -> bool:
    """PeepholeOptimize: local algebraic simplifications (x.t().t(), list and tuple idioms, Int(NumToTensor))."""
    return changes(graph, lambda: torch._C._jit_pass_peephole(graph, True))  # True: no shape-based peepholes


@lowering_pass()
def remove_mutation(graph: Graph, ctx: LoweringContext) -> bool:
    """RemoveListMutation + RemoveTensorMutation: list appends become literals, in-place ops functional.

    Each only where alias analysis shows nothing else sees the mutation.
    """
    return changes(graph, lambda: torch._C._jit_pass_remove_mutation(graph))


@lowering_pass()
def constant_propagation(graph: Graph, ctx: LoweringContext) -> bool:
    """ConstantPropagation: evaluate nodes whose inputs are all constants."""
    return changes(graph, lambda: torch._C._jit_pass_constant_propagation(graph))


@lowering_pass(replaces=("aten::addmm", "aten::matmul"))
def fuse_linear(graph: Graph, ctx: LoweringContext) -> bool:
    """FuseLinear: addmm(b, x, w.t()) and matmul(x, w.t()) [+ b] become aten::linear(x, w, b)."""
    return changes(graph, lambda: torch._C._jit_pass_fuse_linear(graph))
