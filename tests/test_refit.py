"""refit_module_weights (issue 17): new weights into a compiled module's engines, checked against eager."""
import copy

import pytest
import torch

import torchkiln
from harness import assert_matches_eager


class ConvNet(torch.nn.Module):
    """Conv + batch norm (folded into the kernel by the builder) + linear."""

    def __init__(self, hidden: int = 10) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 6 * 6, hidden)

    def forward(self, x):
        return self.fc(torch.relu(self.bn(self.conv(x))).flatten(1))


def _model(hidden: int = 10) -> ConvNet:
    model = ConvNet(hidden).eval()
    model.bn.running_mean.normal_()
    model.bn.running_var.uniform_(0.5, 2.0)
    model.bn.weight.data.uniform_(0.5, 2.0)
    return model


INPUTS = [torchkiln.Input((2, 3, 8, 8))]


def test_refit_gives_the_new_models_outputs_in_place():
    old, new = _model(), _model()
    compiled = torchkiln.compile(old, INPUTS)
    x = torch.randn(2, 3, 8, 8)
    assert_matches_eager(compiled(x), old(x))
    assert torchkiln.refit_module_weights(compiled, new) is compiled
    assert_matches_eager(compiled(x), new(x))
    assert (compiled(x) - old(x)).abs().max() > 0.1  # the old weights are gone


def test_a_copy_is_refit_alone():
    old, new = _model(), _model()
    compiled = torchkiln.compile(old, INPUTS)
    copied = copy.deepcopy(compiled)
    torchkiln.refit_module_weights(copied, new)
    x = torch.randn(2, 3, 8, 8)
    assert_matches_eager(copied(x), new(x))
    assert_matches_eager(compiled(x), old(x))


def test_refit_fp16_engine():
    old, new = _model(), _model()
    compiled = torchkiln.compile(old, INPUTS, enabled_precisions={torch.float16}, backend="reference")
    torchkiln.refit_module_weights(compiled, new)
    x = torch.randn(2, 3, 8, 8)
    out, ref = compiled(x), new(x)
    assert torch.nn.functional.cosine_similarity(out.flatten(), ref.flatten(), dim=0) >= 0.999
    assert (out - ref).abs().max() <= 1e-2 * ref.abs().max()


def test_refit_with_another_shape_names_the_parameter():
    compiled = torchkiln.compile(_model(), INPUTS)
    with pytest.raises(torchkiln.RefitError,
                       match=r"parameter 'fc.weight': shape \[12, 288\] in the new model, \[10, 288\]"):
        torchkiln.refit_module_weights(compiled, _model(hidden=12))
    with pytest.raises(torchkiln.RefitError, match=r"parameter 'conv.weight': dtype torch.float64"):
        torchkiln.refit_module_weights(compiled, _model().double())


def test_refit_of_a_loaded_module(tmp_path):
    old, new = _model(), _model()
    path = str(tmp_path / "m.ts")
    torch.jit.save(torchkiln.compile(old, INPUTS), path)
    loaded = torchkiln.load(path)
    with pytest.raises(ValueError, match="records no compile settings"):
        torchkiln.refit_module_weights(loaded, new)
    with pytest.raises(torchkiln.RefitError, match=r"engine 'ConvNet_0': .*compiled"):
        torchkiln.refit_module_weights(loaded, _model(hidden=12), INPUTS)
    torchkiln.refit_module_weights(loaded, new, INPUTS)
    x = torch.randn(2, 3, 8, 8)
    assert_matches_eager(loaded(x), new(x))


def test_refit_refuses_weights_frozen_into_the_pytorch_part():
    old = _model()
    compiled = torchkiln.compile(old, INPUTS, torch_executed_ops=["aten::linear"])
    new = _model()
    with pytest.raises(torchkiln.RefitError, match="runs in PyTorch"):
        torchkiln.refit_module_weights(compiled, new)
    x = torch.randn(2, 3, 8, 8)
    assert_matches_eager(compiled(x), old(x))  # untouched
