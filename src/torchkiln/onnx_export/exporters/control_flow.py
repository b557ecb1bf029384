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

    outer = ctx.nodes, ctx.layer, ctx._dims, len(ctx.guards)
    ctx.nodes, ctx._dims = [], {}  # a dim computed in one scope is not visible in another
    try:
        tensor_names = {id(t): name for t, name in zip(network.inputs, names)}
        for layer in network.layers:
            outs = export_layer(ctx, layer, [tensor_names[id(t)] for t in layer.inputs])
            tensor_names.update(zip(map(id, layer.outputs), outs))
        ctx.layer = outer[1]
        if len(ctx.guards) != outer[3]:
            ctx.decline(f"{network.name} holds a layer exact only for finite values, whose guard cannot leave it")
        outputs = []
        for t in network.outputs:  # an Identity each: a branch may pass an outer value through
            name = ctx.fresh(f"{ctx.layer.name}/{network.name}/{t.name}")
            ctx.nodes.append(helper.make_node("Identity", [tensor_names[id(t)]], [name], name=ctx.fresh(name)))
            outputs.append(value_info(name, t.dtype, t.shape))
        return helper.make_graph(ctx.nodes, ctx.fresh(f"{ctx.layer.name}/{network.name}"), list(graph_inputs), outputs)
    finally:
        ctx.nodes, ctx.layer, ctx._dims = outer[:3]


@exporter(L.ConditionalLayer)
def _conditional(ctx: ExportContext, layer: L.ConditionalLayer, xs: list[str]) -> list[str]:
    branches = {key: subgraph(ctx, getattr(layer, key), xs[1:], []) for key in layer.SUBNETWORKS}
    return ctx.node("If", [xs[0]], len(layer.outputs), **branches)


@exporter(L.LoopLayer)
def _loop(ctx: ExportContext, layer: L.LoopLayer, xs: list[str]) -> list[str]:
    trips = L.constant_value(layer.inputs[0])
    if trips is None or int(trips) > layer.max_trips:
        ctx.decline(f"a trip count that may pass max_trips={layer.max_trips} (the meaning's error has no ONNX form)")
    n = layer.num_carried
    iteration, condition = ctx.fresh(f"{layer.name}/iteration"), ctx.fresh(f"{layer.name}/condition")
    carried = [ctx.fresh(f"{layer.name}/carried{k}") for k in range(n)]
    graph_inputs = [value_info(iteration, torch.int64, ()), value_info(condition, torch.bool, ()),
                    *(value_info(name, t.dtype, t.shape) for name, t in zip(carried, layer.inputs[2:2 + n]))]
    body = subgraph(ctx, layer.body, [iteration, *carried, *xs[2 + n:]], graph_inputs)
    trip_count = ctx.cast(xs[0], layer.inputs[0].dtype, torch.int64)
    return ctx.node("Loop", [trip_count, xs[1], *xs[2:2 + n]], n, body=body)
