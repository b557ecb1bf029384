"""Slicing converters: select, slice, narrow, chunk, split, tensor_split (hsplit, vsplit, dsplit), unbind,
unfold."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import needs_static, normalize_dim
from torchkiln.conversion.impl.shuffle import permute, unsqueeze
from torchkiln.conversion.impl.slicing import meta_of, select, slice_dim, split_as
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.symbolic import decide
from torchkiln.ir.tensor import Tensor


@converter("aten::select.int")
def select_int(ctx: ConversionCtx, args: Args) -> Tensor:
    return select(ctx, ctx.to_tensor(args.self), args.dim, args.index)


@converter("aten::slice.Tensor")
def slice_tensor(ctx: ConversionCtx, args: Args) -> Tensor:
    return slice_dim(ctx, ctx.to_tensor(args.self), args.dim, args.start, args.end, args.step)


@converter("aten::narrow", "aten::narrow.Tensor", "aten::narrow_copy",
           capability=lambda args: needs_static(args, "start"))
def narrow(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    dim = normalize_dim(args.dim, x.rank)
    start = int(args.start)
    start = start + x.shape[dim] if start < 0 else start
    return slice_dim(ctx, x, dim, start, start + args.length)


@converter("aten::chunk", "aten::unsafe_chunk")
def chunk(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    x = ctx.to_tensor(args.self)
    return split_as(ctx, x, args.dim, meta_of(x, args.dim).chunk(args.chunks, args.dim))


@converter("aten::split.Tensor", "aten::split.sizes", "aten::split_with_sizes", "aten::split_copy.Tensor",
           "aten::split_with_sizes_copy", "aten::unsafe_split.Tensor", "aten::unsafe_split_with_sizes")
def split(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    x = ctx.to_tensor(args.self)
    return split_as(ctx, x, args.dim, torch.split(meta_of(x, args.dim), args[1], args.dim))


_SPLIT_DIM = {"aten::hsplit": lambda rank: 1 if rank > 1 else 0, "aten::vsplit": lambda rank: 0,
              "aten::dsplit": lambda rank: 2}


def _sections_ok(args: Args) -> str | None:
    found = args.get("tensor_indices_or_sections")
    if found is not None and not isinstance(found, torch.Tensor):
        return "sections or indices known only at run time"
    return None


@converter("aten::tensor_split.sections", "aten::tensor_split.indices", "aten::tensor_split.tensor_indices_or_sections",
           "aten::hsplit.int", "aten::hsplit.array", "aten::vsplit.int", "aten::vsplit.array", "aten::dsplit.int",
           "aten::dsplit.array", capability=_sections_ok)
def tensor_split(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    """The pieces torch.tensor_split (or hsplit, vsplit, dsplit: along dims 1 (0 for 1-d), 0, 2) gives."""
    x, how = ctx.to_tensor(args.self), args[1]
    kind = args.node.kind()
    if kind in _SPLIT_DIM:
        dim = _SPLIT_DIM[kind](x.rank)
        split = getattr(torch, kind.removeprefix("aten::"))
        pieces = split(meta_of(x, dim), how if isinstance(how, int) else list(how))
    else:
        dim = args.dim
        if isinstance(how, torch.Tensor):
            how = int(how) if how.dim() == 0 else how.tolist()
        pieces = torch.tensor_split(meta_of(x, dim), how, dim)
    return split_as(ctx, x, dim, pieces)


@converter("aten::unbind.int", "aten::unbind_copy.int")
def unbind(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    x = ctx.to_tensor(args.self)
    dim = normalize_dim(args.dim, x.rank)
    return [select(ctx, x, dim, i) for i in range(x.shape[dim])]


def _scatter_bounds(args: Args) -> tuple[int, int] | str:
    """(first, stop) of the slice slice_scatter / select_scatter writes, or why they are not static."""
    shape = args.self.shape
    dim = normalize_dim(args.dim, len(shape))
    if not isinstance(shape[dim], int):
        return _dynamic_scatter_bounds(args, shape[dim])
    if args.node.kind() == "aten::select_scatter":
        index = args.index
        if not isinstance(index, int) or not -shape[dim] <= index < shape[dim]:
            return f"index {index} is not a static index into a dim of size {shape[dim]}"
        index = index % shape[dim]
        return index, index + 1
    if any(not isinstance(v, (int, type(None))) for v in (args.start, args.end)) or args.step != 1:
        return "bounds known only at run time, or a step other than 1"
    first, stop, _ = slice(args.start, args.end, 1).indices(shape[dim])
    return first, max(first, stop)


def _dynamic_scatter_bounds(args: Args, size: object) -> tuple[int, object] | str:
    """(first, stop) in a dim of a size known only at run time, where the ranges settle them: a select at a static
    index the dim always holds, or a slice from a static start that it always holds to its end (functionalized
    `x[:, 1:] = y` writes all of dim 0 first, then dim 1 from 1)."""
    if args.node.kind() == "aten::select_scatter":
        index = args.index
        if isinstance(index, int) and index >= 0 and decide("lt", index, size) is True:
            return index, index + 1
    else:
        first = 0 if args.start is None else args.start
        if isinstance(first, int) and first >= 0 and args.step == 1 and decide("le", first, size) is True and (
                args.end is None or decide("ge", args.end, size) is True):
            return first, size
    return f"dim {args.dim} has a size known only at run time"


def _scatter_ok(args: Args) -> str | None:
    found = _scatter_bounds(args)
    return found if isinstance(found, str) else None


@converter("aten::slice_scatter", "aten::select_scatter", capability=_scatter_ok)
def slice_scatter(ctx: ConversionCtx, args: Args) -> Tensor:
    """self with self[first:stop] on `dim` replaced by src: the parts around it and src, concatenated."""
    x = ctx.to_tensor(args.self)
    src = ctx.to_tensor(args.src, x.dtype)
    dim = normalize_dim(args.dim, x.rank)
    first, stop = _scatter_bounds(args)
    if src.rank < x.rank:  # select_scatter: src lacks the selected dim
        src = unsqueeze(ctx, src, dim)
    to_end = stop == x.shape[dim]  # (a dynamic dim: the same symbolic size)
    parts = ([slice_dim(ctx, x, dim, 0, first)] if first > 0 else []) + [src] \
        + ([] if to_end else [slice_dim(ctx, x, dim, stop, None)])
    return parts[0] if len(parts) == 1 else ctx.network.add_concatenation(parts, dim).get_output()


def _unfold_ok(args: Args) -> str | None:
    shape = args.self.shape
    if not shape:
        return "a 0-d tensor"
    size = shape[normalize_dim(args.dimension, len(shape))]
    return None if isinstance(size, int) and size >= args.size else f"windows of {args.size} in a dim of size {size}"


@converter("aten::unfold", "aten::unfold_copy", capability=_unfold_ok)
def unfold(ctx: ConversionCtx, args: Args) -> Tensor:
    """Windows of `size` every `step` along `dimension`: that dim counts the windows, a new last dim holds each."""
    x = ctx.to_tensor(args.self)
    dim = normalize_dim(args.dimension, x.rank)
    starts = torch.arange(0, x.shape[dim] - args.size + 1, args.step)
    index = ctx.to_tensor(starts.unsqueeze(1) + torch.arange(args.size).unsqueeze(0))
    windows = ctx.network.add_gather(x, index, dim, L.GatherMode.DEFAULT).get_output()  # [..., n, size, ...]
    perm = [d for d in range(x.rank + 1) if d != dim + 1] + [dim + 1]
    return permute(ctx, windows, perm)
