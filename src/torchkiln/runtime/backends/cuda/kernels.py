"""The CUDA backend's kernels: for each (kind, op) row of a plan's kernel table, how to make the callable that
runs a step.

A maker takes the step's layers (symbolic parameters already evaluated for the input shapes), its kernel row,
its weights on the device (laid out and cast once, when the runner is made) and the backend options; it gives
`fn(inputs) -> outputs` over the step's external inputs and outputs, in `StepIO` order. Nothing here
synchronizes with the host, so every step can be captured in a CUDA graph.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from torchkiln.ir import layers as L
from torchkiln.ir.reference import MEANINGS, gather
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.cuda.codegen.layout import copy_to_channels_last
from torchkiln.runtime.backends.cuda.patches import patch_gemm
from torchkiln.runtime.backends.cuda.timing import EPILOGUE_ACTIVATIONS, aligned_mask, constant_mask, sdpa
from torchkiln.runtime.executor import convolve
from torchkiln.runtime.plan import Kernel

StepFn = Callable[[list[torch.Tensor]], list[torch.Tensor]]
Weights = dict[str, torch.Tensor]
Maker = Callable[["StepLayers", Kernel, bool], StepFn]
MAKERS: dict[tuple[str, str], Maker] = {}
CHANNELS_LAST_OUT = "channels_last_out"  # a generated step's option: its 4-D outputs feed channels-last convolutions
# the ops of the steps of a quantized convolution with its input's dequantize (quant_kernels.py): the library's
# (dequantize, then the float convolution) and the generated one's
DEQUANTIZED_CONV_OP, QUANTIZED_CONV_OP = "dequantized_conv", "quantized_conv"


class StepLayers:
    """A step's layers with their device weights, and which tensors it reads and returns (by tensor id)."""

    def __init__(self, layers: Sequence[L.Layer], weights: Sequence[Weights], inputs: Sequence[int],
                 outputs: Sequence[int], device: torch.device) -> None:
        self.device = device
        self.layers = list(layers)
        self.weights = list(weights)
        self.inputs = list(inputs)
        self.outputs = list(outputs)


def maker(kind: str, op: str) -> Callable[[Maker], Maker]:
    def register(fn: Maker) -> Maker:
        MAKERS[(kind, op)] = fn
        return fn

    return register


def make_step(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """The callable of one step; a row without a maker of its own runs its layers' ATen meanings in order."""
    return MAKERS.get((kernel.kind, kernel.op), _layer_by_layer)(step, kernel, allow_tf32)


def _layer_fn(layer: L.Layer, weights: Weights, allow_tf32: bool, device: torch.device
              ) -> Callable[[list[torch.Tensor]], object]:
    """One layer on the GPU: its meaning, but with the CUDA variants below where one exists."""
    special = LAYER_KERNELS.get(type(layer))
    if special is not None:
        return special(layer, weights, allow_tf32)
    meaning = MEANINGS[type(layer)]
    return lambda xs: meaning(layer, xs, weights, device)


def _layer_by_layer(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    fns = [_layer_fn(layer, w, allow_tf32, step.device) for layer, w in zip(step.layers, step.weights)]
    if len(step.layers) == 1 and len(step.outputs) == 1 and [id(t) for t in step.layers[0].outputs] == step.outputs \
            and [id(t) for t in step.layers[0].inputs] == list(step.inputs):
        fn = fns[0]  # one layer of one output reading each input once, in order: no bookkeeping
        return lambda xs: [fn(xs)]
    ins = step.inputs
    plan = [(fn, [id(t) for t in layer.inputs], [id(t) for t in layer.outputs]) for fn, layer in zip(fns, step.layers)]
    outs = step.outputs

    def run(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        values = dict(zip(ins, xs))
        for fn, reads, writes in plan:
            result = fn([values[i] for i in reads])
            if isinstance(result, torch.Tensor):
                values[writes[0]] = result
            else:
                values.update(zip(writes, result))
        return [values[o] for o in outs]

    return run


# ---- single-layer CUDA variants (same values as the meanings, no host synchronisation) ----------------------

def _convolution(layer: L.ConvolutionLayer, ws: Weights, allow_tf32: bool):
    kernel, bias = ws["kernel"], ws.get("bias")
    return lambda xs: convolve(layer, xs[0], kernel, bias, allow_tf32)


def channels_last_input(x: torch.Tensor) -> torch.Tensor:
    """A 4-D input of a channels-last convolution in that layout (a no-op where it is): ATen picks the memory format
    of a convolution from its input and weight, and a weight with one input channel per group (a depthwise
    convolution's) is contiguous in both formats, so an NCHW input took ATen's generic depthwise kernel instead of
    cuDNN's (a 7x7 depthwise convolution at [8,192,56,56] fp16 on an H100: 170 us). The copy is a generated
    kernel where it pays (codegen/layout.py)."""
    if x.dim() != 4 or x.is_contiguous(memory_format=torch.channels_last):
        return x
    return copy_to_channels_last(x)


def nchw_input(x: torch.Tensor) -> torch.Tensor:
    """A 4-D input of a convolution planned NCHW (a depthwise one timed faster so) in that layout: ATen picks the
    memory format from the input (see channels_last_input)."""
    return x.contiguous() if x.dim() == 4 else x


def takes_channels_last(kernel: Kernel, lead: L.Layer) -> bool:
    """Whether a step of this kernel row, led by `lead`, is a convolution that reads its input channels-last (a
    quantized one's step is led by the dequantize of its input)."""
    if isinstance(lead, L.DequantizeLayer):
        return kernel.op in (DEQUANTIZED_CONV_OP, QUANTIZED_CONV_OP)
    return isinstance(lead, L.ConvolutionLayer) and (bool(kernel.option("channels_last"))
                                                     or kernel.op in ("gemm", "depthwise"))


@maker("library", "convolution")
def _library_convolution(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    conv = _convolution(step.layers[0], step.weights[0], allow_tf32)
    if not kernel.option("channels_last"):
        return lambda xs: [conv([nchw_input(xs[0])])]
    return lambda xs: [conv([channels_last_input(xs[0])])]


def _gather(layer: L.GatherLayer, ws: Weights, allow_tf32: bool):
    """Gather without the host-side index check of the meaning (it would synchronize every call): on the GPU
    an index outside [0, size) trips the CUDA kernel's own bounds assertion, as eager PyTorch's does."""
    return lambda xs: gather(layer, xs[0], xs[1], check=False)


def _normalization(layer: L.NormalizationLayer, ws: Weights, allow_tf32: bool):
    """Layer norm as one kernel: CUDA's layer norm accumulates half-precision inputs in fp32 itself, so the
    meaning's explicit casts (three kernels) are not needed."""
    if layer.kind != L.NormalizationKind.LAYER:
        meaning = MEANINGS[type(layer)]
        return lambda xs: meaning(layer, xs, ws, xs[0].device)  # it reads an input: its device is the engine's
    shape, eps = list(layer.normalized_shape), layer.epsilon
    cache: dict[torch.dtype, tuple] = {}

    def norm(xs):
        x = xs[0]
        wb = cache.get(x.dtype)
        if wb is None:
            wb = cache[x.dtype] = tuple(None if ws.get(k) is None else ws[k].to(x.dtype) for k in ("scale", "bias"))
        return F.layer_norm(x, shape, wb[0], wb[1], eps)

    return norm


def _softmax(layer: L.SoftMaxLayer, ws: Weights, allow_tf32: bool):
    """Softmax as one kernel: CUDA's softmax accumulates half-precision inputs in fp32 itself."""
    axis, log = layer.axis, layer.log
    return lambda xs: (torch.log_softmax if log else torch.softmax)(xs[0], axis)


def _shape(layer: L.ShapeLayer, ws: Weights, allow_tf32: bool):
    """The shape as a device tensor, made once per shape at the first (eager) call: copying it from the host
    inside a CUDA graph capture is not allowed, and every replay of a graph has the same shapes."""
    made: dict[tuple[int, ...], torch.Tensor] = {}

    def shape(xs):
        key = tuple(xs[0].shape)
        found = made.get(key)
        if found is None:
            found = made[key] = torch.tensor(key, dtype=torch.int64, device=xs[0].device)
        return found.clone()  # a device-to-device copy (capturable): what a call returns is the caller's

    return shape


MIN_FLATTENED_WIDTH = 64  # input features below which a linear of a strided input keeps ATen's own path


def _matrix_multiply(layer: L.MatrixMultiplyLayer, ws: Weights, allow_tf32: bool):
    """A linear layer (x @ W.t() + b) over an input of more than 2 dims that is not contiguous (a window
    partition's transposed view) as one GEMM with the bias in its epilogue: ATen's linear takes such an input
    through a batched product and adds the bias in a kernel of its own, a pass over the output. Flattening the
    input copies it (where no view is its matrix), as ATen's product does too; that copy moves fewer bytes than the
    bias pass where the output is at least as wide as the input (a query-key-value projection). Narrower outputs,
    products too narrow for the library's tiles (CaiT's talking heads mix 4 heads: [M, 4] x [4, 4] ran 0.7 ms
    slower a call as one flattened GEMM), and everything else keep the meaning."""
    meaning, bias = MEANINGS[type(layer)], ws.get("bias")
    if layer.op0 != L.MatrixOperation.NONE or layer.op1 != L.MatrixOperation.TRANSPOSE or bias is None \
            or bias.dim() != 1:
        return lambda xs: meaning(layer, xs, ws, xs[0].device)

    def linear(xs):
        a, w = xs
        if a.dim() <= 2 or w.dim() != 2 or a.is_contiguous() or w.shape[0] < w.shape[1] \
                or w.shape[1] < MIN_FLATTENED_WIDTH:
            return meaning(layer, xs, ws, a.device)
        return torch.addmm(bias, a.reshape(-1, a.shape[-1]), w.t()).view(*a.shape[:-1], w.shape[0])

    return linear


LAYER_KERNELS = {  # layer kinds with a CUDA variant of their meaning (a control-flow layer's step: control_flow.py)
    L.ConvolutionLayer: _convolution,
    L.MatrixMultiplyLayer: _matrix_multiply,
    L.GatherLayer: _gather,
    L.NormalizationLayer: _normalization,
    L.SoftMaxLayer: _softmax,
    L.ShapeLayer: _shape,
}


# ---- fused library calls --------------------------------------------------------------------------------

@maker("library", "conv_relu")
def _conv_relu(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """relu(conv(x) + bias) as one cuDNN call."""
    conv = step.layers[0]
    w, b = step.weights[0]["kernel"], step.weights[0].get("bias")
    args = (list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)
    return lambda xs: [torch.cudnn_convolution_relu(xs[0], w, b, *args)]


@maker("library", "conv_add_relu")
def _conv_add_relu(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """relu(conv(x) + bias + z) as one cuDNN call; z is the other operand of the add."""
    conv = step.layers[0]
    w, b = step.weights[0]["kernel"], step.weights[0].get("bias")
    args = (list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)
    add = step.layers[1]
    z = next(t for t in add.inputs if t is not conv.outputs[0])
    x_at, z_at = step.inputs.index(id(conv.inputs[0])), step.inputs.index(id(z))
    return lambda xs: [torch.cudnn_convolution_add_relu(xs[x_at], w, xs[z_at], 1.0, b, *args)]


@maker("library", "patch_conv")
def _patch_conv(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """A convolution whose windows tile its input as one GEMM over the patches (patches.py)."""
    w, b = step.weights[0]["kernel"], step.weights[0].get("bias")
    return lambda xs: [patch_gemm(xs[0], w, b)]


@maker("library", "layer_norm")
def _half_layer_norm(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """cast -> fp32 layer norm -> cast back as one kernel on the half-precision input (fp32 statistics)."""
    norm = step.layers[1]
    ws = {k: w.to(step.layers[0].inputs[0].dtype) for k, w in step.weights[1].items()}
    shape, eps = list(norm.normalized_shape), norm.epsilon
    return lambda xs: [F.layer_norm(xs[0], shape, ws.get("scale"), ws.get("bias"), eps)]


@maker("library", "attention")
def _attention(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """SDPA through the backend the build timed fastest (the tactic "backend"; "" = PyTorch's choice), a constant
    mask aligned once (`aligned_mask`)."""
    layer = step.layers[0]
    run = sdpa(str(dict(kernel.tactic).get("backend", "")), layer.causal, layer.scale, layer.enable_gqa)
    if not constant_mask(layer):
        return _attention_call(step, run)
    aligned: list[torch.Tensor] = []  # the constant mask, aligned at the first call

    def with_constant_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if not aligned:
            aligned.append(aligned_mask(mask))
        return run(q, k, v, aligned[0])
    return _attention_call(step, with_constant_mask)


@maker("generated", "attention")
def _generated_attention(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """Attention as the generated flash-attention kernel (codegen/attention.py) with the tile the build timed
    fastest (the tactic "config")."""
    from torchkiln.runtime.backends.cuda.codegen.attention import Attention

    return _attention_call(step, Attention(step.layers[0], str(kernel.option("config"))))


def _attention_call(step: StepLayers, run: Callable) -> StepFn:
    """`run(query, key, value, mask or None)` on the step's inputs, found by tensor: the step's inputs hold each
    once, and self-attention reads x as query, key and value."""
    at = [step.inputs.index(id(t)) for t in step.layers[0].inputs]
    return lambda xs: [run(*(xs[k] for k in at[:3]), xs[at[3]] if len(at) > 3 else None)]


@maker("generated", "pointwise")
def _pointwise(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """The step's pointwise layers as one generated Triton kernel (codegen/pointwise.py)."""
    from torchkiln.runtime.backends.cuda.codegen.pointwise import compile_group

    return _generated(step, kernel, compile_group)


@maker("generated", "rows")
def _rows(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """The step's reductions over one set of axes, with their pointwise prologue and epilogue, as one generated
    Triton kernel (codegen/reduction.py)."""
    from torchkiln.runtime.backends.cuda.codegen.reduction import compile_group

    return _generated(step, kernel, compile_group)


@maker("generated", "indexed")
def _indexed(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """The step's pointwise and movement layers as one generated Triton kernel, the moves as index arithmetic
    (codegen/indexed.py)."""
    from torchkiln.runtime.backends.cuda.codegen.indexed import compile_group

    return _generated(step, kernel, compile_group)


def _generated(step: StepLayers, kernel: Kernel, compile_group: Callable) -> StepFn:
    """A generated kernel over the step's layers, reading its inputs and writing its outputs (channels-last where
    the kernel row says its outputs feed channels-last convolutions)."""
    tensors = {id(t): t for layer in step.layers for t in (*layer.inputs, *layer.outputs)}
    return compile_group(step.layers, [tensors[i] for i in step.inputs], [tensors[o] for o in step.outputs],
                         bool(kernel.option(CHANNELS_LAST_OUT)))


@maker("generated", "max_pool")
def _max_pool(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """A 2-D max pool as the generated Triton kernel (codegen/pooling.py), in its input's memory format; between a
    dequantize and a quantize of the same parameters (planner rule 3d: the step's three layers), of the quantized
    values themselves."""
    from torchkiln.runtime.backends.cuda.codegen.pooling import MaxPool2d

    pool = MaxPool2d(next(layer for layer in step.layers if isinstance(layer, L.PoolingLayer)))
    return lambda xs: [pool(xs[0])]


@maker("library", "conv_epilogue")
def _conv_epilogue(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """A convolution without its bias, then one generated kernel: the bias (a per-channel scale layer made here,
    outside the network) and the pointwise layers after it, or the row group (a reduction's) after it. Where the
    step's second layer transposes the convolution's output (planner rule 2), the kernel reads that transposed view
    and adds the bias along the axis the channels moved to."""
    from torchkiln.runtime.backends.cuda.codegen import pointwise, reduction

    conv, rest = step.layers[0], step.layers[1:]
    ws = step.weights[0]
    perm = L.transposition(rest[0]) if rest and rest[0].inputs[0] is conv.outputs[0] else None
    if perm is not None:
        rest = rest[1:]
    out = conv.outputs[0] if perm is None else step.layers[1].outputs[0]
    raw = Tensor(f"{out.name}:without_bias", out.shape, out.dtype)
    first: list[L.Layer] = []
    if "bias" in ws:
        first.append(L.ScaleLayer(name=f"{conv.name}/bias", inputs=[raw], outputs=[out],
                                  weights={"shift": ws["bias"]}, mode=L.ScaleMode.CHANNEL,
                                  channel_axis=1 if perm is None else perm.index(1)))
    conv_fn = _convolution(conv, {"kernel": ws["kernel"]}, allow_tf32)
    layout = channels_last_input if kernel.option("channels_last") else nchw_input
    if perm is None:
        convolve = lambda xs: conv_fn([layout(xs[0])])  # noqa: E731
    else:
        convolve = lambda xs: conv_fn([layout(xs[0])]).permute(perm)  # noqa: E731
    reads = epilogue_inputs(conv, rest, step.inputs)
    at = [step.inputs.index(id(t)) for t in reads]
    rows = any(reduction.reduced_axes(layer) is not None for layer in rest)
    launch = (reduction if rows else pointwise).compile_group(first + rest, [raw if first else out, *reads],
                                                              [step_output(first + rest, o) for o in step.outputs])

    def run(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        return launch([convolve(xs[:1]), *(xs[k] for k in at)])

    return run


def step_output(layers: Sequence[L.Layer], tid: int) -> Tensor:
    """The tensor of id `tid` that one of `layers` makes."""
    return next(t for layer in layers for t in layer.outputs if id(t) == tid)


def epilogue_inputs(product: L.Layer, rest: Sequence[L.Layer], inputs: Sequence[int]) -> list[Tensor]:
    """What the pointwise layers after a product read from outside its step (in the order of the step's `inputs`,
    tensor ids), the product's output aside."""
    made = {id(t) for layer in rest for t in layer.outputs}
    tensors = {id(t): t for layer in rest for t in layer.inputs}
    return [tensors[i] for i in inputs if i in tensors and i not in made and i != id(product.outputs[0])]


@maker("generated", "gemm")
def _gemm(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """A matrix product (x @ W.T + b, or a 1x1 convolution with its bias) and the pointwise layers after it as one
    generated Triton GEMM (codegen/gemm.py) of the tile configuration the build timed fastest."""
    from torchkiln.runtime.backends.cuda.codegen.gemm import Config, GemmLauncher, generate

    product, rest = step.layers[0], step.layers[1:]
    reads = epilogue_inputs(product, rest, step.inputs)
    launch = GemmLauncher(generate(product, rest, reads, [step_output(step.layers, o) for o in step.outputs]),
                          product, Config.parse(str(kernel.option("config", ""))))
    x_at, at = step.inputs.index(id(product.inputs[0])), [step.inputs.index(id(t)) for t in reads]
    bias = step.weights[0].get("bias")
    if isinstance(product, L.ConvolutionLayer):
        weight = step.weights[0]["kernel"]
        return lambda xs: launch(xs[x_at], weight, bias, [xs[k] for k in at])
    w_at = step.inputs.index(id(product.inputs[1]))
    return lambda xs: launch(xs[x_at], xs[w_at], bias, [xs[k] for k in at])


@maker("generated", "depthwise")
def _depthwise(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """A depthwise convolution with its bias and the pointwise layers after it as one generated Triton kernel
    (codegen/depthwise.py) of the tile configuration the build timed fastest."""
    from torchkiln.runtime.backends.cuda.codegen.depthwise import Config, DepthwiseLauncher, lay_out

    conv, rest = step.layers[0], step.layers[1:]
    reads = epilogue_inputs(conv, rest, step.inputs)
    launch = DepthwiseLauncher(conv, rest, reads, [step_output(step.layers, o) for o in step.outputs],
                               Config.parse(str(kernel.option("config", ""))))
    weight, bias = lay_out(step.weights[0]["kernel"]), step.weights[0].get("bias")
    x_at, at = step.inputs.index(id(conv.inputs[0])), [step.inputs.index(id(t)) for t in reads]
    return lambda xs: launch(xs[x_at], weight, bias, [xs[k] for k in at])


@maker("library", "linear_activation")
def _linear_activation(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """x @ W (+ bias) with its ReLU or tanh GELU as one cuBLASLt call (the library's fused epilogue), on x's rows as
    a matrix; the reshapes between the product and the activation run on the result (views)."""
    matmul, *moves, activation = step.layers
    gelu = EPILOGUE_ACTIVATIONS[activation.type]
    x_at, w_at = step.inputs.index(id(matmul.inputs[0])), step.inputs.index(id(matmul.inputs[1]))
    transposed = matmul.op1 == L.MatrixOperation.TRANSPOSE
    columns = matmul.inputs[1].shape[0 if transposed else 1]
    bias = step.weights[0].get("bias")
    if bias is None:
        bias = torch.zeros(columns, dtype=matmul.outputs[0].dtype, device=step.device)
    reshapes = [_layer_fn(m, w, allow_tf32, step.device) for m, w in zip(moves, step.weights[1:-1])]

    def run(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        x, w = xs[x_at], xs[w_at]
        y = torch._addmm_activation(bias, x.reshape(-1, x.shape[-1]), w.t() if transposed else w, use_gelu=gelu)
        y = y.reshape(*x.shape[:-1], columns)
        for fn in reshapes:
            y = fn([y])
        return [y]

    return run


@maker("library", "linear_group")
def _linear_group(step: StepLayers, kernel: Kernel, allow_tf32: bool) -> StepFn:
    """Several x @ W.T + b of one x as one GEMM over the concatenated weights; the outputs are column views."""
    pairs = [(step.weights[k - 1]["value"], step.weights[k].get("bias"), layer)
             for k, layer in enumerate(step.layers) if isinstance(layer, L.MatrixMultiplyLayer)]
    weight = torch.cat([w for w, _, _ in pairs])
    bias = torch.cat([b for _, b, _ in pairs]) if pairs[0][1] is not None else None
    sizes = [w.shape[0] for w, _, _ in pairs]
    order = {id(layer.outputs[0]): k for k, (_, _, layer) in enumerate(pairs)}
    picks = [order[o] for o in step.outputs]

    def run(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        parts = F.linear(xs[0], weight, bias).split(sizes, dim=-1)
        return [parts[k] for k in picks]

    return run
