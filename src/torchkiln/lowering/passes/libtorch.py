"""LibTorch's own graph passes, wrapped so the pipeline can log whether each changed the graph."""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import changes, lowering_pass
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Graph


@lowering_pass()
def eliminate_dead_code(graph: Graph, settings: CompileSettings) -> bool:
    """EliminateDeadCode: drop nodes whose outputs nobody reads and that have no side effects."""
    return changes(graph, lambda: torch._C._jit_pass_dce(graph))


@lowering_pass()
def eliminate_common_subexpression(graph: Graph, settings: CompileSettings) -> bool:
    """EliminateCommonSubexpression: compute identical pure expressions once."""
    return changes(graph, lambda: torch._C._jit_pass_cse(graph))


@lowering_pass()
def peephole_optimize(graph: Graph, settings: CompileSettings) -> bool:
    """PeepholeOptimize: local algebraic and shape simplifications."""
    return changes(graph, lambda: torch._C._jit_pass_peephole(graph, True))


@lowering_pass()
def remove_tensor_mutation(graph: Graph, settings: CompileSettings) -> bool:
    """RemoveTensorMutation: turn in-place ops into their functional forms where aliasing allows."""
    return changes(graph, lambda: torch._C._jit_pass_remove_mutation(graph))


@lowering_pass()
def constant_propagation(graph: Graph, settings: CompileSettings) -> bool:
    """ConstantPropagation: evaluate nodes whose inputs are all constants."""
    return changes(graph, lambda: torch._C._jit_pass_constant_propagation(graph))
