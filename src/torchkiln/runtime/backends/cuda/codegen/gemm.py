"""A Triton GEMM whose epilogue is a generated pointwise group: `epilogue(x @ W.T + bias)` in one kernel.

The product is a 2-D [M, N] = [M, K] @ [K, N] over views of the operands: a linear layer's input [..., K] is [M, K]
with M its leading dims; a 1x1 convolution (stride 1, no padding, one group) is the same product over the channels
of a channels-last input, M = batch x height x width. The accumulator is float32 (half-precision operands only);
the bias is added in float32 before the product is rounded to its dtype, as the library GEMM's output is; the
pointwise layers after it are the epilogue (codegen/epilogue.py).

Tile sizes are a tactic (`Config`): the planner times a few against the library GEMM followed by the pointwise
kernel, at the opt shape, and keeps the fastest.

A quantized product (a matrix multiply of a dequantized int8 or fp8 activation by a dequantized constant weight,
post-training quantization's Q/DQ form) runs on the quantized values: int8 x int8 into an int32 accumulator, or fp8
e4m3 x fp8 e4m3 into float32, then times each column's scale (the activation's scale times the weight's channel
scale) and plus the bias in float32, then the epilogue. (Quantizing the float activation as the kernel loads it was
measured and dropped: a 12-layer, 768-wide encoder's GEMMs over 4096 tokens took 3.7 ms against 1.3 ms reading the
quantized activation on an H100; the quantize joins the kernel that makes the activation instead.) A quantized 1x1
convolution (stride 1, no padding, one group) is the same quantized product over a channels-last input's channels,
its input's zero point subtracted as the zero point times each column's weight sum (codegen/quantized_conv.py runs
the other quantized convolutions).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.errors import EngineInputError, NetworkError
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.cuda.codegen import (PDL_PARAM, WAIT_LINES, chain_options, epilogue, launch,
                                                     launches_recorded)
from torchkiln.runtime.backends.cuda.codegen.epilogue import strides_2d
from torchkiln.runtime.backends.cuda.codegen.pointwise import HEADER, Builder

KERNEL_NAME = "gemm_epilogue_kernel"
SHARED_BYTES = 192 << 10  # the half-precision operand tiles a program's pipeline may hold (an H100 has 227 KiB)
MAX_SPLIT = 16  # the most programs one output tile's K is split over
SMS = 132  # multiprocessors of an H100 or H200: `candidates` fills this many unless told the device's own
DTYPES = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Config:
    """One tile configuration: the block sizes, software-pipelining stages and warps of a program."""

    block_m: int
    block_n: int
    block_k: int
    stages: int
    warps: int
    group_m: int = 8
    split_k: int = 1  # programs sharing one output tile, each over a part of K (`_split`)

    def text(self) -> str:
        return ",".join(str(v) for v in dataclasses.astuple(self))

    @classmethod
    def parse(cls, text: str) -> Config:
        try:
            values = [int(v) for v in text.split(",")]
            return cls(*values)
        except (ValueError, TypeError):
            raise NetworkError(f"malformed GEMM tile configuration {text!r}") from None


def candidates(m: int, n: int, k: int, sms: int = SMS) -> list[Config]:
    """The tile configurations worth timing for an [m, k] @ [k, n] product. First the one fitted by its size: the
    fastest of 11 on an H100 over products of inverted-residual, bottleneck-convolution and encoder-FFN shapes, its
    N and K blocks no wider than the product (a narrow product gets taller blocks instead). Then, where they differ,
    the tile `filling` sizes to the product and the GPU's multiprocessors (`sms`), a split-K tile (`_split`) and a
    balanced one (`_balanced`). One to three per product: each is one more Triton compile in a cold build."""
    if m * n <= 1 << 20:
        base = Config(64, 32, 64, 4, 4) if n <= 1024 else Config(64, 64, 128, 3, 4)
    elif m * n <= 1 << 23:
        base = Config(64, 64, 32, 5, 2)
    else:
        base = Config(128, 128, 32, 4, 4) if n < 1024 else Config(128, 256, 64, 3, 8)
    block_n = min(base.block_n, max(16, _pow2(n)))
    block_k = min(base.block_k, max(16, _pow2(k)))
    block_m = min(256, base.block_m * base.block_n // block_n) if m * n > 1 << 20 else base.block_m
    warps = max(base.warps, 4) if block_m > base.block_m else base.warps
    fitted = dataclasses.replace(base, block_m=block_m, block_n=block_n, block_k=block_k, warps=warps)
    small = filling(fitted, m, n, k, sms)
    found = [fitted]
    for other in (small, _split(small, m, n, k, sms), _balanced(m, n, k)):
        if other is not None and other not in found:
            found.append(other)
    return found


def filling(config: Config, m: int, n: int, k: int, sms: int) -> Config:
    """`config` resized to the product and the GPU: M blocks no taller than the product, then the wider of the M and
    N blocks halved until the launch has `sms` programs or both are 16; K blocks as deep as the product up to 128
    while the pipeline's stages fit `SHARED_BYTES`; 2 warps below a 64 x 64 tile, 8 from 128 x 256. A small-M
    product (a CNN's late stages, or any network at batch 1) leaves most multiprocessors idle with the fitted
    tile. Timed beside it and the library on an H200, over the 33 1x1
    convolutions of an inverted-residual network with squeeze-excitation: this tile won 23 at batch 1 (the network
    0.457 -> 0.421 ms) and 14 at batch 32 (the library the other 19; 1.329 -> 1.294 ms)."""
    block_m, block_n = min(config.block_m, max(16, _pow2(m))), config.block_n
    while math.ceil(m / block_m) * math.ceil(n / block_n) < sms and (block_m > 16 or block_n > 16):
        if block_n >= block_m and block_n > 16:
            block_n //= 2
        else:
            block_m //= 2
    block_k = min(128, max(16, _pow2(k)))
    stages = 4 if block_k <= 64 else 3
    while (block_m + block_n) * block_k * 2 * stages > SHARED_BYTES and block_k > 16:
        block_k //= 2
    tile = block_m * block_n
    return Config(block_m, block_n, block_k, stages, 2 if tile < 64 * 64 else 4 if tile < 128 * 256 else 8)


def _balanced(m: int, n: int, k: int) -> Config | None:
    """For a product of over 2**20 outputs, 64 x 64 x 64 blocks in 4 warps and 4 stages (narrowed to the product),
    or None: the tile nearest the best of 11 tiles timed on an H200 over 1x1 convolutions of inverted-residual
    networks ([1568..100352, 24..1536] @ [24..1536, 128..1536]) and an encoder's feed-forward products, within 10%
    of it on all but one."""
    if m * n <= 1 << 20:
        return None
    return Config(min(64, max(16, _pow2(m))), min(64, max(16, _pow2(n))), min(64, max(16, _pow2(k))), 4, 4)


def _split(tile: Config, m: int, n: int, k: int, sms: int) -> Config | None:
    """`tile` (the filling one) with K split over programs, for a product of few output tiles and a long K (a
    squeeze-excitation's reduction [B, C] @ [C, C/4], a linear layer at batch 1), or None: as many parts as fill
    `sms` multiprocessors (`MAX_SPLIT` at most), each at least one block of K deep. The partial products meet in a
    float32 workspace; the program that finishes a tile last sums them in order and applies the epilogue, so the
    result does not depend on which program was last. [32, 1536] @ [1536, 64] on an H200: 5.2 us unsplit, 3.5 in 8
    parts."""
    tiles, blocks = math.ceil(m / tile.block_m) * math.ceil(n / tile.block_n), math.ceil(k / tile.block_k)
    split = min(MAX_SPLIT, sms // tiles, blocks)
    if split < 2:
        return None
    return dataclasses.replace(tile, split_k=math.ceil(blocks / math.ceil(blocks / split)))  # no part left empty


def quantized_candidates(m: int, n: int, k: int) -> list[Config]:
    """The tile configurations worth timing for a quantized product, narrowed to the product where it is smaller (K
    blocks of at least 32, the depth of the int8 and fp8 tensor-core instructions): the four that were fastest at
    least once of ten timed on an H100 (2026-11-27) over the int8 and fp8 products of an encoder's linear layers
    (M 4096; N x K 768 x 768, 3072 x 768, 768 x 3072, 2304 x 768), each with its GELU epilogue; and 128 x 128 in 8
    warps, the fastest of 27 for the [4096, 768] @ [768, 3072] product whose epilogue computes GELU (in 4 warps its
    registers spill: 42.5 against 38.9 us, H200); and 128 x 64, for a narrow product's last wave of tiles
    ([4096, 768] @ [768, 768]: 9.8 against 11.1 us, H200)."""
    found = []
    for base in (Config(128, 128, 128, 3, 4), Config(128, 256, 128, 3, 8), Config(128, 128, 64, 4, 4),
                 Config(128, 256, 64, 4, 8), Config(128, 128, 128, 3, 8), Config(128, 64, 128, 3, 4)):
        tile = dataclasses.replace(base, block_m=min(base.block_m, max(16, _pow2(m))),
                                   block_n=min(base.block_n, max(16, _pow2(n))),
                                   block_k=min(base.block_k, max(32, _pow2(k))))
        if tile not in found:
            found.append(tile)
    return found


def _pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


@dataclasses.dataclass(frozen=True)
class GemmKernel:
    """Generated source and what its launcher binds: the epilogue's other inputs (in launch order), the weights it
    reads (shaped to broadcast against the output) and its outputs. A quantized product has a second source,
    `described_source`, taking the operands and the epilogue's `described` parameters as tensor descriptors
    (`_source`); `params` names the epilogue's parameters in launch order."""

    source: str
    inputs: tuple[Tensor, ...]
    weights: tuple[torch.Tensor, ...]
    outputs: tuple[Tensor, ...]
    rank: int
    described_source: str | None = None
    described: tuple[str, ...] = ()
    params: tuple[str, ...] = ()


def _product_layout(product: L.Layer, quantized: bool = False) -> tuple[tuple[int, ...], int]:
    """(m_dims, n_dim) of the product's output, or NetworkError if the layer is not a GEMM this kernel runs."""
    why = quantized_gemm_layer(product) if quantized else gemm_layer(product)
    if why is not None:
        raise NetworkError(f"{product.KIND} layer {product.name!r} is not a generated GEMM: {why}")
    rank = product.outputs[0].rank
    if isinstance(product, L.ConvolutionLayer):
        return (0, 2, 3), 1
    return tuple(range(rank - 1)), rank - 1


def gemm_layer(layer: L.Layer) -> str | None:
    """None if `layer` is a product this kernel computes (x @ W.T [+ b] of a 2-D W, or a 1x1 convolution of
    stride 1, no padding and one group), in half precision; else why not."""
    out = layer.outputs[0]
    if out.dtype not in DTYPES:
        return f"dtype {out.dtype}: generated GEMMs are half precision"
    if isinstance(layer, L.MatrixMultiplyLayer):
        if any(t.dtype != out.dtype for t in layer.inputs):
            return "only an input and a weight of the product's dtype"
        return _linear_form(layer)
    if isinstance(layer, L.ConvolutionLayer):
        if layer.inputs[0].dtype != out.dtype:
            return "only an input of the convolution's dtype"
        return pointwise_conv(layer)
    return f"{layer.KIND} is not a matrix product"


def pointwise_conv(layer: L.Layer) -> str | None:
    """None if `layer` is a 1x1 convolution of stride 1, no padding and one group, of a batched 2-D input (a product
    over the channels of a channels-last input); else why not."""
    if not isinstance(layer, L.ConvolutionLayer):
        return f"{layer.KIND} is not a convolution"
    w = layer.weights["kernel"]
    if layer.transposed or w.dim() != 4 or tuple(w.shape[2:]) != (1, 1) or layer.groups != 1 or \
            any(s != 1 for s in layer.stride) or any(p != 0 for p in layer.padding) or layer.inputs[0].rank != 4:
        return "only a 1x1 convolution of stride 1, no padding and one group"
    return None


def generate(product: L.Layer, layers: Sequence[L.Layer], inputs: Sequence[Tensor],
             outputs: Sequence[Tensor], quant_type: torch.dtype | None = None, zero_point: int = 0) -> GemmKernel:
    """The kernel computing `outputs` from the product's output through the pointwise `layers` (the product's
    output is their first layer's input; `inputs` are the epilogue's other inputs); with `quant_type` (int8 or fp8
    e4m3), of a quantized product (`quantized_gemm_layer`) reading quantized operands, the activation's of
    `zero_point` (int8 only)."""
    _product_layout(product, quant_type is not None)
    # a half-precision product's activations divide approximately (pointwise.py, before HEADER); a quantized
    # product's epilogue keeps IEEE division, so its next layer's quantize reads the reference's values
    b = epilogue.build(product.outputs[0], layers, inputs, outputs, approximate_division=quant_type is None)
    described = () if quant_type is None else tuple(epilogue.described_params(b, product.outputs[0], inputs, outputs))
    return GemmKernel(_source(b, outputs, quant_type, zero_point), tuple(inputs), tuple(b.weights), tuple(outputs),
                      product.outputs[0].rank,
                      None if quant_type is None else _source(b, outputs, quant_type, zero_point, described),
                      described, tuple(epilogue.pointer_params(b, outputs)))


def quantized_gemm_layer(product: L.Layer) -> str | None:
    """None if `product` is a matrix multiply (`_linear_form`) or a convolution of a quantized kernel
    (`pointwise_conv`) this kernel computes on quantized operands; else why not. The caller checks the operands'
    dequantize layers (quant_kernels.quantized_matmuls and quantized_convolutions)."""
    if isinstance(product, L.ConvolutionLayer):
        return pointwise_conv(product) or (None if product.kernel_type is not None else "its kernel is not quantized")
    if not isinstance(product, L.MatrixMultiplyLayer):
        return f"{product.KIND} is not a matrix multiply"
    return _linear_form(product)


def _linear_form(mm: L.MatrixMultiplyLayer) -> str | None:
    """None if `mm` is x @ W.T of a rank >= 2 input, a 2-D weight and a bias of one value per column; else why not."""
    if mm.op0 != L.MatrixOperation.NONE or mm.op1 != L.MatrixOperation.TRANSPOSE:
        return "only x @ W.T"
    if mm.inputs[0].rank < 2 or mm.inputs[1].rank != 2:
        return "only an input of rank >= 2 times a 2-D weight"
    if "bias" in mm.weights and mm.weights["bias"].dim() > 1:
        return "only a bias of one value per output column"
    return None


# Program `pid`'s output tile: rows `rm`, columns `rn`, and the K offsets `rk` of a block. Programs of GROUP_M rows of
# blocks run together, so the weight tiles they share stay in L2.
TILE_LINES = (
    "grid_m = (M + BLOCK_M - 1) // BLOCK_M",
    "grid_n = (N + BLOCK_N - 1) // BLOCK_N",
    "in_group = GROUP_M * grid_n",
    "first_m = (pid // in_group) * GROUP_M",
    "rows = tl.minimum(grid_m - first_m, GROUP_M)",
    "pid_m = first_m + (pid % in_group) % rows",
    "pid_n = (pid % in_group) // rows",
    "rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)",
    "rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)",
    "rk = tl.arange(0, BLOCK_K)",
)

# A split program stores its partial tile, then counts itself in at its tile's counter; the last one to arrive
# (every other program's stores before its count, the barrier ordering the program's threads) sums the parts in
# order from L2 (`.cg`: no stale L1 lines), sets the counter back to 0 for the next launch, and alone stores the
# epilogue's outputs (the other programs' `in_m` is all false from here).
_SPLIT_LINES = (
    "if SPLIT_K > 1:",
    "    mn = M.to(tl.int64) * N",
    "    tile = rm[:, None].to(tl.int64) * N + rn[None, :]",
    "    tl.store(parts + pid_k * mn + tile, acc, mask=in_m & in_n)",
    "    tl.debug_barrier()",
    "    count = tl.atomic_add(counts + pid, 1)",
    "    in_m = in_m & (rm[:, None] * 0 + count == SPLIT_K - 1)",  # (Triton 3.9's interpreter mistypes tensor & scalar)
    "    acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)",
    "    for s in tl.static_range(SPLIT_K):",
    "        acc += tl.load(parts + s * mn + tile, mask=in_m & in_n, other=0.0, cache_modifier='.cg')",
    "    tl.store(counts + pid, 0, mask=count == SPLIT_K - 1)",
)


def _source(b: Builder, outputs: Sequence[Tensor], quant_type: torch.dtype | None = None, zero_point: int = 0,
            described: Sequence[str] | None = None) -> str:
    """The kernel's source; with `described` (a quantized product's), the one taking the operands `a` and `w` and the
    epilogue's parameters named in it as tensor descriptors over their 2-D views: tiles moved by the GPU's copy
    engine (TMA), no address or mask arithmetic for them, and no split K. Over the 1x1 convolutions of bottleneck
    blocks with their epilogues (int8, batch 32, H200) such a kernel took 416 us a network against 500 with the
    same tiles loaded and stored through pointers (cuDNN's half-precision ones: 530)."""
    scales = ["col_scale"] if quant_type is not None else []
    scales += ["col_sum"] if zero_point else []
    params = ["a", "w", "bias", *scales, *epilogue.pointer_params(b, outputs), "parts", "counts", "M", "N", "K",
              "a_m", "a_k", "w_n", "w_k", *epilogue.stride_params(b, outputs),
              "HAS_BIAS: tl.constexpr", "EVEN_K: tl.constexpr", "BLOCK_M: tl.constexpr", "BLOCK_N: tl.constexpr",
              "BLOCK_K: tl.constexpr", "GROUP_M: tl.constexpr", "SPLIT_K: tl.constexpr", PDL_PARAM]
    integer = quant_type == torch.int8
    body = [
        *WAIT_LINES,
        "pid = tl.program_id(0)",
        "pid_k = pid % SPLIT_K",  # the part of K this program sums (`_split`); 0 unsplit
        "pid = pid // SPLIT_K",
        *TILE_LINES,
        "in_m = rm[:, None] < M",
        "in_n = rn[None, :] < N",
        "acc = tl.full((BLOCK_M, BLOCK_N), 0, tl.int32)" if integer else
        "acc = tl.full((BLOCK_M, BLOCK_N), 0.0, tl.float32)",
    ]
    if described is not None:
        body += [
            "for k in range(0, (K + BLOCK_K - 1) // BLOCK_K):",
            "    x = a.load([pid_m * BLOCK_M, k * BLOCK_K])",
            "    y = w.load([pid_n * BLOCK_N, k * BLOCK_K])",
            "    acc = tl.dot(x, y.T, acc, out_dtype=tl.int32)" if integer else "    acc = tl.dot(x, y.T, acc)",
        ]
    else:
        body += _pointer_loop(integer)
    body += [
        *([f"acc = acc - {zero_point} * tl.load(col_sum + rn, mask=rn < N, other=0)[None, :]"] if zero_point else []),
        *(["acc = acc.to(tl.float32) * tl.load(col_scale + rn, mask=rn < N, other=0.0)[None, :]"]
          if quant_type is not None else []),
        "if HAS_BIAS:",
        "    acc = acc + tl.load(bias + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]",
        "mask = in_m & in_n",
        "m64 = rm[:, None].to(tl.int64)",
        "n64 = rn[None, :].to(tl.int64)",
    ]
    body += epilogue.tail(b, outputs, described or (), "pid_m * BLOCK_M, pid_n * BLOCK_N")
    signature = ",\n        ".join(params)
    return (f"# Generated by {__name__} from the engine's layers; do not edit.\n{HEADER}\n\n"
            f"@triton.jit(do_not_specialize=['M'])\n"
            f"def {KERNEL_NAME}(\n        {signature},\n):\n" + "".join(f"    {line}\n" for line in body))


def _pointer_loop(integer: bool) -> list[str]:
    """The K loop over pointers: this program's part of K (`_split`), then the split's sum (`_SPLIT_LINES`)."""
    return [
        "a_ptr = a + rm[:, None].to(tl.int64) * a_m + rk[None, :] * a_k",
        "w_ptr = w + rn[None, :].to(tl.int64) * w_n + rk[:, None] * w_k",
        "lo = 0",
        "hi = (K + BLOCK_K - 1) // BLOCK_K",
        "if SPLIT_K > 1:",
        "    per = (hi + SPLIT_K - 1) // SPLIT_K",
        "    lo = pid_k * per",
        "    hi = tl.minimum(lo + per, hi)",
        "    a_ptr += lo * BLOCK_K * a_k",
        "    w_ptr += lo * BLOCK_K * w_k",
        "for k in range(lo, hi):",
        "    if EVEN_K:",
        "        x = tl.load(a_ptr, mask=in_m, other=0.0)",
        "        y = tl.load(w_ptr, mask=in_n, other=0.0)",
        "    else:",
        "        left = K - k * BLOCK_K",
        "        x = tl.load(a_ptr, mask=in_m & (rk[None, :] < left), other=0.0)",
        "        y = tl.load(w_ptr, mask=in_n & (rk[:, None] < left), other=0.0)",
        "    acc = tl.dot(x, y, acc, out_dtype=tl.int32)" if integer else "    acc = tl.dot(x, y, acc)",
        "    a_ptr += BLOCK_K * a_k",
        "    w_ptr += BLOCK_K * w_k",
        *_SPLIT_LINES,
    ]


class GemmLauncher:
    """Runs a generated GEMM on CUDA tensors (or CPU tensors under Triton's interpreter) for one product layer."""

    def __init__(self, kernel: GemmKernel, product: L.Layer, config: Config,
                 column_scale: torch.Tensor | None = None, column_sum: torch.Tensor | None = None) -> None:
        """`column_scale`: a quantized product's scale of each output column; `column_sum`: its weight's sum over
        each output column's K values (int32), where the kernel was generated for a zero point."""
        from torchkiln.runtime.backends.cuda.codegen.compile import load_source

        self.config = config
        self.scales = tuple(t for t in (column_scale, column_sum) if t is not None)
        self.m_dims, self.n_dim = _product_layout(product, column_scale is not None)
        self.conv = isinstance(product, L.ConvolutionLayer)
        self.epilogue = epilogue.Operands(kernel.inputs, kernel.weights, kernel.outputs, self.m_dims, self.n_dim,
                                          self.conv)
        self._fn = getattr(load_source(kernel.source), KERNEL_NAME)
        self.kernel = kernel
        self._described_at = [kernel.params.index(name) for name in kernel.described]  # their launch positions
        self._described_fn: tuple[Any, Any] | None = None  # (the descriptor kernel, TensorDescriptor), on first use
        self._workspaces: dict[tuple[torch.device, int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                 inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The epilogue's outputs for the product of `x` and `weight` ([N, K], or a [N, K, 1, 1] kernel) plus
        `bias`, and the epilogue's other `inputs`."""
        cfg = self.config
        w = weight.reshape(weight.shape[0], -1)
        n, k = w.shape
        if self.conv:
            shape = (x.shape[0], n, x.shape[2], x.shape[3])
            k_dim = 1
        else:
            shape = (*x.shape[:-1], n)
            k_dim = x.dim() - 1
        if x.shape[k_dim] != k:
            raise EngineInputError(f"GEMM input of shape {list(x.shape)} does not fit a weight of shape "
                                   f"{list(weight.shape)}")
        a = strides_2d(x, x.shape, self.m_dims, k_dim)
        if a is None:
            x = self.epilogue.layout(x)
            a = strides_2d(x, x.shape, self.m_dims, k_dim)
        if bias is not None and tuple(bias.shape) != (n,):
            bias = bias.expand(n).contiguous()  # one value for every column
        operands, outputs, strides = self.epilogue.bind(inputs, shape, x.device)
        m = math.prod(shape) // n if n else 0
        if m == 0 or n == 0:
            return outputs
        tiles = _cdiv(m, cfg.block_m) * _cdiv(n, cfg.block_n)
        parts, counts = self._workspace(m, n, tiles, x.device) if cfg.split_k > 1 else (w, w)
        fn, x_arg, w_arg, bound = self._fn, x, w, [*operands, *outputs]
        described = self._described(x, w, a, m, n, k, bound, strides)
        if described is not None:
            fn, x_arg, w_arg, bound = described
        launch(
            fn, (tiles * cfg.split_k,), x_arg, w_arg, w if bias is None else bias, *self.scales, *bound,
            parts, counts, m, n, k, *a,
            w.stride(0), w.stride(1), *strides, HAS_BIAS=bias is not None, EVEN_K=k % cfg.block_k == 0,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
            SPLIT_K=cfg.split_k, num_stages=cfg.stages, num_warps=cfg.warps, **chain_options())
        return outputs

    def _described(self, x: torch.Tensor, w: torch.Tensor, a: tuple[int, int], m: int, n: int, k: int,
                   bound: list[torch.Tensor], strides: list[int]) -> tuple[Any, Any, Any, list[Any]] | None:
        """(the descriptor kernel, the operands' and the described parameters' descriptors, the other parameters)
        where the kernel has a descriptor source and every described view can be one (`_describable`); else None.
        Launches recorded for a tape take pointers (`launches_recorded`)."""
        if self.kernel.described_source is None or self.config.split_k > 1 or launches_recorded():
            return None
        cfg = self.config
        views = [(x, (m, k), a, (cfg.block_m, cfg.block_k)), (w, (n, k), tuple(w.stride()), (cfg.block_n, cfg.block_k))]
        views += [(bound[j], (m, n), (strides[2 * j], strides[2 * j + 1]), (cfg.block_m, cfg.block_n))
                  for j in self._described_at]
        if not all(_describable(t, stride) for t, _, stride, _ in views):
            return None
        if self._described_fn is None:
            from triton.tools.tensor_descriptor import TensorDescriptor

            from torchkiln.runtime.backends.cuda.codegen.compile import load_source

            self._described_fn = getattr(load_source(self.kernel.described_source), KERNEL_NAME), TensorDescriptor
        fn, descriptor = self._described_fn
        made = [descriptor(t, list(shape), list(stride), list(block)) for t, shape, stride, block in views]
        bound = list(bound)
        for j, desc in zip(self._described_at, made[2:]):
            bound[j] = desc
        return fn, made[0], made[1], bound

    def _workspace(self, m: int, n: int, tiles: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """A split-K launch's float32 partial products and its tiles' arrival counters (zero between launches: the
        last program of a tile resets its counter), made at the first launch of a product's shape and kept."""
        key = (device, m, n)
        found = self._workspaces.get(key)
        if found is None:
            found = self._workspaces[key] = (torch.empty(self.config.split_k * m * n, dtype=torch.float32,
                                                         device=device),
                                             torch.zeros(tiles, dtype=torch.int32, device=device))
        return found


def _describable(t: torch.Tensor, strides: tuple[int, int]) -> bool:
    """Whether a 2-D view of `t` of these (row, column) strides can be a tensor descriptor: columns contiguous, rows
    and the first element 16-byte aligned (the copy engine's conditions)."""
    size = t.element_size()
    return strides[1] == 1 and strides[0] * size % 16 == 0 and strides[0] > 0 and t.data_ptr() % 16 == 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)
