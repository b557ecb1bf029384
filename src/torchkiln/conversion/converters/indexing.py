"""Indexing converters: index (advanced indexing), index_select, gather, scatter, take_along_dim,
combinations, index_fill, index_copy and take (constant
indices)."""
from __future__ import annotations

import itertools
import math

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.indexing import advanced_index, mask_to_indices, select_by_mask
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.conversion.impl.tiling import expand
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.torchscript import TensorMeta


def _run_time_mask(args: Args) -> bool:
    """x[mask]: one run-time bool index, first, and no other."""
    first = args.indices[0] if args.indices else None
    return isinstance(first, (Tensor, TensorMeta)) and first.dtype == torch.bool


def _index_capability(args: Args) -> str | None:
    if _run_time_mask(args):
        mask, x = args.indices[0], args.self
        if len(args.indices) > 1 or tuple(mask.shape) != tuple(x.shape[:len(mask.shape)]):
            return "a run-time boolean mask with other indices, or not of the indexed dims' shape"
        return None
    for index in args.indices:
        if isinstance(index, (Tensor, TensorMeta)) and index.dtype in (torch.bool, torch.uint8):
            return "a run-time boolean mask after the first index, or of dtype uint8"
        if index is not None and index.dtype.is_floating_point:
            return "index tensors must be integer or boolean"
    return None


@converter("aten::index.Tensor", capability=_index_capability)
def index(ctx: ConversionCtx, args: Args) -> Tensor:
    if _run_time_mask(args):
        return select_by_mask(ctx, ctx.to_tensor(args.self), args.indices[0])
    return advanced_index(ctx, ctx.to_tensor(args.self), mask_to_indices(args.indices))


@converter("aten::index_select")
def index_select(ctx: ConversionCtx, args: Args) -> Tensor:
    x, index = ctx.to_tensor(args.self), ctx.to_tensor(args.index)
    if index.rank == 0:
        index = reshape(ctx, index, [1])
    if x.rank == 0:  # torch picks the 0-d tensor itself by its one index 0 (a 1-element index)
        picked = ctx.network.add_gather(reshape(ctx, x, [1]), index, 0, L.GatherMode.DEFAULT).get_output()
        return reshape(ctx, picked, [])
    return ctx.network.add_gather(x, index, normalize_dim(args.dim, x.rank), L.GatherMode.DEFAULT).get_output()


def _int64(ctx: ConversionCtx, index: Tensor) -> Tensor:
    """torch also takes int32 indices; the element gather and scatter layers take int64."""
    return index if index.dtype == torch.int64 else ctx.network.add_cast(index, torch.int64).get_output()


@converter("aten::gather")
def gather(ctx: ConversionCtx, args: Args) -> Tensor:
    x, index = ctx.to_tensor(args.self), _int64(ctx, ctx.to_tensor(args.index))
    if x.rank == 0 or index.rank == 0:  # torch takes a 0-d self or index as 1-d; the result has the index's shape
        dim = normalize_dim(args.dim, 1)
        flat = [reshape(ctx, t, [1]) if t.rank == 0 else t for t in (x, index)]
        picked = ctx.network.add_gather(flat[0], flat[1], dim, L.GatherMode.ELEMENT).get_output()
        return reshape(ctx, picked, list(index.shape))
    return ctx.network.add_gather(x, index, normalize_dim(args.dim, x.rank), L.GatherMode.ELEMENT).get_output()


@converter("aten::scatter.src", "aten::scatter.value")
def scatter(ctx: ConversionCtx, args: Args) -> Tensor:
    x, index = ctx.to_tensor(args.self), _int64(ctx, ctx.to_tensor(args.index))
    if "src" in args.names:
        updates = ctx.to_tensor(args.src)
    else:  # one value everywhere the index points, in self's dtype
        updates = expand(ctx, ctx.to_tensor(args.value, x.dtype), index.shape)
    return ctx.network.add_scatter(x, index, updates, normalize_dim(args.dim, x.rank)).get_output()


def _constant_indices_in(index: object, size: object, why_constant: str = "") -> str | None:
    """None if `index` is a constant tensor of indices in [0, `size`) (a static size), else why not."""
    if not isinstance(index, torch.Tensor) or not isinstance(size, int):
        return f"indices known only at run time{why_constant}"
    if index.numel() and not bool(((index >= 0) & (index < size)).all()):
        return f"indices outside [0, {size})"
    return None


def _take_along_dim_ok(args: Args) -> str | None:
    shape = args.self.shape
    size = math.prod(shape) if args.dim is None else shape[normalize_dim(args.dim, len(shape))]
    return _constant_indices_in(args.indices, size, " (eager wraps negative ones in its own way)")


@converter("aten::take_along_dim", capability=_take_along_dim_ok)
def take_along_dim(ctx: ConversionCtx, args: Args) -> Tensor:
    """gather along `dim` of constant in-range indices, after broadcasting self and indices on the other dims (dim
    None: of the flattened self)."""
    x, index = ctx.to_tensor(args.self), args.indices
    if args.dim is None:
        x, dim = reshape(ctx, x, [-1]), 0
        index = ctx.to_tensor(index.reshape(-1).to(torch.int64))
    else:
        dim = normalize_dim(args.dim, x.rank)
        index = ctx.to_tensor(index.to(torch.int64))
        others = torch.broadcast_shapes(*([1 if d == dim else s for d, s in enumerate(t.shape)] for t in (x, index)))
        x = expand(ctx, x, [x.shape[d] if d == dim else s for d, s in enumerate(others)])
        index = expand(ctx, index, [index.shape[d] if d == dim else s for d, s in enumerate(others)])
    return ctx.network.add_gather(x, index, dim, L.GatherMode.ELEMENT).get_output()


def _combinations_ok(args: Args) -> str | None:
    shape = args.self.shape
    if len(shape) != 1 or not isinstance(shape[0], int):
        return "not a 1-d input of static size"
    if args.r < 1 or (not args.with_replacement and args.r > shape[0]):
        return f"no combination of {args.r} of {shape[0]} elements (eager gives an empty tensor)"
    return None


@converter("aten::combinations", capability=_combinations_ok)
def combinations(ctx: ConversionCtx, args: Args) -> Tensor:
    """Rows of the elements at every combination of r indices, in itertools' order (as eager's)."""
    x = ctx.to_tensor(args.self)
    pick = itertools.combinations_with_replacement if args.with_replacement else itertools.combinations
    index = torch.tensor(list(pick(range(x.shape[0]), args.r)), dtype=torch.int64)
    return ctx.network.add_gather(x, ctx.to_tensor(index), 0, L.GatherMode.DEFAULT).get_output()


def _index_fill_ok(args: Args) -> str | None:
    index, shape = args.index, args.self.shape
    size = shape[normalize_dim(args.dim, len(shape))] if shape else 1
    if not isinstance(index, torch.Tensor) or not isinstance(size, int):
        return "indices known only at run time"
    if index.numel() and not bool(((index >= -size) & (index < size)).all()):
        return f"indices outside [-{size}, {size})"
    return None


@converter("aten::index_fill.int_Scalar", "aten::index_fill.int_Tensor", capability=_index_fill_ok)
def index_fill(ctx: ConversionCtx, args: Args) -> Tensor:
    """value where the index along `dim` is listed (negative ones counted from the end), self elsewhere."""
    x = ctx.to_tensor(args.self)
    if x.rank == 0:
        return ctx.to_tensor(args.value, x.dtype) if args.index.numel() else x
    dim = normalize_dim(args.dim, x.rank)
    mask = torch.zeros(x.shape[dim], dtype=torch.bool)
    mask[args.index.reshape(-1).to(torch.int64) % x.shape[dim]] = True
    mask = mask.reshape([x.shape[dim] if d == dim else 1 for d in range(x.rank)])
    value = ctx.to_tensor(args.value, x.dtype)
    return ctx.network.add_select(ctx.to_tensor(mask), value, x).get_output()


def _index_copy_ok(args: Args) -> str | None:
    found = _index_fill_ok(args)
    if found is not None:
        return found
    shape = args.self.shape
    size = shape[normalize_dim(args.dim, len(shape))] if shape else 1
    if args.index.numel() != len(set((args.index.reshape(-1) % size).tolist())):
        return "repeated indices (which source row eager keeps is unspecified)"
    return None if args.source.dtype == args.self.dtype else "a source of another dtype (eager raises)"


@converter("aten::index_copy", capability=_index_copy_ok)
def index_copy(ctx: ConversionCtx, args: Args) -> Tensor:
    """source's slice k where index[k] lists the position along `dim`, self elsewhere."""
    x, source = ctx.to_tensor(args.self), ctx.to_tensor(args.source)
    if x.rank == 0:
        return source if args.index.numel() else x
    dim = normalize_dim(args.dim, x.rank)
    size = x.shape[dim]
    where = (args.index.reshape(-1).to(torch.int64) % size).tolist()
    mask, pick = torch.zeros(size, dtype=torch.bool), torch.zeros(size, dtype=torch.int64)
    for k, position in enumerate(where):
        mask[position], pick[position] = True, k
    if source.rank == 0:
        source = reshape(ctx, source, [1])
    picked = ctx.network.add_gather(source, ctx.to_tensor(pick), dim, L.GatherMode.DEFAULT).get_output()
    mask = mask.reshape([size if d == dim else 1 for d in range(x.rank)])
    return ctx.network.add_select(ctx.to_tensor(mask), picked, x).get_output()


def _take_ok(args: Args) -> str | None:
    return _constant_indices_in(args.index, math.prod(args.self.shape))


@converter("aten::take", capability=_take_ok)
def take(ctx: ConversionCtx, args: Args) -> Tensor:
    """The flattened self gathered at the indices, in their shape."""
    flat = reshape(ctx, ctx.to_tensor(args.self), [-1])
    return ctx.network.add_gather(flat, ctx.to_tensor(args.index.to(torch.int64)), 0, L.GatherMode.DEFAULT).get_output()
