"""Product converters: cross (and linalg.cross), kron, inner, tensordot, linalg.vander, cov and corrcoef (without
weights), pdist."""
from __future__ import annotations

import math

import torch

from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.converters.diagonal import diagonal
from torchkiln.conversion.impl.common import normalize_dim, one_dtype
from torchkiln.conversion.impl.activation import clip
from torchkiln.conversion.impl.elementwise import binary, unary
from torchkiln.conversion.impl.reduce import reduce, vector_norm
from torchkiln.conversion.impl.matmul import matmul
from torchkiln.conversion.impl.shuffle import permute, reshape
from torchkiln.conversion.impl.slicing import slice_dim
from torchkiln.conversion.impl.tiling import expand
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

E = L.ElementWiseOperation


def _cross_dim(shape: tuple[int, ...], dim: int | None) -> int | None:
    """The dim cross works along: `dim`, or the first of size 3 (cross's deprecated default)."""
    if dim is None:
        return next((i for i, d in enumerate(shape) if d == 3), None)
    return normalize_dim(dim, len(shape))


def _cross_ok(args: Args) -> str | None:
    shapes = (args[0].shape, args[1].shape)
    if any(not isinstance(d, int) for s in shapes for d in s):
        return "a dim known only at run time"
    shape = torch.broadcast_shapes(*shapes)
    dim = _cross_dim(shape, args[2])
    if dim is None or shape[dim] != 3 or any(s[dim - len(shape)] != 3 for s in shapes):
        return f"no dim of size 3 in both operands at dim {args[2]} (eager raises)"
    return one_dtype(0, 1)(args)


@converter("aten::cross", "aten::linalg_cross", capability=_cross_ok)
def cross(ctx: ConversionCtx, args: Args) -> Tensor:
    """(a1 b2 - a2 b1, a2 b0 - a0 b2, a0 b1 - a1 b0) along the dim of size 3, the operands broadcast first."""
    a, b = ctx.to_tensor(args[0]), ctx.to_tensor(args[1])
    shape = list(torch.broadcast_shapes(a.shape, b.shape))
    a, b = expand(ctx, a, shape), expand(ctx, b, shape)
    dim = _cross_dim(tuple(shape), args[2])
    ai = [slice_dim(ctx, a, dim, i, i + 1) for i in range(3)]
    bi = [slice_dim(ctx, b, dim, i, i + 1) for i in range(3)]
    parts = [binary(ctx, binary(ctx, ai[j], bi[k], E.PROD), binary(ctx, ai[k], bi[j], E.PROD), E.SUB)
             for j, k in ((1, 2), (2, 0), (0, 1))]
    return ctx.network.add_concatenation(parts, dim).get_output()


@converter("aten::kron", capability=one_dtype("self", "other"))
def kron(ctx: ConversionCtx, args: Args) -> Tensor:
    """a[i] * b[k] at i * len(b) + k along every dim (the shorter shape padded with leading 1s): one product each."""
    a, b = ctx.to_tensor(args.self), ctx.to_tensor(args.other)
    rank = max(a.rank, b.rank)
    sa, sb = [1] * (rank - a.rank) + list(a.shape), [1] * (rank - b.rank) + list(b.shape)
    spread_a = reshape(ctx, a, [d for s in sa for d in (s, 1)])
    spread_b = reshape(ctx, b, [d for s in sb for d in (1, s)])
    return reshape(ctx, binary(ctx, spread_a, spread_b, E.PROD), [x * y for x, y in zip(sa, sb)])


def tensordot(ctx: ConversionCtx, a: Tensor, b: Tensor, dims_a: list[int], dims_b: list[int]) -> Tensor:
    """Contract a's `dims_a` with b's `dims_b`: a's free dims, then b's (one matrix product)."""
    free_a = [d for d in range(a.rank) if d not in dims_a]
    free_b = [d for d in range(b.rank) if d not in dims_b]
    contracted = math.prod(a.shape[d] for d in dims_a)
    left = reshape(ctx, permute(ctx, a, free_a + dims_a), [math.prod(a.shape[d] for d in free_a), contracted])
    right = reshape(ctx, permute(ctx, b, dims_b + free_b), [contracted, math.prod(b.shape[d] for d in free_b)])
    return reshape(ctx, matmul(ctx, left, right), [a.shape[d] for d in free_a] + [b.shape[d] for d in free_b])


def _static_floating(*names: str):
    same = one_dtype(*names, floating=True)

    def check(args: Args) -> str | None:
        if any(not isinstance(d, int) for n in names for d in args[n].shape):
            return "a dim known only at run time"
        return same(args)

    return check


def _tensordot_ok(args: Args) -> str | None:
    a, b = args.self.shape, args.other.shape
    sizes = [(a[normalize_dim(i, len(a))], b[normalize_dim(j, len(b))])
             for i, j in zip(args.dims_self, args.dims_other)]
    if any(x != y for x, y in sizes):
        return f"contracted dims of sizes {sizes} differ (eager sums a size-1 side first)"
    return _static_floating("self", "other")(args)


@converter("aten::tensordot", capability=_tensordot_ok)
def tensordot_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    a, b = ctx.to_tensor(args.self), ctx.to_tensor(args.other)
    return tensordot(ctx, a, b, [normalize_dim(d, a.rank) for d in args.dims_self],
                     [normalize_dim(d, b.rank) for d in args.dims_other])


@converter("aten::inner", capability=_static_floating("self", "other"))
def inner(ctx: ConversionCtx, args: Args) -> Tensor:
    """The last dims contracted (a 0-d operand: the product)."""
    a, b = ctx.to_tensor(args.self), ctx.to_tensor(args.other)
    if a.rank == 0 or b.rank == 0:
        return binary(ctx, a, b, E.PROD)
    return tensordot(ctx, a, b, [a.rank - 1], [b.rank - 1])


def _vander_ok(args: Args) -> str | None:
    return "a 0-d tensor" if not args.x.shape else _static_floating("x")(args)


@converter("aten::linalg_vander", capability=_vander_ok)
def linalg_vander(ctx: ConversionCtx, args: Args) -> Tensor:
    """[1, x, x^2, ...] as ATen computes it: ones and x repeated N - 1 times, then a cumulative product."""
    x = ctx.to_tensor(args.x)
    n = x.shape[-1] if args.N is None else args.N
    column = reshape(ctx, x, [*x.shape, 1])
    ones = ctx.to_tensor(torch.ones([*x.shape, 1], dtype=x.dtype))
    if n <= 1:
        return slice_dim(ctx, ones, x.rank, 0, n)
    repeated = ctx.network.add_expand(column, [*x.shape, n - 1]).get_output()
    rows = ctx.network.add_concatenation([ones, repeated], x.rank).get_output()
    return ctx.network.add_cumulative(rows, L.CumulativeOperation.PROD, x.rank).get_output()


def _cov_ok(args: Args) -> str | None:
    if args.get("fweights") is not None or args.get("aweights") is not None:
        return "observation weights (eager checks their values)"
    shape = args.self.shape
    if len(shape) > 2 or any(not isinstance(d, int) for d in shape):
        return f"a {len(shape)}-d input or a dim known only at run time"
    return _static_floating("self")(args)


def cov(ctx: ConversionCtx, x: Tensor, correction: int) -> Tensor:
    """torch.cov: rows are variables; (x - mean) (x - mean)^T / (N - correction), 0 as divisor where that is <= 0;
    size-1 dims squeezed."""
    x = reshape(ctx, x, [1, -1]) if x.rank < 2 else x
    centered = binary(ctx, x, reduce(ctx, x, L.ReduceOperation.AVG, 1, True), E.SUB)
    product = matmul(ctx, centered, centered, L.MatrixOperation.TRANSPOSE)
    c = binary(ctx, product, float(max(x.shape[1] - correction, 0)), E.DIV)
    return reshape(ctx, c, [d for d in c.shape if d != 1])


@converter("aten::cov", capability=_cov_ok)
def cov_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    return cov(ctx, ctx.to_tensor(args.self), args.correction)


@converter("aten::corrcoef", capability=_cov_ok)
def corrcoef(ctx: ConversionCtx, args: Args) -> Tensor:
    """cov / (stddev_i stddev_j), clipped to [-1, 1], as ATen divides (a 0-d cov: c / c)."""
    c = cov(ctx, ctx.to_tensor(args.self), 1)
    if c.rank == 0:
        return binary(ctx, c, c, E.DIV)
    stddev = unary(ctx, diagonal(ctx, c, 0, 0, 1), L.UnaryOperation.SQRT)
    c = binary(ctx, c, reshape(ctx, stddev, [-1, 1]), E.DIV)
    c = binary(ctx, c, reshape(ctx, stddev, [1, -1]), E.DIV)
    return clip(ctx, c, -1.0, 1.0)


def _pdist_ok(args: Args) -> str | None:
    shape = args.self.shape
    if len(shape) != 2 or shape[0] < 2:
        return "not a 2-d input of at least 2 rows"
    if args.p == 0:
        return "p=0 (pdist's count of differing elements is NaN where one is NaN, a norm's is not)"
    return _static_floating("self")(args)


@converter("aten::pdist", capability=_pdist_ok)
def pdist(ctx: ConversionCtx, args: Args) -> Tensor:
    """The p-norm distance of every pair of rows i < j, in row-major order."""
    x = ctx.to_tensor(args.self)
    i, j = torch.triu_indices(x.shape[0], x.shape[0], 1)
    rows = [ctx.network.add_gather(x, ctx.to_tensor(k), 0, L.GatherMode.DEFAULT).get_output() for k in (i, j)]
    return vector_norm(ctx, binary(ctx, rows[0], rows[1], E.SUB), args.p, 1, False)
