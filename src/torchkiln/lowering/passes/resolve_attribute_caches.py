"""Resolve attribute caches: a module's dict attribute that forward fills once and then reads (timm's LeViT and
EfficientFormer `attention_bias_cache`) is read from the value that fills it, or from what it holds now.

The pattern, per key `k` (a build-time str or int, `str(x.device)` once shape analysis knows the device):

    if k not in self.cache:          # aten::__contains__ -> aten::__not__ -> prim::If (no else, no outputs)
        self.cache[k] = v            # v computed from constants only (the parameters, after freezing)
    return self.cache[k]             # aten::__getitem__

Whatever the cache held before a call, after the guard `self.cache[k]` equals `v`: either it held `v` from an
earlier call (`v` is the same on every call: it depends on constants only) or it holds what it held when the
module was compiled. The pass starts from the attribute's contents at compile time: a key present then is read
from there (a constant; the guard disappears), a missing key from `v` (the guard's body runs unconditionally
and the item set is dropped). So the outputs are eager's on every call, but **the compiled module does not
fill the attribute** (its item sets are gone; the frozen module's copy of the dict is not the caller's).

Only where every use of the attribute in the method is such a guard or such a read, with keys known at build
time, and the method never assigns the attribute; anything else (`len(self.cache)`, a key known only at run
time, a value read before it is filled, a value computed from the inputs) leaves it alone.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from torchkiln.analysis.resolve import NotStatic, Resolver, aliases_of, writers_into
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.static_values import context_resolver
from torchkiln.lowering.walk import all_nodes, attribute_path
from torchkiln.torchscript import Graph, Node, Value, node_blocks, node_schema, writes_to_arguments

_CONSTANT_ELEMENTS = (torch.Tensor, bool, int, float, str)
_LITERALS = ("prim::Constant", "prim::ListConstruct", "prim::TupleConstruct")


@dataclasses.dataclass
class _Guard:
    """`if k not in cache: cache[k] = v` at the top level: the If, its key, the item set and the value set."""

    branch: Node
    key: Any
    set_item: Node
    value: Value


def _current_contents(module: torch.jit.ScriptModule, path: tuple[str, ...]) -> dict[Any, Any] | None:
    obj: Any = module
    for name in path:
        obj = getattr(obj, name, None)
    if not isinstance(obj, dict) or not all(isinstance(v, _CONSTANT_ELEMENTS) for v in obj.values()):
        return None
    return dict(obj)


def _pure(node: Node) -> bool:
    """A deterministic op without blocks that writes to nothing (or a literal)."""
    if node.kind() in _LITERALS:
        return True
    schema = node_schema(node)
    return schema is not None and not node_blocks(node) and not node.isNondeterministic() \
        and not writes_to_arguments(schema)


def _depends_on_constants_only(v: Value) -> bool:
    """Whether `v` is computed from constants alone by pure ops (the same on every call)."""
    pending, seen = [v], set()
    while pending:
        node = pending.pop().node()
        if node in seen:
            continue
        seen.add(node)
        if node.kind() == "prim::Constant":
            continue
        if not _pure(node):
            return False
        pending.extend(node.inputs())
    return True


class _CacheAttribute:
    """One dict attribute (by path) and every read of it: plans the rewrite, then applies it."""

    def __init__(self, graph: Graph, resolver: Resolver, path: tuple[str, ...], reads: list[Value]) -> None:
        self.graph = graph
        self.resolver = resolver
        self.path = path
        self.reads = reads
        self.keys = {v.unique() for v in reads}

    def _key(self, v: Value) -> Any:
        key = self.resolver.resolve(v)
        if not isinstance(key, (str, int)):
            raise NotStatic(f"%{v.debugName()} is not a build-time key")
        return key

    def _guard(self, contains: Node) -> _Guard | None:
        """The guard `contains` tests, if it is exactly the pattern of the module docstring."""
        uses = contains.output().uses()
        if len(uses) != 1 or uses[0].user.kind() != "aten::__not__":
            return None
        uses = uses[0].user.output().uses()
        branch = uses[0].user if len(uses) == 1 else None
        if branch is None or branch.kind() != "prim::If" or uses[0].offset != 0 or branch.outputsSize() != 0 \
                or branch.owningBlock() != self.graph.block():
            return None
        fill, skip = branch.blocks()
        sets = [n for n in fill.nodes() if n.kind() == "aten::_set_item"]
        if list(skip.nodes()) or len(sets) != 1 or sets[0].inputsAt(0).unique() not in self.keys:
            return None
        for n in fill.nodes():  # besides the item set: reads of the attribute and pure ops
            if n is sets[0] or (n.kind() == "prim::GetAttr" and n.output().unique() in self.keys):
                continue
            if not _pure(n):
                return None
        try:
            key, set_key = self._key(contains.inputsAt(1)), self._key(sets[0].inputsAt(1))
        except NotStatic:
            return None
        if key != set_key or not _depends_on_constants_only(sets[0].inputsAt(2)):
            return None
        return _Guard(branch, key, sets[0], sets[0].inputsAt(2))

    def plan(self) -> tuple[list[_Guard], list[tuple[Node, Any]]] | None:
        """The guards and the top-level reads (node, key), or None when some use is not the pattern."""
        guards: dict[Node, _Guard] = {}
        reads: list[tuple[Node, Any]] = []
        guarded_sets: set[Node] = set()
        for v in self.reads:
            for use in v.uses():
                user = use.user
                if user.kind() == "aten::__contains__" and use.offset == 0:
                    guard = self._guard(user)
                    if guard is None:
                        return None
                    guards[guard.branch] = guard
                    guarded_sets.add(guard.set_item)
                elif user.kind() == "aten::__getitem__" and use.offset == 0 \
                        and user.owningBlock() == self.graph.block():
                    if writers_into(aliases_of(user.output())):
                        return None  # written in place: eager keeps the change in the cache for later calls
                    try:
                        reads.append((user, self._key(user.inputsAt(1))))
                    except NotStatic:
                        return None
                elif user.kind() != "aten::_set_item" or use.offset != 0:
                    return None
        sets = {u.user for v in self.reads for u in v.uses() if u.user.kind() == "aten::_set_item"}
        if sets != guarded_sets:
            return None
        order = {n: i for i, n in enumerate(self.graph.nodes())}
        return sorted(guards.values(), key=lambda g: order[g.branch]), sorted(reads, key=lambda r: order[r[0]])

    def apply(self, contents: dict[Any, Any], guards: list[_Guard], reads: list[tuple[Node, Any]]) -> bool:
        """Rewrite guards and reads in program order, from `contents`; False (graph untouched) if a read would
        find its key missing (eager raises then)."""
        order = {n: i for i, n in enumerate(self.graph.nodes())}
        events = sorted([(order[g.branch], 0, g) for g in guards] + [(order[n], 1, (n, k)) for n, k in reads],
                        key=lambda e: e[:2])
        known = set(contents)
        for _, kind, event in events:
            if kind == 0:
                known.add(event.key)
            elif event[1] not in known:
                return False
        state: dict[Any, Value] = {}
        for key, value in contents.items():
            with self.graph.insert_point_guard(next(self.graph.nodes())):
                state[key] = self.graph.insertConstant(value.detach() if isinstance(value, torch.Tensor) else value)
        for _, kind, event in events:
            if kind == 0:
                self._fold(event, state)
            else:
                node, key = event
                node.output().replaceAllUsesWith(state[key])
                node.destroy()
        return True

    def _fold(self, guard: _Guard, state: dict[Any, Value]) -> None:
        if guard.key not in state:
            for n in list(next(guard.branch.blocks()).nodes()):
                if n is not guard.set_item:
                    n.moveBefore(guard.branch)
            state[guard.key] = guard.value
        guard.set_item.destroy()
        guard.branch.destroy()


@lowering_pass()
def resolve_attribute_caches(graph: Graph, ctx: LoweringContext) -> bool:
    """Read a module dict attribute filled once per key from constants (timm's attention bias cache) as a value."""
    if ctx.module is None:
        return False
    nodes = list(all_nodes(graph.block()))
    assigned = {(attribute_path(n.inputsAt(0), graph), n.s("name")) for n in nodes if n.kind() == "prim::SetAttr"}
    by_path: dict[tuple[str, ...], list[Value]] = {}
    for node in nodes:
        if node.kind() != "prim::GetAttr" or not isinstance(node.output().type(), torch._C.DictType):
            continue
        path = attribute_path(node.output(), graph)
        if path is not None and (path[:-1], path[-1]) not in assigned:
            by_path.setdefault(path, []).append(node.output())
    changed = False
    resolver = context_resolver(graph, ctx)
    for path, reads in by_path.items():
        contents = _current_contents(ctx.module, path)
        attribute = _CacheAttribute(graph, resolver, path, reads)
        planned = attribute.plan() if contents is not None else None
        if planned is not None and attribute.apply(contents, *planned):
            changed = True
    if changed:
        torch._C._jit_pass_dce(graph)
    return changed
