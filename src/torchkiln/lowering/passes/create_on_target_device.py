"""Create on target device: a filled tensor made on the CPU (no device given) and moved by its one reader,
`.to(device=D)`, is made on D.

EdgeNeXt's position encoding makes `torch.zeros(shape).to(device=weight.device, dtype=torch.bool)`. Past the size
folded at build time (a batch of 32 at 32x32), the engine had to create a CPU tensor and move it, which it
cannot: the two nodes, and every layer after them, split the engine. Made on D the values are the same (zeros,
ones and constant fills are exact anywhere), and the move is a cast the engine makes.
"""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph, argument_names, node_key

_FILLS = ("aten::zeros", "aten::ones", "aten::full")  # the overloads with a `device` argument
_MOVES = ("aten::to.device", "aten::to.dtype_layout", "aten::to.prim_Device")


def _argument(node: torch._C.Node, name: str) -> torch._C.Value | None:
    names = argument_names(node)
    return node.inputsAt(names.index(name)) if name in names else None


def _constant_device(value: torch._C.Value | None) -> torch.device | None:
    if value is None or value.node().kind() != "prim::Constant":
        return None
    found = value.toIValue()
    return found if isinstance(found, torch.device) else None


def _constant_in(value: torch._C.Value | None, allowed: tuple) -> bool:
    """Whether an optional argument is absent or a constant among `allowed`."""
    return value is None or (value.node().kind() == "prim::Constant" and value.toIValue() in allowed)


@lowering_pass()
def create_on_target_device(graph: Graph, ctx: LoweringContext) -> bool:
    """Make a fill created on the CPU and moved to a constant device by its only reader on that device."""
    changed = False
    for node in list(all_nodes(graph.block())):
        if node_key(node) not in _FILLS or len(node.output().uses()) != 1:
            continue
        if not _constant_in(_argument(node, "device"), (None, torch.device("cpu"))) \
                or not _constant_in(_argument(node, "pin_memory"), (None, False)) \
                or not _constant_in(_argument(node, "layout"), (None, 0, torch.strided)):
            continue  # a pinned (or non-strided) fill is made for the host: CUDA refuses to make one pinned
        move = node.output().uses()[0].user
        target = _constant_device(_argument(move, "device")) if node_key(move) in _MOVES else None
        if target is None or target.type == "cpu":
            continue
        with graph.insert_point_guard(node):
            made_on = graph.insertConstant(target)
        node.replaceInput(argument_names(node).index("device"), made_on)  # (every fill here has one)
        changed = True
    return changed
