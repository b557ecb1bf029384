"""Advanced indexing (x[idx0, :, idx2]) with torch's exact placement of the indexed dims."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary, select
from torchkiln.conversion.impl.shuffle import permute, unsqueeze
from torchkiln.conversion.impl.tiling import expand
from torchkiln.ir import layers as L
from torchkiln.ir.symbolic import is_symbolic
from torchkiln.ir.symbolic import broadcast_shapes, has_symbols
from torchkiln.ir.tensor import Tensor


def mask_to_indices(indices: Sequence[Any]) -> list[Any]:
    """Replace each (build-time) bool mask by the integer index tensors of its True positions, one per dim."""
    out: list[Any] = []
    for index in indices:
        if isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8):
            out.extend(index.bool().nonzero(as_tuple=True))
        else:
            out.append(index)
    return out


def broadcast_shape(shapes: Sequence[Sequence[int]]) -> list[int]:
    if has_symbols(list(shapes)):
        return list(broadcast_shapes(*shapes))
    return list(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))


def wrap_negative(ctx: ConversionCtx, index: Any, size: int) -> Tensor:
    """Indexing's meaning of an index in [-size, 0): index + size. Gather layers never wrap, so indexing
    wraps first; an index below -size stays as it is, for the gather to report."""
    dynamic = is_symbolic(size)
    if isinstance(index, torch.Tensor):
        index = index.to(torch.int64)
        if not bool((index < 0).any()):
            return ctx.to_tensor(index)
        if not dynamic:
            return ctx.to_tensor(torch.where((index < 0) & (index >= -size), index + size, index))
    index = ctx.to_tensor(index, torch.int64)
    # A dynamic size is an int64 tensor computed at run time (a Python scalar would become a float constant).
    size, minus_size = (ctx.to_tensor(size, torch.int64), ctx.to_tensor(-size, torch.int64)) if dynamic \
        else (size, -size)
    wraps = binary(ctx, binary(ctx, index, 0, L.ElementWiseOperation.LESS),
                   binary(ctx, index, minus_size, L.ElementWiseOperation.GREATER_EQUAL), L.ElementWiseOperation.AND)
    return select(ctx, wraps, binary(ctx, index, size, L.ElementWiseOperation.SUM), index)


def advanced_index(ctx: ConversionCtx, x: Tensor, indices: Sequence[Any]) -> Tensor:
    """x[indices] where each entry is None (the whole dim) or an integer index tensor (network or constant)."""
    indices = list(indices) + [None] * (x.rank - len(indices))
    picked = [d for d, index in enumerate(indices) if index is not None]
    tensors = [wrap_negative(ctx, indices[d], x.shape[d]) for d in picked]
    if len(picked) == 1:  # one index tensor: its dims replace the indexed dim where it was
        return ctx.network.add_gather(x, tensors[0], picked[0], L.GatherMode.DEFAULT).get_output()
    rest = [d for d in range(x.rank) if d not in picked]
    moved = permute(ctx, x, picked + rest) if picked != list(range(len(picked))) else x
    shape = broadcast_shape([t.shape for t in tensors])
    columns = [unsqueeze(ctx, expand(ctx, t, shape), len(shape)) for t in tensors]
    coordinates = ctx.network.add_concatenation(columns, len(shape)).get_output()
    out = ctx.network.add_gather(moved, coordinates, 0, L.GatherMode.ND).get_output()  # shape + rest dims
    adjacent = picked == list(range(picked[0], picked[-1] + 1))
    if not adjacent or picked[0] == 0:  # separated index tensors put the indexed dims first
        return out
    n, before = len(shape), picked[0]  # adjacent ones keep them where the indexed dims were
    order = list(range(n, n + before)) + list(range(n)) + list(range(n + before, out.rank))
    return permute(ctx, out, order)


def select_by_mask(ctx: ConversionCtx, x: Tensor, mask: Tensor) -> Tensor:
    """x[mask] for a run-time bool mask over x's leading dims (its shape is theirs): the elements or slices where it
    is true, in row-major order, [count] + x.shape[mask.rank:] (count is known once the engine runs)."""
    if mask.rank == 0:  # torch: a 0-d mask adds a dim, of size 1 or 0
        x, mask = unsqueeze(ctx, x, 0), ctx.network.add_shuffle(mask, reshape_dims=[1]).get_output()
    indices = ctx.network.add_non_zero(mask).get_output()
    return ctx.network.add_gather(x, indices, 0, L.GatherMode.ND).get_output()
