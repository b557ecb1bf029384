"""Walking a TorchScript graph's nodes, nested blocks included."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from torchkiln.torchscript import Node


def all_nodes(block: torch._C.Block) -> Iterator[Node]:
    """Every node of `block`, each followed by the nodes of its own blocks (a snapshot: safe to edit)."""
    for node in list(block.nodes()):
        yield node
        for inner in node.blocks():
            yield from all_nodes(inner)
