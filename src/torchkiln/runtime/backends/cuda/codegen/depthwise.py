"""A Triton depthwise 2-D convolution with its bias and a pointwise epilogue in one kernel.

A depthwise convolution (one group per channel, one output channel per group) is memory-bound: cuDNN's kernel,
then a separate pass for the bias and activation (MobileNet's ReLU6), reads and writes the activation twice. Here
one program computes a tile of output positions (batch, row, column flattened: M) by channels (N); channels are the
fast axis, so in channels-last memory every load and store is a contiguous vector. The window is unrolled
(compile-time size); stride, padding and dilation are run-time ints. Products accumulate in float32; the bias is
added in float32 and the sum rounded to the convolution's dtype before the epilogue (codegen/epilogue.py) reads it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from torchkiln.errors import EngineInputError, NetworkError
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.cuda.codegen import epilogue
from torchkiln.runtime.backends.cuda.codegen.pointwise import HEADER

KERNEL_NAME = "depthwise_kernel"
DTYPES = (torch.float16, torch.bfloat16)
M_DIMS, N_DIM = (0, 2, 3), 1


@dataclasses.dataclass(frozen=True)
class Config:
    """One tile: output positions by channels per program, and warps."""

    block_p: int
    block_c: int
    warps: int

    def text(self) -> str:
        return ",".join(str(v) for v in dataclasses.astuple(self))

    @classmethod
    def parse(cls, text: str) -> Config:
        try:
            return cls(*(int(v) for v in text.split(",")))
        except (ValueError, TypeError):
            raise NetworkError(f"malformed depthwise tile configuration {text!r}") from None


def candidates(channels: int) -> list[Config]:
    """The tile worth timing: up to 64 channels wide, 2048 outputs a program (like the generated max pool)."""
    block_c = min(64, 1 << max(channels - 1, 0).bit_length())
    return [Config(2048 // block_c, block_c, 4)]


def depthwise_layer(layer: L.Layer) -> str | None:
    """None if `layer` is a convolution this kernel computes (2-D, one group per channel, as many outputs as
    inputs, half precision); else why not."""
    if not isinstance(layer, L.ConvolutionLayer):
        return f"{layer.KIND} is not a convolution"
    w, out = layer.weights["kernel"], layer.outputs[0]
    if out.dtype not in DTYPES or layer.inputs[0].dtype != out.dtype:
        return f"dtype {out.dtype}: generated depthwise convolutions are half precision"
    if layer.transposed or w.dim() != 4 or layer.inputs[0].rank != 4 or w.shape[1] != 1 or \
            layer.groups != w.shape[0] or layer.inputs[0].shape[1] != w.shape[0]:
        return "only a 2-D convolution of one group per channel and one output channel per group"
    return None


@dataclasses.dataclass(frozen=True)
class DepthwiseKernel:
    """Generated source and the epilogue's inputs, weights and outputs (as `gemm.GemmKernel`)."""

    source: str
    inputs: tuple[Tensor, ...]
    weights: tuple[torch.Tensor, ...]
    outputs: tuple[Tensor, ...]


def generate(conv: L.Layer, layers: Sequence[L.Layer], inputs: Sequence[Tensor],
             outputs: Sequence[Tensor]) -> DepthwiseKernel:
    """The kernel computing `outputs` from the convolution's output through the pointwise `layers`."""
    why = depthwise_layer(conv)
    if why is not None:
        raise NetworkError(f"{conv.KIND} layer {conv.name!r} is not a generated depthwise convolution: {why}")
    b = epilogue.build(conv.outputs[0], layers, inputs, outputs)
    params = ["x", "w", "bias", *epilogue.pointer_params(b, outputs), "P", "C", "H", "W", "OH", "OW",
              "x_sn", "x_sc", "x_sh", "x_sw", "stride_h", "stride_w", "pad_h", "pad_w", "dil_h", "dil_w",
              *epilogue.stride_params(b, outputs), "KH: tl.constexpr", "KW: tl.constexpr",
              "HAS_BIAS: tl.constexpr", "BLOCK_P: tl.constexpr", "BLOCK_C: tl.constexpr"]
    body = [
        "rp = tl.program_id(0).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)",
        "rc = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)",
        "in_p = rp < P",
        "in_c = rc < C",
        "ow = rp % OW",
        "oh = (rp // OW) % OH",
        "h0 = oh * stride_h - pad_h",
        "w0 = ow * stride_w - pad_w",
        "x_n = (rp // (OW * OH)) * x_sn",
        "x_c = (rc.to(tl.int64) * x_sc)[None, :]",
        "acc = tl.full((BLOCK_P, BLOCK_C), 0.0, tl.float32)",
        "for kh in tl.static_range(KH):",
        "    ih = h0 + kh * dil_h",
        "    row_ok = in_p & (ih >= 0) & (ih < H)",
        "    for kw in tl.static_range(KW):",
        "        iw = w0 + kw * dil_w",
        "        ok = row_ok & (iw >= 0) & (iw < W)",
        "        v = tl.load(x + (x_n + ih * x_sh + iw * x_sw)[:, None] + x_c, mask=ok[:, None] & in_c[None, :],"
        " other=0.0)",
        "        k = tl.load(w + (kh * KW + kw) * C + rc, mask=in_c, other=0.0)",  # the kernel laid out [KH, KW, C]
        "        acc += v.to(tl.float32) * k.to(tl.float32)[None, :]",
        "if HAS_BIAS:",
        "    acc = acc + tl.load(bias + rc, mask=in_c, other=0.0).to(tl.float32)[None, :]",
        "mask = in_p[:, None] & in_c[None, :]",
        "m64 = rp[:, None]",
        "n64 = rc[None, :].to(tl.int64)",
        *epilogue.tail(b, outputs),
    ]
    signature = ",\n        ".join(params)
    source = (f"# Generated by {__name__} from the engine's layers; do not edit.\n{HEADER}\n\n"
              f"@triton.jit(do_not_specialize=['P'])\ndef {KERNEL_NAME}(\n        {signature},\n):\n"
              + "".join(f"    {line}\n" for line in body))
    return DepthwiseKernel(source, tuple(inputs), tuple(b.weights), tuple(outputs))


class DepthwiseLauncher:
    """Runs a generated depthwise convolution on CUDA tensors (or CPU tensors under Triton's interpreter)."""

    def __init__(self, kernel: DepthwiseKernel, conv: L.ConvolutionLayer, config: Config) -> None:
        from torchkiln.runtime.backends.cuda.codegen.compile import load_source

        self.conv, self.config = conv, config
        self.window = tuple(conv.weights["kernel"].shape[2:])
        self.stride, self.padding, self.dilation = (tuple(v) if v else d for v, d in (
            (conv.stride, (1, 1)), (conv.padding, (0, 0)), (conv.dilation, (1, 1))))
        self.epilogue = epilogue.Operands(kernel.inputs, kernel.weights, kernel.outputs, M_DIMS, N_DIM, True)
        self._fn = getattr(load_source(kernel.source), KERNEL_NAME)

    def __call__(self, x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor | None,
                 inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The epilogue's outputs for the convolution of `x` with `kernel` laid out [KH, KW, C] (`lay_out`) plus
        `bias`, and the epilogue's other `inputs`."""
        n, c, h, w = x.shape
        kh, kw = self.window
        if tuple(kernel.shape) != (kh, kw, c):
            raise EngineInputError(f"depthwise layer {self.conv.name!r}: input {list(x.shape)} does not fit a "
                                   f"kernel of {c} channels laid out {list(kernel.shape)}")
        oh, ow = (((size + 2 * p - d * (k - 1) - 1) // s) + 1 for size, k, s, p, d in
                  zip((h, w), self.window, self.stride, self.padding, self.dilation))
        if oh < 1 or ow < 1:
            raise EngineInputError(f"depthwise layer {self.conv.name!r}: input {list(x.shape)} is smaller than "
                                   f"its window {list(self.window)}")
        shape = (n, c, oh, ow)
        operands, outputs, strides = self.epilogue.bind(inputs, shape, x.device)
        positions = n * oh * ow
        if positions == 0 or c == 0:
            return outputs
        cfg = self.config
        grid = (-(-positions // cfg.block_p), -(-c // cfg.block_c))
        self._fn[grid](x, kernel, kernel if bias is None else bias, *operands, *outputs, positions, c, h, w, oh, ow,
                       *x.stride(), *self.stride, *self.padding, *self.dilation, *strides, KH=kh, KW=kw,
                       HAS_BIAS=bias is not None, BLOCK_P=cfg.block_p, BLOCK_C=cfg.block_c, num_warps=cfg.warps)
        return outputs


def lay_out(kernel: torch.Tensor) -> torch.Tensor:
    """A depthwise kernel [C, 1, KH, KW] as the generated kernel reads it: [KH, KW, C], contiguous."""
    return kernel[:, 0].permute(1, 2, 0).contiguous()
