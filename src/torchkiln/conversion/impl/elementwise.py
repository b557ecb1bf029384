"""Binary and unary elementwise layers with torch's broadcasting and scalar promotion."""
from __future__ import annotations

from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx, scalar_dtype
from torchkiln.network import layers as L
from torchkiln.network.tensor import Tensor


def _dtype_of(x: Any) -> torch.dtype | None:
    return x.dtype if isinstance(x, (Tensor, torch.Tensor)) else None


def binary(ctx: ConversionCtx, a: Any, b: Any, op: L.ElementWiseOperation) -> Tensor:
    """`a op b` where either side may be a network tensor, a constant tensor or a Python scalar."""
    if not isinstance(a, (Tensor, torch.Tensor)):
        a = ctx.to_tensor(a, scalar_dtype(_dtype_of(b), a))
    if not isinstance(b, (Tensor, torch.Tensor)):
        b = ctx.to_tensor(b, scalar_dtype(_dtype_of(a), b))
    return ctx.network.add_elementwise(ctx.to_tensor(a), ctx.to_tensor(b), op).get_output()


def scaled(ctx: ConversionCtx, x: Any, alpha: Any) -> Any:
    """alpha * x, skipping the multiply when alpha is 1 (aten::add/sub's alpha)."""
    if alpha == 1:
        return x
    if isinstance(x, (bool, int, float)):
        return x * alpha
    return binary(ctx, x, alpha, L.ElementWiseOperation.PROD)


def unary(ctx: ConversionCtx, x: Any, op: L.UnaryOperation) -> Tensor:
    return ctx.network.add_unary(ctx.to_tensor(x), op).get_output()
