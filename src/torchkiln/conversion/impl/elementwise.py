"""Binary, unary and select layers with torch's broadcasting and scalar promotion."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchkiln.conversion.context import ConversionCtx, scalar_dtype
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor


def dtype_of(x: Any) -> torch.dtype | None:
    """The dtype of a network or constant tensor; None for a Python scalar."""
    return x.dtype if isinstance(x, (Tensor, torch.Tensor)) else None


def _operands(ctx: ConversionCtx, *xs: Any) -> list[Tensor]:
    """Network tensors for `xs`; a Python scalar takes the dtype it would have next to the first tensor."""
    like = next((dtype_of(x) for x in xs if dtype_of(x) is not None), None)
    return [ctx.to_tensor(x, None if dtype_of(x) is not None else scalar_dtype(like, x)) for x in xs]


def binary(ctx: ConversionCtx, a: Any, b: Any, op: L.ElementWiseOperation) -> Tensor:
    """`a op b` where either side may be a network tensor, a constant tensor or a Python scalar."""
    a, b = _operands(ctx, a, b)
    return ctx.network.add_elementwise(a, b, op).get_output()


def scaled(ctx: ConversionCtx, x: Any, alpha: Any) -> Any:
    """alpha * x, skipping the multiply when alpha is 1 (aten::add/sub's alpha)."""
    if alpha == 1:
        return x
    if isinstance(x, (bool, int, float)):
        return x * alpha
    return binary(ctx, x, alpha, L.ElementWiseOperation.PROD)


def unary(ctx: ConversionCtx, x: Any, op: L.UnaryOperation) -> Tensor:
    return ctx.network.add_unary(ctx.to_tensor(x), op).get_output()


def select(ctx: ConversionCtx, condition: Any, then: Any, other: Any) -> Tensor:
    """torch.where(condition, then, other); either branch may be a Python scalar (a wrapped number)."""
    then, other = _operands(ctx, then, other)
    return ctx.network.add_select(ctx.to_tensor(condition), then, other).get_output()


def binary_converter(op: L.ElementWiseOperation) -> Callable[[ConversionCtx, Args], Tensor]:
    """The converter of an `op(self, other)` overload: self and other may each be a tensor or a scalar."""
    def convert(ctx: ConversionCtx, args: Args) -> Tensor:
        return binary(ctx, args[0], args[1], op)

    return convert


def unary_converter(op: L.UnaryOperation) -> Callable[[ConversionCtx, Args], Tensor]:
    def convert(ctx: ConversionCtx, args: Args) -> Tensor:
        return unary(ctx, args[0], op)

    return convert
