"""LibTorch's own graph passes, wrapped so the pipeline can log whether each changed the graph."""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, changes, lowering_pass
from torchkiln.lowering.walk import all_nodes
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

    Each only where alias analysis shows nothing else sees the mutation. An in-place comparison or logical
    op keeps its tensor's dtype (`y.eq_(0.5)` writes 0.0/1.0 into a float y) while its functional form
    returns bool, which LibTorch's pass does not account for; such ops are first rewritten as
    `y.copy_(y.eq(0.5))`, which keeps the dtype and which LibTorch leaves in place.
    """
    kept = _copy_dtype_changing_inplace(graph)
    return changes(graph, lambda: torch._C._jit_pass_remove_mutation(graph)) or kept


_BOOL_RESULT_INPLACE = frozenset({
    "aten::eq_", "aten::ne_", "aten::lt_", "aten::le_", "aten::gt_", "aten::ge_",
    "aten::logical_and_", "aten::logical_or_", "aten::logical_xor_", "aten::logical_not_",
})


def _copy_dtype_changing_inplace(graph: Graph) -> bool:
    changed = False
    for node in [n for n in all_nodes(graph.block()) if n.kind() in _BOOL_RESULT_INPLACE]:
        target = node.inputsAt(0)
        with graph.insert_point_guard(node):
            result = graph.insert(node.kind()[:-1], list(node.inputs()))
            copied = graph.insert("aten::copy_", [target, result, graph.insertConstant(False)])
        node.output().replaceAllUsesWith(copied)
        node.destroy()
        changed = True
    return changed


@lowering_pass()
def constant_propagation(graph: Graph, ctx: LoweringContext) -> bool:
    """ConstantPropagation: evaluate nodes whose inputs are all constants."""
    return changes(graph, lambda: torch._C._jit_pass_constant_propagation(graph))


@lowering_pass(replaces=("aten::addmm", "aten::matmul"))
def fuse_linear(graph: Graph, ctx: LoweringContext) -> bool:
    """FuseLinear: addmm(b, x, w.t()) and matmul(x, w.t()) [+ b] become aten::linear(x, w, b)."""
    return changes(graph, lambda: torch._C._jit_pass_fuse_linear(graph))
