"""Lower Tuples: tuples built and taken apart inside the method become their elements.

LibTorch's LowerAllTuples also flattens the method's tuple inputs and outputs, which would change
its signature; this pass touches only internal tuples (freezing already lowered the simple ones,
a TupleConstruct read by TupleUnpack/TupleIndex, wherever nothing came between them).
"""
from __future__ import annotations

import torch

from torchkiln.analysis.resolve import NotStatic
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.static_values import input_resolver
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph, Node

_CONSTRUCT = "prim::TupleConstruct"


def _flatten_if_output(graph: Graph, node: Node) -> bool:
    """Split the first tuple output of a prim::If that both branches build with TupleConstruct."""
    blocks = list(node.blocks())
    for i, out in enumerate(node.outputs()):
        builders = [list(b.outputs())[i].node() for b in blocks]
        if not isinstance(out.type(), torch._C.TupleType) or any(b.kind() != _CONSTRUCT for b in builders):
            continue
        elements = []
        for k, element_type in enumerate(out.type().elements()):
            for block, builder in zip(blocks, builders):
                block.registerOutput(builder.inputsAt(k))
            elements.append(node.addOutput().setType(element_type))
        rebuilt = graph.create(_CONSTRUCT, elements, 1)
        rebuilt.insertAfter(node)
        rebuilt.output().setType(out.type())
        out.replaceAllUsesWith(rebuilt.output())
        for block in blocks:
            block.returnNode().removeInput(i)
        node.eraseOutput(i)
        return True
    return False


def _fold_accesses(graph: Graph, ctx: LoweringContext) -> bool:
    """TupleUnpack / TupleIndex (static index) of a TupleConstruct read the element directly."""
    resolver = input_resolver(graph, ctx.settings)
    changed = False
    for node in list(all_nodes(graph.block())):
        source = node.inputsAt(0).node() if node.inputsSize() else None
        if source is None or source.kind() != _CONSTRUCT:
            continue
        elements = list(source.inputs())
        if node.kind() == "prim::TupleUnpack":
            for out, element in zip(node.outputs(), elements):
                out.replaceAllUsesWith(element)
        elif node.kind() == "prim::TupleIndex":
            try:
                index = resolver.resolve(node.inputsAt(1))
            except NotStatic:
                continue
            node.output().replaceAllUsesWith(elements[index])
        else:
            continue
        node.destroy()
        changed = True
    return changed


@lowering_pass()
def lower_tuples(graph: Graph, ctx: LoweringContext) -> bool:
    """Give tuple outputs of prim::If one output per element and read tuple elements where they are built."""
    return _flatten_if_outputs(graph) | _fold_accesses(graph, ctx)


def _flatten_if_outputs(graph: Graph) -> bool:
    """Flatten tuple outputs of prim::If one at a time, each time the first flattenable If in pre-order.

    Flattening an If changes only it and the Ifs around it (a branch of an enclosing If may now return a
    TupleConstruct), and no If moves, so after each one the search resumes at the outermost If around it
    rather than at the top of the graph: the same Ifs in the same order as searching the whole graph again."""
    ifs = [n for n in all_nodes(graph.block()) if n.kind() == "prim::If"]
    changed, i = False, 0
    while i < len(ifs):
        if not _flatten_if_output(graph, ifs[i]):
            i += 1
            continue
        changed = True
        outer = ifs[i].owningBlock().owningNode()
        while outer is not None:
            if outer.kind() == "prim::If":
                i = ifs.index(outer)
            outer = outer.owningBlock().owningNode()
    return changed
