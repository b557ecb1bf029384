"""Matrix products: matmul with torch's broadcasting, and linear (x @ weight.T + bias)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

NONE, TRANSPOSE = L.MatrixOperation.NONE, L.MatrixOperation.TRANSPOSE


def matmul(ctx: ConversionCtx, a, b, op_b: L.MatrixOperation = NONE) -> Tensor:
    """torch.matmul(a, b), or a @ b.mT with op_b=TRANSPOSE."""
    return ctx.network.add_matrix_multiply(ctx.to_tensor(a), NONE, ctx.to_tensor(b), op_b).get_output()


def linear(ctx: ConversionCtx, x, weight, bias) -> Tensor:
    """torch.nn.functional.linear: x @ weight.T (+ bias)."""
    out = matmul(ctx, x, weight, TRANSPOSE)
    return out if bias is None else binary(ctx, out, bias, L.ElementWiseOperation.SUM)
