"""Creation converters: arange, full, zeros, ones (and their _like/new_ forms), eye, tensor, fill_, zero_.

Their values are known at build time; shape, dtype and device are those eager PyTorch gave
(shape analysis), so torch's dtype inference rules need no copy here.
"""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import functional_inplace, to_dtype
from torchkiln.conversion.impl.creation import arange, created_shape, eager_meta, filled
from torchkiln.conversion.impl.inplace import register_inplace
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.errors import ConversionError
from torchkiln.ir.symbolic import has_symbols
from torchkiln.ir.tensor import Tensor
from torchkiln.settings import SUPPORTED_INPUT_DTYPES
from torchkiln.torchscript import TensorMeta


def _static_data(args: Args) -> str | None:
    dtype = to_dtype(args.get("dtype"))
    if dtype is not None and dtype not in SUPPORTED_INPUT_DTYPES:
        return f"engines do not carry dtype {dtype}"
    return None


@converter("aten::arange", "aten::arange.start", "aten::arange.start_step", capability=_static_data)
def arange_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    start = args.get("start", 0)
    return arange(ctx, start, args.end, args.get("step", 1), eager_meta(ctx, args))


@converter("aten::full", "aten::full_like", "aten::new_full", capability=_static_data)
def full(ctx: ConversionCtx, args: Args) -> Tensor:
    meta = eager_meta(ctx, args)
    return filled(ctx, created_shape(ctx, args, meta), args.fill_value, meta.dtype)


@converter("aten::zeros", "aten::zeros_like", "aten::new_zeros", capability=_static_data)
def zeros(ctx: ConversionCtx, args: Args) -> Tensor:
    meta = eager_meta(ctx, args)
    return filled(ctx, created_shape(ctx, args, meta), 0, meta.dtype)


@converter("aten::ones", "aten::ones_like", "aten::new_ones", capability=_static_data)
def ones(ctx: ConversionCtx, args: Args) -> Tensor:
    meta = eager_meta(ctx, args)
    return filled(ctx, created_shape(ctx, args, meta), 1, meta.dtype)


@converter("aten::tensor", "aten::tensor.int", "aten::tensor.float", "aten::tensor.bool", capability=_static_data)
def tensor(ctx: ConversionCtx, args: Args) -> Tensor:
    meta = eager_meta(ctx, args)
    return ctx.to_tensor(torch.tensor(args[0], dtype=meta.dtype))


@converter("aten::eye", "aten::eye.m", capability=_static_data)
def eye(ctx: ConversionCtx, args: Args) -> Tensor:
    """An identity matrix of static size (BoTNet-style relative position logits build one per call)."""
    meta = eager_meta(ctx, args)
    if has_symbols(meta.shape):
        raise ConversionError(f"needs a static shape: eye of shape {meta.shape}")
    return ctx.to_tensor(torch.eye(*meta.shape, dtype=meta.dtype))


def _zero_dim_value(args: Args) -> str | None:
    value = args.value
    if isinstance(value, (Tensor, TensorMeta, torch.Tensor)) and len(value.shape) != 0:
        return "fill takes a 0-d tensor"
    return None


@converter("aten::fill.Scalar", "aten::fill.Tensor", capability=_zero_dim_value)
def fill(ctx: ConversionCtx, args: Args) -> Tensor:
    """A tensor like self holding value (lowering's functional form of fill_)."""
    x = ctx.to_tensor(args.self)
    return filled(ctx, x.shape, args.value, x.dtype)


@converter("aten::fill_.Scalar", "aten::fill_.Tensor",
           capability=lambda args: _zero_dim_value(args) or functional_inplace(args))
def fill_(ctx: ConversionCtx, args: Args) -> Tensor:
    return fill(ctx, args)


@converter("aten::zero")
def zero(ctx: ConversionCtx, args: Args) -> Tensor:
    """A tensor like self holding zeros (the functional form of zero_)."""
    x = ctx.to_tensor(args.self)
    return filled(ctx, x.shape, 0, x.dtype)


register_inplace(zero, "aten::zero_")
