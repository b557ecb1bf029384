"""Resizing converters: upsample_* (nearest, nearest-exact, linear, bilinear, bicubic, trilinear) and grid_sampler.

F.interpolate keeps `size` and `scale_factor` apart because they sample differently: with scale factors
the source coordinates use 1/scale, not input/output size. A resize layer says which one it uses.
"""
from __future__ import annotations

import math

from torchkiln.conversion.context import ConversionCtx
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor

_MODES = {
    "upsample_nearest": "nearest", "_upsample_nearest_exact": "nearest-exact", "upsample_linear": "linear",
    "upsample_bilinear": "bilinear", "upsample_bicubic": "bicubic", "upsample_trilinear": "trilinear",
}
_OPS = [("upsample_nearest", 1), ("upsample_nearest", 2), ("upsample_nearest", 3), ("_upsample_nearest_exact", 1),
        ("_upsample_nearest_exact", 2), ("_upsample_nearest_exact", 3), ("upsample_linear", 1),
        ("upsample_bilinear", 2), ("upsample_bicubic", 2), ("upsample_trilinear", 3)]
_PLAIN = [f"aten::{name}{nd}d" for name, nd in _OPS]
_VEC = [f"{op}.vec" for op in _PLAIN]


def _mode(args: Args) -> str:
    return _MODES[args.node.kind().removeprefix("aten::")[:-2]]


def _resize(ctx: ConversionCtx, args: Args, size, scales) -> Tensor:
    return ctx.network.add_resize(ctx.to_tensor(args[0]), _mode(args), size=size, scales=scales,
                                  align_corners=args.get("align_corners")).get_output()


@converter(*_VEC)
def upsample_vec(ctx: ConversionCtx, args: Args) -> Tensor:
    if args.output_size is not None:
        return _resize(ctx, args, args.output_size, None)
    return _resize(ctx, args, None, args.scale_factors)


def _plain_scales(args: Args) -> list[float] | None:
    """The scales to resize with, None to resize to output_size; raises ValueError when neither is exact."""
    scales = [args[name] for name in args.names if name.startswith("scales")]
    if args.get("align_corners") or all(s is None for s in scales):
        return None  # align_corners samples by sizes only
    spatial = args.self.shape[-len(scales):]
    if any(s is None for s in scales) or any(math.floor(i * s) != o for i, s, o in zip(spatial, scales,
                                                                                      args.output_size)):
        raise ValueError(f"output_size {list(args.output_size)} with scales {scales}: a resize is by size or by "
                         f"scale factors, and these scales do not give this size")
    return scales


def _plain_ok(args: Args) -> str | None:
    try:
        _plain_scales(args)
    except ValueError as e:
        return str(e)
    return None


@converter(*_PLAIN, capability=_plain_ok)
def upsample(ctx: ConversionCtx, args: Args) -> Tensor:
    scales = _plain_scales(args)
    return _resize(ctx, args, args.output_size if scales is None else None, scales)


_INTERPOLATION = ("bilinear", "nearest", "bicubic")
_PADDING = ("zeros", "border", "reflection")


def _grid_sampler_ok(args: Args) -> str | None:
    if args.interpolation_mode not in range(len(_INTERPOLATION)) or args.padding_mode not in range(len(_PADDING)):
        return f"unknown interpolation_mode {args.interpolation_mode} or padding_mode {args.padding_mode}"
    return None


@converter("aten::grid_sampler", "aten::grid_sampler_2d", "aten::grid_sampler_3d", capability=_grid_sampler_ok)
def grid_sampler(ctx: ConversionCtx, args: Args) -> Tensor:
    return ctx.network.add_grid_sample(ctx.to_tensor(args.input), ctx.to_tensor(args.grid),
                                       _INTERPOLATION[args.interpolation_mode], _PADDING[args.padding_mode],
                                       args.align_corners).get_output()
