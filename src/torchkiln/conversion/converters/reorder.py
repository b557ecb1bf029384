"""Reordering converters: flip, fliplr, flipud, roll, rot90 and fftshift/ifftshift (of real
tensors), as slices and concatenations."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim, normalize_dims
from torchkiln.conversion.impl.shuffle import permute, reshape
from torchkiln.conversion.impl.slicing import slice_dim
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


@converter("aten::flip")
def flip(ctx: ConversionCtx, args: Args) -> Tensor:
    return _flip(ctx, ctx.to_tensor(args.self), list(args.dims))


def _rank_at_least(rank: int):
    def check(args: Args) -> str | None:
        return None if len(args.self.shape) >= rank else f"the tensor has fewer than {rank} dims (eager raises)"

    return check


@converter("aten::fliplr", capability=_rank_at_least(2))
def fliplr(ctx: ConversionCtx, args: Args) -> Tensor:
    return _flip(ctx, ctx.to_tensor(args.self), [1])


@converter("aten::flipud", capability=_rank_at_least(1))
def flipud(ctx: ConversionCtx, args: Args) -> Tensor:
    return _flip(ctx, ctx.to_tensor(args.self), [0])


def _flip(ctx: ConversionCtx, x: Tensor, dims: list[int]) -> Tensor:
    if x.rank == 0:  # torch flips a 0-d tensor along dim 0 or -1: itself
        return x
    dims = [d for d in normalize_dims(dims, x.rank) if x.shape[d] > 1] if dims else []
    if not dims:
        return x
    starts, strides = [0] * x.rank, [1] * x.rank
    for d in dims:
        starts[d], strides[d] = x.shape[d] - 1, -1
    return ctx.network.add_slice(x, starts, x.shape, strides).get_output()


def _roll(ctx: ConversionCtx, x: Tensor, shift: int, dim: int) -> Tensor:
    size = x.shape[dim]
    shift = shift % size if size else 0
    if shift == 0:
        return x
    tail, head = slice_dim(ctx, x, dim, size - shift, size), slice_dim(ctx, x, dim, 0, size - shift)
    return ctx.network.add_concatenation([tail, head], dim).get_output()


@converter("aten::roll")
def roll(ctx: ConversionCtx, args: Args) -> Tensor:
    x, shifts, dims = ctx.to_tensor(args.self), list(args.shifts), list(args.dims)
    if not dims:  # roll the flattened tensor
        return reshape(ctx, _roll(ctx, reshape(ctx, x, [-1]), shifts[0], 0), x.shape)
    for shift, dim in zip(shifts, dims):
        x = _roll(ctx, x, shift, normalize_dim(dim, x.rank))
    return x


@converter("aten::rot90")
def rot90(ctx: ConversionCtx, args: Args) -> Tensor:
    """k quarter turns in the plane of `dims` (from the first dim towards the second), as ATen flips and transposes."""
    x, k = ctx.to_tensor(args.self), args.k % 4
    a, b = normalize_dims(args.dims, x.rank) if args.dims[0] % x.rank < args.dims[1] % x.rank else \
        reversed(normalize_dims(args.dims, x.rank))
    if k == 0:
        return x
    if k == 2:
        return _flip(ctx, x, [a, b])
    flipped = _flip(ctx, x, [b] if k == 1 else [a])
    perm = list(range(x.rank))
    perm[a], perm[b] = perm[b], perm[a]
    return permute(ctx, flipped, perm)


def _real(args: Args) -> str | None:
    return "a complex tensor" if args.self.dtype.is_complex else None


@converter("aten::fft_fftshift", "aten::fft_ifftshift", capability=_real)
def fftshift(ctx: ConversionCtx, args: Args) -> Tensor:
    """roll by n // 2 along each dim (ifftshift: by -(n // 2)); every dim where `dim` is None."""
    x = ctx.to_tensor(args.self)
    dims = list(range(x.rank)) if args.dim is None else normalize_dims(args.dim, x.rank)
    sign = -1 if args.node.kind() == "aten::fft_ifftshift" else 1
    for dim in dims:
        x = _roll(ctx, x, sign * (x.shape[dim] // 2), dim)
    return x
