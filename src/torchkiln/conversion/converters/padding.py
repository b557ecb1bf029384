"""Padding converters: constant, reflection, replication and circular padding (torch.nn.functional.pad)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

_MODES = {"constant": L.PaddingMode.CONSTANT, "reflect": L.PaddingMode.REFLECT,
          "replicate": L.PaddingMode.REPLICATE, "circular": L.PaddingMode.CIRCULAR}


def _pad(ctx: ConversionCtx, x, pad, mode: L.PaddingMode, value: float = 0.0) -> Tensor:
    return ctx.network.add_padding(ctx.to_tensor(x), list(pad), mode, value).get_output()


def _exact_value(args: Args) -> str | None:
    value = args.value
    if value is not None and float(value) != value:
        return f"pad value {value} has no exact float representation"
    return None


@converter("aten::constant_pad_nd", capability=_exact_value)
def constant_pad_nd(ctx: ConversionCtx, args: Args) -> Tensor:
    return _pad(ctx, args.self, args.pad, L.PaddingMode.CONSTANT, args.value)


@converter("aten::reflection_pad1d", "aten::reflection_pad2d", "aten::reflection_pad3d")
def reflection_pad(ctx: ConversionCtx, args: Args) -> Tensor:
    return _pad(ctx, args.self, args.padding, L.PaddingMode.REFLECT)


@converter("aten::replication_pad1d", "aten::replication_pad2d", "aten::replication_pad3d")
def replication_pad(ctx: ConversionCtx, args: Args) -> Tensor:
    return _pad(ctx, args.self, args.padding, L.PaddingMode.REPLICATE)


@converter("aten::pad", capability=lambda args: None if args.mode in _MODES else f"unknown padding mode {args.mode!r}")
def pad(ctx: ConversionCtx, args: Args) -> Tensor:
    return _pad(ctx, args.self, args.pad, _MODES[args.mode], args.value or 0.0)
