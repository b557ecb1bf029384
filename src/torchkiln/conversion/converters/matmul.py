"""Matrix multiply converters: linear, addmm, matmul, mm, bmm."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary, scaled
from torchkiln.conversion.registry import converter
from torchkiln.conversion.resolve import Args
from torchkiln.network import layers as L
from torchkiln.network.tensor import Tensor

NONE, TRANSPOSE = L.MatrixOperation.NONE, L.MatrixOperation.TRANSPOSE


def matmul(ctx: ConversionCtx, a, b, op_b: L.MatrixOperation = NONE) -> Tensor:
    return ctx.network.add_matrix_multiply(ctx.to_tensor(a), NONE, ctx.to_tensor(b), op_b).get_output()


@converter("aten::linear")
def linear(ctx: ConversionCtx, args: Args) -> Tensor:
    out = matmul(ctx, args.input, args.weight, TRANSPOSE)
    return out if args.bias is None else binary(ctx, out, args.bias, L.ElementWiseOperation.SUM)


@converter("aten::matmul", "aten::mm", "aten::bmm")
def matmul_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    return matmul(ctx, args.self, args[1])


@converter("aten::addmm")
def addmm(ctx: ConversionCtx, args: Args) -> Tensor:
    product = scaled(ctx, matmul(ctx, args.mat1, args.mat2), args.alpha)
    return binary(ctx, scaled(ctx, args.self, args.beta), product, L.ElementWiseOperation.SUM)
