"""New tensors known at build time: filled, ranges, and the shape/dtype/device eager PyTorch gave them."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.tiling import expand
from torchkiln.analysis.resolve import Args
from torchkiln.errors import ConversionError
from torchkiln.ir.symbolic import agree_on_samples, as_dim, as_shape, decide, floordiv, has_symbols, is_symbolic
from torchkiln.ir.tensor import Tensor
from torchkiln.torchscript import TensorMeta, value_key


def eager_meta(ctx: ConversionCtx, args: Args) -> TensorMeta:
    """What eager PyTorch made of this node's output (shape analysis): its shape, dtype and device.

    A tensor created on another device than the engine's cannot be made by the engine."""
    meta = ctx.metas[value_key(args.node.output())]
    if meta.device.type != ctx.settings.device.type:
        raise ConversionError(f"{args.node.kind()} creates a tensor on {meta.device} but the engine runs on "
                              f"{ctx.settings.device}; leave it to PyTorch with torch_executed_ops")
    return meta


def created_shape(ctx: ConversionCtx, args: Args, meta: TensorMeta) -> tuple:
    """The shape of a created tensor. With dynamic shapes it comes from the node's own size argument (or the
    tensor it is made like), whose symbolic dims the engine can bind; shape analysis saw the same values."""
    if not has_symbols(meta.shape):
        return meta.shape
    like = args.get("self")
    size = args.get("size")
    if size is None and isinstance(like, Tensor):
        size = like.shape
    if size is None or not isinstance(size, (list, tuple)) or not agree_on_samples(as_shape(size), meta.shape):
        raise ConversionError(f"needs a static shape: the shape {meta.shape} of {args.node.kind()} is not "
                              f"known from its arguments")
    return as_shape(size)


def filled(ctx: ConversionCtx, shape: Sequence[int], value: Any, dtype: torch.dtype) -> Tensor:
    """A tensor of `shape` holding `value` (a number, a 0-d constant or 0-d network tensor) as `dtype`."""
    if isinstance(value, torch.Tensor):
        value = value.reshape(())
    scalar = ctx.to_tensor(value if isinstance(value, Tensor) else torch.as_tensor(value).to(dtype), dtype)
    return expand(ctx, scalar, shape)


def arange(ctx: ConversionCtx, start: Any, end: Any, step: Any, meta: TensorMeta) -> Tensor:
    """torch.arange: an integer range as a fill layer (exact below 2**53), a floating one as the
    constant torch itself computes."""
    length = meta.shape[0]
    if has_symbols([start, end, step, length]):
        if meta.dtype.is_floating_point or not all(isinstance(v, int) or is_symbolic(v) for v in (start, end)) \
                or not isinstance(step, int) or step <= 0:
            raise ConversionError(f"needs a static shape: arange({start}, {end}, {step}) of a dynamic length "
                                  f"converts for integer bounds and a positive integer step")
        length = floordiv(as_dim(end - start + step - 1), step)
        if decide("ge", length, 0) is not True or not agree_on_samples((length,), meta.shape):
            raise ConversionError(f"needs a static shape: arange({start}, {end}, {step}) may be empty")
        return ctx.network.add_fill(length, start, step, meta.dtype).get_output()
    if meta.dtype.is_floating_point:
        return ctx.to_tensor(torch.arange(start, end, step, dtype=meta.dtype))
    return ctx.network.add_fill(length, start, step, meta.dtype).get_output()
