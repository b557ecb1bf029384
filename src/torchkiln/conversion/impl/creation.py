"""New tensors known at build time: filled, ranges, and the shape/dtype/device eager PyTorch gave them."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.tiling import expand
from torchkiln.conversion.resolve import Args
from torchkiln.errors import ConversionError
from torchkiln.network.tensor import Tensor
from torchkiln.torchscript import TensorMeta, value_key


def eager_meta(ctx: ConversionCtx, args: Args) -> TensorMeta:
    """What eager PyTorch made of this node's output (shape analysis): its shape, dtype and device.

    A tensor created on another device than the engine's cannot be made by the engine."""
    meta = ctx.metas[value_key(args.node.output())]
    if meta.device.type != ctx.settings.device.type:
        raise ConversionError(f"{args.node.kind()} creates a tensor on {meta.device} but the engine runs on "
                              f"{ctx.settings.device}; leave it to PyTorch with torch_executed_ops")
    return meta


def filled(ctx: ConversionCtx, shape: Sequence[int], value: Any, dtype: torch.dtype) -> Tensor:
    """A tensor of `shape` holding `value` (a number, a 0-d constant or 0-d network tensor) as `dtype`."""
    if isinstance(value, torch.Tensor):
        value = value.reshape(())
    scalar = ctx.to_tensor(value if isinstance(value, Tensor) else torch.as_tensor(value).to(dtype), dtype)
    return expand(ctx, scalar, shape)


def arange(ctx: ConversionCtx, start: Any, end: Any, step: Any, meta: TensorMeta) -> Tensor:
    """torch.arange: an integer range as a fill layer (exact below 2**53), a floating one as the
    constant torch itself computes."""
    if meta.dtype.is_floating_point:
        return ctx.to_tensor(torch.arange(start, end, step, dtype=meta.dtype))
    return ctx.network.add_fill(meta.shape[0], start, step, meta.dtype).get_output()
