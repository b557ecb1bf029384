"""Softmax converters: softmax and log_softmax (with an optional dtype), and the _softmax forms traces record."""
from __future__ import annotations

import torch

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import normalize_dim, to_dtype
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir.tensor import Tensor


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
