"""Functionalize size arithmetic: an in-place add, sub, mul, floor division or remainder on a 0-d tensor made from
a size (a trace's `B *= 4`, where `B = x.shape[0]` was recorded as `prim::NumToTensor`) becomes its functional
form when nothing reads the old value after it.

LibTorch's RemoveTensorMutation rewrites the first op of such a chain only (Hiera's `B *= prod(strides)` in a
loop, traced: `mul_` twice on one tensor, with `int(B)` read between them). The value stayed "modified in place",
so build-time evaluation could not fold `int(B)`, and every reshape to it split the engine. These ops on integer
tensors keep the dtype either way (an in-place op that would change it raises in eager PyTorch).
"""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph

_ARITHMETIC = ("aten::add", "aten::sub", "aten::mul", "aten::floor_divide", "aten::remainder")
_READS = ("aten::Int", "aten::ScalarImplicit", "aten::IntImplicit", "aten::item", *_ARITHMETIC)


def _size_tensor(v: torch._C.Value) -> bool:
    """A 0-d tensor a trace made from sizes: NumToTensor, an integer constant, or their functional arithmetic."""
    node = v.node()
    if node.kind() == "prim::NumToTensor":
        return node.inputsAt(0).type().kind() == "IntType"
    if node.kind() == "prim::Constant":
        if not node.hasAttribute("value") or node.kindOf("value") != "t":
            return False
        value = node.t("value")
        return value.dim() == 0 and not value.is_floating_point() and not value.is_complex()
    return node.kind() in _ARITHMETIC and all(_size_tensor(i) or i.type().kind() == "IntType"
                                               for i in list(node.inputs())[:2])


@lowering_pass()
def functionalize_size_arithmetic(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace in-place arithmetic on size tensors by its functional form where the old value is not read after."""
    changed = False
    for node in list(all_nodes(graph.block())):
        op = node.kind()[:-1]
        if not node.kind().endswith("_") or op not in _ARITHMETIC:
            continue
        target, other = node.inputsAt(0), node.inputsAt(1)
        if not _size_tensor(target) or not (_size_tensor(other) or other.type().kind() == "IntType"):
            continue
        uses = [u.user for u in target.uses() if u.user is not node]
        if any(not u.isBefore(node) or u.kind() not in _READS for u in uses):
            continue
        with graph.insert_point_guard(node):
            functional = graph.insert(op, list(node.inputs()))
        node.output().replaceAllUsesWith(functional)
        node.destroy()
        changed = True
    return changed
