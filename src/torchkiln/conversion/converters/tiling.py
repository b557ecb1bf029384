"""Broadcasting and tiling converters: expand, expand_as, broadcast_to, repeat, repeat_interleave, meshgrid,
broadcast_tensors."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import needs_static, normalize_dim
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.conversion.impl.tiling import expand, meshgrid, repeat, repeat_each
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor


@converter("aten::expand", "aten::broadcast_to", "aten::expand_copy")
def expand_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    return expand(ctx, ctx.to_tensor(args.self), args.size)


@converter("aten::expand_as")
def expand_as(ctx: ConversionCtx, args: Args) -> Tensor:
    return expand(ctx, ctx.to_tensor(args.self), args.other.shape)


@converter("aten::repeat")
def repeat_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    return repeat(ctx, ctx.to_tensor(args.self), args.repeats)


def _interleave_capability(args: Args) -> str | None:
    reason = needs_static(args, "repeats")
    if reason:
        return reason
    repeats = args.repeats
    if isinstance(repeats, torch.Tensor) and repeats.dtype.is_floating_point:
        return "repeats must be integers"
    return None


@converter("aten::repeat_interleave.self_int", "aten::repeat_interleave.self_Tensor", capability=_interleave_capability)
def repeat_interleave(ctx: ConversionCtx, args: Args) -> Tensor:
    x, repeats = ctx.to_tensor(args.self), args.repeats
    if args.dim is None:
        x = reshape(ctx, x, [-1])
    dim = normalize_dim(args.dim if args.dim is not None else 0, x.rank)
    if isinstance(repeats, torch.Tensor) and repeats.numel() == 1:
        repeats = int(repeats.item())
    if isinstance(repeats, int):
        return repeat_each(ctx, x, dim, repeats)
    # one count per element: gather each index as often as it repeats
    index = torch.repeat_interleave(torch.arange(x.shape[dim]), repeats.cpu().to(torch.int64))
    return ctx.network.add_gather(x, ctx.to_tensor(index), dim, L.GatherMode.DEFAULT).get_output()


@converter("aten::meshgrid", "aten::meshgrid.indexing")
def meshgrid_converter(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    return meshgrid(ctx, [ctx.to_tensor(t) for t in args.tensors], args.get("indexing") or "ij")


def _static_shapes(args: Args) -> str | None:
    if any(not isinstance(d, int) for t in args.tensors for d in t.shape):
        return "a dim known only at run time"
    return None


@converter("aten::broadcast_tensors", capability=_static_shapes)
def broadcast_tensors(ctx: ConversionCtx, args: Args) -> list[Tensor]:
    """Each tensor expanded to the operands' broadcast shape."""
    tensors = [ctx.to_tensor(t) for t in args.tensors]
    shape = torch.broadcast_shapes(*(t.shape for t in tensors))
    return [expand(ctx, t, shape) for t in tensors]
