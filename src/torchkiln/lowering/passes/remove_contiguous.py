"""Remove Contiguous: engine tensors have no strides, so contiguous() is the identity."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph

_NEEDS_CONTIGUOUS = ("aten::view", "aten::view_as")


@lowering_pass(replaces=("aten::contiguous",))
def remove_contiguous(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::contiguous(x, format) by x, unless x or the result is written in place.

    contiguous() may return a copy; when something mutates x or the result, dropping the copy would
    let the mutation show through the other name. view() needs contiguity: view_to_reshape runs
    first, and a contiguous() still read by a view (the user kept aten::view in PyTorch) stays.
    """
    aliases = graph.alias_db()
    removable = [n for n in all_nodes(graph.block()) if n.kind() == "aten::contiguous"
                 and not aliases.has_writers(n.inputsAt(0)) and not aliases.has_writers(n.output())
                 and not any(u.user.kind() in _NEEDS_CONTIGUOUS for u in n.output().uses())]
    for node in removable:
        node.output().replaceAllUsesWith(node.inputsAt(0))
        node.destroy()
    return bool(removable)
