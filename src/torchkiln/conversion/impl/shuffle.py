"""Reshapes and transposes as shuffle layers."""
from __future__ import annotations

from collections.abc import Sequence

from torchkiln.conversion.context import ConversionCtx
from torchkiln.errors import ConversionError
from torchkiln.ir.symbolic import Dim, decide
from torchkiln.ir.tensor import Tensor


def reshape(ctx: ConversionCtx, x: Tensor, shape: Sequence[int]) -> Tensor:
    """torch.reshape semantics: -1 is inferred, 0 is a zero-size dim."""
    return ctx.network.add_shuffle(x, reshape_dims=list(shape), zero_is_placeholder=False).get_output()


def permute(ctx: ConversionCtx, x: Tensor, perm: Sequence[int]) -> Tensor:
    return ctx.network.add_shuffle(x, first_transpose=list(perm)).get_output()


def unsqueeze(ctx: ConversionCtx, x: Tensor, dim: int) -> Tensor:
    shape = list(x.shape)
    shape.insert(dim % (x.rank + 1), 1)
    return reshape(ctx, x, shape)


def squeeze_dims(ctx: ConversionCtx, x: Tensor, dims: Sequence[int]) -> Tensor:
    shape = [d for i, d in enumerate(x.shape) if not (i in dims and _is_one(d, i))]
    return reshape(ctx, x, shape)


def _is_one(d: Dim, i: int) -> bool:
    """Whether a dim is 1; a dynamic dim must be 1 everywhere or nowhere in its range (squeeze keeps the rank)."""
    result = decide("eq", d, 1)
    if result is None:
        raise ConversionError(f"needs a static shape: squeeze of dim {i} of size {d}, which may or may not be 1")
    return result
