"""INT8 and FP8 matrix multiplies on the GPU's integer and fp8 tensor cores.

A matrix multiply whose activation and constant weight are dequantized values (post-training quantization's
Q/DQ form, builder/passes/quantize.py) runs as one step over the quantized activation and weight: `torch._int_mm`
(int8 x int8 -> int32) or `torch._scaled_mm` (fp8 e4m3 x fp8 e4m3 -> float32), then the dequantize epilogue, the
activation's scale times each output column's weight scale, and the bias. The quantize layer before it is not part
of the step (it may feed several multiplies): a per-tensor one joins the generated kernel that makes its input
(planner rule 2). The step's members are the weight's constant, both dequantize layers and the multiply; the weight
is laid out column-major once, when the step is made.

Integer sums are exact (the reference sums dequantized values in fp32: they differ by fp32 rounding only). Shapes
the libraries refuse (int8: M <= 16; fp8: M not a multiple of 16) compute the same product on the dequantized
values with `torch.matmul`.

Where Triton is installed, the planner also times a generated quantized GEMM (`quantized_gemm`,
codegen/gemm.py) for such a multiply: the integer or fp8 product with the dequantize epilogue, the bias and the
pointwise layers after it (the cast back to half precision, an activation and its next quantize, a residual) in
one kernel.

A 2-D convolution of a quantized kernel (one group) whose input is a per-tensor dequantized value it alone reads is
one step with that dequantize: on the library, the dequantize and the float convolution, channels-last
(`dequantized_conv`); generated, where timing picks it, an implicit GEMM on the quantized values with the pointwise
layers after it (`quantized_conv`, codegen/quantized_conv.py), or for a 1x1 convolution of stride 1 the generated
quantized GEMM over the input's channels (codegen/gemm.py), in the same step kind.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.quantization import kernel_values, zero_point
from torchkiln.ir.reference import MEANINGS
from torchkiln.runtime.backends.cuda.codegen.quantized_conv import quantized_conv_layer
from torchkiln.runtime.backends.cuda.kernels import (DEQUANTIZED_CONV_OP, QUANTIZED_CONV_OP, StepFn, StepLayers,
                                                     channels_last_input, epilogue_inputs, maker, step_output)
from torchkiln.runtime.executor import convolve
from torchkiln.runtime.plan import Kernel

if TYPE_CHECKING:
    from torchkiln.ir.tensor import Tensor
    from torchkiln.runtime.backends.cuda.codegen.gemm import GemmKernel

KERNEL = Kernel("library", "quantized_matmul")
GENERATED_OP = "quantized_gemm"  # the generated kernel's row: Kernel("generated", GENERATED_OP, (("config", ...),))
CONV_KERNEL = Kernel("library", DEQUANTIZED_CONV_OP, (("channels_last", True),))
GENERATED_CONV_OP = QUANTIZED_CONV_OP
ALIGN = {torch.int8: 8, torch.float8_e4m3fn: 16}  # K and N must be multiples of this for cuBLASLt
FP8_CAPABILITY = (8, 9)  # fp8 tensor cores: Ada and Hopper on


def _zero_free(dq: L.DequantizeLayer) -> bool:
    zero = dq.weights.get("zero_point")
    return zero is None or not bool(zero.any())


def quantized_matmuls(network: Network, sole_reader: Callable[[object], L.Layer | None],
                      capability: Callable[[], tuple[int, int]]) -> list[list[int]]:
    """The members (indices: weight constant, both dequantize layers, the multiply) of each matrix multiply that
    can run quantized on a GPU of `capability()` (asked only for fp8)."""
    index = {id(layer): j for j, layer in enumerate(network.layers)}
    found = []
    for j, mm in enumerate(network.layers):
        if not isinstance(mm, L.MatrixMultiplyLayer) or mm.op0 != L.MatrixOperation.NONE \
                or mm.outputs[0].dtype != torch.float32:
            continue
        dqx, dqw = mm.inputs[0].producer, mm.inputs[1].producer
        if not (isinstance(dqx, L.DequantizeLayer) and isinstance(dqw, L.DequantizeLayer)) or dqx is dqw:
            continue
        constant, quant_type = dqw.inputs[0].producer, dqw.quant_type
        transposed = mm.op1 == L.MatrixOperation.TRANSPOSE
        if not isinstance(constant, L.ConstantLayer) or dqx.quant_type != quant_type or dqx.axis is not None \
                or dqw.axis is None or dqw.axis % 2 != (0 if transposed else 1) or dqw.inputs[0].rank != 2 \
                or not (_zero_free(dqx) and _zero_free(dqw)):
            continue
        n, k = dqw.inputs[0].shape if transposed else reversed(dqw.inputs[0].shape)
        if n % ALIGN[quant_type] or k % ALIGN[quant_type] \
                or (quant_type == torch.float8_e4m3fn and tuple(capability()) < FP8_CAPABILITY) \
                or sole_reader(dqx.outputs[0]) is not mm or sole_reader(dqw.outputs[0]) is not mm:
            continue
        found.append(sorted(index[id(x)] for x in (constant, dqw, dqx, mm)))
    return found


def quantized_convolutions(network: Network, sole_reader: Callable[[object], L.Layer | None],
                           capability: Callable[[], tuple[int, int]]) -> list[list[int]]:
    """The members (indices: the input's dequantize layer, the convolution) of each convolution that runs as one
    quantized step on a GPU of `capability()` (asked only for fp8): a generated kernel computes it
    (`quantized_conv_layer`), and its input is a float32 value, dequantized per tensor from its kernel's type (with
    a zero point only for int8), that it alone reads."""
    index = {id(layer): j for j, layer in enumerate(network.layers)}
    found = []
    for j, conv in enumerate(network.layers):
        if quantized_conv_layer(conv) is not None:
            continue
        dq = conv.inputs[0].producer
        if not isinstance(dq, L.DequantizeLayer) or dq.quant_type != conv.kernel_type or dq.axis is not None \
                or dq.to_type != torch.float32 or dq.weights["scale"].numel() != 1 \
                or sole_reader(dq.outputs[0]) is not conv:
            continue
        zero = dq.weights.get("zero_point")
        if zero is not None and zero.numel() != 1 or conv.kernel_type != torch.int8 and zero_point(dq):
            continue
        if conv.kernel_type == torch.float8_e4m3fn and tuple(capability()) < FP8_CAPABILITY:
            continue
        found.append([index[id(dq)], j])
    return found


@maker(CONV_KERNEL.kind, CONV_KERNEL.op)
def _dequantized_conv(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """The dequantize, then the float convolution (channels-last), as their meanings compute them."""
    (dq, conv), (dq_weights, conv_weights) = step.layers, step.weights
    dequantize = MEANINGS[L.DequantizeLayer]
    weight, bias = conv_weights["kernel"], conv_weights.get("bias")
    return lambda xs: [convolve(conv, dequantize(dq, [channels_last_input(xs[0])], dq_weights, xs[0].device), weight,
                                bias, allow_tf32)]


@maker(KERNEL.kind, KERNEL.op)
def _quantized_matmul(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    by_kind = {type(layer): (layer, w) for layer, w in zip(step.layers, step.weights)
               if not isinstance(layer, L.DequantizeLayer)}
    mm, mm_weights = by_kind[L.MatrixMultiplyLayer]
    constant_weights = by_kind[L.ConstantLayer][1]
    dqx = mm.inputs[0].producer
    dqw, dqw_weights = next((layer, w) for layer, w in zip(step.layers, step.weights) if layer is mm.inputs[1].producer)
    dqx_weights = next(w for layer, w in zip(step.layers, step.weights) if layer is dqx)
    weight = constant_weights["value"]
    b = weight.t() if mm.op1 == L.MatrixOperation.TRANSPOSE else weight  # [K, N]
    b = b.t().contiguous().t()  # column-major, as cuBLASLt takes the second operand
    k, n = b.shape
    columns = (dqx_weights["scale"].reshape(()) * dqw_weights["scale"]).reshape(1, n).float()
    bias = mm_weights.get("bias")
    x_at = step.inputs.index(id(dqx.inputs[0]))
    quant_type = dqw.quant_type
    one = torch.ones((), device=step.device)

    def product(a: torch.Tensor) -> torch.Tensor:
        m = a.shape[0]
        if quant_type == torch.int8 and m > 16:
            return torch._int_mm(a, b).float()
        if quant_type == torch.float8_e4m3fn and m % 16 == 0:
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
        return a.float() @ b.float()

    def run(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        q = xs[x_at]
        out = product(q.reshape(-1, k).contiguous()) * columns
        if bias is not None:
            out = out + bias
        return [out.reshape(*q.shape[:-1], n)]

    return run


class QuantizedProduct:
    """The roles of a quantized product's step layers: the product (a matrix multiply or a convolution), the
    activation's dequantize layer, a multiply's weight dequantize layer and constant (None for a convolution, whose
    kernel is its own weight), and the pointwise layers after it."""

    def __init__(self, layers: list[L.Layer]) -> None:
        self.product = next(layer for layer in layers if isinstance(layer, (L.MatrixMultiplyLayer, L.ConvolutionLayer)))
        self.dqx = self.product.inputs[0].producer
        self.dqw = self.constant = None
        if isinstance(self.product, L.MatrixMultiplyLayer):
            self.dqw = self.product.inputs[1].producer
            self.constant = self.dqw.inputs[0].producer
        own = {id(x) for x in (self.product, self.dqx, self.dqw, self.constant) if x is not None}
        self.epilogue = [layer for layer in layers if id(layer) not in own]


def generated_kernel(layers: list[L.Layer], inputs: Sequence[int], outputs: Sequence[Tensor]
                     ) -> tuple[GemmKernel, QuantizedProduct]:
    """The generated quantized GEMM or convolution of a step's `layers` (`QuantizedProduct`'s roles), reading
    `inputs` (tensor ids, the step's order) and writing `outputs`."""
    from torchkiln.runtime.backends.cuda.codegen import gemm, quantized_conv

    roles = QuantizedProduct(layers)
    reads = epilogue_inputs(roles.product, roles.epilogue, inputs)
    if roles.dqw is not None:
        return gemm.generate(roles.product, roles.epilogue, reads, outputs, roles.dqw.quant_type), roles
    if gemm.pointwise_conv(roles.product) is None:
        return gemm.generate(roles.product, roles.epilogue, reads, outputs, roles.product.kernel_type,
                             zero_point(roles.dqx)), roles
    return quantized_conv.generate(roles.product, roles.epilogue, reads, outputs, zero_point(roles.dqx)), roles


@maker("generated", GENERATED_OP)
def _quantized_gemm(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    from torchkiln.runtime.backends.cuda.codegen.gemm import Config, GemmLauncher

    weights = {id(layer): w for layer, w in zip(step.layers, step.weights)}
    generated, roles = generated_kernel(step.layers, step.inputs, [step_output(step.layers, o) for o in step.outputs])
    scale_x = weights[id(roles.dqx)]["scale"].reshape(()).float()
    columns = (scale_x * weights[id(roles.dqw)]["scale"].float().reshape(-1)).contiguous()
    weight = weights[id(roles.constant)]["value"]  # [N, K]: the generated GEMM takes x @ W.T only
    launch = GemmLauncher(generated, roles.product, Config.parse(str(kernel.option("config", ""))), columns)
    x_at = step.inputs.index(id(roles.dqx.inputs[0]))
    at = [step.inputs.index(id(t)) for t in generated.inputs]  # the epilogue's other inputs, in launch order
    bias = weights[id(roles.product)].get("bias")
    bias = None if bias is None else bias.float()
    return lambda xs: launch(xs[x_at], weight, bias, [xs[k] for k in at])


@maker("generated", GENERATED_CONV_OP)
def _quantized_conv(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    from torchkiln.runtime.backends.cuda.codegen.gemm import Config, GemmLauncher, pointwise_conv
    from torchkiln.runtime.backends.cuda.codegen.quantized_conv import QuantizedConvLauncher, column_sums

    weights = {id(layer): w for layer, w in zip(step.layers, step.weights)}
    generated, roles = generated_kernel(step.layers, step.inputs, [step_output(step.layers, o) for o in step.outputs])
    conv_weights = weights[id(roles.product)]
    columns = weights[id(roles.dqx)]["scale"].reshape(()).float() * conv_weights["kernel_scale"].float().reshape(-1)
    bias = conv_weights.get("bias")
    bias = None if bias is None else bias.float()
    values, zero = kernel_values(roles.product, conv_weights), zero_point(roles.dqx)
    config = Config.parse(str(kernel.option("config", "")))
    x_at = step.inputs.index(id(roles.dqx.inputs[0]))
    at = [step.inputs.index(id(t)) for t in generated.inputs]
    if pointwise_conv(roles.product) is None:  # generated as a GEMM over the channels (`generated_kernel`)
        weight = values.reshape(values.shape[0], -1).contiguous()
        sums = column_sums(weight) if zero else None
        gemm_launch = GemmLauncher(generated, roles.product, config, columns.contiguous(), sums)
        return lambda xs: gemm_launch(xs[x_at], weight, bias, [xs[k] for k in at])
    launch = QuantizedConvLauncher(generated, roles.product, config, values, columns, bias, zero)
    return lambda xs: launch(xs[x_at], [xs[k] for k in at])
