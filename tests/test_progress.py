"""The build progress display: phases and engine blocks on stderr; off where stderr is not a terminal or when
TORCHKILN_PROGRESS=0; on from the start with TORCHKILN_PROGRESS=1."""
import io
import sys

import pytest
import torch
from torch import nn

import torchkiln
from torchkiln import progress

PHASES = ["scripting", "lowering", "shape analysis", "partitioning", "engine block 1/1", "stitching", "done"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _compile() -> None:
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    torchkiln.compile(model, [torchkiln.Input((2, 4))])


def test_forced_on_it_reports_every_phase(monkeypatch, capsys):
    monkeypatch.setenv(progress.ENV, "1")
    _compile()
    shown = capsys.readouterr().err
    positions = [shown.find(f"compiling Sequential: {phase}") for phase in PHASES]
    assert -1 not in positions and positions == sorted(positions), shown


def test_off_where_stderr_is_not_a_terminal(monkeypatch, capsys):
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.setattr(progress, "DELAY", 0)
    _compile()
    assert "compiling Sequential" not in capsys.readouterr().err


@pytest.mark.parametrize("value,shown", [("0", False), ("auto", True), ("", True)])
def test_on_a_terminal_unless_asked_off(monkeypatch, value, shown):
    monkeypatch.setenv(progress.ENV, value)
    monkeypatch.setattr(progress, "DELAY", 0)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _compile()
    assert ("compiling Sequential: done" in terminal.getvalue()) == shown


def test_nothing_is_printed_before_the_delay(monkeypatch):
    monkeypatch.delenv(progress.ENV, raising=False)
    monkeypatch.setattr(progress, "DELAY", 3600)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    _compile()
    assert terminal.getvalue() == ""


def test_a_bad_switch_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(progress.ENV, "sometimes")
    with pytest.raises(ValueError, match=progress.ENV):
        _compile()
