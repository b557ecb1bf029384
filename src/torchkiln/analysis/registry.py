"""Registries of converters (node -> layers) and evaluators (node -> static value), keyed by op overload.

Partitioning asks these same registries what is supported, so "supported" has one definition.
Keys are overloads as `node_key` gives them: 'aten::add.Tensor', 'aten::relu', 'prim::Constant'.
An evaluator registered under a bare op name ('aten::add') covers every overload of it whose
inputs and outputs hold no tensors (int/float/list/str arithmetic).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from torchkiln.torchscript import Node, holds_tensor_type, node_key

# A capability check gets the node's resolved arguments and returns None when it accepts them,
# otherwise the reason it does not.
Capability = Callable[["Args"], "str | None"]  # noqa: F821


@dataclasses.dataclass(frozen=True)
class Converter:
    fn: Callable[..., Any]
    keys: tuple[str, ...]
    capability: Capability | None = None


@dataclasses.dataclass(frozen=True)
class Evaluator:
    fn: Callable[..., Any]
    keys: tuple[str, ...]


FALLBACK_ATTR = "torchkiln_fallback"  # a node attribute: module fallback forces this node to PyTorch (and why)

CONVERTERS: dict[str, Converter] = {}
EVALUATORS: dict[str, Evaluator] = {}


def _register(table: dict, keys: tuple[str, ...], entry: Any) -> None:
    for key in keys:
        if key in table:
            raise ValueError(f"{key} is registered twice")
        table[key] = entry


def converter(*keys: str, capability: Capability | None = None) -> Callable:
    """Register `fn(ctx, args) -> Tensor | list[Tensor]` as the converter of these overloads."""
    def register(fn: Callable) -> Callable:
        _register(CONVERTERS, keys, Converter(fn, keys, capability))
        return fn

    return register


def evaluator(*keys: str) -> Callable:
    """Register `fn(args) -> value` (a tuple for several outputs) as the evaluator of these ops."""
    def register(fn: Callable) -> Callable:
        _register(EVALUATORS, keys, Evaluator(fn, keys))
        return fn

    return register


def _scalar_only(node: Node) -> bool:
    values = list(node.inputs()) + list(node.outputs())
    return not any(holds_tensor_type(v.type()) for v in values)


def find_converter(node: Node) -> Converter | None:
    return CONVERTERS.get(node_key(node))


def find_evaluator(node: Node) -> Evaluator | None:
    key = node_key(node)
    found = EVALUATORS.get(key)
    if found is None and "." in key and _scalar_only(node):
        found = EVALUATORS.get(key.split(".")[0])
    return found


def is_registered(node: Node) -> bool:
    return find_converter(node) is not None or find_evaluator(node) is not None
