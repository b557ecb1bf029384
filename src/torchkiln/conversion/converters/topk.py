"""Selection converters: max/min along a dim (values and indices), argmax/argmin, topk, and sort and msort whose
indices are not read (sorted values are one answer whatever the order among ties)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.reduce import top_one
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
