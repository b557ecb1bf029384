"""Clamp converters: clamp, clamp_min, clamp_max with scalar or tensor bounds (and in place).

TorchScript writes torch.clip as aten::clamp, so clip needs no converter of its own."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.activation import bounds_problem, clip
from torchkiln.conversion.impl.inplace import register_inplace
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


def _scalar_bounds(args: Args) -> str | None:
    return bounds_problem(args.get("min"), args.get("max"))


@converter("aten::clamp", capability=_scalar_bounds)
def clamp(ctx: ConversionCtx, args: Args) -> Tensor:
    return clip(ctx, args.self, args.min, args.max)


@converter("aten::clamp_min", capability=_scalar_bounds)
def clamp_min(ctx: ConversionCtx, args: Args) -> Tensor:
    return clip(ctx, args.self, args.min, None)


@converter("aten::clamp_max", capability=_scalar_bounds)
def clamp_max(ctx: ConversionCtx, args: Args) -> Tensor:
    return clip(ctx, args.self, None, args.max)


def _tensor_bounds(args: Args) -> str | None:
    return None if args.get("min") is not None or args.get("max") is not None else "clamp needs min or max"


@converter("aten::clamp.Tensor", capability=_tensor_bounds)
def clamp_tensor(ctx: ConversionCtx, args: Args) -> Tensor:
    return clip(ctx, args.self, args.min, args.max)


@converter("aten::clamp_min.Tensor", "aten::clamp_max.Tensor")
def clamp_one_side(ctx: ConversionCtx, args: Args) -> Tensor:
    return clip(ctx, args.self, args.get("min"), args.get("max"))


register_inplace(clamp, "aten::clamp_", capability=_scalar_bounds)
register_inplace(clamp_min, "aten::clamp_min_", capability=_scalar_bounds)
register_inplace(clamp_max, "aten::clamp_max_", capability=_scalar_bounds)
register_inplace(clamp_tensor, "aten::clamp_.Tensor", capability=_tensor_bounds)
register_inplace(clamp_one_side, "aten::clamp_min_.Tensor", "aten::clamp_max_.Tensor")
