"""Quantize convolutions and matrix multiplies by weight (TensorRT's explicit quantization): a quantize-dequantize
pair on the activation input (one scale, from calibration), the weights quantized per output channel (a
convolution's kernel with `kernel_scale`, a matrix multiply's constant operand as an int8/fp8 constant read through
a dequantize layer). Backends match dequantize -> convolution / matrix multiply and run it in integer or fp8.

Which layers, and their activation ranges, come from calibration (`builder/quantization.py`) as
`BuildSettings.quantization`; without it the pass does nothing."""
from __future__ import annotations

import dataclasses
from collections.abc import Container

import torch

from torchkiln.builder.ranges import UNSIGNED_ZERO, channel_amax, scale_of
from torchkiln.builder.settings import BuildSettings, QuantizationPlan
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.quantization import clamps_at_zero, order_preserving, per_tensor_int8
from torchkiln.ir.reference import dequantize, quantize


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A layer the pass can quantize: which input is the activation, and its weight and output-channel axis."""

    activation: int
    weight: torch.Tensor
    axis: int


def candidate(layer: L.Layer) -> Candidate | None:
    """A float32 convolution (not transposed) or a matrix multiply of an activation by a constant 2-d weight, whose
    activation the graph does not quantize itself (a QAT model's fake quantization keeps its own scales)."""
    if not isinstance(layer, (L.ConvolutionLayer, L.MatrixMultiplyLayer)) \
            or isinstance(layer.inputs[0].producer, L.DequantizeLayer):
        return None
    if isinstance(layer, L.ConvolutionLayer):
        kernel = layer.weights["kernel"]
        if layer.transposed or layer.kernel_type is not None or kernel.dtype != torch.float32 \
                or layer.inputs[0].dtype != torch.float32:
            return None
        return Candidate(0, kernel, 0)
    if isinstance(layer, L.MatrixMultiplyLayer) and layer.op0 == L.MatrixOperation.NONE:
        weight = layer.inputs[1].producer
        if not isinstance(weight, L.ConstantLayer) or layer.inputs[0].dtype != torch.float32:
            return None
        value = weight.weights["value"]
        if value.dim() != 2 or value.dtype != torch.float32:
            return None
        return Candidate(0, value, 0 if layer.op1 == L.MatrixOperation.TRANSPOSE else 1)
    return None


def quantizes_output(found: Candidate) -> bool:
    """Whether calibration also quantizes the layer's output: a convolution's (its weight axis is the kernel's)."""
    return found.weight.dim() > 2


def quantized_relus(network: Network, candidates: Container[str], quant_type: torch.dtype) -> dict[str, L.Layer]:
    """The int8 convolutions (by name) whose output quantizer goes after the ReLU (or ReLU6, or clamp from 0:
    `clamps_at_zero`) that alone reads their output, as ONNX Runtime's quantizer places it (the ReLU then disappears
    into QLinearConv): wherever the ReLU's output is not a network output, whoever reads it (a quantized layer reads
    it through that quantizer; a max pooling passes its scale on: `quantize_through_order_preserving`). Its range is
    [0, amax] (zero point `UNSIGNED_ZERO`)."""
    if quant_type != torch.int8:
        return {}
    readers = network.consumers()
    outputs = {id(t) for t in network.outputs}
    found = {}
    for layer in network.layers:
        if not isinstance(layer, L.ConvolutionLayer) or layer.name not in candidates \
                or layer.outputs[0].dtype != torch.float32 or id(layer.outputs[0]) in outputs:
            continue
        relu = readers.get(id(layer.outputs[0]), [])
        if len(relu) == 1 and clamps_at_zero(relu[0]) and id(relu[0].outputs[0]) not in outputs:
            found[layer.name] = relu[0]
    return found


def quantize_weight(weight: torch.Tensor, axis: int, quant_type: torch.dtype,
                    weight_max: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight quantized per slice along `axis` (symmetric, by each slice's largest |value|, to
    [-weight_max, weight_max] where given for int8), and the scales."""
    scale = scale_of(channel_amax(weight, axis), quant_type, top=weight_max if quant_type == torch.int8 else None)
    shaped = scale.reshape([-1 if d == axis % weight.dim() else 1 for d in range(weight.dim())])
    return quantize(weight, shaped, None, quant_type), scale


def _quantize_output(network: Network, layer: L.Layer, scale: float, quant_type: torch.dtype,
                     zero: int | None = None) -> None:
    """Every reader of the layer's output (and the network's outputs) reads it through a quantizer."""
    out = layer.outputs[0]
    before = len(network.layers)
    fake = network.add_fake_quantize(out, torch.tensor([scale]), None if zero is None else torch.tensor([zero]),
                                     quant_type, divide=True)
    made = network.layers[before:]
    network.replace_all_uses(out, fake)
    made[0].inputs = [out]  # the quantizer itself reads the layer's output
    after = network.layers.index(layer) + 1
    for k, m in enumerate(made):
        network.layers.remove(m)
        network.layers.insert(after + k, m)


def _quantizer_of(t, readers: dict[int, list[L.Layer]]) -> L.QuantizeLayer | None:
    """The int8 per-tensor quantizer that reads `t` (the one a quantized layer reading `t` made), if any."""
    return next((r for r in readers.get(id(t), []) if isinstance(r, L.QuantizeLayer) and r.quant_type == torch.int8
                 and r.axis is None and (r.quant_min, r.quant_max) == L.QUANT_RANGE[torch.int8]), None)


def quantize_residual_adds(network: Network) -> bool:
    """A sum of two int8-quantized values followed by a ReLU (a residual block's end) reads both addends
    dequantized, and the symmetric quantizer through which a quantized layer reads the ReLU's output becomes one of
    range [0, amax] (the same amax): ONNX Runtime then runs the add as QLinearAdd with the ReLU dropped, in uint8
    between QLinearConvs. An addend the graph does not dequantize is read through a new dequantizer of its
    quantizer (a residual's identity is the input of the block's first convolution, quantized for it; so the
    ReLU before has no float reader left)."""
    readers = network.consumers()
    changed = False
    for add in list(network.layers):
        if not isinstance(add, L.ElementWiseLayer) or add.op != L.ElementWiseOperation.SUM \
                or add.outputs[0].dtype != torch.float32:
            continue
        after = readers.get(id(add.outputs[0]), [])
        if len(after) != 1 or not isinstance(after[0], L.ActivationLayer) or after[0].type != L.ActivationType.RELU:
            continue
        out_q = _quantizer_of(after[0].outputs[0], readers)
        sources = [t.producer if isinstance(t.producer, L.DequantizeLayer) else _quantizer_of(t, readers)
                   for t in add.inputs]
        if any(s is None or s.quant_type != torch.int8 for s in sources):
            continue
        for k, (t, source) in enumerate(zip(add.inputs, sources)):
            if isinstance(source, L.QuantizeLayer):
                dq = network.add_layer(L.DequantizeLayer, source.outputs, weights=dict(source.weights),
                                       quant_type=torch.int8, to_type=t.dtype)
                network.move_before(dq, add)
                add.inputs[k] = dq.outputs[0]
        if out_q is not None and out_q.weights.get("zero_point") is None:
            unsigned = {"scale": out_q.weights["scale"] * (L.QUANT_RANGE[torch.int8][1] / 255),
                        "zero_point": torch.tensor([UNSIGNED_ZERO], dtype=torch.int8)}
            for layer in [out_q, *readers.get(id(out_q.outputs[0]), [])]:
                layer.weights = {**layer.weights, **unsigned}
        readers = network.consumers()
        changed = True
    return changed


def quantize_through_order_preserving(network: Network) -> bool:
    """A max pooling, shuffle or slice of a dequantized int8 value, whose output a quantized layer reads through an
    int8 quantizer, gives that quantizer (and its dequantizers) the dequantizer's scale and zero point: `dequantize
    -> layer -> quantize` of one scale and zero point is the layer on the quantized values, exactly (its values are
    the grid's, which the quantizer maps back), and ONNX Runtime runs it so (a uint8 MaxPool between QLinearConvs,
    in their layout). In order, so that a chain of them passes the scale along."""
    readers = network.consumers()
    changed = False
    for layer in network.layers:
        dq = layer.inputs[0].producer if layer.inputs else None
        if not order_preserving(layer) or not per_tensor_int8(dq) or layer.outputs[0].dtype != torch.float32:
            continue
        q = _quantizer_of(layer.outputs[0], readers)
        if q is None or not per_tensor_int8(q):
            continue
        params = {"scale": dq.weights["scale"]} | \
            ({"zero_point": dq.weights["zero_point"]} if "zero_point" in dq.weights else {})
        for made in [q, *(r for r in readers.get(id(q.outputs[0]), []) if isinstance(r, L.DequantizeLayer))]:
            made.weights = {k: w for k, w in made.weights.items() if k not in ("scale", "zero_point")} | params
        changed = True
    return changed


def mark_explicit_kernels(network: Network) -> bool:
    """A QAT graph's convolution reads a dequantized int8 value and has a kernel its lowering already fake-quantized
    (per output channel, symmetric: scale = largest |value| / 127). Where the kernel is exactly on that grid, it is
    marked quantized (kernel_scale, kernel_type) so backends run it in int8; its values, and so its meaning, are
    unchanged."""
    changed = False
    for layer in network.layers:
        if not isinstance(layer, L.ConvolutionLayer) or layer.kernel_type is not None or layer.transposed \
                or layer.weights["kernel"].dtype != torch.float32:
            continue
        producer = layer.inputs[0].producer
        if not isinstance(producer, L.DequantizeLayer) or producer.quant_type != torch.int8:
            continue
        kernel = layer.weights["kernel"]
        q, scale = quantize_weight(kernel, 0, torch.int8)
        if bool((channel_amax(kernel, 0) > 0).all()) and \
                torch.equal(dequantize(q, scale.reshape([-1] + [1] * (kernel.dim() - 1)), None), kernel):
            layer.weights = {**layer.weights, "kernel_scale": scale}
            layer.kernel_type = torch.int8
            changed = True
    return changed


def quantize_layers(network: Network, settings: BuildSettings) -> bool:
    plan: QuantizationPlan | None = settings.quantization
    if plan is None:
        return mark_explicit_kernels(network)
    amax, output_amax = dict(plan.activation_amax), dict(plan.output_amax)
    # (activation tensor, amax) -> its quantize layer: readers of one activation share it, and each has its own
    # dequantize layer (ONNX Runtime fuses a DequantizeLinear into QLinearConv only where the convolution alone
    # reads it; so does the CUDA planner)
    shared: dict[tuple[int, float], L.Layer] = {}
    found_at = {layer.name: found for layer in network.layers if (found := candidate(layer)) is not None}
    relus = quantized_relus(network, found_at, plan.quant_type)
    claimed: set[int] = set()
    changed = False
    for layer in list(network.layers):
        found = found_at.get(layer.name) if layer.name in amax else None
        if found is None:
            continue
        x = layer.inputs[found.activation]
        key = (id(x), amax[layer.name])
        before = len(network.layers)
        if isinstance(x.producer, L.DequantizeLayer) and id(x) not in claimed:  # a quantized ReLU's (first reader)
            dq = x.producer
            claimed.add(id(x))
        elif isinstance(x.producer, L.DequantizeLayer):  # (and its other readers: each its own dequantizer)
            q = x.producer.inputs[0].producer
            dq = network.add_layer(L.DequantizeLayer, q.outputs, weights=dict(q.weights), axis=q.axis,
                                   quant_type=q.quant_type, to_type=x.dtype)
        elif key not in shared:
            dq = network.add_fake_quantize(x, torch.tensor([scale_of(amax[layer.name], plan.quant_type)]),
                                           None, plan.quant_type, divide=True).producer
            shared[key] = dq.inputs[0].producer
        else:
            q = shared[key]
            dq = network.add_layer(L.DequantizeLayer, q.outputs, weights=dict(q.weights), axis=q.axis,
                                   quant_type=q.quant_type, to_type=x.dtype)
        for made in network.layers[before:]:
            network.move_before(made, layer)
        layer.inputs[found.activation] = dq.outputs[0]
        q, scale = quantize_weight(found.weight, found.axis, plan.quant_type, plan.weight_max)
        if isinstance(layer, L.ConvolutionLayer):
            shaped = scale.reshape([-1] + [1] * (q.dim() - 1))
            layer.weights = {**layer.weights, "kernel": dequantize(q, shaped, None), "kernel_scale": scale}
            layer.kernel_type = plan.quant_type
        else:
            before = len(network.layers)
            constant = network.add_constant(q).get_output()
            weights = {"scale": scale}
            dq = network.add_layer(L.DequantizeLayer, [constant], weights=weights, axis=found.axis,
                                   quant_type=plan.quant_type)
            for made in network.layers[before:]:
                network.move_before(made, layer)
            layer.inputs[1] = dq.get_output()
        if layer.name in relus and layer.name in output_amax:
            _quantize_output(network, relus[layer.name], scale_of(output_amax[layer.name], plan.quant_type, True),
                             plan.quant_type, UNSIGNED_ZERO)
        elif layer.name in output_amax:
            _quantize_output(network, layer, scale_of(output_amax[layer.name], plan.quant_type), plan.quant_type)
        changed = True
    if plan.quant_type == torch.int8:
        changed = quantize_residual_adds(network) or changed
        changed = quantize_through_order_preserving(network) or changed
    return mark_explicit_kernels(network) or changed
