"""Normalize Pad: aten::pad becomes the op it dispatches to (constant_pad_nd, reflection_padNd, replication_padNd)."""
from __future__ import annotations

from torchkiln.analysis.resolve import NotStatic
from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.lowering.static_values import input_resolver
from torchkiln.lowering.walk import all_nodes, replace_node
from torchkiln.torchscript import Graph

_BY_MODE = {"reflect": "aten::reflection_pad{}d", "replicate": "aten::replication_pad{}d"}


def _constant_mode(graph: Graph) -> bool:
    changed = rewrite(graph, """
        graph(%x, %pad):
            %mode : str = prim::Constant[value="constant"]()
            %none : NoneType = prim::Constant()
            %y = aten::pad(%x, %pad, %mode, %none)
            return (%y)""", """
        graph(%x, %pad):
            %zero : float = prim::Constant[value=0.]()
            %y = aten::constant_pad_nd(%x, %pad, %zero)
            return (%y)""")
    return rewrite(graph, """
        graph(%x, %pad, %value):
            %mode : str = prim::Constant[value="constant"]()
            %y = aten::pad(%x, %pad, %mode, %value)
            return (%y)""", """
        graph(%x, %pad, %value):
            %y = aten::constant_pad_nd(%x, %pad, %value)
            return (%y)""") or changed


@lowering_pass(replaces=("aten::pad",), decomposition=True)
def normalize_pad(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::pad by constant_pad_nd, or by reflection/replication_pad{1,2,3}d chosen by len(pad).

    aten::pad takes len(pad) == 2N with an input of rank N+1 or N+2 to the N-d op, exactly the
    ranks that op accepts, and raises otherwise, as the op does. Circular padding has no public op
    and stays aten::pad; so does a pad list only known at run time (its length picks the op).
    """
    changed = _constant_mode(graph)
    resolver = input_resolver(graph, ctx.settings)
    for node in list(all_nodes(graph.block())):
        if node.kind() != "aten::pad" or node.inputsAt(2).node().kind() != "prim::Constant":
            continue
        mode = node.inputsAt(2).toIValue()
        try:
            pad = resolver.resolve(node.inputsAt(1))
        except NotStatic:
            continue
        if mode not in _BY_MODE or not isinstance(pad, list) or len(pad) not in (2, 4, 6):
            continue
        replace_node(graph, node, _BY_MODE[mode].format(len(pad) // 2), [node.inputsAt(0), node.inputsAt(1)])
        changed = True
    return changed
