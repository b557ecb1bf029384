"""Resolve static containers: lists and dicts built in the method whose structure is known at build time.

Models build containers of tensors in `forward` (torchvision's IntermediateLayerGetter fills a dict
`out[name] = x`, a feature pyramid inserts into a list and zips names with results into a dict). Their
elements are tensors, but the containers themselves cannot cross an engine boundary. This pass follows
each container *object* through the top-level block in program order, as long as every index and key is
known at build time (constants, the compiled shapes, or shape analysis' facts when it runs again after it):

- made by `prim::ListConstruct`, `prim::DictConstruct`, `dict()`, `dict([(k, v), ...])`, a copy (`list(l)`,
  `dict(d)`, `.copy()`), `d.keys()`, `d.values()`, `a + b` or a static slice;
- changed by `append`, `insert`, `extend`, `l[i] = x` and `d[k] = x`;
- read by `l[i]`, `d[k]`, `len`, `k in d` and `prim::ListUnpack`, which become the element (or a constant);
- read whole by an op that neither changes nor keeps it (`torch.cat(l)`), or returned by the method: it is
  given a new `ListConstruct` / `DictConstruct` of the elements at that point.

Reading an element gives the very value that was stored, so a rewrite is exact whatever happens to that value
later. From the first use that this pass does not model (a dynamic index, an op that may keep or change the
container, a use inside a loop or branch, storing it in another container) the object's contents count as
unknown and nothing after it is rewritten. An object that nothing reads any more loses its creation and its
changes.

An attribute the method assigns such a container to (RAFT's `self.corr_pyramid = [x]`, then appends) is
followed through its later reads; a loop or branch that only reads it (`len`, `l[i]`) reads a literal of its
elements made before it. When no read of the attribute is left, the assignment goes with the container's other
changes: **the compiled module does not set that attribute** (every read in the method came after the
assignment, so the outputs do not depend on it). Other containers from outside (method inputs, attributes the
method does not assign) are left alone here (module dict caches: `resolve_attribute_caches`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from torchkiln.analysis.resolve import NotStatic, Resolver, alias_flags
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.static_values import context_resolver
from torchkiln.lowering.walk import all_nodes, attribute_path
from torchkiln.torchscript import Graph, Node, Value, node_blocks, node_key

_KEY_TYPES = (str, int)
_LITERALS = ("prim::ListConstruct", "prim::DictConstruct")


@dataclasses.dataclass
class Container:
    """What the pass knows of one list or dict object: its elements (a dict's keys are build-time values)."""

    items: list[Value] | dict[Any, Value]
    type: torch._C.JitType
    known: bool = True
    changes: list[Node] = dataclasses.field(default_factory=list)  # the mutations modelled, in program order
    values: list[Value] = dataclasses.field(default_factory=list)  # the Values that hold this object

    @property
    def is_dict(self) -> bool:
        return isinstance(self.items, dict)


class ContainerWalk:
    """Follows container objects through one block in program order, rewriting the reads it can prove."""

    def __init__(self, graph: Graph, resolver: Resolver) -> None:
        self.graph = graph
        self.resolver = resolver
        self.objects: dict[int, Container] = {}  # Value.unique() -> the object it holds
        self.all: list[Container] = []
        self.changed = False
        # attributes the method assigns a followed container to (`self.pyramid = [x]`), by path from self
        self.slots: dict[tuple[str, ...], Container] = {}
        nested = [n for n in all_nodes(graph.block()) if n.owningBlock() != graph.block()]
        owners = [(attribute_path(n.inputsAt(0), graph), n.s("name")) for n in nested if n.kind() == "prim::SetAttr"]
        self.unsafe_slots = {None if owner is None else owner + (name,) for owner, name in owners}

    # -- bookkeeping -------------------------------------------------------------------------------------------
    def of(self, v: Value) -> Container | None:
        obj = self.objects.get(v.unique())
        return obj if obj is not None and obj.known else None

    def track(self, v: Value, obj: Container) -> Container:
        self.objects[v.unique()] = obj
        obj.values.append(v)
        if obj not in self.all:
            self.all.append(obj)
        return obj

    def poison(self, v: Value) -> None:
        obj = self.objects.get(v.unique())
        if obj is not None:
            obj.known = False

    def static(self, v: Value) -> Any:
        """The build-time value of an index or key; NotStatic when it is only known at run time."""
        value = self.resolver.resolve(v)
        if isinstance(value, (list, dict, torch.Tensor)) or not isinstance(value, (*_KEY_TYPES, type(None))):
            raise NotStatic(f"%{v.debugName()} is not a build-time int or str")
        return value

    def constant(self, value: Any, before: Node) -> Value:
        with self.graph.insert_point_guard(before):
            return self.graph.insertConstant(value)

    def replace(self, out: Value, by: Value) -> None:
        out.replaceAllUsesWith(by)
        self.changed = True

    def materialize(self, obj: Container, before: Node) -> Value:
        """A new ListConstruct / DictConstruct of the object's elements, placed before `before`."""
        if obj.is_dict:
            inputs = [v for key, value in obj.items.items() for v in (self.constant(key, before), value)]
            node = self.graph.create("prim::DictConstruct", inputs, 1)
        else:
            node = self.graph.create("prim::ListConstruct", list(obj.items), 1)
        node.insertBefore(before)
        node.output().setType(obj.type)
        node.copyMetadata(before)
        return node.output()

    def new(self, out: Value, items: list[Value] | dict[Any, Value] | None) -> None:
        self.track(out, Container(items, out.type()) if items is not None else Container([], out.type(), False))

    # -- the walk ----------------------------------------------------------------------------------------------
    def run(self, block: torch._C.Block) -> bool:
        for node in list(block.nodes()):
            if node_blocks(node):
                self.poison_nested(node)
                continue
            handler = _HANDLERS.get(node_key(node)) or _HANDLERS.get(node.kind())
            if handler is None or not handler(self, node):
                self.other_use(node)
        self.other_use(block.returnNode())
        self.drop_unread()
        return self.changed

    def poison_nested(self, node: Node) -> None:
        """A loop or branch: what it uses (in its blocks too) is no longer followed. It reads an assigned
        attribute's container from a new literal made before it, if it only reads it (`len`, `l[i]`)."""
        self.read_slots_in(node)
        used = list(node.inputs())
        for inner in node.blocks():
            used += list(inner.outputs())
            for n in all_nodes(inner):
                used += list(n.inputs()) + [v for b in node_blocks(n) for v in b.outputs()]
        for v in used:
            self.poison(v)

    def read_slots_in(self, node: Node) -> None:
        inner = [n for b in node.blocks() for n in all_nodes(b)]
        for obj in {id(o): o for o in self.slots.values() if o.known}.values():
            paths = {p for p, o in self.slots.items() if o is obj}
            reads = [n for n in inner
                     if n.kind() == "prim::GetAttr" and attribute_path(n.output(), self.graph) in paths]
            if not reads:
                continue
            held = {v.unique() for v in obj.values}
            if any(v.unique() in held for n in inner for v in n.inputs()) or any(
                    u.user.kind() not in ("aten::len", "aten::__getitem__") or u.offset != 0
                    for n in reads for u in n.output().uses()):
                obj.known = False  # the loop or branch may change it through the attribute
                continue
            literal = self.materialize(obj, node)
            for n in reads:
                n.output().replaceAllUsesWith(literal)
            self.changed = True

    def assigned_everywhere(self, setter: Node) -> bool:
        """Whether every read of the attribute `setter` assigns reads the container it assigns (nothing else in
        the method reads the attribute)."""
        path = attribute_path(setter.inputsAt(0), self.graph) + (setter.s("name"),)
        obj = self.slots.get(path)
        held = set() if obj is None else {v.unique() for v in obj.values}
        return all(n.output().unique() in held or not n.output().uses() for n in all_nodes(self.graph.block())
                   if n.kind() == "prim::GetAttr" and attribute_path(n.output(), self.graph) == path)

    def other_use(self, node: Node) -> None:
        """A use the walk does not model: a plain read gets a new container; anything else stops the object."""
        flags = alias_flags(node) if node.kind() != "prim::Return" else None
        for i, v in enumerate(list(node.inputs())):
            obj = self.of(v)
            if obj is None:
                self.poison(v)
                continue
            plain_read = node.kind() == "prim::Return" or (
                flags is not None and i < len(flags.kept) and not flags.kept[i])
            if plain_read:
                if obj.changes or v.node().kind() not in _LITERALS:  # else it is that literal already
                    node.replaceInput(i, self.materialize(obj, node))
                    self.changed = True
            else:
                obj.known = False

    def drop_unread(self) -> None:
        """Remove the changes of objects nothing reads any more (their creation goes with dead-code elimination)."""
        dropped = True
        while dropped:  # dropping `a.extend(b)` may leave `b` unread
            dropped = False
            for obj in (o for o in self.all if o.changes):
                changes = set(obj.changes)
                if any(u.user not in changes for v in obj.values for u in v.uses()) or not all(
                        self.assigned_everywhere(n) for n in obj.changes if n.kind() == "prim::SetAttr"):
                    continue
                for node in reversed(obj.changes):
                    node.destroy()
                obj.changes = []
                dropped = self.changed = True


def _list_index(obj: Container, index: int) -> int | None:
    """A Python index into the list (negative counts from the end); None when out of range (a run-time error)."""
    n = len(obj.items)
    if -n <= index < n:
        return index % n
    return None


def _store(walk: ContainerWalk, element: Value) -> Value:
    """An element put into a container: a container stored inside another one is no longer followed."""
    walk.poison(element)
    return element


# -- creation --------------------------------------------------------------------------------------------------
def _list_construct(walk: ContainerWalk, node: Node) -> bool:
    walk.new(node.output(), [_store(walk, v) for v in node.inputs()])
    return True


def _dict_construct(walk: ContainerWalk, node: Node) -> bool:
    inputs = list(node.inputs())
    values = [_store(walk, v) for v in inputs[1::2]]  # stored: each is no longer followed, whatever the keys
    try:
        keys = [walk.static(k) for k in inputs[::2]]
    except NotStatic:
        keys = None
    walk.new(node.output(), None if keys is None else dict(zip(keys, values)))
    return True


def _dict(walk: ContainerWalk, node: Node) -> bool:
    """`dict()`, `dict(d)`, or `dict([(k, v), ...])` of tuples built in place."""
    if node.inputsSize() == 0:
        walk.new(node.output(), {})
        return True
    source = walk.of(node.inputsAt(0))
    if source is None:
        return False
    if source.is_dict:
        walk.new(node.output(), dict(source.items))
        return True
    items: dict[Any, Value] = {}
    for pair in source.items:
        if pair.node().kind() != "prim::TupleConstruct" or pair.node().inputsSize() != 2:
            return False
        try:
            items[walk.static(pair.node().inputsAt(0))] = _store(walk, pair.node().inputsAt(1))
        except NotStatic:
            return False
    walk.new(node.output(), items)
    return True


def _copy(walk: ContainerWalk, node: Node) -> bool:
    source = walk.of(node.inputsAt(0))
    if source is None:
        return False
    walk.new(node.output(), dict(source.items) if source.is_dict else list(source.items))
    return True


def _keys(walk: ContainerWalk, node: Node) -> bool:
    source = walk.of(node.inputsAt(0))
    if source is None or not source.is_dict:
        return False
    walk.new(node.output(), [walk.constant(k, node) for k in source.items])
    return True


def _values(walk: ContainerWalk, node: Node) -> bool:
    source = walk.of(node.inputsAt(0))
    if source is None or not source.is_dict:
        return False
    walk.new(node.output(), list(source.items.values()))
    return True


def _concatenate(walk: ContainerWalk, node: Node) -> bool:
    a, b = walk.of(node.inputsAt(0)), walk.of(node.inputsAt(1))
    if a is None or b is None:
        return False
    walk.new(node.output(), list(a.items) + list(b.items))
    return True


def _slice(walk: ContainerWalk, node: Node) -> bool:
    source = walk.of(node.inputsAt(0))
    if source is None or source.is_dict:
        return False
    try:
        start, end, step = (walk.static(v) for v in list(node.inputs())[1:4])
    except NotStatic:
        return False
    if step == 0:
        return False  # raises at run time
    walk.new(node.output(), list(source.items)[start:end:step])
    return True


# -- changes ---------------------------------------------------------------------------------------------------
def _changed(walk: ContainerWalk, obj: Container, node: Node) -> bool:
    obj.changes.append(node)
    if node.outputsSize() == 1:  # append returns the list itself
        walk.track(node.output(), obj)
    return True


def _append(walk: ContainerWalk, node: Node) -> bool:
    obj = walk.of(node.inputsAt(0))
    if obj is None or obj.is_dict:
        return False
    obj.items.append(_store(walk, node.inputsAt(1)))
    return _changed(walk, obj, node)


def _insert(walk: ContainerWalk, node: Node) -> bool:
    obj = walk.of(node.inputsAt(0))
    if obj is None or obj.is_dict:
        return False
    try:
        index = walk.static(node.inputsAt(1))
    except NotStatic:
        return False
    if not isinstance(index, int) or isinstance(index, bool):
        return False
    obj.items.insert(index, _store(walk, node.inputsAt(2)))
    return _changed(walk, obj, node)


def _extend(walk: ContainerWalk, node: Node) -> bool:
    obj, other = walk.of(node.inputsAt(0)), walk.of(node.inputsAt(1))
    if obj is None or other is None or obj.is_dict or other.is_dict or obj is other:
        return False
    obj.items.extend(other.items)
    return _changed(walk, obj, node)


def _set_item(walk: ContainerWalk, node: Node) -> bool:
    obj = walk.of(node.inputsAt(0))
    if obj is None:
        return False
    try:
        key = walk.static(node.inputsAt(1))
    except NotStatic:
        return False
    if obj.is_dict:
        obj.items[key] = _store(walk, node.inputsAt(2))
        return _changed(walk, obj, node)
    index = _list_index(obj, key) if isinstance(key, int) and not isinstance(key, bool) else None
    if index is None:
        return False
    obj.items[index] = _store(walk, node.inputsAt(2))
    return _changed(walk, obj, node)


def _set_attribute(walk: ContainerWalk, node: Node) -> bool:
    """`self.a = l`: later reads of `self.a` read `l`'s object (the assignment is a change of it)."""
    obj = walk.of(node.inputsAt(1))
    owner = attribute_path(node.inputsAt(0), walk.graph)
    if obj is None or owner is None or None in walk.unsafe_slots or owner + (node.s("name"),) in walk.unsafe_slots:
        if owner is not None:  # the attribute now holds something not followed: reads of it are no longer known
            walk.slots.pop(owner + (node.s("name"),), None)
        else:
            walk.slots.clear()
        walk.poison(node.inputsAt(1))
        return False
    walk.slots[owner + (node.s("name"),)] = obj
    obj.changes.append(node)
    return True


def _get_attribute(walk: ContainerWalk, node: Node) -> bool:
    path = attribute_path(node.output(), walk.graph)
    obj = walk.slots.get(path) if path is not None else None
    if obj is None or not obj.known:
        return False
    walk.track(node.output(), obj)
    return True


# -- reads -----------------------------------------------------------------------------------------------------
def _element(obj: Container, key: Any) -> Value | None:
    if obj.is_dict:
        return obj.items.get(key)
    index = _list_index(obj, key) if isinstance(key, int) and not isinstance(key, bool) else None
    return None if index is None else obj.items[index]


def _get_item(walk: ContainerWalk, node: Node) -> bool:
    obj = walk.of(node.inputsAt(0))
    if obj is None:
        return False
    try:
        element = _element(obj, walk.static(node.inputsAt(1)))
    except NotStatic:
        return False
    if element is None:  # out of range or a missing key: raises at run time, as in eager
        return False
    walk.replace(node.output(), element)
    node.destroy()
    return True


def _length(walk: ContainerWalk, node: Node) -> bool:
    obj = walk.of(node.inputsAt(0))
    if obj is None:
        return False
    walk.replace(node.output(), walk.constant(len(obj.items), node))
    node.destroy()
    return True


def _contains(walk: ContainerWalk, node: Node) -> bool:
    obj = walk.of(node.inputsAt(0))
    if obj is None or not obj.is_dict:
        return False
    try:
        key = walk.static(node.inputsAt(1))
    except NotStatic:
        return False
    walk.replace(node.output(), walk.constant(key in obj.items, node))
    node.destroy()
    return True


def _unpack(walk: ContainerWalk, node: Node) -> bool:
    obj = walk.of(node.inputsAt(0))
    if obj is None or obj.is_dict or len(obj.items) != node.outputsSize():
        return False
    for out, element in zip(node.outputs(), obj.items):
        walk.replace(out, element)
    node.destroy()
    return True


_HANDLERS: dict[str, Callable[[ContainerWalk, Node], bool]] = {
    "prim::ListConstruct": _list_construct, "prim::DictConstruct": _dict_construct,
    "aten::dict": _dict, "aten::dict.str": _dict, "aten::dict.int": _dict,
    "aten::dict.Dict_str": _dict, "aten::dict.Dict_int": _dict,
    "aten::list.t": _copy, "aten::copy.t": _copy, "aten::copy.Dict_str": _copy, "aten::copy.Dict_int": _copy,
    "aten::keys.str": _keys, "aten::keys.int": _keys, "aten::values.str": _values, "aten::values.int": _values,
    "aten::add.t": _concatenate, "aten::slice.t": _slice,
    "aten::append.t": _append, "aten::insert.t": _insert, "aten::extend.t": _extend,
    "aten::_set_item.t": _set_item, "aten::_set_item.str": _set_item, "aten::_set_item.int": _set_item,
    "aten::__getitem__.t": _get_item, "aten::__getitem__.Dict_str": _get_item, "aten::__getitem__.Dict_int": _get_item,
    "aten::len.t": _length, "aten::len.Dict_str": _length, "aten::len.Dict_int": _length,
    "aten::__contains__.str": _contains, "aten::__contains__.int": _contains,
    "prim::ListUnpack": _unpack, "prim::SetAttr": _set_attribute, "prim::GetAttr": _get_attribute,
}


@lowering_pass()
def resolve_static_containers(graph: Graph, ctx: LoweringContext) -> bool:
    """Read elements of lists and dicts built in the method (static keys and indices) where they are stored."""
    if not any(n.kind() in ("prim::ListConstruct", "prim::DictConstruct", "aten::dict") for n in graph.nodes()):
        return False
    return ContainerWalk(graph, context_resolver(graph, ctx)).run(graph.block())
