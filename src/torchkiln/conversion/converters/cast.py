"""Dtype and copy converters: to, type_as, clone, copy, copy_, and the identities positive, resolve_conj,
resolve_neg, alias, alias_copy (lowering removes detach).

The engine runs on one device: `to` a different device stays in PyTorch. Memory formats change
strides, not values: engine tensors are contiguous whatever format was asked.
"""
from __future__ import annotations

from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import functional_inplace, to_dtype
from torchkiln.conversion.impl.tiling import expand
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor
from torchkiln.settings import SUPPORTED_INPUT_DTYPES
from torchkiln.torchscript import TensorMeta


def _target(args: Args) -> tuple[Any, torch.dtype | None]:
    """The (device, dtype) an aten::to overload asks for; None where it keeps the input's."""
    if "other" in args.names:
        return getattr(args.other, "device", None), args.other.dtype
    return args.get("device"), to_dtype(args.get("dtype"))


def _to_capability(args: Args) -> str | None:
    device, dtype = _target(args)
    if dtype is not None and dtype not in SUPPORTED_INPUT_DTYPES:
        return f"engines do not carry dtype {dtype}"
    here = getattr(args.self, "device", None)
    if device is not None and here is not None and not _same_device(torch.device(device), here):
        return f"it moves the tensor from {here} to {device}"
    return None


def _same_device(asked: torch.device, here: torch.device) -> bool:
    """`.to("cuda")` of a tensor on cuda:0 moves nothing where cuda:0 is the current device (no index: the current
    one, as PyTorch reads it). Decided at build: the engine runs on the device it was built for."""
    if asked.type != here.type:
        return False
    if asked.index is None and here.type == "cuda":
        return here.index == torch.cuda.current_device()
    return asked.index is None or asked.index == here.index


@converter("aten::to.dtype", "aten::to.dtype_layout", "aten::to.device", "aten::to.other", "aten::to.prim_Device",
           "aten::to.prim_dtype", capability=_to_capability)
def to(ctx: ConversionCtx, args: Args) -> Tensor:
    x = ctx.to_tensor(args.self)
    return ctx.to_tensor(x, _target(args)[1])


@converter("aten::type_as")
def type_as(ctx: ConversionCtx, args: Args) -> Tensor:
    return ctx.to_tensor(args.self, args.other.dtype)


@converter("aten::clone")
def clone(ctx: ConversionCtx, args: Args) -> Tensor:
    """Engine tensors are never aliased: a copy is the tensor itself."""
    return ctx.to_tensor(args.self)


def _real_self(args: Args) -> str | None:
    if args.self.dtype.is_complex:
        return "complex tensors are not supported"
    if args.self.dtype == torch.bool and args.node.kind() == "aten::positive":
        return "positive of a bool tensor raises in eager PyTorch"
    return None


@converter("aten::positive", "aten::resolve_conj", "aten::resolve_neg", "aten::alias", "aten::alias_copy",
           "aten::detach_copy", "aten::conj_physical", "aten::real", capability=_real_self)
def identity(ctx: ConversionCtx, args: Args) -> Tensor:
    """Of a real tensor, these are the tensor itself (engine tensors are never aliased)."""
    return ctx.to_tensor(args.self)


def _real_source(args: Args) -> str | None:
    src = args[1]
    if isinstance(src, (Tensor, TensorMeta, torch.Tensor)) and src.dtype.is_complex:
        return "complex sources are not supported"
    return None


@converter("aten::copy", capability=_real_source)
def copy(ctx: ConversionCtx, args: Args) -> Tensor:
    """src cast to self's dtype and broadcast to self's shape (lowering's functional form of copy_)."""
    x = ctx.to_tensor(args.self)
    return expand(ctx, ctx.to_tensor(args.src, x.dtype), x.shape)


@converter("aten::copy_", capability=lambda args: _real_source(args) or functional_inplace(args))
def copy_(ctx: ConversionCtx, args: Args) -> Tensor:
    return copy(ctx, args)
