"""lstm_cell and gru_cell through the whole pipeline, with an nn.LSTMCell's / nn.GRUCell's weights; nn.LSTM and
nn.GRU (aten::lstm.input / aten::gru.input) unrolled over their static sequence length.

The cells are called as torch.lstm_cell / torch.gru_cell: the op a scripted nn.LSTMCell reaches once its
input checks fold, without depending on the evaluators of those checks.
"""
import pytest
import torch
import torch.nn as nn
from harness import assert_falls_back, check_compiled

import torchkiln


class LSTMCell(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(6, 5, bias=bias)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        cell = self.cell
        return torch.lstm_cell(x, [h, c], cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)


class GRUCell(nn.Module):
    def __init__(self, bias: bool) -> None:
        super().__init__()
        self.cell = nn.GRUCell(6, 5, bias=bias)

    def forward(self, x: torch.Tensor, h: torch.Tensor):
        cell = self.cell
        return torch.gru_cell(x, h, cell.weight_ih, cell.weight_hh, cell.bias_ih, cell.bias_hh)


@pytest.mark.parametrize("bias", [True, False])
def test_lstm_cell(bias):
    _, report = check_compiled(LSTMCell(bias), [torch.randn(3, 6), torch.randn(3, 5), torch.randn(3, 5)],
                               min_block_size=1)
    assert "aten::lstm_cell" in report.blocks[0].ops


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu"])
@pytest.mark.parametrize("bias", [True, False])
def test_rnn_cell(nonlinearity, bias):
    cell = nn.RNNCell(6, 5, bias=bias, nonlinearity=nonlinearity)
    op = getattr(torch, f"rnn_{nonlinearity}_cell")

    class Cell(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.cell = cell

        def forward(self, x: torch.Tensor, h: torch.Tensor):
            return op(x, h, self.cell.weight_ih, self.cell.weight_hh, self.cell.bias_ih, self.cell.bias_hh)

    _, report = check_compiled(Cell(), [torch.randn(3, 6), torch.randn(3, 5) * 2], min_block_size=1)
    assert f"aten::rnn_{nonlinearity}_cell" in report.blocks[0].ops


@pytest.mark.parametrize("bias", [True, False])
def test_gru_cell(bias):
    _, report = check_compiled(GRUCell(bias), [torch.randn(3, 6), torch.randn(3, 5)], min_block_size=1)
    assert "aten::gru_cell" in report.blocks[0].ops


class Unrolled(nn.Module):
    """Two steps of a GRU cell, each feeding an LSTM cell; weights shared across steps."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = GRUCell(True)
        self.lstm = LSTMCell(True)
        self.lstm.cell = nn.LSTMCell(5, 5)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        h = self.gru(x, h)
        state, c = self.lstm(h, h, c)
        h = self.gru(x, h)
        state, c = self.lstm(h, state, c)
        return state, c


def test_unrolled_cells():
    _, report = check_compiled(Unrolled(), [torch.randn(2, 6), torch.randn(2, 5), torch.randn(2, 5)])
    assert report.blocks[0].ops.count("aten::lstm_cell") == 2


class LSTM(nn.Module):
    """nn.LSTM as a sequence model calls it: with or without initial states."""

    def __init__(self, layers: int, bidirectional: bool, batch_first: bool, states: bool, **more) -> None:
        super().__init__()
        self.rnn = nn.LSTM(6, 5, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first,
                           dropout=0.25 if layers > 1 else 0.0, **more)
        self.states = states

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        if self.states:
            return self.rnn(x, (h, c))
        return self.rnn(x)


class GRU(nn.Module):
    """nn.GRU as a sequence model calls it: with or without an initial state."""

    def __init__(self, layers: int, bidirectional: bool, batch_first: bool, states: bool, **more) -> None:
        super().__init__()
        self.rnn = nn.GRU(6, 5, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first,
                          dropout=0.25 if layers > 1 else 0.0, **more)
        self.states = states

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        if self.states:
            return self.rnn(x, h)
        return self.rnn(x)


class RNN(nn.Module):
    """nn.RNN (tanh or ReLU) as a sequence model calls it: with or without an initial state."""

    def __init__(self, layers: int, bidirectional: bool, batch_first: bool, states: bool,
                 nonlinearity: str = "tanh", **more) -> None:
        super().__init__()
        self.rnn = nn.RNN(6, 5, num_layers=layers, nonlinearity=nonlinearity, bidirectional=bidirectional,
                          batch_first=batch_first, dropout=0.25 if layers > 1 else 0.0, **more)
        self.states = states

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        if self.states:
            return self.rnn(x, h)
        return self.rnn(x)


KINDS = {"lstm": LSTM, "gru": GRU, "rnn_tanh": RNN,
         "rnn_relu": lambda *a, **k: RNN(*a, nonlinearity="relu", **k)}


def _example(layers: int, bidirectional: bool, batch_first: bool, steps: int = 4) -> list[torch.Tensor]:
    x = torch.randn(3, steps, 6) if batch_first else torch.randn(steps, 3, 6)
    states = layers * (2 if bidirectional else 1)
    return [x, torch.randn(states, 3, 5), torch.randn(states, 3, 5)]


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("layers, bidirectional, batch_first, states, bias", [
    (1, False, False, False, True), (1, True, True, True, False), (2, False, True, True, True),
    (2, True, False, False, True)])
def test_recurrent_layers(kind, layers, bidirectional, batch_first, states, bias):
    model = torch.jit.script(KINDS[kind](layers, bidirectional, batch_first, states, bias=bias).eval())
    check_compiled(model, _example(layers, bidirectional, batch_first), min_block_size=1,
                   op=f"aten::{kind}.input")


def test_recurrent_dynamic_sequence_length_falls_back():
    model = GRU(1, False, True, False)
    spec = torchkiln.Input(min_shape=(3, 2, 6), opt_shape=(3, 4, 6), max_shape=(3, 8, 6))
    _, report = check_compiled(model, _example(1, False, True), min_block_size=1,
                               inputs=[spec, torchkiln.Input((1, 3, 5)), torchkiln.Input((1, 3, 5))],
                               engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::gru.input", "a sequence length known only at run time")


def test_lstm_with_projections_falls_back():
    model = LSTM(1, False, False, False, proj_size=3)
    _, report = check_compiled(model, _example(1, False, False), min_block_size=1, engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::lstm.input", "proj_size")
