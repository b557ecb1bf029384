"""Fuse AddMM Branches: the old F.linear's `if x.dim() == 2: addmm else: matmul + add` becomes one path."""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph, Node, Value


def _ops(block: torch._C.Block) -> list[Node]:
    return [n for n in block.nodes() if n.kind() != "prim::Constant"]


def _is_one(v: Value) -> bool:
    return v.node().kind() == "prim::Constant" and v.toIValue() == 1


def _same(a: Value, b: Value) -> bool:
    """The same value, or equal constants (freezing folds w.t() separately in each branch)."""
    if a == b:
        return True
    if a.node().kind() != "prim::Constant" or b.node().kind() != "prim::Constant":
        return False
    x, y = a.toIValue(), b.toIValue()
    return isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype \
        and torch.equal(x, y)


def _general_branch(node: Node) -> torch._C.Block | None:
    """The matmul + add branch, when the other branch is addmm(b, x, w) of the same b, x, w."""
    if node.outputsSize() != 1:
        return None
    blocks = list(node.blocks())
    for addmm_block, general in (blocks, blocks[::-1]):
        addmm, pair = _ops(addmm_block), _ops(general)
        if [n.kind() for n in addmm] != ["aten::addmm"] or [n.kind() for n in pair] not in (
                ["aten::matmul", "aten::add"], ["aten::matmul", "aten::add_"]):
            continue
        (fused,), (mm, add) = addmm, pair
        if list(addmm_block.outputs())[0] != fused.output() or list(general.outputs())[0] != add.output():
            continue
        b, x, w, beta, alpha = fused.inputs()
        if not (_is_one(beta) and _is_one(alpha) and _is_one(add.inputsAt(2)) and add.inputsAt(0) == mm.output()):
            continue
        if mm.inputsAt(0) == x and _same(mm.inputsAt(1), w) and _same(add.inputsAt(1), b):
            return general
    return None


@lowering_pass(replaces=("aten::addmm",))
def fuse_addmm_branches(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace the prim::If choosing addmm(b, x, w) (2-D x) or matmul(x, w) + b by its matmul + add branch.

    That branch is right for every rank; for 2-D x it is addmm's value. The condition becomes dead code.
    """
    fusable = [(n, general) for n in all_nodes(graph.block())
               if n.kind() == "prim::If" and (general := _general_branch(n)) is not None]
    for node, general in fusable:  # their branches hold no Ifs, so none is inside another
        for inner in list(general.nodes()):
            inner.moveBefore(node)
        node.output().replaceAllUsesWith(list(general.outputs())[0])
        node.destroy()
    return bool(fusable)
