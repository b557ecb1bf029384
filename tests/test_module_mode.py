"""Compiling leaves every submodule in the mode the user left it in, and warns about training mode."""
import warnings

import pytest
import torch
from harness import assert_matches_eager
from torch import nn

import torchkiln


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x) * 2


def _modes(module: nn.Module) -> list[bool]:
    return [m.training for m in module.modules()]


def test_compile_keeps_each_submodule_mode():
    model = Wrapper()
    model.body.eval()  # the wrapper stays in training mode, its body is in eval mode
    before = _modes(model)
    assert before[0] and not any(before[1:])
    x = torch.randn(4, 8)
    compiled = torchkiln.compile(model, inputs=[torchkiln.Input((4, 8))], min_block_size=1)
    assert _modes(model) == before
    model.eval()
    torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-5)


def test_scripted_module_modes_are_restored():
    scripted = torch.jit.script(Wrapper())
    scripted.body.eval()
    before = _modes(scripted)
    torchkiln.compile(scripted, inputs=[torchkiln.Input((4, 8))], min_block_size=1)
    assert _modes(scripted) == before


class DropoutBatchNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(torch.relu(self.bn(self.conv(x))))


def test_a_module_left_in_training_mode_warns_and_computes_eval_behaviour():
    torch.manual_seed(0)
    model = DropoutBatchNorm()
    model.bn.running_mean.uniform_(-1, 1)
    model.bn.running_var.uniform_(0.5, 2)
    x = torch.randn(2, 3, 6, 6)
    with pytest.warns(UserWarning, match=r"DropoutBatchNorm is in training mode \(bn, drop\).*"
                                         r"eval-mode behaviour \(dropout off, batch norm with its running stat"):
        compiled = torchkiln.compile(model, inputs=[x], min_block_size=1)
    assert model.training
    with torch.no_grad():
        assert_matches_eager(compiled(x), model.eval()(x))


def test_a_scripted_module_in_training_mode_warns():
    with pytest.warns(UserWarning, match=r"DropoutBatchNorm is in training mode \(bn, drop\)"):
        torchkiln.compile(torch.jit.script(DropoutBatchNorm()), inputs=[torch.randn(2, 3, 6, 6)], min_block_size=1)


@pytest.mark.parametrize("which", ["eval", "no training-dependent submodule in training mode"])
def test_no_warning_when_training_mode_changes_nothing(which):
    model = DropoutBatchNorm().eval() if which == "eval" else Wrapper()
    if which != "eval":
        model.body.eval()  # the wrapper's own forward does not read self.training
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = torch.randn(2, 3, 6, 6) if which == "eval" else torch.randn(4, 8)
        torchkiln.compile(model, inputs=[x], min_block_size=1)
    assert not [w for w in caught if "training mode" in str(w.message)]


class Containers(nn.Module):
    """Sequential, ModuleList and ModuleDict: their TorchScript methods include __len__ (and __contains__), whose
    Python attribute is the container's own Python method."""

    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5), nn.ReLU())
        self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
        self.heads = nn.ModuleDict({"a": nn.Linear(8, 4), "b": nn.Dropout(0.2)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.seq(x)
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.heads["a"](self.heads["b"](x))


@pytest.mark.parametrize("scripted", [False, True], ids=["module", "scripted"])
def test_a_training_mode_model_with_containers_warns_and_computes_eval_behaviour(scripted):
    torch.manual_seed(0)
    model = Containers()
    x = torch.randn(4, 8)
    given = torch.jit.script(model) if scripted else model
    with pytest.warns(UserWarning, match=r"Containers is in training mode \(seq.1, heads.b\)"):
        compiled = torchkiln.compile(given, inputs=[x], min_block_size=1)
    assert all(_modes(given))
    with torch.no_grad():
        assert_matches_eager(compiled(x), model.eval()(x))
