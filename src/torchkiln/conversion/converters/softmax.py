"""Softmax converters: softmax and log_softmax (with an optional dtype), the _softmax forms traces record,
_safe_softmax and _softmax_backward_data."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim, to_dtype
from torchkiln.conversion.impl.elementwise import binary, select
from torchkiln.conversion.impl.reduce import reduce
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

E, R = L.ElementWiseOperation, L.ReduceOperation


def softmax(ctx: ConversionCtx, x, dim: int, dtype: torch.dtype | None, log: bool) -> Tensor:
    x = ctx.to_tensor(x, dtype)
    return ctx.network.add_softmax(x, normalize_dim(dim, x.rank), log=log).get_output()


@converter("aten::softmax.int")
def softmax_int(ctx: ConversionCtx, args: Args) -> Tensor:
    return softmax(ctx, args.self, args.dim, to_dtype(args.dtype), log=False)


@converter("aten::log_softmax.int")
def log_softmax_int(ctx: ConversionCtx, args: Args) -> Tensor:
    """Converted directly when the unpack_log_softmax lowering pass did not run."""
    return softmax(ctx, args.self, args.dim, to_dtype(args.dtype), log=True)


def _half_to_float(args: Args) -> torch.dtype | None:
    return torch.float32 if args.half_to_float else None


@converter("aten::_softmax")
def softmax_internal(ctx: ConversionCtx, args: Args) -> Tensor:
    return softmax(ctx, args.self, args.dim, _half_to_float(args), log=False)


@converter("aten::_log_softmax")
def log_softmax_internal(ctx: ConversionCtx, args: Args) -> Tensor:
    return softmax(ctx, args.self, args.dim, _half_to_float(args), log=True)


@converter("aten::_safe_softmax")
def safe_softmax(ctx: ConversionCtx, args: Args) -> Tensor:
    """softmax, but 0 in rows that are -inf throughout (where softmax gives NaN)."""
    x = ctx.to_tensor(args.self)
    out = softmax(ctx, x, args.dim, to_dtype(args.dtype), log=False)
    masked = reduce(ctx, binary(ctx, x, float("-inf"), E.EQUAL), R.ALL, normalize_dim(args.dim, x.rank), True)
    return select(ctx, masked, ctx.to_tensor(0, out.dtype), out)


def _same_dtype_backward(args: Args) -> str | None:
    dtypes = {args.grad_output.dtype, args.output.dtype, to_dtype(args.input_dtype)}
    return None if len(dtypes) == 1 else f"dtypes {sorted(map(str, dtypes))} (only one dtype throughout)"


@converter("aten::_softmax_backward_data", capability=_same_dtype_backward)
def softmax_backward_data(ctx: ConversionCtx, args: Args) -> Tensor:
    """output * (grad - sum(grad * output, dim))."""
    grad, out = ctx.to_tensor(args.grad_output), ctx.to_tensor(args.output)
    dim = normalize_dim(args.dim, out.rank)
    total = reduce(ctx, binary(ctx, grad, out, E.PROD), R.SUM, dim, True)
    return binary(ctx, out, binary(ctx, grad, total, E.SUB), E.PROD)
