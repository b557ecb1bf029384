"""Quantize and dequantize layers as ONNX's QuantizeLinear / DequantizeLinear, and a convolution's quantized kernel
as an int8 (or fp8) initializer read through DequantizeLinear: the QDQ form ONNX Runtime fuses into QLinearConv and
QLinearMatMul (DequantizeLinear -> Conv/MatMul -> QuantizeLinear).

An int8 activation that only dequantize layers read is written as uint8 with its zero point moved by 128 (the same
values): ONNX Runtime's x86 kernels (MLAS) take uint8 activations with int8 weights, and its own int8-to-uint8
rewrite skips a QuantizeLinear that several DequantizeLinear read (one activation quantized for several
convolutions or matrix multiplies), which then stay float.

For ONNX Runtime's own sessions (`network_to_onnx(contrib_ops=True)`), an int8 matrix multiply with a bias, of a
per-tensor quantized activation by a constant weight quantized per output column, is ONNX Runtime's
`com.microsoft.MatMulIntegerToFloat` with the bias as its last input: what ORT's QDQ fusion makes of
DequantizeLinear -> MatMul, but with the bias added in the kernel's output loop (ORT fuses no Add after it: 24
float Adds were 6% of a BERT-style encoder's int8 time at batch 8). Its dequantize layers then write no
DequantizeLinear: the integer values pass through to it."""
from __future__ import annotations

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.quantization import (as_uint8, clamps_at_zero, kernel_values, order_preserving, per_tensor_int8,
                                        same_grid, zero_point)
from torchkiln.ir.tensor import Tensor
from torchkiln.onnx_export.context import CONTRIB_DOMAIN, ExportContext, exporter


def unsigned_quantized(network: Network) -> set[int]:
    """The int8 outputs (ids) of per-tensor quantize layers of int8's full range that only dequantize layers read
    and that are not network outputs: these are exported as uint8."""
    found = {id(layer.outputs[0]) for layer in network.layers
             if isinstance(layer, L.QuantizeLayer) and layer.quant_type == torch.int8 and layer.axis is None
             and (layer.quant_min, layer.quant_max) == L.QUANT_RANGE[torch.int8]}
    found -= {id(t) for t in network.outputs}
    found -= {id(t) for layer in network.layers if not isinstance(layer, L.DequantizeLayer) for t in layer.inputs}
    return found


def _integer_operands(layer: L.Layer, readers: dict[int, int], outputs: set[int]) -> bool:
    """Whether a matrix multiply is one `integer_matrix_multiplies` takes (module docstring): float32, with a bias,
    reading a per-tensor int8 activation (rank 2 or more) and a 2-d int8 constant quantized per output column, each
    through a dequantize layer that only it reads."""
    if not isinstance(layer, L.MatrixMultiplyLayer) or layer.op0 != L.MatrixOperation.NONE \
            or "bias" not in layer.weights or layer.outputs[0].dtype != torch.float32 or layer.inputs[0].rank < 2:
        return False
    a, b = (t.producer for t in layer.inputs)
    column = 0 if layer.op1 == L.MatrixOperation.TRANSPOSE else 1
    return all(isinstance(dq, L.DequantizeLayer) and dq.quant_type == torch.int8 and dq.to_type == torch.float32
               and readers.get(id(dq.outputs[0])) == 1 and id(dq.outputs[0]) not in outputs for dq in (a, b)) \
        and a.axis is None and b.axis in (None, column) and isinstance(b.inputs[0].producer, L.ConstantLayer) \
        and b.inputs[0].rank == 2 and layer.weights["bias"].numel() == b.inputs[0].shape[column]


def integer_matrix_multiplies(network: Network) -> tuple[set[int], set[int]]:
    """The matrix multiplies (ids) exported as MatMulIntegerToFloat with their bias (module docstring), and the
    outputs (ids) of the dequantize layers they read, which pass their integer input through."""
    readers: dict[int, int] = {}
    for layer in network.layers:
        for t in layer.inputs:
            readers[id(t)] = readers.get(id(t), 0) + 1
    outputs = {id(t) for t in network.outputs}
    found = [layer for layer in network.layers if _integer_operands(layer, readers, outputs)]
    return {id(layer) for layer in found}, {id(t) for layer in found for t in layer.inputs}


def integer_matrix_multiply(ctx: ExportContext, layer: L.MatrixMultiplyLayer, xs: list[str]) -> str:
    """com.microsoft.MatMulIntegerToFloat(a, b, a scale, b scale, a zero point, b zero point, bias): `xs` are the
    integer operands (their dequantize layers passed them through), b [K, N] (transposed where the layer reads
    [N, K]: a Transpose of a constant, which ORT folds when the session is made)."""
    a, b = (t.producer for t in layer.inputs)
    (a_scale, a_zero), (b_scale, b_zero) = (_scale_and_zero(ctx, dq, unsigned=id(dq.inputs[0]) in ctx.unsigned)
                                            for dq in (a, b))
    q = xs[1] if layer.op1 != L.MatrixOperation.TRANSPOSE else ctx.node("Transpose", [xs[1]], perm=[1, 0])[0]
    bias = ctx.constant(layer.weights["bias"].to(torch.float32).reshape(-1), "bias")
    return ctx.node("MatMulIntegerToFloat", [xs[0], q, a_scale, b_scale, a_zero, b_zero, bias],
                    domain=CONTRIB_DOMAIN)[0]


def _scale_and_zero(ctx: ExportContext, layer: L.QuantizeLayer | L.DequantizeLayer, unit: bool = False,
                    unsigned: bool = False) -> list[str]:
    """The scale (a scalar per tensor; ones where `unit`) and the zero point (zero where the layer has none: its type
    is the output's; uint8, moved by 128, where `unsigned`)."""
    scale = layer.weights["scale"]
    scale = torch.ones_like(scale) if unit else scale
    zero = layer.weights.get("zero_point", torch.zeros(scale.shape, dtype=torch.int8)).to(layer.quant_type)
    if unsigned:
        zero = as_uint8(zero)
    if layer.axis is None:
        scale, zero = scale.reshape(()), zero.reshape(())
    return [ctx.constant(scale, "scale"), ctx.constant(zero, "zero_point")]


def _axis(layer: L.QuantizeLayer | L.DequantizeLayer) -> dict[str, int]:
    return {} if layer.axis is None else {"axis": layer.axis}


_FUSED_INTO = (L.ConvolutionLayer, L.MatrixMultiplyLayer)


def _fused(ctx: ExportContext, layer: L.QuantizeLayer) -> bool:
    """Whether ORT fuses the QuantizeLinear into the QLinearConv / QLinearMatMul / QLinearAdd before it, or drops it
    with the DequantizeLinear before a max pooling or reshape: after a convolution or matrix multiply; after a ReLU
    (or a clamp from 0 up to at least the quantizer's top, which ORT drops too) of a convolution or sum where the
    zero point is int8's lowest value (the range [0, amax] builder/passes/quantize.py gives it: ORT then drops the
    ReLU, exactly; it would drop it for an fp8 zero point too, wrongly); or after an order-preserving layer of a
    value dequantized by the same scale and zero point (`_same_grid`: exact then)."""
    producer = layer.inputs[0].producer
    if clamps_at_zero(producer) and layer.quant_type == torch.int8 and layer.axis is None \
            and layer.weights.get("zero_point") is not None and zero_point(layer) == L.QUANT_RANGE[torch.int8][0]:
        top = float(layer.weights["scale"].reshape(()).float() * 255)  # in float32, as ORT's ClipQuantFusion
        if producer.type != L.ActivationType.RELU and producer.beta < top - torch.finfo(torch.float32).eps:
            return False  # ORT keeps a Clip that cuts below the quantizer's top, and converts around it
        producer = producer.inputs[0].producer
        return isinstance(producer, L.ConvolutionLayer) or \
            isinstance(producer, L.ElementWiseLayer) and producer.op == L.ElementWiseOperation.SUM
    if order_preserving(producer) and _same_grid(layer, producer.inputs[0].producer):
        return True
    return isinstance(producer, _FUSED_INTO) and id(producer) not in ctx.integer_matmuls


def _same_grid(q: L.QuantizeLayer, dq: L.Layer | None) -> bool:
    """Whether `q` quantizes by `dq`'s scale and zero point (both int8 per tensor): what `q` reads, once dequantized
    by `dq`, it maps back exactly, and ONNX Runtime drops the pair around a max pooling or reshape between them."""
    return per_tensor_int8(q) and per_tensor_int8(dq) and same_grid(q, dq)


def _scale_in_quantize(ctx: ExportContext, layer: L.QuantizeLayer) -> bool:
    """Whether QuantizeLinear takes the layer's scale, with no Mul or Div before it: where ONNX Runtime fuses it
    (`_fused`), and for an int8 quantizer that divides (`divide`: QuantizeLinear's own arithmetic) where ORT can
    change nothing before it. ORT moves a QuantizeLinear back through moves (its QDQ propagation: `_source`), drops
    a Relu or Clip before one (ReluQuantFusion, ClipQuantFusion: exact only where `_fused` says so), and fuses
    DequantizeLinear -> op -> QuantizeLinear into an integer op that requantizes (QLinearAdd, QLinearAveragePool...),
    so not after a ReLU or clip, nor after a layer reading a dequantized value. An fp8 one never: ORT drops a Relu
    before any fp8 QuantizeLinear."""
    if _fused(ctx, layer):
        return True
    if not layer.divide or layer.quant_type != torch.int8:
        return False
    source = _source(layer.inputs[0])
    if source is None:  # a network input
        return True
    dropped = isinstance(source, L.ActivationLayer) and source.type in _EXPORTED_AS_RELU_OR_CLIP
    return not dropped and not isinstance(source, L.DequantizeLayer) \
        and not any(isinstance(_source(t), L.DequantizeLayer) for t in source.inputs)


_EXPORTED_AS_RELU_OR_CLIP = (L.ActivationType.RELU, L.ActivationType.CLIP, L.ActivationType.HARD_TANH)


def _source(t: Tensor) -> L.Layer | None:
    """The layer whose values `t` holds, moved or selected (`order_preserving` layers walked back)."""
    source = t.producer
    while order_preserving(source):
        source = source.inputs[0].producer
    return source


@exporter(L.QuantizeLayer)
def _quantize(ctx: ExportContext, layer: L.QuantizeLayer, xs: list[str]) -> str:
    """QuantizeLinear divides by the scale: exactly a quantizer that divides (`divide`: those calibration places).
    Torch's fake quantization (a QAT graph's) multiplies by the float32 reciprocal instead; the two differ on values
    a last bit from a half step. So x is multiplied by the reciprocal first (divided by the scale where `divide`)
    and quantized with scale 1, which is exact; except where the scale goes in QuantizeLinear (`_scale_in_quantize`):
    where ONNX Runtime fuses it (`_fused`: DequantizeLinear -> Conv -> QuantizeLinear into QLinearConv), which it
    does only with the scale in QuantizeLinear (a quantizer that multiplies may then differ by one step at those
    values), and where nothing before it is at risk. A range narrower than int8's is a Clip after it."""
    x = ctx.cast(xs[0], layer.inputs[0].dtype, torch.float32)
    scaled = _scale_in_quantize(ctx, layer)
    if not scaled:
        factor = layer.weights["scale"] if layer.divide else torch.reciprocal(layer.weights["scale"])
        if layer.axis is not None:
            rank = layer.inputs[0].rank
            factor = factor.reshape([-1] + [1] * (rank - layer.axis % rank - 1))
        x = ctx.node("Div" if layer.divide else "Mul",
                     [x, ctx.constant(factor.reshape(()) if layer.axis is None else factor, "factor")])[0]
    unsigned = id(layer.outputs[0]) in ctx.unsigned
    q = ctx.node("QuantizeLinear", [x, *_scale_and_zero(ctx, layer, not scaled, unsigned)], **_axis(layer))[0]
    if layer.quant_type == torch.int8 and (layer.quant_min, layer.quant_max) != (-128, 127):
        bounds = [ctx.constant(torch.tensor(b, dtype=torch.int8), "bound") for b in (layer.quant_min, layer.quant_max)]
        q = ctx.node("Clip", [q, *bounds])[0]
    return q


@exporter(L.DequantizeLayer)
def _dequantize(ctx: ExportContext, layer: L.DequantizeLayer, xs: list[str]) -> str:
    if id(layer.outputs[0]) in ctx.integer_inputs:  # read by MatMulIntegerToFloat (`integer_matrix_multiply`)
        return xs[0]
    unsigned = id(layer.inputs[0]) in ctx.unsigned
    out = ctx.node("DequantizeLinear", [xs[0], *_scale_and_zero(ctx, layer, unsigned=unsigned)], **_axis(layer))[0]
    return ctx.cast(out, torch.float32, layer.to_type)


def quantized_kernel(ctx: ExportContext, layer: L.ConvolutionLayer) -> str:
    """A quantized convolution's kernel: its values per output channel in the kernel type, dequantized."""
    scale = layer.weights["kernel_scale"]
    q, zero = kernel_values(layer), torch.zeros(scale.shape, dtype=layer.kernel_type)
    if ctx.unsigned_weights and layer.kernel_type == torch.int8:  # (`network_to_onnx(unsigned_weights=True)`)
        q, zero = as_uint8(q), as_uint8(zero)
    return ctx.node("DequantizeLinear", [ctx.constant(q, "kernel"),
                                         ctx.constant(scale, "kernel_scale"), ctx.constant(zero, "kernel_zero")],
                    axis=0)[0]
