"""Matrix multiply converters: linear, matmul, mm, bmm, mv, dot, addmm, addmv, baddbmm, addbmm, outer, addr,
einsum."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.common import one_dtype
from torchkiln.conversion.impl.einsum import einsum_as_matmul
from torchkiln.conversion.impl.elementwise import binary, scaled
from torchkiln.conversion.impl.matmul import linear, matmul
from torchkiln.conversion.impl.reduce import reduce
from torchkiln.conversion.impl.shuffle import reshape
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor


def _add_product(ctx: ConversionCtx, args: Args, product: Tensor) -> Tensor:
    """beta * self + alpha * product; with beta == 0 `self` is ignored (its nan/inf do not propagate)."""
    product = scaled(ctx, product, args.alpha)
    if args.beta == 0:
        return product
    return binary(ctx, scaled(ctx, args.self, args.beta), product, L.ElementWiseOperation.SUM)


@converter("aten::linear")
def linear_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    return linear(ctx, args.input, args.weight, args.bias)


@converter("aten::matmul", "aten::mm", "aten::bmm", "aten::mv", "aten::dot")
def matmul_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    return matmul(ctx, args.self, args[1])


@converter("aten::addmm")
def addmm(ctx: ConversionCtx, args: Args) -> Tensor:
    return _add_product(ctx, args, matmul(ctx, args.mat1, args.mat2))


@converter("aten::addmv", capability=one_dtype("self", "mat", "vec", floating=True))
def addmv(ctx: ConversionCtx, args: Args) -> Tensor:
    return _add_product(ctx, args, matmul(ctx, args.mat, args.vec))


def _outer(ctx: ConversionCtx, a, b) -> Tensor:
    """a[:, None] * b[None, :]."""
    return binary(ctx, reshape(ctx, ctx.to_tensor(a), [-1, 1]), reshape(ctx, ctx.to_tensor(b), [1, -1]),
                  L.ElementWiseOperation.PROD)


@converter("aten::outer", "aten::ger", capability=one_dtype("self", 1))
def outer(ctx: ConversionCtx, args: Args) -> Tensor:
    return _outer(ctx, args.self, args[1])


@converter("aten::addr", capability=one_dtype("self", "vec1", "vec2"))
def addr(ctx: ConversionCtx, args: Args) -> Tensor:
    return _add_product(ctx, args, _outer(ctx, args.vec1, args.vec2))


@converter("aten::baddbmm")
def baddbmm(ctx: ConversionCtx, args: Args) -> Tensor:
    return _add_product(ctx, args, matmul(ctx, args.batch1, args.batch2))


@converter("aten::addbmm")
def addbmm(ctx: ConversionCtx, args: Args) -> Tensor:
    """beta * self + alpha * (the batch of products summed over the batch)."""
    return _add_product(ctx, args, reduce(ctx, matmul(ctx, args.batch1, args.batch2), L.ReduceOperation.SUM, 0, False))


@converter("aten::einsum")
def einsum(ctx: ConversionCtx, args: Args) -> Tensor:
    """A contraction of two operands as a matrix multiply between shuffles; any other equation one einsum layer."""
    tensors = [ctx.to_tensor(t) for t in args.tensors]
    if len(tensors) == 2 and (product := einsum_as_matmul(ctx, *tensors, args.equation)) is not None:
        return product
    return ctx.network.add_einsum(tensors, args.equation).get_output()


@converter("aten::bilinear", capability=one_dtype("input1", "input2", "weight", floating=True))
def bilinear(ctx: ConversionCtx, args: Args) -> Tensor:
    """x1^T W_o x2 (+ b_o) for each output o, over the leading dims flattened."""
    x1, x2, w = ctx.to_tensor(args.input1), ctx.to_tensor(args.input2), ctx.to_tensor(args.weight)
    lead = list(x1.shape[:-1])
    flat1, flat2 = reshape(ctx, x1, [-1, x1.shape[-1]]), reshape(ctx, x2, [-1, x2.shape[-1]])
    out = ctx.network.add_einsum([flat1, w, flat2], "bi,oij,bj->bo").get_output()
    out = reshape(ctx, out, lead + [w.shape[0]])
    return out if args.bias is None else binary(ctx, out, args.bias, L.ElementWiseOperation.SUM)


def _multi_dot_ok(args: Args) -> str | None:
    tensors = args.tensors
    dtypes = {t.dtype for t in tensors}
    if len(tensors) < 2 or len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
        return "fewer than 2 tensors, or not one floating dtype"
    if any(len(t.shape) != 2 for t in tensors[1:-1]) or any(len(t.shape) not in (1, 2) for t in tensors):
        return "inner operands that are not matrices (eager raises)"
    return None


@converter("aten::linalg_multi_dot", capability=_multi_dot_ok)
def linalg_multi_dot(ctx: ConversionCtx, args: Args) -> Tensor:
    """The chained matrix product (a 1-d first operand a row, a 1-d last one a column, both dropped again)."""
    tensors = [ctx.to_tensor(t) for t in args.tensors]
    first_vector, last_vector = tensors[0].rank == 1, tensors[-1].rank == 1
    if first_vector:
        tensors[0] = reshape(ctx, tensors[0], [1, -1])
    if last_vector:
        tensors[-1] = reshape(ctx, tensors[-1], [-1, 1])
    out = tensors[0]
    for t in tensors[1:]:
        out = matmul(ctx, out, t)
    shape = [d for i, d in enumerate(out.shape) if not (i == 0 and first_vector) and not (i == 1 and last_vector)]
    return reshape(ctx, out, shape)
