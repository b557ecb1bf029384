"""Shape converters: view, reshape, flatten, permute, transpose."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.shuffle import permute, reshape
from torchkiln.conversion.registry import converter
from torchkiln.conversion.resolve import Args
from torchkiln.network.tensor import Tensor


@converter("aten::view", "aten::reshape")
def view(ctx: ConversionCtx, args: Args) -> Tensor:
    return reshape(ctx, ctx.to_tensor(args.self), args[1])


@converter("aten::flatten.using_ints")
def flatten(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    if x.rank == 0:
        return reshape(ctx, x, [1])
    start, end = normalize_dim(args.start_dim, x.rank), normalize_dim(args.end_dim, x.rank)
    merged = 1
    for d in x.shape[start:end + 1]:
        merged *= d
    return reshape(ctx, x, list(x.shape[:start]) + [merged] + list(x.shape[end + 1:]))


@converter("aten::permute")
def permute_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    return permute(ctx, x, [normalize_dim(d, x.rank) for d in args.dims])


@converter("aten::transpose.int")
def transpose(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    perm = list(range(x.rank))
    a, b = normalize_dim(args.dim0, x.rank), normalize_dim(args.dim1, x.rank)
    perm[a], perm[b] = perm[b], perm[a]
    return permute(ctx, x, perm)
