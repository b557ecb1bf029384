"""Walking a TorchScript graph's nodes, nested blocks included, and replacing one node by another op."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from torchkiln.torchscript import Graph, Node, Value


def all_nodes(block: torch._C.Block) -> Iterator[Node]:
    """Every node of `block`, each followed by the nodes of its own blocks (a snapshot: safe to edit)."""
    stack = [list(block.nodes())[::-1]]
    while stack:
        pending = stack[-1]
        if not pending:
            stack.pop()
            continue
        node = pending.pop()
        yield node
        stack.extend(list(inner.nodes())[::-1] for inner in reversed(list(node.blocks())))


def replace_node(graph: Graph, node: Node, kind: str, inputs: list[Value]) -> Node:
    """Put a one-output `kind` node in `node`'s place, keeping its source location, module path and type."""
    new = graph.create(kind, inputs, 1)
    new.copyMetadata(node)
    new.insertBefore(node)
    new.output().setType(node.output().type())
    node.output().replaceAllUsesWith(new.output())
    node.destroy()
    return new
