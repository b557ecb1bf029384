"""Normalization converters: batch norm (inference) as a per-channel scale; layer, group, instance and RMS norm."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import needs_static
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.conversion.impl.reduce import reduce
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

_AFFINE = ("weight", "bias")
_RUNNING = ("running_mean", "running_var")


def _running_stats_scale(ctx: ConversionCtx, args: Args) -> Tensor:
    """(x - running_mean) / sqrt(running_var + eps) * weight + bias, folded into one per-channel scale."""
    x = ctx.to_tensor(args.input)
    channels = x.shape[1]
    mean = args.running_mean.double()
    var = args.running_var.double()
    weight = args.weight.double() if args.weight is not None else torch.ones(channels, dtype=torch.float64)
    bias = args.bias.double() if args.bias is not None else torch.zeros(channels, dtype=torch.float64)
    scale = weight / torch.sqrt(var + args.eps)
    shift = bias - mean * scale
    dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    return ctx.network.add_scale(x, L.ScaleMode.CHANNEL, scale=scale.to(dtype), shift=shift.to(dtype)).get_output()


def _batch_norm_ok(args: Args) -> str | None:
    if args.training:
        return "batch norm with batch statistics (training=True)"
    if args.running_mean is None or args.running_var is None:
        return "batch norm without running statistics"
    return needs_static(args, *_AFFINE, *_RUNNING)


@converter("aten::batch_norm", capability=_batch_norm_ok)
def batch_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    return _running_stats_scale(ctx, args)


def _normalization(ctx: ConversionCtx, args: Args, kind: L.NormalizationKind, **params: object) -> Tensor:
    x = ctx.to_tensor(args.input)
    weight, bias = (None if w is None else w.to(x.dtype) for w in (args.weight, args.bias))
    return ctx.network.add_normalization(x, kind, args.eps, weight, bias, **params).get_output()


def _eps_ok(args: Args) -> str | None:
    if isinstance(args.eps, (int, float)) and args.eps < 0:
        return f"eps={args.eps} is negative (the normalization layer takes eps >= 0)"
    return None


def _normalization_ok(args: Args) -> str | None:
    return _eps_ok(args) or needs_static(args, *_AFFINE)


@converter("aten::layer_norm", capability=_normalization_ok)
def layer_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    return _normalization(ctx, args, L.NormalizationKind.LAYER, normalized_shape=args.normalized_shape)


@converter("aten::group_norm", capability=_normalization_ok)
def group_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    return _normalization(ctx, args, L.NormalizationKind.GROUP, num_groups=args.num_groups)


def _instance_norm_ok(args: Args) -> str | None:
    has_running = args.running_mean is not None or args.running_var is not None
    if args.use_input_stats and has_running:
        return "instance norm that updates its running statistics (use_input_stats=True with running stats)"
    if not args.use_input_stats and not (args.running_mean is not None and args.running_var is not None):
        return "instance norm with use_input_stats=False needs running statistics"
    return (_eps_ok(args) if args.use_input_stats else None) or needs_static(args, *_AFFINE, *_RUNNING)


@converter("aten::instance_norm", capability=_instance_norm_ok)
def instance_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    if not args.use_input_stats:
        return _running_stats_scale(ctx, args)
    return _normalization(ctx, args, L.NormalizationKind.INSTANCE)


def _rms_norm_ok(args: Args) -> str | None:
    dtypes = {args.input.dtype} | ({args.weight.dtype} if args.weight is not None else set())
    if dtypes != {torch.float32}:
        return f"dtypes {sorted(map(str, dtypes))} (only float32: eager computes half precision in float32)"
    return None


@converter("aten::rms_norm", capability=_rms_norm_ok)
def rms_norm(ctx: ConversionCtx, args: Args) -> Tensor:
    """x * rsqrt(mean(x^2 over the normalized dims) + eps) * weight; eps defaults to the dtype's epsilon."""
    x = ctx.to_tensor(args.input)
    dims = list(range(x.rank - len(args.normalized_shape), x.rank))
    eps = torch.finfo(x.dtype).eps if args.eps is None else args.eps
    mean_square = reduce(ctx, unary(ctx, x, L.UnaryOperation.SQUARE), L.ReduceOperation.AVG, dims, True)
    scale = unary(ctx, binary(ctx, mean_square, eps, L.ElementWiseOperation.SUM), L.UnaryOperation.RSQRT)
    out = binary(ctx, x, scale, L.ElementWiseOperation.PROD)
    return out if args.weight is None else binary(ctx, out, args.weight, L.ElementWiseOperation.PROD)
