"""The ordered lowering pipeline: module passes, freezing, then graph passes."""
from __future__ import annotations

import dataclasses
import logging

import torch

from torchkiln.lowering import passes as _passes  # noqa: F401  (registers every pass)
from torchkiln.lowering.registry import PASSES
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Graph

logger = logging.getLogger("torchkiln.lowering")

MODULE_PIPELINE: tuple[str, ...] = ()
GRAPH_PIPELINE: tuple[str, ...] = (
    "remove_dropout",
    "remove_contiguous",
    "unpack_log_softmax",
    "functionalize_list_appends",
    "remove_tensor_mutation",
    "peephole_optimize",
    "constant_propagation",
    "eliminate_common_subexpression",
    "eliminate_dead_code",
)


@dataclasses.dataclass
class LoweredModule:
    """The frozen module and the lowered graph of its method (the module's own graph, edited in place)."""

    module: torch.jit.ScriptModule
    graph: Graph
    fired: list[str]


def lower(module: torch.jit.ScriptModule, settings: CompileSettings, method: str = "forward") -> LoweredModule:
    """Freeze `module` (in eval mode) and run every lowering pass over `method`'s graph."""
    fired = []
    for name in MODULE_PIPELINE:
        if PASSES[name].fn(module, settings):
            fired.append(name)
            logger.debug("lowering pass %s changed the module", name)
    was_training = module.training
    module.eval()
    try:
        frozen = torch.jit.freeze(module, preserved_attrs=[method] if method != "forward" else None)
    finally:
        module.train(was_training)
    graph = getattr(frozen, method).graph
    logger.debug("graph after freeze:\n%s", graph)
    for name in GRAPH_PIPELINE:
        if PASSES[name].fn(graph, settings):
            fired.append(name)
            logger.debug("graph after lowering pass %s:\n%s", name, graph)
        else:
            logger.debug("lowering pass %s: no change", name)
    return LoweredModule(frozen, graph, fired)
