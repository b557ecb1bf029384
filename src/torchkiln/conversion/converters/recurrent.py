"""Recurrent cells and layers composed as ATen computes them: lstm_cell, gru_cell, rnn_tanh_cell, rnn_relu_cell, and
aten::lstm / aten::gru / aten::rnn_tanh / aten::rnn_relu (nn.LSTM, nn.GRU, nn.RNN: several layers, bidirectional,
batch_first) unrolled over a static sequence length.

ATen's gate order is kept: LSTM i, f, g, o; GRU r, z, n with the reset gate applied after the hidden
projection (ONNX's linear_before_reset=1).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.elementwise import binary
from torchkiln.conversion.impl.matmul import linear
from torchkiln.conversion.impl.shuffle import permute
from torchkiln.conversion.impl.slicing import slice_dim
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

E, A = L.ElementWiseOperation, L.ActivationType

MAX_STEPS = 512  # longer sequences stay in PyTorch: the unrolled network grows with the sequence


def _gates(ctx: ConversionCtx, x: Tensor, count: int) -> list[Tensor]:
    """x.chunk(count, dim=-1)."""
    size = x.shape[-1] // count
    lead = [0] * (x.rank - 1)
    return [ctx.network.add_slice(x, [*lead, i * size], [*x.shape[:-1], size], [1] * x.rank).get_output()
            for i in range(count)]


def _act(ctx: ConversionCtx, x: Tensor, kind: L.ActivationType) -> Tensor:
    return ctx.network.add_activation(x, kind).get_output()


def _lstm_step(ctx: ConversionCtx, x_proj: Tensor, h: Tensor, c: Tensor, w_hh, b_hh) -> tuple[Tensor, Tensor]:
    """One LSTM step from the input's projection x @ w_ih.T + b_ih: the next (h, c)."""
    gates = binary(ctx, x_proj, linear(ctx, h, w_hh, b_hh), E.SUM)
    i, f, g, o = _gates(ctx, gates, 4)
    i, f, g, o = _act(ctx, i, A.SIGMOID), _act(ctx, f, A.SIGMOID), _act(ctx, g, A.TANH), _act(ctx, o, A.SIGMOID)
    c_next = binary(ctx, binary(ctx, f, c, E.PROD), binary(ctx, i, g, E.PROD), E.SUM)
    return binary(ctx, o, _act(ctx, c_next, A.TANH), E.PROD), c_next


def _gru_step(ctx: ConversionCtx, x_proj: Tensor, h: Tensor, w_hh, b_hh) -> tuple[Tensor]:
    """One GRU step from the input's projection x @ w_ih.T + b_ih: the next h (a 1-tuple)."""
    in_r, in_z, in_n = _gates(ctx, x_proj, 3)
    h_r, h_z, h_n = _gates(ctx, linear(ctx, h, w_hh, b_hh), 3)
    reset = _act(ctx, binary(ctx, in_r, h_r, E.SUM), A.SIGMOID)
    update = _act(ctx, binary(ctx, in_z, h_z, E.SUM), A.SIGMOID)
    new = _act(ctx, binary(ctx, in_n, binary(ctx, h_n, reset, E.PROD), E.SUM), A.TANH)
    return (binary(ctx, binary(ctx, binary(ctx, h, new, E.SUB), update, E.PROD), new, E.SUM),)


def _elman_step(activation: L.ActivationType) -> Callable[..., tuple[Tensor]]:
    """nn.RNN's step: the next h = activation(x @ w_ih.T + b_ih + h @ w_hh.T + b_hh) (a 1-tuple)."""
    def step(ctx: ConversionCtx, x_proj: Tensor, h: Tensor, w_hh, b_hh) -> tuple[Tensor]:
        return (_act(ctx, binary(ctx, x_proj, linear(ctx, h, w_hh, b_hh), E.SUM), activation),)
    return step


_ELMAN = {"tanh": _elman_step(A.TANH), "relu": _elman_step(A.RELU)}


@converter("aten::lstm_cell")
def lstm_cell(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor]:
    h, c = (ctx.to_tensor(t) for t in args.hx)
    return _lstm_step(ctx, linear(ctx, args.input, args.w_ih, args.b_ih), h, c, args.w_hh, args.b_hh)


@converter("aten::gru_cell")
def gru_cell(ctx: ConversionCtx, args: Args) -> Tensor:
    return _gru_step(ctx, linear(ctx, args.input, args.w_ih, args.b_ih), ctx.to_tensor(args.hx),
                     args.w_hh, args.b_hh)[0]


@converter("aten::rnn_tanh_cell", "aten::rnn_relu_cell")
def rnn_cell(ctx: ConversionCtx, args: Args) -> Tensor:
    step = _ELMAN["relu" if args.node.kind() == "aten::rnn_relu_cell" else "tanh"]
    return step(ctx, linear(ctx, args.input, args.w_ih, args.b_ih), ctx.to_tensor(args.hx), args.w_hh, args.b_hh)[0]


def _sequence_ok(args: Args) -> str | None:
    """aten::lstm.input / gru.input / rnn_tanh.input / rnn_relu.input: a rank-3 input of static sequence length,
    weights without projections."""
    shape = args.input.shape
    if len(shape) != 3:
        return f"an input of rank {len(shape)} (expected [seq, batch, feature] or batch_first)"
    steps = shape[1 if args.batch_first else 0]
    if not isinstance(steps, int):
        return "a sequence length known only at run time (the recurrence is unrolled over a static length)"
    if not 0 < steps <= MAX_STEPS:
        return f"a sequence of {steps} steps (unrolled: 1 to {MAX_STEPS})"
    if args.train and args.dropout > 0:
        return "dropout between layers in training mode"
    if not isinstance(args.params, (list, tuple)) or any(p is None for p in args.params):
        return "weights known only at run time"
    per_direction = 4 if args.has_biases else 2
    if len(args.params) != args.num_layers * (2 if args.bidirectional else 1) * per_direction:
        return "weights of another layout (an LSTM with proj_size)"
    return None


def _cat(ctx: ConversionCtx, parts: Sequence[Tensor], axis: int) -> Tensor:
    return parts[0] if len(parts) == 1 else ctx.network.add_concatenation(list(parts), axis).get_output()


def _recurrence(ctx: ConversionCtx, args: Args, initial: Sequence[Tensor],
                step: Callable[..., tuple[Tensor, ...]]) -> list[Tensor]:
    """Every layer and direction unrolled over the sequence: [output, final states stacked as the initial]."""
    x = ctx.to_tensor(args.input)
    if args.batch_first:
        x = permute(ctx, x, [1, 0, 2])
    steps, directions = x.shape[0], 2 if args.bidirectional else 1
    per_direction = 4 if args.has_biases else 2
    params = list(args.params)
    finals: list[list[Tensor]] = [[] for _ in initial]
    for layer in range(args.num_layers):
        outputs = []
        for direction in range(directions):
            index = layer * directions + direction
            w_ih, w_hh, *biases = params[index * per_direction:(index + 1) * per_direction]
            b_ih, b_hh = biases or (None, None)
            w_hh, b_hh = ctx.to_tensor(w_hh), None if b_hh is None else ctx.to_tensor(b_hh)  # once, not per step
            projected = linear(ctx, x, w_ih, b_ih)  # every step's input projection in one product
            state = tuple(slice_dim(ctx, s, 0, index, index + 1) for s in initial)  # [1, batch, hidden]
            sequence = []
            for t in (range(steps) if direction == 0 else reversed(range(steps))):
                state = step(ctx, slice_dim(ctx, projected, 0, t, t + 1), *state, w_hh, b_hh)
                sequence.append(state[0])
            if direction:
                sequence.reverse()
            outputs.append(_cat(ctx, sequence, 0))
            for final, s in zip(finals, state):
                final.append(s)
        x = _cat(ctx, outputs, 2)
    if args.batch_first:
        x = permute(ctx, x, [1, 0, 2])
    return [x] + [_cat(ctx, final, 0) for final in finals]


@converter("aten::lstm.input", capability=_sequence_ok)
def lstm(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor, Tensor]:
    out, h, c = _recurrence(ctx, args, [ctx.to_tensor(t) for t in args.hx], _lstm_step)
    return out, h, c


@converter("aten::gru.input", capability=_sequence_ok)
def gru(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor]:
    out, h = _recurrence(ctx, args, [ctx.to_tensor(args.hx)], _gru_step)
    return out, h


@converter("aten::rnn_tanh.input", "aten::rnn_relu.input", capability=_sequence_ok)
def rnn(ctx: ConversionCtx, args: Args) -> tuple[Tensor, Tensor]:
    step = _ELMAN["relu" if args.node.kind() == "aten::rnn_relu" else "tanh"]
    out, h = _recurrence(ctx, args, [ctx.to_tensor(args.hx)], step)
    return out, h
