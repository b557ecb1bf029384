"""View to Reshape: reshape is view where view works, and also works where remove_contiguous left a strided tensor."""
from __future__ import annotations

import torch

from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes, replace_node
from torchkiln.torchscript import Graph

_RESHAPES = {"aten::view": "aten::reshape", "aten::view_as": "aten::reshape_as"}


@lowering_pass(replaces=tuple(_RESHAPES))
def view_to_reshape(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::view(x, size) by aten::reshape(x, size) and view_as by reshape_as.

    Written over nodes, not as a pattern: view(x, dtype) has the same arity and is not a reshape.
    """
    views = [n for n in all_nodes(graph.block()) if n.kind() in _RESHAPES
             and (n.kind() == "aten::view_as" or isinstance(n.inputsAt(1).type(), torch._C.ListType))]
    for node in views:
        replace_node(graph, node, _RESHAPES[node.kind()], list(node.inputs()))
    return bool(views)
