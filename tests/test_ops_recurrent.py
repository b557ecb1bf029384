"""lstm_cell and gru_cell through the whole pipeline, with an nn.LSTMCell's / nn.GRUCell's weights.

The cells are called as torch.lstm_cell / torch.gru_cell: the op a scripted nn.LSTMCell reaches once its
input checks fold, without depending on the evaluators of those checks.
"""
import pytest
import torch
import torch.nn as nn
from harness import check_compiled


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
