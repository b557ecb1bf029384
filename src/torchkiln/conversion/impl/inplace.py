"""In-place forms of ops (`x.relu_()`, `x.eq_(y)`), converted through their functional converters.

An in-place op writes into `x`, so its result keeps x's dtype (`x.eq_(y)` stays float, `h.add_(f)`
with a half `h` stays half); the functional result is cast back to it. Converting functionally is
right only where `impl.common.functional_inplace` allows it; elsewhere the node stays in PyTorch.
"""
from __future__ import annotations

from collections.abc import Callable

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import functional_inplace
from torchkiln.conversion.impl.elementwise import dtype_of
from torchkiln.analysis.registry import Capability, converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor

ConverterFn = Callable[[ConversionCtx, Args], Tensor]


def inplace(functional: ConverterFn) -> ConverterFn:
    """The converter of `x.op_(...)` from that of `x.op(...)`: the same layers, cast to x's dtype."""
    def convert(ctx: ConversionCtx, args: Args) -> Tensor:
        return ctx.to_tensor(functional(ctx, args), dtype_of(args[0]))

    return convert


def register_inplace(functional: ConverterFn, *keys: str, capability: Capability | None = None) -> None:
    """Register the in-place overloads `keys` of a functional converter; `capability` is the functional's."""
    def check(args: Args) -> str | None:
        return (capability(args) if capability else None) or functional_inplace(args)

    converter(*keys, capability=check)(inplace(functional))
