"""Slicing converters: select, slice, narrow, chunk, split, unbind."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import needs_static, normalize_dim
from torchkiln.conversion.impl.slicing import meta_of, select, slice_dim, split_as
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


@converter("aten::select.int")
def select_int(ctx: ConversionCtx, args: Args) -> Tensor:
    return select(ctx, ctx.to_tensor(args.self), args.dim, args.index)


@converter("aten::slice.Tensor")
def slice_tensor(ctx: ConversionCtx, args: Args) -> Tensor:
    return slice_dim(ctx, ctx.to_tensor(args.self), args.dim, args.start, args.end, args.step)


@converter("aten::narrow", "aten::narrow.Tensor", capability=lambda args: needs_static(args, "start"))
def narrow(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    dim = normalize_dim(args.dim, x.rank)
    start = int(args.start)
    start = start + x.shape[dim] if start < 0 else start
    return slice_dim(ctx, x, dim, start, start + args.length)


@converter("aten::chunk")
def chunk(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    x = ctx.to_tensor(args.self)
    return split_as(ctx, x, args.dim, meta_of(x, args.dim).chunk(args.chunks, args.dim))


@converter("aten::split.Tensor", "aten::split.sizes", "aten::split_with_sizes")
def split(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    x = ctx.to_tensor(args.self)
    return split_as(ctx, x, args.dim, torch.split(meta_of(x, args.dim), args[1], args.dim))


@converter("aten::unbind.int")
def unbind(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    x = ctx.to_tensor(args.self)
    dim = normalize_dim(args.dim, x.rank)
    return [select(ctx, x, dim, i) for i in range(x.shape[dim])]
