"""Unroll Loops: short for-loops whose trip count is known become straight-line code.

LibTorch's UnrollLoops also unrolls loops of unknown length by 8 (keeping a loop) and
UnrollConstantLoops copies a body of any size up to 63 times; this pass unrolls a loop only when
it disappears entirely and the copies stay small: at most MAX_TRIPS iterations and MAX_NODES
nodes in all. A loop whose body writes in place (RAFT appends each iteration's flow to a list) has no other way
into an engine, since a loop layer's body is a function of its carried tensors, so it may take MAX_WRITING_NODES.
The trip count may come from constants or the compiled input shapes.
"""
from __future__ import annotations

import torch

from torchkiln.analysis.resolve import NotStatic, Resolver
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.static_values import input_resolver
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph, Node, Value, node_schema, writes_to_arguments

MAX_TRIPS = 32
MAX_NODES = 512
MAX_WRITING_NODES = 4096  # for a loop that writes in place: unrolled, or not in an engine at all


def _is_true(v: Value) -> bool:
    return v.node().kind() == "prim::Constant" and v.toIValue() is True


def _trips(loop: Node, resolver: Resolver) -> int | None:
    """The iteration count of a for-loop (no break: both conditions are constant true) small enough to unroll."""
    body = next(loop.blocks())
    if not (_is_true(loop.inputsAt(1)) and _is_true(list(body.outputs())[0])):
        return None
    try:
        trips = resolver.resolve(loop.inputsAt(0))
    except NotStatic:
        return None
    if not isinstance(trips, int) or isinstance(trips, bool):
        return None
    nodes = [n for n in all_nodes(body) if n.kind() != "prim::Constant"]
    trips = max(trips, 0)
    budget = MAX_WRITING_NODES if any(_writes(n) for n in nodes) else MAX_NODES
    return trips if trips <= MAX_TRIPS and trips * len(nodes) <= budget else None


def _writes(node: Node) -> bool:
    schema = node_schema(node)
    return schema is not None and writes_to_arguments(schema)


def _unroll(graph: Graph, loop: Node, trips: int) -> None:
    body = next(loop.blocks())
    params, results = list(body.inputs()), list(body.outputs())
    carried = list(loop.inputs())[2:]
    for i in range(trips):
        counter = graph.insertConstant(i)
        counter.node().moveBefore(loop)
        mapping = {params[0].unique(): counter}
        mapping.update((p.unique(), v) for p, v in zip(params[1:], carried))
        for node in body.nodes():
            copy = graph.createClone(node, lambda v: mapping.get(v.unique(), v))
            copy.insertBefore(loop)
            mapping.update((o.unique(), c) for o, c in zip(node.outputs(), copy.outputs()))
        carried = [mapping.get(r.unique(), r) for r in results[1:]]
    for out, value in zip(loop.outputs(), carried):
        out.replaceAllUsesWith(value)
    loop.destroy()


def _unroll_block(graph: Graph, block: torch._C.Block, resolver: Resolver) -> bool:
    changed = False
    for node in list(block.nodes()):
        for inner in node.blocks():  # inner loops first: an unrolled inner loop counts in the outer body's size
            changed |= _unroll_block(graph, inner, resolver)
        if node.kind() == "prim::Loop" and (trips := _trips(node, resolver)) is not None:
            _unroll(graph, node, trips)
            changed = True
    return changed


def unroll_static_loops(graph: Graph, resolver: Resolver) -> bool:
    """Unroll every short for-loop whose trip count `resolver` knows (partitioning calls this again after
    shape analysis, when trip counts computed from intermediate shapes are known)."""
    return _unroll_block(graph, graph.block(), resolver)


@lowering_pass()
def unroll_loops(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace a for-loop of at most MAX_TRIPS iterations (MAX_NODES nodes unrolled; MAX_WRITING_NODES where it
    writes in place) by copies of its body."""
    return unroll_static_loops(graph, input_resolver(graph, ctx.settings))
