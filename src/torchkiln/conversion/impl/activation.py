"""Activation layers, and clamping with torch.clamp's bounds and result dtype."""
from __future__ import annotations

import math
from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary, dtype_of
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor


def activation(ctx: ConversionCtx, x: Any, kind: L.ActivationType, alpha: float = 0.0, beta: float = 0.0) -> Tensor:
    return ctx.network.add_activation(ctx.to_tensor(x), kind, alpha, beta).get_output()


def bounds_problem(*bounds: Any) -> str | None:
    """Capability helper: why these scalar clamp bounds cannot be a clip layer's float parameters."""
    given = [b for b in bounds if b is not None]
    if not given:
        return "clamp needs at least one of min and max"
    for b in given:
        if not isinstance(b, (bool, int, float)):
            return f"clamp bound {b!r} is not a number known before run time"
        if isinstance(b, int) and float(b) != b:
            return f"clamp bound {b} has no exact float value"
    return None


def clip(ctx: ConversionCtx, x: Any, lo: Any, hi: Any) -> Tensor:
    """torch.clamp(x, lo, hi) for bounds that are each None, a scalar or a tensor."""
    x = ctx.to_tensor(x)
    if dtype_of(lo) is not None or dtype_of(hi) is not None:  # tensor bounds: elementwise max, then min
        out: Any = x
        if lo is not None:
            out = binary(ctx, out, lo, L.ElementWiseOperation.MAX)
        if hi is not None:
            out = binary(ctx, out, hi, L.ElementWiseOperation.MIN)
        return out
    # Scalar bounds may promote the result (an int tensor clamped to 0.5 is float): ask ATen which dtype.
    dtype = torch.clamp(torch.empty((), dtype=x.dtype, device="meta"), lo, hi).dtype
    return activation(ctx, ctx.to_tensor(x, dtype), L.ActivationType.CLIP,
                      -math.inf if lo is None else lo, math.inf if hi is None else hi)
