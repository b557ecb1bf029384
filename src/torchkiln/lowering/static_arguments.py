"""Static arguments: fold each argument compiled as a constant (frontend/arguments.py) into the graph.

Every use of the argument reads the constant instead, so `if attn_mask is not None` folds away, and the
argument is erased from the graph's inputs: partitioning and shape analysis see only the tensor arguments.
An `Optional[Tensor]` argument given an Input is typed `Tensor`, so its `is None` tests fold too.
Stitching gives the arguments back, guarded (stitching/static_arguments.py).
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from torchkiln.torchscript import Graph, StaticArgument

logger = logging.getLogger("torchkiln.lowering")


def _is_optional_tensor(t: torch._C.JitType) -> bool:
    return isinstance(t, torch._C.OptionalType) and isinstance(t.getElementType(), torch._C.TensorType)


def fold_static_arguments(graph: Graph, arguments: Sequence[StaticArgument]) -> tuple[int, ...]:
    """Replace each static argument by its constant and erase it from the graph's inputs; type every other
    `Optional[Tensor]` argument `Tensor`. Returns the indices (self not counted) of the arguments so typed."""
    params = list(graph.inputs())[1:]  # after self
    with graph.insert_point_guard(next(iter(graph.nodes()), graph.return_node())):
        for a in arguments:
            params[a.index].replaceAllUsesWith(graph.insertConstant(a.value))
    static = {a.index for a in arguments}
    refined = tuple(i for i, p in enumerate(params) if i not in static and _is_optional_tensor(p.type()))
    for i in refined:
        params[i].setType(torch._C.TensorType.get())
    for index in sorted(static, reverse=True):
        graph.eraseInput(index + 1)
    if arguments:
        logger.debug("arguments compiled as constants: %s", ", ".join(f"{a.name}={a.value!r}" for a in arguments))
    return refined
