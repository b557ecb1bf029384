"""Recurrent cells composed as ATen computes them: lstm_cell, gru_cell."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary
from torchkiln.conversion.impl.matmul import linear
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

E, A = L.ElementWiseOperation, L.ActivationType


def _gates(ctx: ConversionCtx, x: Tensor, count: int) -> list[Tensor]:
    """x.chunk(count, dim=-1)."""
    size = x.shape[-1] // count
    lead = [0] * (x.rank - 1)
    return [ctx.network.add_slice(x, [*lead, i * size], [*x.shape[:-1], size], [1] * x.rank).get_output()
            for i in range(count)]


def _act(ctx: ConversionCtx, x: Tensor, kind: L.ActivationType) -> Tensor:
    return ctx.network.add_activation(x, kind).get_output()


@converter("aten::lstm_cell")
def lstm_cell(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor]:
    h, c = (ctx.to_tensor(t) for t in args.hx)
    gates = binary(ctx, linear(ctx, args.input, args.w_ih, args.b_ih), linear(ctx, h, args.w_hh, args.b_hh), E.SUM)
    i, f, g, o = _gates(ctx, gates, 4)
    i, f, g, o = _act(ctx, i, A.SIGMOID), _act(ctx, f, A.SIGMOID), _act(ctx, g, A.TANH), _act(ctx, o, A.SIGMOID)
    c_next = binary(ctx, binary(ctx, f, c, E.PROD), binary(ctx, i, g, E.PROD), E.SUM)
    return binary(ctx, o, _act(ctx, c_next, A.TANH), E.PROD), c_next


@converter("aten::gru_cell")
def gru_cell(ctx: ConversionCtx, args: Args) -> Tensor:
    h = ctx.to_tensor(args.hx)
    in_r, in_z, in_n = _gates(ctx, linear(ctx, args.input, args.w_ih, args.b_ih), 3)
    h_r, h_z, h_n = _gates(ctx, linear(ctx, h, args.w_hh, args.b_hh), 3)
    reset = _act(ctx, binary(ctx, in_r, h_r, E.SUM), A.SIGMOID)
    update = _act(ctx, binary(ctx, in_z, h_z, E.SUM), A.SIGMOID)
    new = _act(ctx, binary(ctx, in_n, binary(ctx, h_n, reset, E.PROD), E.SUM), A.TANH)
    return binary(ctx, binary(ctx, binary(ctx, h, new, E.SUB), update, E.PROD), new, E.SUM)
