"""Helpers over TorchScript graphs (torch._C.Graph, Node, Value) that every phase uses."""
from __future__ import annotations

import dataclasses
import functools
import re

import torch

Graph = torch._C.Graph
Node = torch._C.Node
Value = torch._C.Value


@dataclasses.dataclass(frozen=True)
class TensorMeta:
    """Shape, dtype and device of a tensor seen during shape analysis; its data is not known."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @property
    def rank(self) -> int:
        return len(self.shape)

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorMeta:
        return cls(tuple(t.shape), t.dtype, t.device)


@dataclasses.dataclass(frozen=True)
class StaticArgument:
    """A method argument compiled as a constant (its default, or a value `inputs` gave by name): lowering
    folds it into the graph; the compiled module keeps the argument and refuses any other value."""

    index: int  # among the method's arguments, self not counted
    name: str
    type: torch._C.JitType
    value: object
    is_default: bool


def value_key(v: Value) -> int:
    """A stable key for a Value inside its graph (Python wrappers of one Value are not identical)."""
    return v.unique()


@functools.lru_cache(maxsize=4096)
def _schema_key(schema: str) -> tuple[str, tuple[str, ...]]:
    parsed = torch._C.parse_schema(schema)
    key = f"{parsed.name}.{parsed.overload_name}" if parsed.overload_name else parsed.name
    return key, tuple(a.name for a in parsed.arguments)


def node_key(node: Node) -> str:
    """The op overload a node calls, e.g. 'aten::add.Tensor'; prim nodes give their kind."""
    schema = node_schema(node)
    return _schema_key(schema)[0] if schema else node.kind()


def node_schema(node: Node) -> str | None:
    try:
        schema = node.schema()
    except RuntimeError:
        return None
    return None if schema == "(no schema)" else schema


def argument_names(node: Node) -> tuple[str, ...]:
    """Schema argument names of a node's inputs (empty for prim nodes)."""
    schema = node_schema(node)
    return _schema_key(schema)[1] if schema else ()


def is_tensor_type(t: torch._C.JitType) -> bool:
    return isinstance(t, torch._C.TensorType)


def holds_tensor_type(t: torch._C.JitType) -> bool:
    """True for Tensor and for any container or optional type that can hold tensors."""
    if isinstance(t, torch._C.TensorType):
        return True
    return any(holds_tensor_type(c) for c in t.containedTypes())


def top_level_node(node: Node, block: torch._C.Block) -> Node:
    """The node of `block` that contains `node` (itself, or an If/Loop around it)."""
    while node.owningBlock() != block:
        node = node.owningBlock().owningNode()
    return node


def source_location(node: Node) -> str:
    """'file:line' of the Python source a node came from, when TorchScript kept it."""
    match = re.search(r'File "([^"]+)", line (\d+)', node.sourceRange() or "")
    return f"{match.group(1)}:{match.group(2)}" if match else "<unknown>"


def binding_name(v: Value) -> str:
    """A readable name for a value: its debug name without TorchScript's '.N' suffix."""
    name = re.sub(r"\.\d+$", "", v.debugName())
    return name if not name.isdigit() else f"v{name}"


# Nodes whose list (or dict) output is a new one that no earlier value aliases (append's and _set_item's output
# is its input, which lowering stops reading after the append).
FRESH_LIST_PRODUCERS = frozenset({
    "prim::ListConstruct", "prim::Constant", "aten::list", "aten::size", "aten::add", "aten::append", "aten::slice",
    "aten::_set_item", "aten::copy", "prim::DictConstruct", "aten::dict",
})
# Users that keep a reference to a list inside another value, so changing the list shows through that one.
ALIASING_USERS = frozenset({
    "prim::ListConstruct", "prim::TupleConstruct", "prim::DictConstruct", "prim::unchecked_cast", "prim::Return",
    "prim::Loop", "prim::If",
})


@functools.lru_cache(maxsize=4096)
def writes_to_arguments(schema: str) -> bool:
    """Whether an op of this schema may write to one of its arguments (or cannot be parsed)."""
    try:
        arguments = torch._C.parse_schema(schema).arguments
    except RuntimeError:
        return True
    return any(a.alias_info is not None and a.alias_info.is_write for a in arguments)


# Kinds that never hold blocks besides ATen operators: nodes made like operators (Graph::create), never given a
# block. Blocks belong to control flow (prim::If, prim::Loop, closures, a traced fork), which is not listed.
_BLOCKLESS_PRIMS = frozenset({
    "prim::Constant", "prim::ListConstruct", "prim::ListUnpack", "prim::TupleConstruct", "prim::TupleUnpack",
    "prim::TupleIndex", "prim::DictConstruct", "prim::GetAttr", "prim::SetAttr", "prim::NumToTensor", "prim::dtype",
    "prim::device", "prim::unchecked_cast", "prim::RaiseException", "prim::Uninitialized", "prim::CallMethod",
    "prim::CallFunction", "prim::PythonOp", "prim::max", "prim::min", "prim::isinstance", "prim::Print",
})


def node_blocks(node: Node) -> list[torch._C.Block]:
    """The node's blocks. Asking a node for them costs more than the rest of a graph walk's work per node, so
    ATen operators and the prims above, which never hold blocks, are not asked."""
    kind = node.kind()
    if kind.startswith("aten::") or kind in _BLOCKLESS_PRIMS:
        return []
    return list(node.blocks())


def inline_branch(node: Node, condition: bool) -> list[Node]:
    """Replace the prim::If `node` by the nodes of the branch `condition` takes; those nodes' own Ifs, in order."""
    taken = list(node.blocks())[0 if condition else 1]
    inner_ifs = [inner for inner in taken.nodes() if inner.kind() == "prim::If"]
    for inner in list(taken.nodes()):
        inner.moveBefore(node)
    for out, value in zip(node.outputs(), taken.outputs()):
        out.replaceAllUsesWith(value)
    node.destroy()
    return inner_ifs


def defined_inside(v: Value, node: Node) -> bool:
    """Whether `v` is made inside one of `node`'s blocks (by a node there, or as a block's parameter)."""
    block = v.node().owningBlock()
    while block is not None:
        owner = block.owningNode()
        if owner is None:
            return False
        if owner == node:
            return True
        block = owner.owningBlock()
    return False


def outer_values(node: Node) -> list[Value]:
    """The values made outside a control-flow node that its blocks read (besides its inputs), each once."""
    seen: dict[int, Value] = {}
    for block in node_blocks(node):
        for inner in block.nodes():
            for v in used_values(inner):
                seen.setdefault(value_key(v), v)
        for v in block.outputs():
            seen.setdefault(value_key(v), v)
    return [v for v in seen.values() if not defined_inside(v, node)]


def used_values(node: Node) -> list[Value]:
    """Every value a node reads, its nested blocks' reads and results included."""
    values = list(node.inputs())
    for block in node_blocks(node):
        for inner in block.nodes():
            values.extend(used_values(inner))
        values.extend(block.outputs())
    return values
