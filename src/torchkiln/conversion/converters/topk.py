"""Selection converters: max/min along a dim (values and indices), argmax/argmin, topk, sort and msort whose
indices are not read (sorted values are one answer whatever the order among ties), median and nanmedian of every
element, cummax and cummin."""
from __future__ import annotations

import math

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.conversion.impl.reduce import reduce, top_one
from torchkiln.conversion.impl.shuffle import permute, reshape, unsqueeze
from torchkiln.conversion.impl.tiling import expand
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


_MAX_RUNNING = 1024  # cummax/cummin compare every pair along the dim: n^2 elements per row


def _running_ok(args: Args) -> str | None:
    shape = args.self.shape
    size = shape[normalize_dim(args.dim, len(shape))] if shape else 1
    if not args.self.dtype.is_floating_point or not isinstance(size, int) or size > _MAX_RUNNING:
        return f"not a floating tensor with a static dim of at most {_MAX_RUNNING} elements"
    return None


@converter("aten::cummax", "aten::cummin", capability=_running_ok)
def running_extreme(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor]:
    """values[i] = max (min) of x[:i + 1] along `dim`, NaN once one is seen; indices[i] = the last j <= i holding
    that value (the last NaN), as ATen's loop (x >= out, x <= out for cummin) keeps it."""
    x = ctx.to_tensor(args.self)
    if x.rank == 0:
        return x, ctx.to_tensor(torch.tensor(0))
    dim = normalize_dim(args.dim, x.rank)
    order = [d for d in range(x.rank) if d != dim] + [dim]
    last = permute(ctx, x, order)  # [..., n]
    n = x.shape[dim]
    pairs = expand(ctx, unsqueeze(ctx, last, last.rank - 1), [*last.shape[:-1], n, n])  # [..., i, j] = x[j]
    j = torch.arange(n)
    before = ctx.to_tensor(j.unsqueeze(0) <= j.unsqueeze(1))  # j <= i
    is_max = args.node.kind() == "aten::cummax"
    outside = ctx.to_tensor(torch.tensor(-math.inf if is_max else math.inf, dtype=x.dtype))
    values = reduce(ctx, ctx.network.add_select(before, pairs, outside).get_output(),
                    L.ReduceOperation.MAX if is_max else L.ReduceOperation.MIN, last.rank, False)
    target = unsqueeze(ctx, values, last.rank)  # [..., i, 1]
    nan = L.UnaryOperation.ISNAN
    same = binary(ctx, binary(ctx, pairs, target, L.ElementWiseOperation.EQUAL),
                  binary(ctx, unary(ctx, pairs, nan), unary(ctx, target, nan), L.ElementWiseOperation.AND),
                  L.ElementWiseOperation.OR)
    holds = binary(ctx, same, before, L.ElementWiseOperation.AND)
    index = ctx.network.add_select(holds, ctx.to_tensor(j), ctx.to_tensor(torch.tensor(-1))).get_output()
    indices = reduce(ctx, index, L.ReduceOperation.MAX, last.rank, False)
    back = [order.index(d) for d in range(x.rank)]
    return permute(ctx, values, back), permute(ctx, indices, back)
