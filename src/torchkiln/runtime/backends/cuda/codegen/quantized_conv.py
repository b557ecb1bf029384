"""A quantized 2-D convolution as an implicit GEMM on the int8 or fp8 tensor cores, with its dequantize, bias and a
generated pointwise epilogue in one kernel. (A 1x1 convolution of stride 1 runs as the quantized GEMM of
codegen/gemm.py instead: no window arithmetic; quant_kernels.generated_kernel chooses.)

The convolution is the product [M, K] @ [K, N]: M the output positions (batch, row, column, in that order), N the
output channels, K the kernel's taps times the input channels. No im2col matrix is made: a program loads each
[BLOCK_M, BLOCK_K] tile of it straight from the input through its strides, the positions outside the image masked
(their loads give 0; see Sums for the zero point). Two ways of walking K, a compile-time choice:
- by tap (`FLAT` off): for each kernel position, the input channels in blocks; one load per tile row is a
  contiguous run of channels in a channels-last input. For inputs of at least one block of channels;
- flat (`FLAT` on): K walked as one index over (tap, channel), each element's tap and channel computed; for few
  input channels (an image's 3), where a block per tap would be mostly padding.
The weight is [N, K] in (row, column, channel) order, its values in the kernel type (int8, or fp8 e4m3).

Sums: int8 x int8 into int32, exact; fp8 e4m3 x fp8 e4m3 into float32. An int8 input with a zero point z sums
(q - z) * w as q * w - z * (the column's weights over the taps inside the image: all of K, or where a position's
window reaches into the padding, a rectangle of taps, summed ahead for every rectangle). The padding loads 0, not
z: masked loads that fill a value other than 0 cost the pipelined copies (1.4-2x slower on an H200). Then the
column's scale (the input's scale times the weight channel's), the bias in float32, and the epilogue
(codegen/epilogue.py) on the value rounded to the convolution's dtype; the outputs are channels-last.

Tile sizes are a tactic (`gemm.Config`, split-K unused): the planner times a few against the library step (the
dequantize and the float convolution, then the pointwise kernel) and keeps the fastest.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from torchkiln.errors import EngineInputError, NetworkError
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.cuda.codegen import PDL_PARAM, WAIT_LINES, chain_options, epilogue, launch
from torchkiln.runtime.backends.cuda.codegen.gemm import TILE_LINES, Config, GemmKernel, filling
from torchkiln.runtime.backends.cuda.codegen.pointwise import HEADER

KERNEL_NAME = "quantized_conv_kernel"
M_DIMS, N_DIM = (0, 2, 3), 1
MIN_DEPTH = 32  # K block of the int8 and fp8 tensor-core instructions
MAX_DEPTH = 128  # K block at most (128 bytes of int8 or fp8 a row)
# The tiles timed for every convolution (before `candidates` narrows them): the fastest four of 15 (tile shapes,
# stages, warps) over 23 bottleneck-block convolutions (1x1 and 3x3, strides 1 and 2, 64-2048 channels, 56x56 to
# 7x7 maps, batch 32; int8, H200; scripts/bench_quant_conv.py): 128x128 and 128x64 tiles won on large maps, 64x64
# with K blocks of 128 on small maps of many channels (a 3x3 of 512 channels over 7x7: 20 us against 38 for 128x128);
# 128x256 tiles of 8 warps never won (2-4x slower on the 1x1 convolutions)
BASES = (Config(128, 128, 64, 4, 4), Config(128, 64, 64, 4, 4), Config(64, 128, 64, 4, 4), Config(64, 64, 128, 4, 4))
# The tiles timed for a 1x1 convolution of stride 1, which runs as the generated quantized GEMM (codegen/gemm.py):
# the best three of 10 over the 13 such convolutions of bottleneck blocks (64-2048 channels, 56x56 to 7x7 maps,
# batch 32, with their epilogues; int8, H200), within 1% of all ten together (557 against 552 us a network)
POINTWISE_BASES = (Config(128, 64, 128, 3, 4), Config(64, 64, 128, 4, 4), Config(128, 128, 128, 3, 4))
MIN_FAST_CHANNELS = 16  # input channels a convolution needs for post-training quantization to pick this kernel


def quantized_conv_layer(layer: L.Layer) -> str | None:
    """None if `layer` is a convolution this kernel computes (`convolution_form`, a quantized kernel); else why not.
    The caller checks that its input is a per-tensor dequantize (quant_kernels.quantized_convolutions)."""
    why = convolution_form(layer)
    if why is None and layer.kernel_type is None:
        return "its kernel is not quantized"
    return why


def convolution_form(layer: L.Layer) -> str | None:
    """None if `layer` is a convolution of the form this kernel computes (2-D, of a batched input, one group, not
    transposed), quantized or not; else why not."""
    if not isinstance(layer, L.ConvolutionLayer):
        return f"{layer.KIND} is not a convolution"
    if layer.transposed or layer.weights["kernel"].dim() != 4 or layer.inputs[0].rank != 4:
        return "only a 2-D convolution of a batched input"
    if layer.groups != 1:
        return "only a convolution of one group"
    return None


def worth_quantizing(layer: L.Layer) -> str | None:
    """None if post-training quantization should quantize `layer` for this kernel: of its form, with at least
    `MIN_FAST_CHANNELS` input channels; else why not. With fewer, K is walked flat and its loads gather single bytes:
    a 7x7 stride-2 image stem of 3 channels at [32,3,224,224] took 258 us against cuDNN's 110 in half precision
    (H200), so it stays in float."""
    why = convolution_form(layer)
    if why is None and layer.weights["kernel"].shape[1] < MIN_FAST_CHANNELS:
        return f"{layer.weights['kernel'].shape[1]} input channels (a kernel of fewer than {MIN_FAST_CHANNELS} is " \
               f"slower than the half-precision library's)"
    return why


def flat(in_channels: int, block_k: int) -> bool:
    """Whether K is walked as one index (`FLAT`): input channels fewer than one block."""
    return in_channels < block_k


def candidates(m: int, n: int, k: int, in_channels: int, sms: int, pointwise: bool = False) -> list[Config]:
    """The tiles worth timing for a convolution of `m` output positions, `n` output channels and `k` = taps x input
    channels: the `BASES` (`POINTWISE_BASES` for a `pointwise` one, a GEMM) narrowed to the product (K blocks no
    deeper than the input channels, but `MIN_DEPTH` at least; two pipeline stages where K is one block: more only
    hold idle shared memory), then the tile `gemm.filling` sizes to the GPU's `sms` multiprocessors where the
    product has few tiles (a late stage, batch 1).
    """
    depth = max(MIN_DEPTH, min(MAX_DEPTH, _pow2(in_channels)))
    found: list[Config] = []
    for base in POINTWISE_BASES if pointwise else BASES:
        block_k = min(base.block_k, depth)
        tile = Config(min(base.block_m, max(16, _pow2(m))), min(base.block_n, max(16, _pow2(n))), block_k,
                      base.stages if _k_blocks(k, in_channels, block_k) > 1 else 2, base.warps)
        if tile not in found:
            found.append(tile)
    small = filling(found[0], m, n, k, sms)
    small = Config(small.block_m, small.block_n, max(MIN_DEPTH, min(small.block_k, depth)), small.stages,
                   small.warps)
    blocks = {(c.block_m, c.block_n, c.block_k) for c in found}
    if sms and (small.block_m, small.block_n, small.block_k) not in blocks and \
            math.ceil(m / found[0].block_m) * math.ceil(n / found[0].block_n) < sms:
        found.append(small)
    return found


def _k_blocks(k: int, in_channels: int, block_k: int) -> int:
    """The iterations of the kernel's K loop: by tap, each tap's channels in blocks; flat, K in blocks."""
    if flat(in_channels, block_k):
        return -(-k // block_k)
    return k // in_channels * -(-in_channels // block_k)


def _pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


def generate(conv: L.ConvolutionLayer, layers: Sequence[L.Layer], inputs: Sequence[Tensor],
             outputs: Sequence[Tensor], zero_point: int) -> GemmKernel:
    """The kernel computing `outputs` from the convolution's output through the pointwise `layers` (`inputs`: their
    other inputs), reading the input's quantized values (of `zero_point`)."""
    why = quantized_conv_layer(conv)
    if why is not None:
        raise NetworkError(f"convolution layer {conv.name!r} is not a generated quantized convolution: {why}")
    b = epilogue.build(conv.outputs[0], layers, inputs, outputs)
    integer = conv.kernel_type == torch.int8
    params = ["x", "w", "bias", "col_scale", "col_sum", "rect_sum", *epilogue.pointer_params(b, outputs), "M", "N",
              "C", "H", "W", "OH", "OW", "x_n", "x_c", "x_h", "x_w", *epilogue.stride_params(b, outputs),
              "KH: tl.constexpr", "KW: tl.constexpr", "SH: tl.constexpr", "SW: tl.constexpr", "PH: tl.constexpr",
              "PW: tl.constexpr", "DH: tl.constexpr", "DW: tl.constexpr", "FLAT: tl.constexpr",
              "HAS_BIAS: tl.constexpr", "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr", "BLOCK_K: tl.constexpr",
              "GROUP_M: tl.constexpr", PDL_PARAM]
    zero = "0" if integer else "0.0"  # what masked loads give
    dot = "acc = tl.dot(a, bw, acc, out_dtype=tl.int32)" if integer else "acc = tl.dot(a, bw, acc)"
    body = [
        *WAIT_LINES,
        "pid = tl.program_id(0)",
        *TILE_LINES,
        "in_m = rm < M",
        "in_n = rn < N",
        "ow = rm % OW",
        "oh = (rm // OW) % OH",
        "ih0 = oh * SH - PH",
        "iw0 = ow * SW - PW",
        # each output position's window corner, in its image (the pointer of a tap is this plus the tap's offset)
        "corner = x + (rm // (OW * OH)).to(tl.int64) * x_n + ih0 * x_h + iw0 * x_w",
        "K = KH * KW * C",
        "w_col = w + rn[None, :].to(tl.int64) * K",
        "acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.int32)" if integer else
        "acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)",
        "if FLAT:",
        "    for k0 in range(0, K, BLOCK_K):",
        "        kk = k0 + rk",
        "        tap = kk // C",
        "        dh = (tap // KW) * DH",  # each column's tap, as offsets from the corner (1-D)
        "        dw = (tap % KW) * DW",
        "        ih = ih0[:, None] + dh[None, :]",
        "        iw = iw0[:, None] + dw[None, :]",
        "        ok = in_m[:, None] & (kk[None, :] < K) & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)",
        "        at = dh * x_h + dw * x_w + (kk % C) * x_c",
        f"        a = tl.load(corner[:, None] + at[None, :], mask=ok, other={zero})",
        f"        bw = tl.load(w_col + kk[:, None], mask=in_n[None, :] & (kk[:, None] < K), other={zero})",
        f"        {dot}",
        "else:",
        "    blocks = (C + BLOCK_K - 1) // BLOCK_K",
        "    for i in range(0, KH * KW * blocks):",
        "        tap = i // blocks",
        "        c = (i % blocks) * BLOCK_K + rk",
        "        dh = (tap // KW) * DH",
        "        dw = (tap % KW) * DW",
        "        ih = ih0 + dh",
        "        iw = iw0 + dw",
        "        ok = in_m & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)",
        "        a = tl.load(corner[:, None] + (dh * x_h + dw * x_w + c * x_c)[None, :],",
        f"                    mask=ok[:, None] & (c[None, :] < C), other={zero})",
        f"        bw = tl.load(w_col + (tap * C + c)[:, None], mask=in_n[None, :] & (c[:, None] < C), other={zero})",
        f"        {dot}",
        *(_zero_point_lines(zero_point) if zero_point else ()),
        "acc = acc.to(tl.float32) * tl.load(col_scale + rn, mask=in_n, other=0.0)[None, :]",
        "if HAS_BIAS:",
        "    acc = acc + tl.load(bias + rn, mask=in_n, other=0.0)[None, :]",
        "mask = in_m[:, None] & in_n[None, :]",
        "m64 = rm[:, None].to(tl.int64)",
        "n64 = rn[None, :].to(tl.int64)",
        *epilogue.tail(b, outputs),
    ]
    signature = ",\n        ".join(params)
    source = (f"# Generated by {__name__} from the engine's layers; do not edit.\n{HEADER}\n\n"
              f"@triton.jit(do_not_specialize=['M'])\n"
              f"def {KERNEL_NAME}(\n        {signature},\n):\n" + "".join(f"    {line}\n" for line in body))
    return GemmKernel(source, tuple(inputs), tuple(b.weights), tuple(outputs), 4)


def _zero_point_lines(zero_point: int) -> tuple[str, ...]:
    """Subtract zero_point x the weights of each position's taps inside the image. Without padding, every tap is:
    the column's sum. With it, the taps inside are a rectangle of rows [lo_h, hi_h) and columns [lo_w, hi_w) of the
    kernel, and `rect_sum` holds each rectangle's sums ([(KH + 1)^2 (KW + 1)^2, N]: one load a value)."""
    return (
        "if PH + PW > 0:",
        "    lo_h = tl.minimum(tl.where(ih0 < 0, (DH - 1 - ih0) // DH, 0), KH)",
        "    hi_h = tl.maximum(tl.where(ih0 > H - 1, 0, tl.minimum((H - 1 - ih0) // DH + 1, KH)), lo_h)",
        "    lo_w = tl.minimum(tl.where(iw0 < 0, (DW - 1 - iw0) // DW, 0), KW)",
        "    hi_w = tl.maximum(tl.where(iw0 > W - 1, 0, tl.minimum((W - 1 - iw0) // DW + 1, KW)), lo_w)",
        "    rect = ((lo_h * (KH + 1) + hi_h) * (KW + 1) + lo_w) * (KW + 1) + hi_w",
        "    inside = tl.load(rect_sum + rect[:, None] * N + rn[None, :], mask=in_m[:, None] & in_n[None, :], other=0)",
        "else:",
        "    inside = tl.load(col_sum + rn, mask=in_n, other=0)[None, :]",
        f"acc = acc - {zero_point} * inside",
    )


class QuantizedConvLauncher:
    """Runs a generated quantized convolution on CUDA tensors (or CPU tensors under Triton's interpreter)."""

    def __init__(self, kernel: GemmKernel, conv: L.ConvolutionLayer, config: Config, weight: torch.Tensor,
                 column_scale: torch.Tensor, bias: torch.Tensor | None, zero_point: int) -> None:
        """`weight`: the kernel's values in its type, [N, C, KH, KW]; `column_scale`: each output channel's scale
        (the input's times the kernel channel's); `bias` in float32 or None; `zero_point`: the input's, as
        `generate` was given it."""
        from torchkiln.runtime.backends.cuda.codegen.compile import load_source

        self.conv, self.config = conv, config
        self.in_channels = weight.shape[1]
        # the window's launch constants: taps, stride, padding, dilation (per dim) and the walk of K
        self.window = (*weight.shape[2:], *_pair(conv.stride), *_pair(conv.padding), *_pair(conv.dilation))
        self.flat = flat(self.in_channels, config.block_k)
        self.weight = weight.permute(0, 2, 3, 1).reshape(weight.shape[0], -1).contiguous()  # [N, (row, col, channel)]
        self.column_scale, self.bias = column_scale.float().contiguous(), bias
        # with a zero point: the column's weights summed, and over each rectangle of taps where there is padding
        # (`_zero_point_lines`); else nothing reads them
        self.column_sum = self.rect_sum = self.column_scale
        if zero_point:
            self.column_sum = column_sums(weight)
            if any(_pair(conv.padding)):
                self.rect_sum = _rectangle_sums(weight)
        self.epilogue = epilogue.Operands(kernel.inputs, kernel.weights, kernel.outputs, M_DIMS, N_DIM, True)
        self._fn = getattr(load_source(kernel.source), KERNEL_NAME)

    def __call__(self, x: torch.Tensor, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The epilogue's outputs for the convolution of `x` (quantized values, [N, C, H, W], any strides) and the
        epilogue's other `inputs`."""
        cfg = self.config
        if x.dim() != 4 or x.shape[1] != self.in_channels:
            raise EngineInputError(f"convolution {self.conv.name!r}: input of shape {list(x.shape)} for a kernel of "
                                   f"{self.in_channels} input channels")
        kh, kw, sh, sw, ph, pw, dh, dw = self.window
        oh = (x.shape[2] + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        ow = (x.shape[3] + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        if oh < 1 or ow < 1:
            raise EngineInputError(f"convolution {self.conv.name!r}: input of shape {list(x.shape)} is smaller than "
                                   f"its {kh}x{kw} window (dilation {dh}x{dw}, padding {ph}x{pw})")
        n = self.weight.shape[0]
        shape = (x.shape[0], n, oh, ow)
        operands, outputs, strides = self.epilogue.bind(inputs, shape, x.device)
        m = x.shape[0] * oh * ow
        if m <= 0 or n == 0:
            return outputs
        bias = self.column_scale if self.bias is None else self.bias
        tiles = -(-m // cfg.block_m) * -(-n // cfg.block_n)
        launch(self._fn, (tiles,), x, self.weight, bias, self.column_scale, self.column_sum, self.rect_sum, *operands,
               *outputs, m, n, x.shape[1], x.shape[2], x.shape[3], oh, ow, *x.stride(), *strides,
               KH=kh, KW=kw, SH=sh, SW=sw, PH=ph, PW=pw, DH=dh, DW=dw, FLAT=self.flat,
               HAS_BIAS=self.bias is not None, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
               GROUP_M=cfg.group_m, num_stages=cfg.stages, num_warps=cfg.warps, **chain_options())
        return outputs


def column_sums(weight: torch.Tensor) -> torch.Tensor:
    """Each output channel's kernel values (the quantized kernel, [N, ...]) summed, int32: what a zero point z takes
    from that column's integer sums, z times it, where every tap is inside the image."""
    return weight.reshape(weight.shape[0], -1).to(torch.int32).sum(1, dtype=torch.int32)


def _rectangle_sums(weight: torch.Tensor) -> torch.Tensor:
    """[(KH + 1)^2 (KW + 1)^2, N] int32: row ((lo_h (KH + 1) + hi_h) (KW + 1) + lo_w) (KW + 1) + hi_w holds each
    output channel's weights summed over the input channels and the taps of rows [lo_h, hi_h) and columns
    [lo_w, hi_w) (0 where a range is empty)."""
    n, _, kh, kw = weight.shape
    taps = weight.to(torch.int32).sum(1, dtype=torch.int32)  # [N, KH, KW]
    prefix = torch.zeros(n, kh + 1, kw + 1, dtype=torch.int32, device=weight.device)
    prefix[:, 1:, 1:] = taps.cumsum(1, dtype=torch.int32).cumsum(2, dtype=torch.int32)
    h, w = torch.arange(kh + 1, device=weight.device), torch.arange(kw + 1, device=weight.device)
    lo_h, hi_h, lo_w, hi_w = (v.reshape(shape) for v, shape in (
        (h, (-1, 1, 1, 1)), (h, (1, -1, 1, 1)), (w, (1, 1, -1, 1)), (w, (1, 1, 1, -1))))
    hi_h, hi_w = torch.maximum(hi_h, lo_h), torch.maximum(hi_w, lo_w)  # an empty range sums to 0
    sums = prefix[:, hi_h, hi_w] - prefix[:, lo_h, hi_w] - prefix[:, hi_h, lo_w] + prefix[:, lo_h, lo_w]
    return sums.reshape(n, -1).t().contiguous()


def _pair(values: Sequence[int]) -> tuple[int, int]:
    return (values[0], values[0]) if len(values) == 1 else (values[0], values[1])
