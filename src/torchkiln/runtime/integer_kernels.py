"""Whether ONNX Runtime's integer kernels compute exact sums for a network on this CPU.

MLAS multiplies uint8 activations by int8 weights. On x86 without VNNI (AVX2 only) it does so with VPMADDUBSW, which
adds each pair of products into a saturating 16-bit sum (ORT's quantization docs warn of it): a pair of 255 x -128
products is -65280, clamped to -32768. Measured on such a CPU, a QAT convolution's outputs came out 3.9 off where
eager's are exact. With every weight in [-64, 64] a pair is at most 2 x 255 x 64 = 32640, so the sums are exact
there: the 7-bit weights ORT's own quantizer offers for these CPUs (`reduce_range`). Elsewhere (AVX512-VNNI,
AVX-VNNI, AMX, ARM's dot products) every sum is exact.

Post-training quantization for a CPU without VNNI therefore quantizes weights to [-64, 64] (`weight_max`): uint8 x
int8 is the faster kernel. A network with wider int8 weights (a QAT graph's own 8-bit weights) has them written as
uint8 there, value + 128 with zero point 128 (`exact_for(unsigned_weights=True)`): MLAS's uint8 x uint8 kernels
widen to 16 bits before adding, so they are exact for any weight (measured here: a `MatMulInteger` of [1024,256] by
[256,1024] took 2.34 ms as uint8 x int8, 2.67 ms as uint8 x uint8, 3.99 ms as a float MatMul). A product of two
dequantized activations runs as float Q/DQ nodes on such a CPU.
"""
from __future__ import annotations

import functools

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.quantization import dequantized_constants, kernel_values

# x86 instruction sets whose int8 dot products ORT's integer kernels use without saturating
_EXACT_INT8_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})
NARROW_WEIGHT_MAX = 64  # the largest |int8 weight| whose pair sums with uint8 activations fit in 16 bits
FULL_WEIGHT_MAX = 127  # symmetric int8 weights elsewhere


@functools.cache
def integer_kernels_exact() -> bool:
    """Whether ORT's integer kernels compute exact sums on this CPU for any int8 weights (the module docstring)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return True
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False  # (not Linux: the CPU cannot be told here; 7-bit or uint8 weights are exact on any x86)
    return bool(_EXACT_INT8_FLAGS & set(flags))


def weight_max(device: torch.device) -> int:
    """The largest |int8 weight| post-training quantization gives an engine for `device`: `NARROW_WEIGHT_MAX` on a
    CPU whose integer kernels would saturate wider weights, else `FULL_WEIGHT_MAX`."""
    return NARROW_WEIGHT_MAX if device.type == "cpu" and not integer_kernels_exact() else FULL_WEIGHT_MAX


def exact_for(network: Network, unsigned_weights: bool = False) -> bool:
    """Whether ORT's integer kernels compute `network`'s quantized products exactly here: on any CPU with exact
    kernels; else where no product multiplies two dequantized int8 activations and every int8 convolution kernel and
    every int8 constant a dequantize layer reads lies in [-NARROW_WEIGHT_MAX, NARROW_WEIGHT_MAX], or, with
    `unsigned_weights`, is written as uint8 (value + 128, zero point 128: any int8 weight is exact so)."""
    if integer_kernels_exact():
        return True
    written_unsigned = dequantized_constants(network) if unsigned_weights else set()
    for layer in network.layers:
        if isinstance(layer, (L.MatrixMultiplyLayer, L.ConvolutionLayer)) and \
                sum(_dequantized_activation(t) for t in layer.inputs) > 1:
            return False
        if isinstance(layer, L.ConvolutionLayer) and layer.kernel_type == torch.int8 and not unsigned_weights:
            if layer.weights["kernel_scale"].numel() != layer.weights["kernel"].shape[0] or \
                    not _narrow(kernel_values(layer)):
                return False
        elif isinstance(layer, L.DequantizeLayer) and layer.quant_type == torch.int8 and \
                isinstance(layer.inputs[0].producer, L.ConstantLayer) and \
                not _narrow(layer.inputs[0].producer.weights["value"]):
            if id(layer.inputs[0]) not in written_unsigned:  # (uint8 only where dequantize layers alone read it)
                return False
    return True


def _narrow(values: torch.Tensor) -> bool:
    return not values.numel() or float(values.float().abs().max()) <= NARROW_WEIGHT_MAX


def _dequantized_activation(t: object) -> bool:
    producer = t.producer
    return isinstance(producer, L.DequantizeLayer) and producer.quant_type == torch.int8 and \
        not isinstance(producer.inputs[0].producer, L.ConstantLayer)
