"""Resolving a node's inputs: network tensors, static values (by running evaluators) or tensor metadata.

Partitioning resolves with tensor metadata only (what shape analysis saw); conversion resolves
with the network tensors built so far. Both run the same evaluators, so both agree on which
values are static.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from torchkiln.analysis.registry import find_converter, find_evaluator
from torchkiln.ir.symbolic import as_dim, floordiv, has_symbols, is_symbolic
from torchkiln.ir.tensor import Tensor
from torchkiln.torchscript import (
    ALIASING_USERS, FRESH_LIST_PRODUCERS, Node, TensorMeta, Value, argument_names, holds_tensor_type,
    is_tensor_type, node_blocks, node_key, node_schema, source_location, value_key, writes_to_arguments,
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


@dataclasses.dataclass(frozen=True)
class _AliasFlags:
    """A schema's alias annotations: per argument, whether an output may alias it (or keep it) and whether
    it is written; per return, whether it may alias an argument."""

    kept: tuple[bool, ...]
    written: tuple[bool, ...]
    returns: tuple[bool, ...]
    written_memory: tuple[bool, ...]  # written, and not as a container only: tensor memory changes


def _writes_memory(argument: torch._C.Argument) -> bool:
    """Whether a written argument's write changes tensor memory: not a generic list builtin's (`t[](a!)` in append,
    insert, an item set), which changes the list. A dict's item set still counts: its getters carry no alias
    annotation, so a write through `d[k]` is seen only as a write into the dict."""
    kind = argument.type
    return not (isinstance(kind, torch._C.ListType) and str(kind.getElementType()) == "t")


@functools.lru_cache(maxsize=4096)
def _schema_alias_flags(schema: str) -> _AliasFlags | None:
    try:
        parsed = torch._C.parse_schema(schema)
    except RuntimeError:
        return None
    written = tuple(a.alias_info is not None and a.alias_info.is_write for a in parsed.arguments)
    return _AliasFlags(tuple(a.alias_info is not None for a in parsed.arguments), written,
                       tuple(r.alias_info is not None for r in parsed.returns),
                       tuple(w and _writes_memory(a) for w, a in zip(written, parsed.arguments)))


def alias_flags(node: Node) -> _AliasFlags | None:
    """The node's alias annotations; None for a node without a (parsable) schema, which may alias anything."""
    schema = node_schema(node)
    return None if schema is None else _schema_alias_flags(schema)


def _holding_tensors(values: Iterable[Value]) -> list[Value]:
    return [v for v in values if holds_tensor_type(v.type())]


def alias_sources(v: Value) -> list[Value]:
    """The values `v` may be a view of (or hold), one step back; [] when `v` is new memory (or a method input)."""
    node = v.node()
    kind = node.kind()
    if kind == "prim::Param":  # a loop body's carried value: what enters the loop, or what the last trip left
        owner = node.owningBlock().owningNode()
        if owner is None or owner.kind() != "prim::Loop" or v.offset() == 0:
            return []
        return _holding_tensors([owner.inputsAt(v.offset() + 1), list(node.owningBlock().outputs())[v.offset()]])
    if kind == "prim::If":
        return _holding_tensors([list(b.outputs())[v.offset()] for b in node.blocks()])
    if kind == "prim::Loop":
        body = next(node.blocks())
        return _holding_tensors([node.inputsAt(v.offset() + 2), list(body.outputs())[v.offset() + 1]])
    if kind in ("prim::Constant", "prim::GetAttr"):
        return []
    flags = alias_flags(node)
    inputs = list(node.inputs())
    if flags is None:
        return _holding_tensors(inputs)
    if v.offset() < len(flags.returns) and not flags.returns[v.offset()]:
        return []
    return _holding_tensors(i for k, i in enumerate(inputs) if k >= len(flags.kept) or flags.kept[k])


def aliases_of(base: Value) -> list[Value]:
    """Every value that may share memory with `base` (views, views of views, what holds them), by `alias_users`'
    one-step walk repeated."""
    found, stack = {value_key(base): base}, [base]
    while stack:
        for v in alias_users(stack.pop())[0]:
            if value_key(v) not in found:
                found[value_key(v)] = v
                stack.append(v)
    return list(found.values())


def writers_into(aliases: list[Value]) -> list[Node]:
    """The nodes that write in place into any of `aliases`."""
    return [w for v in aliases for w in alias_users(v)[1]]


def alias_users(v: Value) -> tuple[list[Value], list[Node]]:
    """One step forward: the values that may be views of `v` (or hold it), and the nodes that write to `v`."""
    aliases: list[Value] = []
    writers: list[Node] = []
    for use in v.uses():
        user, offset = use.user, use.offset
        kind = user.kind()
        owner = user.owningBlock().owningNode() if kind == "prim::Return" else None
        if kind == "prim::Return":  # a block's result: the If's or Loop's output (and the next trip's parameter)
            if owner is None:
                continue
            if owner.kind() == "prim::If":
                aliases.append(owner.outputsAt(offset))
            elif offset >= 1:
                aliases += [owner.outputsAt(offset - 1), list(user.owningBlock().inputs())[offset]]
        elif kind == "prim::Loop":
            if offset >= 2:
                aliases += [user.outputsAt(offset - 2), list(next(user.blocks()).inputs())[offset - 1]]
        elif kind == "prim::If":
            continue  # the condition
        else:
            flags = alias_flags(user)
            if flags is None or offset >= len(flags.kept):
                aliases += list(user.outputs())
                continue
            if not flags.kept[offset]:
                continue
            if flags.written_memory[offset]:  # appending to a list that holds `v` does not change `v`
                writers.append(user)
            aliases += [o for k, o in enumerate(user.outputs()) if k >= len(flags.returns) or flags.returns[k]]
            # a container written here (a list appended to) now holds `v`
            aliases += [i for k, i in enumerate(user.inputs()) if k != offset and k < len(flags.written)
                        and flags.written[k]]
    return _holding_tensors(aliases), writers


@dataclasses.dataclass(frozen=True)
class SharedMemory:
    """Values that may share memory with some value: its bases, every view of them and what holds them;
    the nodes that write to any of them; and the views (tensors neither a base nor a writer's result)."""

    values: frozenset[int]
    writers: tuple[Node, ...]
    views: tuple[Value, ...]

    def split_write(self) -> str | None:
        """Why these values must stay in PyTorch together: a write into memory that views share; else None.

        An engine returns new tensors, so a view made in one is a copy, and a write into it in PyTorch (or a
        write into the base that the copy should see) is lost."""
        if not self.writers or not self.views:
            return None
        writer, view = self.writers[0], self.views[0]
        return (f"{writer.kind()} at {source_location(writer)} writes in place into memory that "
                f"%{view.debugName()} (made by {view.node().kind()}) views")


def _mutates(node: Node, v: Value) -> bool:
    """Whether `node` modifies `v` in place (its schema marks that argument as written)."""
    flags = alias_flags(node)
    return flags is not None and any(i < len(flags.written) and flags.written[i]
                                     for i, inp in enumerate(node.inputs()) if inp.unique() == v.unique())


def read_after_mutation(v: Value) -> str | None:
    """Lists and dicts are mutable: a list's build-time value is its value everywhere only if it is a fresh
    list that nothing reads, or keeps inside another value, after modifying it in place. (Lowering rewrites
    straight-line appends so that later readers read the append's output.)"""
    if not isinstance(v.type(), (torch._C.ListType, torch._C.DictType)):
        return None
    users = [u.user for u in v.uses()]
    for node in users:
        if not _mutates(node, v):
            continue
        if v.node().kind() not in FRESH_LIST_PRODUCERS:
            return f"%{v.debugName()} from {v.node().kind()} is modified in place by {node.kind()}"
        for other in users:
            if other is node:
                continue
            if other.owningBlock() != node.owningBlock() or other.isAfter(node) or other.kind() in ALIASING_USERS:
                return f"%{v.debugName()} is read after {node.kind()} modifies it in place"
    return None


class Resolver:
    """Resolves Values of one graph; subclasses add what they already know (`known`).

    Resolution is iterative (an explicit work stack), so a chain of any depth resolves without Python recursion,
    and every outcome is memoized: static values (`_memo`), run-time tensors (`_runtime`), failures (`_failed`),
    fold attempts (`_folds`, None when the node does not fold) and alias analysis (`_roots`, `_groups`).
    """

    def __init__(self, metas: Mapping[int, TensorMeta]) -> None:
        self.metas = metas
        self._memo: dict[int, Any] = {}
        self._runtime: dict[int, Any] = {}
        self._failed: dict[int, str] = {}
        self._folds: dict[int, list[Any] | None] = {}  # first output's key -> folded outputs, or None
        self._roots: dict[int, list[Value]] = {}
        self._groups: dict[int, SharedMemory] = {}

    def known(self, v: Value) -> tuple[bool, Any]:
        return False, None

    def resolve(self, v: Value) -> Any:
        """The value of `v`: known, evaluated, or TensorMeta for a run-time tensor; else NotStatic."""
        hit, obj = self.known(v)
        if hit:
            return obj
        key = value_key(v)
        if not self._settled(v):
            self._resolve_pending(v)
        if key in self._memo:
            return self._memo[key]
        if key in self._runtime:
            return self._runtime[key]
        raise NotStatic(self._failed[key])

    def _settled(self, v: Value) -> bool:
        key = value_key(v)
        return key in self._memo or key in self._runtime or key in self._failed or self.known(v)[0]

    def _needs(self, node: Node) -> list[Value]:
        """The inputs evaluating (or folding) `node` reads."""
        if node.kind() != "prim::Param" and not node_blocks(node) and find_evaluator(node) is not None:
            return list(node.inputs())
        return list(node.inputs()) if self.foldable(node) else []

    def _resolve_pending(self, v: Value) -> None:
        """Settle `v` and, first, every value it needs, deepest first: no recursion however deep the graph."""
        stack = [v]
        expanded: set[int] = set()
        while stack:
            top = stack[-1]
            if self._settled(top):
                stack.pop()
                continue
            key = value_key(top)
            if key not in expanded:
                expanded.add(key)
                pending = [i for i in self._needs(top.node()) if not self._settled(i)]
                if pending:
                    stack.extend(reversed(pending))
                    continue
            stack.pop()
            try:
                result = self._evaluate(top)
            except NotStatic as e:
                self._failed[key] = str(e)
            else:
                if key not in self._memo:
                    self._runtime[key] = result

    def _evaluate(self, v: Value) -> Any:
        """Evaluate `v` from inputs already settled; static results go to `_memo`, the rest is returned."""
        node = v.node()
        key = value_key(v)
        evaluator = None if node.kind() == "prim::Param" or node_blocks(node) else find_evaluator(node)
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
            if isinstance(value, torch.Tensor) and self.written(out):  # changes at run time: not a constant
                if key in self.metas:
                    return self.metas[key]
                raise NotStatic(f"%{out.debugName()} is modified in place")
        for out, value in zip(outputs, results):
            self._memo[value_key(out)] = value
        return self._memo[key]

    def args(self, node: Node) -> Args:
        return Args(node, [self.resolve(i) for i in node.inputs()], self.metas)

    def foldable(self, node: Node) -> bool:
        """A tensor op that may run at build time when its inputs are build-time values: it has a converter,
        is deterministic, writes to none of its inputs, its outputs are small tensors and nothing modifies
        them (or a view of them) in place."""
        if node.outputsSize() == 0:
            return False
        key = value_key(node.outputsAt(0))
        if self._folds.get(key, True) is None:  # tried before and it does not fold
            return False
        schema = node_schema(node)
        if schema is None or find_converter(node) is None or node.isNondeterministic() or writes_to_arguments(schema):
            return False
        metas = [self.metas.get(value_key(o)) for o in node.outputs()]
        if not all(isinstance(m, TensorMeta) and not has_symbols(m.shape)  # dynamic shapes are never folded
                   and torch.Size(m.shape).numel() <= FOLD_MAX_ELEMENTS for m in metas):
            return False
        return not any(self.written(o) for o in node.outputs())

    def _fold_symbolic(self, node: Node, args: Args) -> list[Any] | None:
        """`a + b`, `a - b`, `a * b`, `a // b` of 0-d integer tensors holding symbolic dims (what tracing makes
        of `x.size(1) + n`): a symbolic dim again. Anything else is left to the converter."""
        op = _SYMBOLIC_TENSOR_ARITHMETIC.get(node_key(node))
        meta = self.metas.get(value_key(node.output())) if node.outputsSize() == 1 else None
        if op is None or not isinstance(meta, TensorMeta) or meta.shape != () or meta.dtype != torch.int64 \
                or args.get("alpha", 1) != 1 or args.get("rounding_mode", "floor") != "floor":
            return None
        # an operand may be a static dim's 0-d tensor (tracing makes `b * c` of sizes, c static, two tensors)
        a, b = (v.item() if isinstance(v, torch.Tensor) and v.dim() == 0 and v.dtype == torch.int64 else v
                for v in (args[0], args[1]))
        if not all(isinstance(v, int) and not isinstance(v, bool) or is_symbolic(v) for v in (a, b)):
            return None
        result = op(a, b)
        self._memo[value_key(node.output())] = result
        return [result]

    def fold(self, node: Node) -> list[Any] | None:
        """Run the node's own op on its build-time inputs (shape arithmetic on 0-d tensors, say): its outputs, or
        None when an input is only known at run time. Each node is tried once."""
        key = value_key(node.outputsAt(0))
        if key not in self._folds:
            self._folds[key] = self._run_op(node)
        return self._folds[key]

    def _run_op(self, node: Node) -> list[Any] | None:
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

    def shared_memory(self, v: Value) -> SharedMemory:
        """What may share memory with `v` and who writes to it (walked once per base, then memoized)."""
        groups = [self._group(root) for root in self._bases(v)]
        if len(groups) == 1:
            return groups[0]
        return SharedMemory(frozenset().union(*(g.values for g in groups)),
                            tuple(dict.fromkeys(w for g in groups for w in g.writers)),
                            tuple(dict.fromkeys(x for g in groups for x in g.views)))

    def written(self, v: Value) -> bool:
        """Whether something modifies `v`'s memory in place (through `v`, its base or any view of them)."""
        return holds_tensor_type(v.type()) and bool(self.shared_memory(v).writers)

    def _bases(self, v: Value) -> list[Value]:
        """The values `v` is ultimately a view of (itself when it is new memory)."""
        key = value_key(v)
        if key in self._roots:
            return self._roots[key]
        bases: dict[int, Value] = {}
        seen: set[int] = set()
        stack = [v]
        while stack:
            x = stack.pop()
            k = value_key(x)
            if k in seen:
                continue
            seen.add(k)
            if k in self._roots and k != key:
                bases.update((value_key(b), b) for b in self._roots[k])
                continue
            sources = alias_sources(x)
            if not sources:
                bases[k] = x
            stack.extend(sources)
        self._roots[key] = list(bases.values())
        return self._roots[key]

    def _group(self, base: Value) -> SharedMemory:
        key = value_key(base)
        if key not in self._groups:
            values: dict[int, Value] = {key: base}
            writers: dict[Node, None] = {}
            stack = [base]
            while stack:
                aliases, found = alias_users(stack.pop())
                writers.update(dict.fromkeys(found))
                for a in aliases:
                    if value_key(a) not in values:
                        values[value_key(a)] = a
                        stack.append(a)
            views = tuple(x for k, x in values.items()
                          if k != key and is_tensor_type(x.type()) and x.node() not in writers)
            self._groups[key] = SharedMemory(frozenset(values), tuple(writers), views)
        return self._groups[key]
