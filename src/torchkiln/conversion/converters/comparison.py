"""Comparison converters (eq, ne, gt, ge, lt, le: tensor and scalar forms) elementwise maximum/minimum, isclose, isin,
bucketize and searchsorted (sorted constant boundaries).
Comparisons give bool; the in-place forms (`x.eq_(y)`, which keeps x's dtype) reach conversion as
`x.copy_(x.eq(y))` (lowering's remove_mutation rewrites them)."""
from __future__ import annotations

import torch

from torchkiln.analysis.resolve import Args
from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import is_tensor_like
from torchkiln.conversion.impl.elementwise import binary, binary_converter, unary
from torchkiln.conversion.impl.reduce import reduce
from torchkiln.conversion.impl.shuffle import reshape, unsqueeze
from torchkiln.analysis.registry import converter
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

E = L.ElementWiseOperation

_COMPARISONS = {
    "eq": E.EQUAL, "ne": E.NOT_EQUAL, "gt": E.GREATER, "ge": E.GREATER_EQUAL, "lt": E.LESS, "le": E.LESS_EQUAL,
}

for _name, _op in _COMPARISONS.items():
    converter(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar")(binary_converter(_op))

converter("aten::maximum", "aten::max.other")(binary_converter(E.MAX))
converter("aten::minimum", "aten::min.other")(binary_converter(E.MIN))


@converter("aten::isin.Tensor_Tensor", "aten::isin.Tensor_Scalar")
def isin(ctx: ConversionCtx, args: Args) -> Tensor:
    """Whether each element equals any test element (NaN equals none), or not with invert."""
    x = ctx.to_tensor(args.elements)
    test = args[1]
    if is_tensor_like(test):
        test = reshape(ctx, ctx.to_tensor(test), [-1])
        found = reduce(ctx, binary(ctx, unsqueeze(ctx, x, x.rank), test, E.EQUAL), L.ReduceOperation.ANY, x.rank, False)
    else:
        found = binary(ctx, x, test, E.EQUAL)
    return unary(ctx, found, L.UnaryOperation.NOT) if args.invert else found


def _sorted_boundaries(args: Args) -> str | None:
    b = args.get("boundaries", args.get("sorted_sequence"))
    if not isinstance(b, torch.Tensor):
        return "boundaries known only at run time"
    if b.dim() != 1 or b.is_complex() or not bool((b[1:] >= b[:-1]).all()) or bool(b.isnan().any()):
        return "boundaries that are not a sorted 1-d tensor without NaN (eager's answer is undefined)"
    return None


def buckets(ctx: ConversionCtx, x, boundaries: torch.Tensor, right: bool, out_int32: bool) -> Tensor:
    """How many boundaries lie below x (right: at or below), counting NaN above every boundary, as ATen's binary
    search does."""
    x = ctx.to_tensor(x)
    b = ctx.to_tensor(boundaries.to(torch.promote_types(boundaries.dtype, x.dtype)))
    x = ctx.to_tensor(x, b.dtype)
    # ATen's search moves past b unless x < b (right) or x <= b: NaN compares false, so it counts every boundary.
    stays = binary(ctx, unsqueeze(ctx, x, x.rank), b, E.LESS if right else E.LESS_EQUAL)
    below = ctx.to_tensor(unary(ctx, stays, L.UnaryOperation.NOT), torch.int64)
    counts = reduce(ctx, below, L.ReduceOperation.SUM, x.rank, False)
    return ctx.to_tensor(counts, torch.int32) if out_int32 else counts


@converter("aten::bucketize.Tensor", capability=_sorted_boundaries)
def bucketize(ctx: ConversionCtx, args: Args) -> Tensor:
    return buckets(ctx, args.self, args.boundaries, args.right, args.out_int32)


def _searchsorted_ok(args: Args) -> str | None:
    if args.sorter is not None:
        return "a sorter"
    if args.side == "left" and args.right:
        return "side='left' with right=True (eager raises)"
    b = args.sorted_sequence
    if isinstance(b, torch.Tensor) and b.dim() != 1:
        return "a sorted sequence of more than one dim"
    return _sorted_boundaries(args)


@converter("aten::searchsorted.Tensor", capability=_searchsorted_ok)
def searchsorted(ctx: ConversionCtx, args: Args) -> Tensor:
    """bucketize with the 1-d sorted sequence as boundaries (side='right' is right=True)."""
    return buckets(ctx, args.self, args.sorted_sequence, bool(args.right) or args.side == "right", args.out_int32)


def _isclose_ok(args: Args) -> str | None:
    a, b = args.self.dtype, args.other.dtype
    return None if a == b and a.is_floating_point else "operands not of one floating dtype"


@converter("aten::isclose", capability=_isclose_ok)
def isclose(ctx: ConversionCtx, args: Args) -> Tensor:
    """a == b, or (equal_nan) both NaN, or |a - b| finite and <= atol + |rtol * b|, as ATen composes it."""
    a, b = ctx.to_tensor(args.self), ctx.to_tensor(args.other)
    close = binary(ctx, a, b, E.EQUAL)
    if args.equal_nan:
        both_nan = binary(ctx, unary(ctx, a, L.UnaryOperation.ISNAN), unary(ctx, b, L.UnaryOperation.ISNAN), E.AND)
        close = binary(ctx, close, both_nan, E.OR)
    if args.rtol == 0 and args.atol == 0:
        return close
    allowed = binary(ctx, args.atol, unary(ctx, binary(ctx, b, args.rtol, E.PROD), L.UnaryOperation.ABS), E.SUM)
    actual = unary(ctx, binary(ctx, a, b, E.SUB), L.UnaryOperation.ABS)
    within = binary(ctx, unary(ctx, actual, L.UnaryOperation.ISFINITE), binary(ctx, actual, allowed, E.LESS_EQUAL),
                    E.AND)
    return binary(ctx, close, within, E.OR)
