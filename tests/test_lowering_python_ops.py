"""Custom autograd Functions (prim::PythonOp): replaced by a registered inference-time equivalent, or by their own
forward scripted without its autograd bookkeeping (`ctx.save_for_backward`, `ctx.alpha = alpha`), they convert;
otherwise they stay in PyTorch with a warning that names them, says why, and says the module cannot be saved."""
import io

import numpy as np
import pytest
import torch
import torch.nn as nn
from harness import assert_matches_eager, check_compiled

from torchkiln.compiler import compile_with_report

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


def bloom_gelu_forward(x: torch.Tensor) -> torch.Tensor:
    """transformers' BLOOM GELU, which its GeLUFunction's forward calls."""
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


class GeLUFunction(torch.autograd.Function):
    """transformers' BloomGelu: a custom backward around a plain function."""

    @staticmethod
    def forward(ctx, input: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(input)
        return bloom_gelu_forward(input)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        (input,) = ctx.saved_tensors
        return grad_output * input  # not what inference runs


class SignedScale(torch.autograd.Function):
    """A branch on the data: scripted, the branch stays a branch (a trace would keep only the branch it took)."""

    @staticmethod
    def forward(ctx, x):
        ctx.mark_non_differentiable(x)
        if bool(x.sum() > 0):
            return x * 2
        return x - 1

    @staticmethod
    def backward(ctx, grad):
        return grad


class NumpyTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return torch.from_numpy(np.tanh(x.numpy()))

    @staticmethod
    def backward(ctx, grad):
        return grad


class GradAware(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2 if ctx.needs_input_grad[0] else x * 3

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class Unscriptable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return GradAware.apply(NumpyTanh.apply(self.fc(x))).relu()


class Gelu(nn.Module):
    def __init__(self, function: type) -> None:
        super().__init__()
        self.function, self.fc1, self.fc2 = function, nn.Linear(8, 16), nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.function.apply(self.fc1(x)))


def assert_saved_module_matches(compiled, model, x):
    """`compiled`, saved and loaded back, gives `model`'s output on `x`."""
    buffer = io.BytesIO()
    torch.jit.save(compiled, buffer)
    buffer.seek(0)
    with torch.no_grad():
        assert_matches_eager(torchkiln.load(buffer)(x), model(x))


@pytest.mark.parametrize("frontend", ["script", "trace"])
def test_a_function_whose_forward_scripts_is_inlined_and_saves(frontend, registry):
    model, x = Block().eval(), torch.randn(2, 8)
    if frontend == "trace":
        model = torch.jit.trace(model, (x,))
    compiled, _ = check_compiled(model, [x], min_block_size=1)
    assert_saved_module_matches(compiled, model, x)


def test_bloom_gelu_function_traced_is_one_engine(registry):
    model, x = Gelu(GeLUFunction).eval(), torch.randn(2, 4, 8)
    check_compiled(torch.jit.trace(model, (x,)), [x], op="aten::tanh")


def test_an_inlined_forward_keeps_its_branch_on_the_data(registry):
    model = Gelu(SignedScale).eval()
    x = torch.randn(2, 8)
    traced = torch.jit.trace(model, (x,))
    compiled, report = compile_with_report(traced, [x], min_block_size=1)
    assert "prim::PythonOp" not in str(report)
    for sign in (1.0, -1.0):  # the branch the trace took, and the other
        y = sign * (x.abs() + 1)
        if float(model.fc1(y).sum()) * sign < 0:
            y = -y
        with torch.no_grad():
            assert_matches_eager(compiled(y), model(y))


@pytest.mark.parametrize("frontend", ["script", "trace"])
def test_a_function_whose_forward_does_not_script_runs_in_pytorch_with_a_warning(frontend, registry):
    model, x = Unscriptable().eval(), torch.randn(2, 8)
    if frontend == "trace":
        model = torch.jit.trace(model, (x,))
    with pytest.warns(UserWarning, match=r"GradAware \(its forward reads ctx.needs_input_grad\).*NumpyTanh \(its "
                                         r"forward does not script.*cannot be saved.*register_python_op"):
        compiled, report = check_compiled(model, [x], min_block_size=1, engines=None, torch_blocks=None)
    assert report.num_torch_blocks >= 1
    with pytest.raises(RuntimeError, match="Could not export Python function call"):
        torch.jit.save(compiled, io.BytesIO())


def test_registered_equivalents_convert_and_save(registry):
    torchkiln.register_python_op(ScaledSiLU, scaled_silu)
    torchkiln.register_python_op("SplitHalves", split_halves)
    model, x = Block().eval(), torch.randn(2, 8)
    compiled, _ = check_compiled(model, [x], min_block_size=1)
    assert_saved_module_matches(compiled, model, x)


def test_a_replacement_that_does_not_script_is_refused(registry):
    with pytest.raises(ValueError, match="must be TorchScript-able"):
        torchkiln.register_python_op("ScaledSiLU", lambda x, alpha: x)


def test_a_replacement_with_other_arguments_names_the_function(registry):
    def wrong(x: torch.Tensor) -> torch.Tensor:
        return x

    torchkiln.register_python_op("ScaledSiLU", wrong)
    with pytest.raises(ValueError, match="replacement registered for .*ScaledSiLU does not take the arguments"):
        torchkiln.compile(Block().eval(), [torch.randn(2, 8)])


class GradModeScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2 if torch.is_grad_enabled() else x * 3  # apply runs this with gradients off

    @staticmethod
    def backward(ctx, grad):
        return grad * 3


def test_a_forward_that_reads_the_grad_mode_is_not_inlined(registry):
    model, x = Gelu(GradModeScale).eval(), torch.randn(2, 8)
    with pytest.warns(UserWarning, match=r"GradModeScale \(its forward reads or sets the grad mode"):
        check_compiled(torch.jit.trace(model, (x,)), [x], min_block_size=1, engines=None, torch_blocks=None)
    compiled, _ = compile_with_report(torch.jit.trace(model, (x,)), [x], min_block_size=1)
    assert_matches_eager(compiled(x), model(x).detach())  # with gradients on, as a caller may run it


class ConfiguredScale(torch.autograd.Function):
    """A Function taking its settings as a dict of mixed values, as some model code passes its config
    (transformers' YOSO): TorchScript has no constant of it."""

    @staticmethod
    def forward(ctx, x, config):
        return x * config["scale"] if config["mode"] == "scaled" else x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class Configured(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return ConfiguredScale.apply(self.fc(x), {"scale": 3.0, "mode": "scaled"}).relu()


def test_a_function_taking_a_python_object_runs_in_pytorch_with_a_warning(registry):
    """A traced call whose argument TorchScript has no constant of (a dict) stays in PyTorch, saying so, and the
    module matches eager; a replacement registered for it cannot take the call, and the error names it."""
    model, x = Configured().eval(), torch.randn(2, 8)
    traced = torch.jit.trace(model, (x,))
    with pytest.warns(UserWarning, match=r"ConfiguredScale \(its argument 1 is a Python dict, which TorchScript "
                                         r"cannot hold as a constant\)"):
        compiled, report = check_compiled(traced, [x], min_block_size=1, engines=None, torch_blocks=None)
    assert report.num_torch_blocks >= 1
    assert_matches_eager(compiled(x), model(x))

    def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
        return x * factor

    torchkiln.register_python_op(ConfiguredScale, scale)
    with pytest.raises(ValueError, match="replacement registered for .*ConfiguredScale cannot take the arguments"
                                         ".*a Python dict"):
        torchkiln.compile(torch.jit.trace(model, (x,)), [x], min_block_size=1)
