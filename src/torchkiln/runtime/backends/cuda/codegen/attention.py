"""A Triton kernel for scaled dot-product attention (a flash-attention forward), and its launcher: a candidate the
build times against SDPA's backends (`timing.attention_backend`).

One program computes a block of query rows of one (batch, head): it walks the keys in blocks, keeping each row's
running maximum and sum (the online softmax), so the scores are never written to memory. Products run on the
tensor cores with float32 accumulation; the probabilities are rounded to the value dtype before they weight the
values, as SDPA's fused kernels do. Query, key, value, mask and output are read and written through their strides
(run-time arguments), so the heads of a projection's output, split by views and permutes, are read in place, and
a mask broadcast over batch, heads or query rows (stride 0) is never expanded.

Values are those of `torch.nn.functional.scaled_dot_product_attention`:
- the scale is `scale`, or 1 / sqrt(head dim);
- a boolean mask lets a key through where it is True, a floating mask is added to the scaled scores;
- `causal` lets query i see keys 0..i (top-left aligned, as SDPA's `is_causal`);
- with `enable_gqa`, query head h reads key and value head h // (query heads / key heads);
- a query row that sees no key gives zeros, as SDPA does.

Where it runs faster than SDPA's kernels: short sequences, where SDPA's fused kernels pay a workspace memset and
a slow launch per call (cuDNN's: 0.8 + 4 us of gaps before a 5.8 us kernel at [1,12,128,64] fp16, H200).
"""
from __future__ import annotations

import math

import torch

from torchkiln.errors import EngineInputError, NetworkError
from torchkiln.ir import layers as L
from torchkiln.runtime.backends.cuda.codegen import chain_options, have_triton, launch, needs_int64
from torchkiln.runtime.backends.cuda.codegen.pointwise import HEADER
from torchkiln.runtime.backends.cuda.codegen.reduction import COMBINE

KERNEL_NAME = "attention_kernel"
DTYPES = (torch.float16, torch.bfloat16)  # float32 stays on SDPA: Triton's float32 products are TF32
MASK_DTYPES = (torch.bool, torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 128  # a block of keys and values stays in registers up to here
LOG2E = 1.4426950408889634
CONFIGS = {"generated:64x64": (64, 64, 4), "generated:64x32": (64, 32, 4)}  # tactic -> BLOCK_M, BLOCK_N, warps
_KERNEL = '''
@triton.jit
def attention_kernel(
        q, k, v, mask, out, heads, group, q_len, k_len, head_dim, qk_scale,
        q_sb, q_sh, q_sl, q_sd, k_sb, k_sh, k_sl, k_sd, v_sb, v_sh, v_sl, v_sd,
        m_sb, m_sh, m_sl, m_sk, o_sb, o_sh, o_sl, o_sd,
        BOOL_MASK: tl.constexpr, ADD_MASK: tl.constexpr, CAUSAL: tl.constexpr, INT64: tl.constexpr,
        LOG2E: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        PDL: tl.constexpr = False,
):
    if PDL:
        gdc_wait()
    bh = tl.program_id(1)
    if INT64:
        bh = bh.to(tl.int64)
    b = bh // heads
    h = bh % heads
    kv_h = h // group
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    row_ok = rows < q_len
    d_ok = d < head_dim
    qt = tl.load(q + b * q_sb + h * q_sh + rows[:, None] * q_sl + d[None, :] * q_sd,
                 mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_base = k + b * k_sb + kv_h * k_sh
    v_base = v + b * v_sb + kv_h * v_sh
    m_base = mask + b * m_sb + h * m_sh + rows[:, None] * m_sl
    top = tl.full([BLOCK_M], -INF, tl.float32)
    total = tl.full([BLOCK_M], 0.0, tl.float32)
    acc = tl.full([BLOCK_M, BLOCK_D], 0.0, tl.float32)
    end = k_len
    if CAUSAL:
        end = tl.minimum(k_len, (tl.program_id(0) + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        col_ok = cols < k_len
        kt = tl.load(k_base + cols[:, None] * k_sl + d[None, :] * k_sd, mask=col_ok[:, None] & d_ok[None, :],
                     other=0.0)
        s = tl.dot(qt, tl.trans(kt)) * qk_scale
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= rows[:, None])
        if BOOL_MASK:
            allowed = tl.load(m_base + cols[None, :] * m_sk, mask=row_ok[:, None] & col_ok[None, :], other=0)
            keep = keep & (allowed != 0)
        if ADD_MASK:
            s += tl.load(m_base + cols[None, :] * m_sk, mask=row_ok[:, None] & col_ok[None, :],
                         other=0.0).to(tl.float32) * LOG2E
        s = tl.where(keep, s, -INF)
        new_top = tl.maximum(top, tl.reduce(s, 1, _max))
        shift = tl.where(new_top == -INF, 0.0, new_top)
        p = tl.exp2(s - shift[:, None])
        scale = tl.exp2(top - shift)
        total = total * scale + tl.reduce(p, 1, _sum)
        vt = tl.load(v_base + cols[:, None] * v_sl + d[None, :] * v_sd, mask=col_ok[:, None] & d_ok[None, :],
                     other=0.0)
        acc = acc * scale[:, None] + tl.dot(p.to(vt.dtype), vt)
        top = new_top
    result = tl.where(total[:, None] > 0.0, acc / tl.where(total > 0.0, total, 1.0)[:, None], 0.0)
    tl.store(out + b * o_sb + h * o_sh + rows[:, None] * o_sl + d[None, :] * o_sd,
             result.to(out.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
'''
SOURCE = f"# Generated by {__name__}; do not edit.\n{HEADER}{COMBINE}{_KERNEL}"


def supported(layer: L.AttentionLayer, shapes: list[tuple[int, ...]]) -> str | None:
    """None if `layer` at input `shapes` runs in the generated kernel, else why not."""
    if not have_triton():
        return "Triton is not installed"
    q, k, v = layer.inputs[:3]
    if len(shapes) < 3 or any(len(s) != 4 for s in shapes[:3]):
        return "query, key and value are not [batch, heads, length, head dim]"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"dtypes {q.dtype}, {k.dtype}, {v.dtype}: the kernel runs float16 or bfloat16"
    (b, h, _, dim), (kb, kh, kl, kd), (vb, vh, vl, vd) = shapes[:3]
    if dim != kd or vd != dim:
        return f"head dims {dim}, {kd}, {vd}: the kernel needs one head dim"
    if not 1 <= dim <= MAX_HEAD_DIM:
        return f"head dim {dim} is over {MAX_HEAD_DIM}"
    if (kb, kl) != (vb, vl) or kb != b or kh != vh or kh == 0 or h % kh or (kh != h and not layer.enable_gqa):
        return f"key and value {list(shapes[1])} and {list(shapes[2])} do not pair with query {list(shapes[0])}"
    if len(layer.inputs) > 3:
        if layer.inputs[3].dtype not in MASK_DTYPES:
            return f"mask dtype {layer.inputs[3].dtype}"
        if len(shapes[3]) > 4:
            return f"mask of rank {len(shapes[3])}"
    return None


class Attention:
    """Runs an attention layer on CUDA tensors (or on CPU tensors under Triton's interpreter), with the tile of
    `config` (a key of CONFIGS)."""

    def __init__(self, layer: L.AttentionLayer, config: str) -> None:
        from torchkiln.runtime.backends.cuda.codegen.compile import load_source

        if not have_triton():
            raise NetworkError(f"attention layer {layer.name!r} cannot run in the generated kernel: Triton is not "
                               f"installed")
        self.layer = layer
        self.block_m, self.block_n, self.warps = CONFIGS[config]
        self._fn = getattr(load_source(SOURCE), KERNEL_NAME)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
                 ) -> torch.Tensor:
        """SDPA of `q`, `k` and `v` ([batch, heads, length, head dim], any strides) and `mask` (broadcast to
        [batch, heads, query length, key length]); the output is [batch, heads, length, head dim] over memory in
        [batch, length, heads, head dim] order, as SDPA's fused kernels write it."""
        b, h, q_len, dim = q.shape
        k_len = k.shape[2]
        if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype or k.shape[3] != dim or \
                v.shape[2:] != (k_len, dim) or k.shape[1] == 0 or h % k.shape[1]:
            raise EngineInputError(f"attention layer {self.layer.name!r}: query {list(q.shape)} {q.dtype}, key "
                                   f"{list(k.shape)} {k.dtype} and value {list(v.shape)} {v.dtype} do not pair")
        out = torch.empty((b, q_len, h, dim), dtype=q.dtype, device=q.device).transpose(1, 2)
        if out.numel() == 0:
            return out
        boolean = mask is not None and mask.dtype == torch.bool
        if mask is not None:
            mask = mask.expand(b, h, q_len, k_len)
            mask = mask.view(torch.uint8) if boolean else mask
        m_strides = mask.stride() if mask is not None else (0, 0, 0, 0)
        scale = self.layer.scale if self.layer.scale is not None else 1.0 / math.sqrt(dim)
        wide = needs_int64(q, k, v, out, *(() if mask is None else (mask,)))
        grid = (-(-q_len // self.block_m), b * h)
        launch(self._fn, grid, q, k, v, mask if mask is not None else q, out, h, h // k.shape[1], q_len, k_len, dim,
               scale * LOG2E, *q.stride(), *k.stride(), *v.stride(), *m_strides, *out.stride(),
               BOOL_MASK=boolean, ADD_MASK=mask is not None and not boolean, CAUSAL=self.layer.causal,
               INT64=wide, LOG2E=LOG2E,
               BLOCK_M=self.block_m, BLOCK_N=self.block_n, BLOCK_D=max(16, 1 << (dim - 1).bit_length()),
               num_warps=self.warps, **chain_options())
        return out
