"""Selection converters: max/min along a dim (values and indices), argmax/argmin, topk, sort and msort whose
indices are not read (sorted values are one answer whatever the order among ties), median and nanmedian of every
element."""
from __future__ import annotations

import math

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.conversion.impl.reduce import reduce, top_one
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.conversion.impl.slicing import select
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

MAX, MIN = L.TopKOperation.MAX, L.TopKOperation.MIN


@converter("aten::max.dim")
def max_dim(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor]:
    return top_one(ctx, ctx.to_tensor(args.self), MAX, args.dim, args.keepdim)


@converter("aten::min.dim")
def min_dim(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor]:
    return top_one(ctx, ctx.to_tensor(args.self), MIN, args.dim, args.keepdim)


@converter("aten::argmax")
def argmax(ctx: ConversionCtx, args: Args) -> Tensor:
    return top_one(ctx, ctx.to_tensor(args.self), MAX, args.dim, args.keepdim)[1]


@converter("aten::argmin")
def argmin(ctx: ConversionCtx, args: Args) -> Tensor:
    return top_one(ctx, ctx.to_tensor(args.self), MIN, args.dim, args.keepdim)[1]


def _topk_ok(args: Args) -> str | None:
    if not args.sorted and args.k > 1:
        return "topk with sorted=False returns its values in an order only PyTorch's kernel defines"
    if args.k == 1 and args.node.outputsAt(1).uses():
        return "topk with k=1 picks among tied values an index only PyTorch's kernel defines"
    if args.k == 1 and not args.largest and args.self.dtype.is_floating_point:
        return "topk with k=1 and largest=False skips NaN, where an engine's k=1 minimum (torch.min) propagates it"
    return None


@converter("aten::topk", capability=_topk_ok)
def topk(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    x = ctx.to_tensor(args.self)
    layer = ctx.network.add_topk(x, MAX if args.largest else MIN, args.k, normalize_dim(args.dim, x.rank))
    return layer.outputs


def _sort_values_ok(args: Args) -> str | None:
    shape = args.self.shape
    if not shape:
        return "a 0-d tensor"
    if args.node.kind() == "aten::sort" and args.node.outputsAt(1).uses():
        return "its indices are read (among tied values their order is only PyTorch's kernel's)"
    size = shape[0 if args.node.kind() == "aten::msort" else normalize_dim(args.dim, len(shape))]
    return None if isinstance(size, int) else "a dim known only at run time"


@converter("aten::sort", "aten::sort.stable", "aten::msort", capability=_sort_values_ok)
def sort_values(ctx: ConversionCtx, args: Args) -> Tensor | list[Tensor]:
    """topk of the whole dim (ascending: the smallest first; NaN last as in sort)."""
    x = ctx.to_tensor(args.self)
    dim = 0 if args.node.kind() == "aten::msort" else normalize_dim(args.dim, x.rank)
    layer = ctx.network.add_topk(x, MAX if args.get("descending") else MIN, x.shape[dim], dim)
    return layer.outputs[0] if args.node.kind() == "aten::msort" else layer.outputs


def _median_ok(args: Args) -> str | None:
    numel = math.prod(args.self.shape)
    if not isinstance(numel, int) or numel == 0:
        return "an empty tensor or a size known only at run time"
    return None if args.self.dtype != torch.bool else "a bool tensor"


@converter("aten::median", "aten::nanmedian", capability=_median_ok)
def median(ctx: ConversionCtx, args: Args) -> Tensor:
    """The lower median of the sorted elements (NaN sorted last): median is NaN where any element is; nanmedian
    takes the lower median of the elements that are not NaN (NaN where all are)."""
    x = reshape(ctx, ctx.to_tensor(args.self), [-1])
    n = x.shape[0]
    ordered = ctx.network.add_topk(x, MIN, n, 0).outputs[0]
    nan = unary(ctx, x, L.UnaryOperation.ISNAN)
    if args.node.kind() == "aten::median":
        middle = select(ctx, ordered, 0, (n - 1) // 2)
        if not x.dtype.is_floating_point:
            return middle
        any_nan = reduce(ctx, nan, L.ReduceOperation.ANY, None, False)
        return ctx.network.add_select(any_nan, ctx.to_tensor(float("nan"), x.dtype), middle).get_output()
    count = binary(ctx, n, reduce(ctx, ctx.to_tensor(nan, torch.int64), L.ReduceOperation.SUM, None, False),
                   L.ElementWiseOperation.SUB)
    index = binary(ctx, binary(ctx, count, 1, L.ElementWiseOperation.SUB), 2, L.ElementWiseOperation.FLOOR_DIV)
    index = binary(ctx, index, 0, L.ElementWiseOperation.MAX)
    picked = ctx.network.add_gather(ordered, reshape(ctx, index, [1]), 0, L.GatherMode.DEFAULT).get_output()
    return reshape(ctx, picked, [])
