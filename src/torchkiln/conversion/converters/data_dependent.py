"""Converters of ops whose output size depends on the data: nonzero (and as_tuple), masked_select, unique,
unique_consecutive (and boolean-mask indexing, in indexing.py). Their layers define that size as a symbol bound when
they run (an output allocator), so the ops after them stay in the same engine."""
from __future__ import annotations

import torch

from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.indexing import broadcast_shape, select_by_mask
from torchkiln.conversion.impl.tiling import expand
from torchkiln.ir.tensor import Tensor


@converter("aten::nonzero")
def nonzero(ctx: ConversionCtx, args: Args) -> Tensor:
    return ctx.network.add_non_zero(ctx.to_tensor(args.self)).get_output()


def _has_dims(args: Args) -> str | None:
    return None if len(args.self.shape) else "nonzero(as_tuple=True) of a 0-d tensor (torch reads it as 1-d)"


@converter("aten::nonzero_numpy", capability=_has_dims)
def nonzero_numpy(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    """nonzero(as_tuple=True): the index columns, one tensor per dim."""
    indices = ctx.network.add_non_zero(ctx.to_tensor(args.self)).get_output()
    return [ctx.network.add_gather(indices, ctx.to_tensor(torch.tensor(d)), 1).get_output()
            for d in range(indices.shape[1])]


def _bool_mask(args: Args) -> str | None:
    return None if args.mask.dtype == torch.bool else f"a mask of dtype {args.mask.dtype} (torch takes bool)"


@converter("aten::masked_select", capability=_bool_mask)
def masked_select(ctx: ConversionCtx, args: Args) -> Tensor:
    x, mask = ctx.to_tensor(args.self), ctx.to_tensor(args.mask)
    shape = broadcast_shape([x.shape, mask.shape])
    return select_by_mask(ctx, expand(ctx, x, shape), expand(ctx, mask, shape))


def _unique_outputs(ctx: ConversionCtx, x: Tensor, consecutive: bool, inverse: bool, counts: bool) -> tuple:
    """values, inverse and counts; one not asked for is empty, as torch gives it."""
    layer = ctx.network.add_unique(x, consecutive=consecutive)
    empty = torch.empty(0, dtype=torch.int64)
    return (layer.get_output(0), layer.get_output(1) if inverse else ctx.to_tensor(empty),
            layer.get_output(2) if counts else ctx.to_tensor(empty))


# sorted=False lets torch return the distinct values in any order; its CPU and CUDA kernels sort them anyway (every
# dtype, checked on torch 2.13), and so does the unique layer.
@converter("aten::_unique2")
def unique2(ctx: ConversionCtx, args: Args) -> tuple:
    return _unique_outputs(ctx, ctx.to_tensor(args.self), False, args.return_inverse, args.return_counts)


@converter("aten::_unique")
def unique(ctx: ConversionCtx, args: Args) -> tuple:
    return _unique_outputs(ctx, ctx.to_tensor(args.self), False, args.return_inverse, False)[:2]


def _no_dim(args: Args) -> str | None:
    return None if args.dim is None else "unique_consecutive along a dim (its slices, not its elements)"


@converter("aten::unique_consecutive", capability=_no_dim)
def unique_consecutive(ctx: ConversionCtx, args: Args) -> tuple:
    return _unique_outputs(ctx, ctx.to_tensor(args.self), True, args.return_inverse, args.return_counts)
