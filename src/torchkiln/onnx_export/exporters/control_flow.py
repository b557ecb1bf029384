"""Conditional and loop layers as ONNX's If and Loop, each sub-network a subgraph that reads the outer graph's
values by name."""
from __future__ import annotations

from collections.abc import Sequence

import onnx
import torch
from onnx import helper

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.onnx_export.context import ExportContext, exporter, value_info


def subgraph(ctx: ExportContext, network: Network, names: Sequence[str],
             graph_inputs: Sequence[onnx.ValueInfoProto]) -> onnx.GraphProto:
    """`network` as a subgraph whose inputs are read from `names` (the subgraph's own inputs or outer values)."""
    from torchkiln.onnx_export.export import export_layer

    owner, guards = ctx.layer, len(ctx.guards) + len(ctx.floors)
    with ctx.subgraph_scope() as nodes:
        tensor_names = {id(t): name for t, name in zip(network.inputs, names)}
        for layer in network.layers:
            outs = export_layer(ctx, layer, [tensor_names[id(t)] for t in layer.inputs])
            tensor_names.update(zip(map(id, layer.outputs), outs))
        ctx.layer = owner
        if len(ctx.guards) + len(ctx.floors) != guards:
            ctx.decline(f"{network.name} holds a layer exact only for finite values, whose guard cannot leave it")
        outputs = []
        for t in network.outputs:  # an Identity each: a branch may pass an outer value through
            name = ctx.fresh(f"{owner.name}/{network.name}/{t.name}")
            nodes.append(helper.make_node("Identity", [tensor_names[id(t)]], [name], name=ctx.fresh(name)))
            outputs.append(value_info(name, t.dtype, t.shape))
        return helper.make_graph(nodes, ctx.fresh(f"{owner.name}/{network.name}"), list(graph_inputs), outputs)


@exporter(L.ConditionalLayer)
def _conditional(ctx: ExportContext, layer: L.ConditionalLayer, xs: list[str]) -> list[str]:
    branches = {key: subgraph(ctx, getattr(layer, key), xs[1:], []) for key in layer.SUBNETWORKS}
    return ctx.node("If", [xs[0]], len(layer.outputs), **branches)


@exporter(L.LoopLayer)
def _loop(ctx: ExportContext, layer: L.LoopLayer, xs: list[str]) -> list[str]:
    """ONNX's Loop. Where the trip count may pass max_trips, the loop runs at most max_trips times, carrying its
    iteration count and last condition besides, and the call is flagged (`exact_below`: the backend then computes
    it on the reference, whose meaning raises) where it stopped at max_trips with more iterations to go."""
    n = layer.num_carried
    iteration, condition = ctx.fresh(f"{layer.name}/iteration"), ctx.fresh(f"{layer.name}/condition")
    carried = [ctx.fresh(f"{layer.name}/carried{k}") for k in range(n)]
    graph_inputs = [value_info(iteration, torch.int64, ()), value_info(condition, torch.bool, ()),
                    *(value_info(name, t.dtype, t.shape) for name, t in zip(carried, layer.inputs[2:2 + n]))]
    body = subgraph(ctx, layer.body, [iteration, *carried, *xs[2 + n:]], graph_inputs)
    trip_count = ctx.cast(xs[0], layer.inputs[0].dtype, torch.int64)
    trips = L.constant_value(layer.inputs[0])
    if trips is not None and int(trips) <= layer.max_trips:
        return ctx.node("Loop", [trip_count, xs[1], *xs[2:2 + n]], n, body=body)
    limit = ctx.constant(torch.tensor(layer.max_trips), "max_trips")
    count, last = ctx.fresh(f"{layer.name}/count"), ctx.fresh(f"{layer.name}/last_condition")
    one = ctx.constant(torch.tensor(1), "one")
    count_out, last_out = ctx.fresh(f"{count}:next"), ctx.fresh(f"{last}:next")
    body.input.extend([value_info(count, torch.int64, ()), value_info(last, torch.bool, ())])
    body.node.extend([helper.make_node("Add", [iteration, one], [count_out], name=ctx.fresh(count_out)),
                      helper.make_node("Identity", [body.output[0].name], [last_out], name=ctx.fresh(last_out))])
    body.output.extend([value_info(count_out, torch.int64, ()), value_info(last_out, torch.bool, ())])
    bounded = ctx.node("Min", [trip_count, limit])[0]
    outs = ctx.node("Loop", [bounded, xs[1], *xs[2:2 + n], ctx.constant(torch.tensor(0), "count"), xs[1]], n + 2,
                    body=body)
    more = ctx.node("And", [ctx.node("Equal", [outs[n], limit])[0], ctx.node("Greater", [trip_count, limit])[0]])[0]
    stopped = ctx.node("Cast", [ctx.node("And", [outs[n + 1], more])[0]], to=onnx.TensorProto.FLOAT)[0]
    ctx.exact_below(stopped, torch.float32, (), 0.5)
    return outs[:n]
