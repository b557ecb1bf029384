"""A module that cannot be scripted is traced: tracing's warnings reach the user as torchkiln warnings, and a
trace that baked in data-dependent values is refused instead of compiling to a constant."""
import logging

import pytest
import torch
from harness import assert_matches_eager

import torchkiln


class BakesNumpy(torch.nn.Module):
    """x.numpy() cannot be scripted; tracing records its result as a constant."""

    def forward(self, x):
        return torch.from_numpy(x.numpy() * 2) + 1


class BakesBranch(torch.nn.Module):
    """A lambda cannot be scripted; the branch on the data is taken once, at trace time."""

    def forward(self, x):
        double = lambda t: t * 2  # noqa: E731
        if x.max() > 100:
            return double(x)
        return x - 1


class BakesShapeConstant(torch.nn.Module):
    """The trace is right for every input of this shape, but tracing still warns."""

    def forward(self, x):
        scale = lambda t: t * 3  # noqa: E731
        return scale(x) + torch.tensor(x.shape[1], dtype=torch.float32)


class Clean(torch.nn.Module):
    def forward(self, x, *rest):
        return torch.relu(x) * 2


@pytest.mark.parametrize("model, example", [(BakesNumpy(), torch.randn(2, 3)),
                                            (BakesBranch(), torch.full((2, 3), 1000.0))],
                         ids=["numpy", "branch"])
def test_trace_that_bakes_in_data_is_refused(model, example):
    with pytest.warns(torchkiln.TracingWarning, match="Converting a tensor to"):
        with pytest.raises(torchkiln.TracingError, match=rf"{type(model).__name__}.*baked.*scriptable"):
            torchkiln.compile(model, [example])


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")
def test_tracing_warning_is_surfaced_and_logged(caplog):
    model, x = BakesShapeConstant(), torch.randn(2, 3)
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        with pytest.warns(torchkiln.TracingWarning, match="BakesShapeConstant.*torch.tensor results"):
            compiled = torchkiln.compile(model, [x])
    assert any("torch.tensor results" in r.getMessage() for r in caplog.records)
    y = torch.randn(2, 3)
    assert_matches_eager(compiled(y), model(y))


def test_clean_trace_compiles_without_warning(recwarn):
    model, x = Clean(), torch.randn(2, 3)
    compiled = torchkiln.compile(model, [x])
    assert not [w for w in recwarn if issubclass(w.category, torchkiln.TracingWarning)]
    y = torch.randn(2, 3)
    assert_matches_eager(compiled(y), model(y))
