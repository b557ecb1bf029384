"""Concatenation converters: cat and stack (TorchScript emits torch.concat/concatenate as aten::cat), the atleast_Nd
reshapes and the stacks built on them (hstack, vstack/row_stack, dstack, column_stack),
block_diag and cartesian_prod."""
from __future__ import annotations

import functools

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim

from torchkiln.conversion.impl.shuffle import reshape, unsqueeze
from torchkiln.conversion.impl.tiling import meshgrid
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.symbolic import is_symbolic
from torchkiln.ir.tensor import Tensor


def _skipped_by_cat(t: Tensor) -> bool:
    """Eager cat leaves out a 1-d empty tensor (legacy), whatever the other tensors' rank; its dtype still counts."""
    return t.rank == 1 and not is_symbolic(t.shape[0]) and t.shape[0] == 0


@converter("aten::cat")
def cat(ctx: ConversionCtx, args: Args) -> Tensor:
    tensors = [ctx.to_tensor(t) for t in args.tensors]
    kept = [t for t in tensors if not _skipped_by_cat(t)]
    if kept and len(kept) < len(tensors):
        dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
        tensors = [t if t.dtype == dtype else ctx.network.add_cast(t, dtype).get_output() for t in kept]
    rank = max(t.rank for t in tensors)
    return ctx.network.add_concatenation(tensors, normalize_dim(args.dim, rank)).get_output()


@converter("aten::stack")
def stack(ctx: ConversionCtx, args: Args) -> Tensor:
    tensors = [ctx.to_tensor(t) for t in args.tensors]
    dim = normalize_dim(args.dim, tensors[0].rank + 1)
    return ctx.network.add_concatenation([unsqueeze(ctx, t, dim) for t in tensors], dim).get_output()


def at_least(ctx: ConversionCtx, x: Tensor, rank: int) -> Tensor:
    """torch.atleast_1d/2d/3d: a 0-d tensor becomes [1]*rank, a 1-d (n) (1, n) or (1, n, 1), a 2-d (m, n) (m, n, 1)."""
    if x.rank >= rank:
        return x
    if x.rank == 0:
        return reshape(ctx, x, [1] * rank)
    return reshape(ctx, x, [1, x.shape[0]] + [1] * (rank == 3) if x.rank == 1 else [*x.shape, 1])


def _at_least(rank: int):
    def convert(ctx: ConversionCtx, args: Args) -> Tensor | list[Tensor]:
        if "tensors" in args.names:
            return [at_least(ctx, ctx.to_tensor(t), rank) for t in args.tensors]
        return at_least(ctx, ctx.to_tensor(args.self), rank)

    return convert


for _rank in (1, 2, 3):
    converter(f"aten::atleast_{_rank}d", f"aten::atleast_{_rank}d.Sequence")(_at_least(_rank))


def _concatenated(ctx: ConversionCtx, tensors: list[Tensor], dim: int) -> Tensor:
    return ctx.network.add_concatenation(tensors, dim).get_output()


@converter("aten::hstack")
def hstack(ctx: ConversionCtx, args: Args) -> Tensor:
    tensors = [at_least(ctx, ctx.to_tensor(t), 1) for t in args.tensors]
    return _concatenated(ctx, tensors, 0 if tensors[0].rank == 1 else 1)


@converter("aten::vstack", "aten::row_stack")
def vstack(ctx: ConversionCtx, args: Args) -> Tensor:
    return _concatenated(ctx, [at_least(ctx, ctx.to_tensor(t), 2) for t in args.tensors], 0)


@converter("aten::dstack")
def dstack(ctx: ConversionCtx, args: Args) -> Tensor:
    return _concatenated(ctx, [at_least(ctx, ctx.to_tensor(t), 3) for t in args.tensors], 2)


@converter("aten::column_stack")
def column_stack(ctx: ConversionCtx, args: Args) -> Tensor:
    """0-d and 1-d tensors as columns (n, 1), then concatenated along dim 1."""
    tensors = [ctx.to_tensor(t) for t in args.tensors]
    return _concatenated(ctx, [reshape(ctx, t, [-1, 1]) if t.rank <= 1 else t for t in tensors], 1)


def _one_dtype_list(args: Args) -> str | None:
    dtypes = {t.dtype for t in args.tensors}
    return None if len(dtypes) == 1 else f"tensors of dtypes {sorted(map(str, dtypes))} (only one dtype)"


@converter("aten::block_diag", capability=_one_dtype_list)
def block_diag(ctx: ConversionCtx, args: Args) -> Tensor:
    """Each tensor (0-d: 1x1, 1-d: one row) on the diagonal of a matrix of zeros."""
    blocks = [ctx.to_tensor(t) for t in args.tensors]
    blocks = [reshape(ctx, t, [1, -1]) if t.rank < 2 else t for t in blocks]
    width = sum(t.shape[1] for t in blocks)
    rows, left = [], 0
    for t in blocks:
        parts = [torch.zeros(t.shape[0], left, dtype=t.dtype), t,
                 torch.zeros(t.shape[0], width - left - t.shape[1], dtype=t.dtype)]
        rows.append(_concatenated(ctx, [ctx.to_tensor(p) for p in parts if p.shape[1]], 1))
        left += t.shape[1]
    return _concatenated(ctx, rows, 0)


@converter("aten::cartesian_prod", capability=_one_dtype_list)
def cartesian_prod(ctx: ConversionCtx, args: Args) -> Tensor:
    """The rows of every combination of elements, the last tensor varying fastest (one tensor: itself)."""
    tensors = [ctx.to_tensor(t) for t in args.tensors]
    if len(tensors) == 1:
        return tensors[0]
    grids = meshgrid(ctx, tensors, "ij")
    return _concatenated(ctx, [reshape(ctx, g, [-1, 1]) for g in grids], 1)
