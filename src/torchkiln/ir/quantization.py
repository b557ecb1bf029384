"""What passes and exporters ask of quantize and dequantize layers and the layers between them."""
from __future__ import annotations

from collections.abc import Mapping

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network


def order_preserving(layer: L.Layer) -> bool:
    """Whether the layer's output is values of its first input, moved, selected or the largest of a window (a max
    pooling): it commutes with a per-tensor quantizer, which is monotonic and non-decreasing, exactly."""
    return isinstance(layer, (L.ShuffleLayer, L.SliceLayer)) or \
        isinstance(layer, L.PoolingLayer) and layer.type == L.PoolingType.MAX


def per_tensor_int8(layer: L.Layer) -> bool:
    """Whether a quantize or dequantize layer is int8, per tensor, of int8's full range, to or from float32."""
    return isinstance(layer, (L.QuantizeLayer, L.DequantizeLayer)) and layer.quant_type == torch.int8 \
        and layer.axis is None and (not isinstance(layer, L.QuantizeLayer)
                                    or (layer.quant_min, layer.quant_max) == L.QUANT_RANGE[torch.int8]) \
        and (layer.to_type if isinstance(layer, L.DequantizeLayer) else layer.inputs[0].dtype) == torch.float32


def clamps_at_zero(layer: L.Layer | None) -> bool:
    """Whether the layer is a ReLU or a clamp from 0 (ReLU6, hardtanh(0, max)): its output lies in [0, max], which a
    quantizer of range [0, amax] holds, so quantizing after it loses none of that range."""
    return isinstance(layer, L.ActivationLayer) and (
        layer.type == L.ActivationType.RELU
        or layer.type in (L.ActivationType.CLIP, L.ActivationType.HARD_TANH) and layer.alpha == 0 and layer.beta > 0)


def as_uint8(value: torch.Tensor) -> torch.Tensor:
    """int8 values (or zero points) as uint8, moved by 128: with the zero point moved too, the same real values."""
    return (value.to(torch.int16) + 128).to(torch.uint8)


def dequantized_constants(network: Network) -> set[int]:
    """The int8 constants (output ids) that only dequantize layers read and that are not network outputs: weights
    whose stored integer type no layer sees (an export may write them as uint8, value + 128)."""
    readers, outputs = network.consumers(), {id(t) for t in network.outputs}
    return {id(layer.outputs[0]) for layer in network.layers
            if isinstance(layer, L.ConstantLayer) and layer.outputs[0].dtype == torch.int8
            and id(layer.outputs[0]) not in outputs and readers.get(id(layer.outputs[0]))
            and all(isinstance(r, L.DequantizeLayer) for r in readers[id(layer.outputs[0])])}


def kernel_values(layer: L.ConvolutionLayer, weights: Mapping[str, torch.Tensor] | None = None) -> torch.Tensor:
    """A quantized convolution's kernel as values of its kernel type (its stored float32 values divided by each output
    channel's scale, rounded to the type), from `weights` (the layer's own, or a copy of them on a device)."""
    weights = layer.weights if weights is None else weights
    kernel, scale = weights["kernel"], weights["kernel_scale"]
    shaped = scale.reshape([-1] + [1] * (kernel.dim() - 1)).to(kernel.device)
    lo, hi = L.QUANT_RANGE[layer.kernel_type]
    q = torch.round(kernel / shaped).clamp(lo, hi) if layer.kernel_type == torch.int8 else \
        (kernel / shaped).clamp(lo, hi)
    return q.to(layer.kernel_type)


def zero_point(layer: L.Layer) -> int:
    """A per-tensor quantize's or dequantize's zero point (0 without one)."""
    zero = layer.weights.get("zero_point")
    return 0 if zero is None else int(zero.reshape(()).float())


def same_grid(q: L.QuantizeLayer, dq: L.Layer | None) -> bool:
    """Whether `q` quantizes per tensor by dequantize `dq`'s one scale and zero point, to its type, over the type's
    whole range: what `q` reads, once dequantized by `dq` (and moved, selected or max-pooled: `order_preserving`),
    it maps back exactly."""
    if not isinstance(dq, L.DequantizeLayer) or dq.quant_type != q.quant_type or q.axis is not None \
            or dq.axis is not None:
        return False
    if q.quant_type == torch.int8 and (q.quant_min, q.quant_max) != L.QUANT_RANGE[torch.int8]:
        return False
    if any(w.numel() != 1 for layer in (q, dq) for name, w in layer.weights.items() if name in ("scale", "zero_point")):
        return False
    return torch.equal(q.weights["scale"].reshape(()), dq.weights["scale"].reshape(())) \
        and zero_point(q) == zero_point(dq)

