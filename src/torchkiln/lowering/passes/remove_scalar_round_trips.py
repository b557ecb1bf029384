"""Remove scalar round trips through 0-d tensors: aten::Int(prim::NumToTensor(n)) is n."""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes, replace_node
from torchkiln.torchscript import Graph

_CONVERSIONS = {"aten::Int": torch._C.IntType, "aten::Float": torch._C.FloatType, "aten::Bool": torch._C.BoolType,
                "aten::ScalarImplicit": None}


@lowering_pass()
def remove_scalar_round_trips(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace Int/Float/Bool/ScalarImplicit(prim::NumToTensor(n)) by n, or by the scalar conversion of n.

    Float(NumToTensor(an int)) becomes aten::Float(int): LibTorch's peephole would return the int itself.
    """
    changed = False
    for node in list(all_nodes(graph.block())):
        if node.kind() not in _CONVERSIONS or node.inputsAt(0).node().kind() != "prim::NumToTensor":
            continue
        number = node.inputsAt(0).node().inputsAt(0)
        wanted = _CONVERSIONS[node.kind()]
        if wanted is None or isinstance(number.type(), wanted):
            node.output().replaceAllUsesWith(number)
            node.destroy()
        else:
            replace_node(graph, node, node.kind(), [number])
        changed = True
    return changed
