"""Resolving a node's inputs: network tensors, static values (by running evaluators) or tensor metadata.

Partitioning resolves with tensor metadata only (what shape analysis saw); conversion resolves
with the network tensors built so far. Both run the same evaluators, so both agree on which
values are static.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from torchkiln.conversion.registry import find_converter, find_evaluator
from torchkiln.network.symbolic import as_dim, floordiv, has_symbols, is_symbolic
from torchkiln.network.tensor import Tensor
from torchkiln.torchscript import (
    ALIASING_USERS, FRESH_LIST_PRODUCERS, Node, TensorMeta, Value, argument_names, node_key, node_schema,
    value_key, writes_to_arguments,
)

FOLD_MAX_ELEMENTS = 4096  # a tensor op on build-time values runs at build time if its outputs are this small

logger = logging.getLogger("torchkiln.conversion")


_SYMBOLIC_TENSOR_ARITHMETIC = {
    "aten::add.Tensor": lambda a, b: as_dim(a + b), "aten::sub.Tensor": lambda a, b: as_dim(a - b),
    "aten::mul.Tensor": lambda a, b: as_dim(a * b), "aten::floor_divide": floordiv, "aten::div.Tensor_mode": floordiv,
}


class NotStatic(Exception):
    """A value cannot be known before run time (it depends on tensor data or on control flow)."""


class Args:
    """A node's resolved inputs, by position or by schema argument name (`args.self`, `args['dim']`)."""

    __slots__ = ("node", "values", "names", "metas")

    def __init__(self, node: Node, values: list[Any], metas: Mapping[int, TensorMeta] | None = None) -> None:
        self.node = node
        self.values = values
        self.names = argument_names(node)
        self.metas = metas or {}  # what shape analysis saw of every top-level tensor (eager dtype, device)

    def __getitem__(self, key: int | str) -> Any:
        if isinstance(key, int):
            return self.values[key]
        try:
            return self.values[self.names.index(key)]
        except ValueError:
            raise KeyError(f"{self.node.kind()} has no argument {key!r} (has {self.names})") from None

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError as e:
            raise AttributeError(str(e)) from None

    def get(self, name: str, default: Any = None) -> Any:
        return self[name] if name in self.names else default

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values)


def is_dynamic(obj: Any) -> bool:
    """Whether a resolved value holds run-time tensors (network tensors or metadata)."""
    if isinstance(obj, (Tensor, TensorMeta)):
        return True
    if isinstance(obj, (list, tuple)):
        return any(is_dynamic(o) for o in obj)
    if isinstance(obj, dict):
        return any(is_dynamic(o) for o in obj.values())
    return False


def _mutates(node: Node, v: Value) -> bool:
    """Whether `node` modifies `v` in place (its schema marks that argument as written)."""
    schema = node_schema(node)
    if schema is None:
        return False
    arguments = torch._C.parse_schema(schema).arguments
    return any(i < len(arguments) and arguments[i].alias_info is not None and arguments[i].alias_info.is_write
               for i, inp in enumerate(node.inputs()) if inp.unique() == v.unique())


def read_after_mutation(v: Value) -> str | None:
    """Lists are mutable: a list's build-time value is its value everywhere only if it is a fresh list
    that nothing reads, or keeps inside another value, after modifying it in place. (Lowering rewrites
    straight-line appends so that later readers read the append's output.)"""
    if not isinstance(v.type(), torch._C.ListType):
        return None
    users = [u.user for u in v.uses()]
    for node in users:
        if not _mutates(node, v):
            continue
        if v.node().kind() not in FRESH_LIST_PRODUCERS:
            return f"list %{v.debugName()} from {v.node().kind()} is modified in place by {node.kind()}"
        for other in users:
            if other is node:
                continue
            if other.owningBlock() != node.owningBlock() or other.isAfter(node) or other.kind() in ALIASING_USERS:
                return f"list %{v.debugName()} is read after {node.kind()} modifies it in place"
    return None


class Resolver:
    """Resolves Values of one graph; subclasses add what they already know (`known`)."""

    def __init__(self, metas: Mapping[int, TensorMeta]) -> None:
        self.metas = metas
        self._memo: dict[int, Any] = {}
        self._failed: dict[int, str] = {}

    def known(self, v: Value) -> tuple[bool, Any]:
        return False, None

    def resolve(self, v: Value) -> Any:
        """The value of `v`: known, evaluated, or TensorMeta for a run-time tensor; else NotStatic."""
        hit, obj = self.known(v)
        if hit:
            return obj
        key = value_key(v)
        if key in self._memo:
            return self._memo[key]
        if key in self._failed:
            raise NotStatic(self._failed[key])
        try:
            return self._evaluate(v)
        except NotStatic as e:
            self._failed[key] = str(e)
            raise

    def _evaluate(self, v: Value) -> Any:
        node = v.node()
        key = value_key(v)
        evaluator = None if node.kind() == "prim::Param" or list(node.blocks()) else find_evaluator(node)
        if evaluator is None:
            if self.foldable(node):
                folded = self.fold(node)
                if folded is not None:
                    return folded[list(node.outputs()).index(v)]
            if key in self.metas:  # a run-time tensor (or list of tensors) that shape analysis saw
                return self.metas[key]
            raise NotStatic(f"%{v.debugName()} comes from {node.kind()}, which has no evaluator")
        try:
            args = self.args(node)
        except NotStatic:
            if key in self.metas:  # computed at run time from run-time inputs
                return self.metas[key]
            raise
        try:
            result = evaluator.fn(args)
        except NotStatic:
            raise
        except Exception as e:  # an evaluator that cannot handle these inputs leaves the node to PyTorch
            logger.debug("evaluator of %s failed: %s", node.kind(), e)
            raise NotStatic(f"{node.kind()} could not be evaluated: {e}") from None
        outputs = list(node.outputs())
        for out in outputs:
            reason = read_after_mutation(out)
            if reason:
                raise NotStatic(reason)
        results = result if len(outputs) > 1 else (result,)
        if len(results) != len(outputs):
            raise NotStatic(f"evaluator of {node.kind()} returned {len(results)} values for {len(outputs)} outputs")
        for out, value in zip(outputs, results):
            self._memo[value_key(out)] = value
        return self._memo[key]

    def args(self, node: Node) -> Args:
        return Args(node, [self.resolve(i) for i in node.inputs()], self.metas)

    def foldable(self, node: Node) -> bool:
        """A tensor op that may run at build time when its inputs are build-time values: it has a converter,
        is deterministic, writes to none of its inputs, and its outputs are small tensors."""
        schema = node_schema(node)
        if schema is None or find_converter(node) is None or node.isNondeterministic() or writes_to_arguments(schema):
            return False
        metas = [self.metas.get(value_key(o)) for o in node.outputs()]
        return all(isinstance(m, TensorMeta) and not has_symbols(m.shape)  # dynamic shapes are never folded
                   and torch.Size(m.shape).numel() <= FOLD_MAX_ELEMENTS for m in metas)

    def _fold_symbolic(self, node: Node, args: Args) -> list[Any] | None:
        """`a + b`, `a - b`, `a * b`, `a // b` of 0-d integer tensors holding symbolic dims (what tracing makes
        of `x.size(1) + n`): a symbolic dim again. Anything else is left to the converter."""
        op = _SYMBOLIC_TENSOR_ARITHMETIC.get(node_key(node))
        meta = self.metas.get(value_key(node.output())) if node.outputsSize() == 1 else None
        if op is None or not isinstance(meta, TensorMeta) or meta.shape != () or meta.dtype != torch.int64 \
                or args.get("alpha", 1) != 1 or args.get("rounding_mode", "floor") != "floor":
            return None
        a, b = args[0], args[1]
        if not all(isinstance(v, int) and not isinstance(v, bool) or is_symbolic(v) for v in (a, b)):
            return None
        result = op(a, b)
        self._memo[value_key(node.output())] = result
        return [result]

    def fold(self, node: Node) -> list[Any] | None:
        """Run the node's own op on its build-time inputs (shape arithmetic on 0-d tensors, say): its outputs, or
        None when an input is only known at run time."""
        try:
            args = self.args(node)
        except NotStatic:
            return None
        if is_dynamic(args.values):
            return None
        if has_symbols(list(args.values)):  # dynamic shapes: traced shape arithmetic on 0-d tensors of a dim
            return self._fold_symbolic(node, args)
        schema = torch._C.parse_schema(node_schema(node))
        namespace, name = schema.name.split("::")
        op = getattr(getattr(getattr(torch.ops, namespace), name), schema.overload_name or "default")
        positional = [a for a, spec in zip(args.values, schema.arguments) if not spec.kwarg_only]
        keywords = {spec.name: a for a, spec in zip(args.values, schema.arguments) if spec.kwarg_only}
        try:
            with torch.no_grad():
                result = op(*positional, **keywords)
        except Exception as e:  # e.g. generic schemas (t[]) that torch.ops cannot bind: the converter handles it
            logger.debug("folding %s at build time failed: %s", node.kind(), e)
            return None
        results = list(result) if node.outputsSize() > 1 else [result]
        for out, value in zip(node.outputs(), results):
            self._memo[value_key(out)] = value
        return results

