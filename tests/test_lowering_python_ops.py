"""Custom autograd Functions (prim::PythonOp): left in PyTorch with a warning that names them and says the
compiled module cannot be saved; replaced by a registered inference-time equivalent, they convert."""
import io

import pytest
import torch
import torch.nn as nn
from harness import assert_matches_eager, check_compiled

import torchkiln
from torchkiln.lowering.passes.replace_python_ops import PYTHON_OPS


class ScaledSiLU(torch.autograd.Function):
    """A memory-saving activation as model code writes one: a custom backward, a plain forward."""

    @staticmethod
    def forward(ctx, x, alpha: float):
        ctx.save_for_backward(x)
        ctx.alpha = alpha
        return x * torch.sigmoid(alpha * x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(ctx.alpha * x)
        return grad * (s + ctx.alpha * x * s * (1 - s)), None


class SplitHalves(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x[..., :4] * 2, x[..., 4:] + 1

    @staticmethod
    def backward(ctx, a, b):
        return torch.cat([a * 2, b], -1)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = SplitHalves.apply(ScaledSiLU.apply(self.fc1(x), 1.702))
        return self.fc2(torch.cat([a, b], -1)).relu()


def scaled_silu(x: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * torch.sigmoid(alpha * x)


def split_halves(x: torch.Tensor):
    return x[..., :4] * 2, x[..., 4:] + 1


@pytest.fixture
def registry():
    saved = dict(PYTHON_OPS)
    yield
    PYTHON_OPS.clear()
    PYTHON_OPS.update(saved)


@pytest.mark.parametrize("frontend", ["script", "trace"])
def test_an_unregistered_function_runs_in_pytorch_with_a_warning(frontend, registry):
    model, x = Block().eval(), torch.randn(2, 8)
    if frontend == "trace":
        model = torch.jit.trace(model, (x,))
    with pytest.warns(UserWarning, match=r"ScaledSiLU.*SplitHalves.*cannot be saved.*register_python_op"):
        compiled, report = check_compiled(model, [x], min_block_size=1, engines=None, torch_blocks=None)
    assert report.num_torch_blocks >= 1
    with pytest.raises(RuntimeError, match="Could not export Python function call"):
        torch.jit.save(compiled, io.BytesIO())


def test_registered_equivalents_convert_and_save(registry):
    torchkiln.register_python_op(ScaledSiLU, scaled_silu)
    torchkiln.register_python_op("SplitHalves", split_halves)
    model, x = Block().eval(), torch.randn(2, 8)
    compiled, _ = check_compiled(model, [x], min_block_size=1)
    buffer = io.BytesIO()
    torch.jit.save(compiled, buffer)
    buffer.seek(0)
    with torch.no_grad():
        assert_matches_eager(torchkiln.load(buffer)(x), model(x))


def test_a_replacement_that_does_not_script_is_refused(registry):
    with pytest.raises(ValueError, match="must be TorchScript-able"):
        torchkiln.register_python_op("ScaledSiLU", lambda x, alpha: x)


def test_a_replacement_with_other_arguments_names_the_function(registry):
    def wrong(x: torch.Tensor) -> torch.Tensor:
        return x

    torchkiln.register_python_op("ScaledSiLU", wrong)
    with pytest.raises(ValueError, match="replacement registered for .*ScaledSiLU does not take the arguments"):
        torchkiln.compile(Block().eval(), [torch.randn(2, 8)])
