"""Walking a TorchScript graph's nodes (nested blocks included) and attribute paths; replacing a node by another op."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from torchkiln.torchscript import Graph, Node, Value, node_blocks


def _block_nodes(block: torch._C.Block) -> list[Node]:
    """The nodes of a block, in order, read back from its return node: Block.nodes() costs as much as reading
    a dozen nodes this way, and most blocks (an If's branches) hold a few."""
    found = []
    node = block.returnNode().prev()
    while node.kind() != "prim::Param":  # the block's own param node, before its first node
        found.append(node)
        node = node.prev()
    found.reverse()
    return found


def all_nodes(block: torch._C.Block) -> Iterator[Node]:
    """Every node of `block`, each followed by the nodes of its own blocks (a snapshot: safe to edit)."""
    stack = [iter(list(block.nodes()))]
    while stack:
        for node in stack[-1]:
            yield node
            inner = node_blocks(node)
            if inner:
                stack.extend([iter(_block_nodes(b)) for b in reversed(inner)])
                break
        else:
            stack.pop()


def replace_node(graph: Graph, node: Node, kind: str, inputs: list[Value]) -> Node:
    """Put a one-output `kind` node in `node`'s place, keeping its source location, module path and type."""
    new = graph.create(kind, inputs, 1)
    new.copyMetadata(node)
    new.insertBefore(node)
    new.output().setType(node.output().type())
    node.output().replaceAllUsesWith(new.output())
    node.destroy()
    return new


def attribute_path(v: Value, graph: Graph) -> tuple[str, ...] | None:
    """The attribute names from the method's `self` to `v` (a chain of prim::GetAttr); None if `v` is not one."""
    self_value = next(graph.inputs())
    names: list[str] = []
    while v.unique() != self_value.unique():
        node = v.node()
        if node.kind() != "prim::GetAttr":
            return None
        names.append(node.s("name"))
        v = node.inputsAt(0)
    return tuple(reversed(names))
