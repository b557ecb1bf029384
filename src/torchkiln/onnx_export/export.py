"""network_to_onnx: a layer Network as a standard ONNX model; supports: whether one layer exports."""
from __future__ import annotations

import logging

import onnx
import torch
from onnx import helper

from torchkiln._version import __version__
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import has_symbols
from torchkiln.onnx_export import exporters  # noqa: F401  (registers every exporter)
from torchkiln.onnx_export.context import CONTRIB_DOMAIN, EXPORTERS, ONNX_DTYPES, ExportContext, OnnxExportError, \
    dtype_name, value_info
from torchkiln.ir.quantization import dequantized_constants
from torchkiln.onnx_export.exporters.nn import pads_into_max_pools
from torchkiln.onnx_export.exporters.quantize import integer_matrix_multiplies, unsigned_quantized

logger = logging.getLogger(__name__)

DEFAULT_OPSET = 21  # LayerNormalization, Gelu (20), GroupNormalization with per-channel affine (21)
MIN_OPSET = 21
GUARD_OUTPUT = "torchkiln/outside_exact_range"  # the guard output's name (`network_to_onnx(guard=True)`)
# ONNX's Attention op (opset 23) replaces the MatMul-Softmax-MatMul form of attention layers from there on.


def export_layer(ctx: ExportContext, layer: L.Layer, xs: list[str]) -> list[str]:
    """Append one layer's nodes (its inputs named `xs`); returns its output names."""
    ctx.layer = layer
    for t in [*layer.inputs, *layer.outputs]:
        if t.dtype not in ONNX_DTYPES:
            ctx.decline(f"tensor {t.name} has dtype {dtype_name(t.dtype)}, which has no ONNX type here")
    fn = EXPORTERS.get(type(layer))
    if fn is None:
        ctx.decline("no ONNX exporter for this layer kind")
    outs = _empty_results(ctx, layer) or fn(ctx, layer, xs)
    ctx.layer = None
    return [outs] if isinstance(outs, str) else list(outs)


def _empty_results(ctx: ExportContext, layer: L.Layer) -> list[str] | None:
    """Empty initializers for a layer whose outputs all have a static dim 0 (their only possible values), else None.
    ONNX Runtime refuses some such layers at run time (an edge Pad that leaves nothing of its input), and its
    optimizer drops an Expand to 0 before a Reshape (repeat or tile by 0). Gathers and scatters are exported as
    they are: their indices must still be checked."""
    if isinstance(layer, (L.GatherLayer, L.ScatterLayer)) or not all(
            0 in t.shape and not has_symbols(t.shape) for t in layer.outputs):
        return None
    return [ctx.constant(torch.empty(t.shape, dtype=t.dtype), "empty") for t in layer.outputs]


def network_to_onnx(network: Network, opset: int = DEFAULT_OPSET, guard: bool = False,
                    contrib_ops: bool = False, unsigned_weights: bool = False) -> onnx.ModelProto:
    """The network as an ONNX model: inputs and outputs keep the network's tensor names, weights become
    initializers. Raises OnnxExportError naming the first layer (kind, param) that has no exact ONNX form.

    Some layers' ONNX forms are exact only for finite values (`ExportContext.exact_below`: linear and cubic
    resize, grid sample). With `guard`, such a model has one more output, last: a bool [] that is true when a call
    gave them other values (a backend then computes that call otherwise).

    Layer outputs with symbolic dims get a value_info with those dims as dim_params (`s0`, `((s0-1)//2)+1`):
    ONNX's shape inference loses a dim behind a shape computed at run time (a slice to an input's length), and
    ONNX Runtime fuses an add and layer norm (SkipLayerNormalization) only where it sees both addends' shapes
    equal.

    With `contrib_ops` (the onnxruntime backend's sessions), layers ONNX Runtime runs faster as one of its own
    (`com.microsoft`) ops of the same meaning are written so: an int8 linear layer as MatMulIntegerToFloat with its
    bias (exporters/quantize.py). Without, the model is standard ONNX.

    With `unsigned_weights`, int8 weights (quantized convolution kernels, int8 constants only dequantize layers read)
    are written as uint8, value + 128 with zero point 128 (the same values): the form ONNX Runtime's integer kernels
    compute exactly on x86 CPUs without VNNI (runtime/integer_kernels.py)."""
    top = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= opset <= top:
        raise OnnxExportError(f"opset {opset}: ONNX export supports opsets {MIN_OPSET} to {top}")
    ctx = ExportContext(opset, guarded=guard)
    ctx.read_symbols(network)
    ctx.unsigned = unsigned_quantized(network) | (dequantized_constants(network) if unsigned_weights else set())
    ctx.unsigned_weights = unsigned_weights
    if contrib_ops:
        ctx.integer_matmuls, ctx.integer_inputs = integer_matrix_multiplies(network)
    ctx.folded_pads, ctx.pool_pads = pads_into_max_pools(network)
    names: dict[int, str] = {}
    inputs = []
    for t in [*network.inputs, *network.outputs]:
        ctx.used.add(t.name)
    for t in network.inputs:
        if t.dtype not in ONNX_DTYPES:
            ctx.decline(f"input {t.name} has dtype {dtype_name(t.dtype)}, which has no ONNX type here")
        names[id(t)] = t.name
        inputs.append(value_info(t.name, t.dtype, t.shape))
    shapes = []  # value_info of every layer output with symbolic dims (see network_to_onnx's docstring)
    for layer in network.layers:
        outs = export_layer(ctx, layer, [names[id(t)] for t in layer.inputs])
        for t, name in zip(layer.outputs, outs):
            names[id(t)] = name
            if has_symbols(t.shape) and not isinstance(layer, L.ConstantLayer) and id(t) not in ctx.integer_inputs \
                    and id(layer) not in ctx.folded_pads:  # (a folded padding's name is its input's)
                shapes.append(value_info(name, torch.uint8 if id(t) in ctx.unsigned else t.dtype, t.shape))
    outputs = []
    for t in network.outputs:  # each output gets the network tensor's name (ORT removes the Identity)
        name = t.name if names[id(t)] != t.name else ctx.fresh(f"{t.name}:output")  # an input passed through
        ctx.nodes.append(helper.make_node("Identity", [names[id(t)]], [name], name=ctx.fresh(f"{t.name}/output")))
        outputs.append(value_info(name, t.dtype, t.shape))
    if guard and (ctx.guards or ctx.floors):
        name = ctx.fresh(GUARD_OUTPUT)
        ctx.nodes.append(helper.make_node("Identity", [ctx.guard_flag()], [name], name=ctx.fresh(f"{name}/output")))
        outputs.append(value_info(name, torch.bool, ()))
    outputs_named = {v.name for v in outputs}
    graph = helper.make_graph(ctx.nodes, network.name, inputs, outputs, initializer=ctx.initializers,
                              value_info=[v for v in shapes if v.name not in outputs_named])
    opsets = [helper.make_opsetid("", opset)]
    contrib = [helper.make_opsetid(CONTRIB_DOMAIN, 1)] if any(n.domain == CONTRIB_DOMAIN for n in ctx.nodes) else []
    model = helper.make_model(graph, opset_imports=opsets + contrib, producer_name="torchkiln",
                              producer_version=__version__)
    # The oldest IR version the opset allows (not the onnx package's newest), so older ONNX Runtimes load it.
    model.ir_version = helper.find_min_ir_version_for(opsets)
    logger.debug("exported network %s to ONNX opset %d: %d layers, %d nodes, %d initializers", network.name,
                 opset, len(network.layers), len(ctx.nodes), len(ctx.initializers))
    return model


def supports(layer: L.Layer, opset: int = DEFAULT_OPSET) -> str | None:
    """None if `layer` exports to ONNX (at `opset`), else the reason it does not (the export's own error)."""
    ctx = ExportContext(opset)
    try:
        export_layer(ctx, layer, [ctx.fresh(f"input{i}") for i in range(len(layer.inputs))])
    except OnnxExportError as e:
        return str(e)
    return None
