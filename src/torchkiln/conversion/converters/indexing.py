"""Indexing converters: index (advanced indexing), index_select, gather, scatter."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.impl.indexing import advanced_index, mask_to_indices
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.conversion.impl.tiling import expand
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.torchscript import TensorMeta


def _index_capability(args: Args) -> str | None:
    for index in args.indices:
        if isinstance(index, (Tensor, TensorMeta)) and index.dtype in (torch.bool, torch.uint8):
            return "a run-time boolean mask gives a data-dependent shape"
        if index is not None and index.dtype.is_floating_point:
            return "index tensors must be integer or boolean"
    return None


@converter("aten::index.Tensor", capability=_index_capability)
def index(ctx: ConversionCtx, args: Args) -> Tensor:
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


@converter("aten::gather")
def gather(ctx: ConversionCtx, args: Args) -> Tensor:
    x, index = ctx.to_tensor(args.self), ctx.to_tensor(args.index)
    if index.dtype != torch.int64:  # torch also takes int32 indices; the element gather layer takes int64
        index = ctx.network.add_cast(index, torch.int64).get_output()
    return ctx.network.add_gather(x, index, normalize_dim(args.dim, x.rank), L.GatherMode.ELEMENT).get_output()


@converter("aten::scatter.src", "aten::scatter.value")
def scatter(ctx: ConversionCtx, args: Args) -> Tensor:
    x, index = ctx.to_tensor(args.self), ctx.to_tensor(args.index)
    if "src" in args.names:
        updates = ctx.to_tensor(args.src)
    else:  # one value everywhere the index points, in self's dtype
        updates = expand(ctx, ctx.to_tensor(args.value, x.dtype), index.shape)
    return ctx.network.add_scatter(x, index, updates, normalize_dim(args.dim, x.rank)).get_output()
