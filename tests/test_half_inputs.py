"""A float16/bfloat16 Input on a float32 model: cast to float32 as the engine's first layer (as Torch-TensorRT);
a float32 Input on a float16 model: cast to float16; an Input without a dtype on a float16 model: float16."""
import pytest
import torch
from harness import assert_matches_eager
from torch import nn
from torch.nn import functional as F

import torchkiln
from torchkiln.compiler import compile_with_report


class ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x))) + y


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_half_precision_input_on_a_float32_model_is_cast_at_the_engine_entry(dtype):
    torch.manual_seed(0)
    model = ConvBn().eval()
    x, y = torch.randn(2, 3, 6, 6).to(dtype), torch.randn(2, 4, 6, 6)
    with pytest.raises(RuntimeError):  # eager itself refuses it
        model(x, y)
    compiled, report = compile_with_report(model, [torchkiln.Input((2, 3, 6, 6), dtype=dtype),
                                                   torchkiln.Input((2, 4, 6, 6))])
    assert report.num_engine_blocks == 1 and report.num_torch_blocks == 0, report
    engine = report.blocks[0]
    assert engine.inputs[0].dtype == dtype and engine.ops[0].startswith("aten::to")
    with torch.no_grad():
        assert_matches_eager(compiled(x, y), model(x.float(), y))


def test_a_half_precision_input_of_the_wrong_shape_reports_the_shape():
    """The cast is what compile does with such an input, so the error is the one left after it: the shape."""
    with pytest.raises(ValueError, match=r"inputs: running the method on random example inputs \(2, 5, 6, 6\) "
                                         r"float16, \(2, 4, 6, 6\) float32 failed \(RuntimeError: .*expected input"
                                         r".* to have 3 channels, but got 5 channels") as info:
        torchkiln.compile(ConvBn().eval(), [torchkiln.Input((2, 5, 6, 6), dtype=torch.float16),
                                            torchkiln.Input((2, 4, 6, 6))])
    assert "Half" not in str(info.value)


class LeNet(nn.Module):
    """Torch-TensorRT's LeNet example: its linear layer takes the flattened features of a 32x32 image only."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(1, 6, 3), nn.Conv2d(6, 16, 3)
        self.fc1, self.fc2, self.fc3 = nn.Linear(16 * 6 * 6, 120), nn.Linear(120, 84), nn.Linear(84, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = torch.flatten(F.max_pool2d(F.relu(self.conv2(x)), 2), 1)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x)))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_a_dynamic_range_the_linear_layer_cannot_take_names_the_shape(dtype):
    """At the range's min (28x28) the flattened features are 400, not fc1's 576: fp16 says so as fp32 does (it
    once reported the half-precision input against the float32 bias, which compile casts anyway)."""
    spec = torchkiln.Input(min_shape=(1, 1, 28, 28), opt_shape=(1, 1, 32, 32), max_shape=(1, 1, 40, 40), dtype=dtype)
    with pytest.raises(ValueError, match=rf"inputs: running the method on random example inputs \(1, 1, 28, 28\) "
                                         rf"{str(dtype).removeprefix('torch.')} failed \(RuntimeError: mat1 and "
                                         rf"mat2 shapes cannot be multiplied \(1x400 and 576x120\)\)"):
        torchkiln.compile(LeNet().eval(), [spec], enabled_precisions={dtype})


def test_a_float16_model_takes_float16_inputs_uncast():
    model = ConvBn().eval().half()
    x, y = torch.randn(2, 3, 6, 6).half(), torch.randn(2, 4, 6, 6).half()
    compiled, report = compile_with_report(model, [x, y], backend="reference")
    assert not any(op.startswith("aten::to") for b in report.blocks for op in b.ops)
    with torch.no_grad():
        assert_matches_eager(compiled(x, y), model(x, y), rtol=1e-2)


def _half_model() -> nn.Module:
    torch.manual_seed(0)
    model = ConvBn().eval()
    with torch.no_grad():  # batch norm statistics from data, so the outputs are not the convolution's alone
        model.bn.running_mean.copy_(torch.randn(4) * 0.1)
        model.bn.running_var.copy_(torch.rand(4) + 0.5)
    return torch.jit.script(model.half())


def _fp32_spec_set_after_construction() -> torchkiln.Input:
    spec = torchkiln.Input((2, 3, 6, 6))
    spec.dtype = torchkiln.dtype.float
    return spec


@pytest.mark.parametrize("full", [False, True], ids=["partial", "full"])
@pytest.mark.parametrize("make_spec,input_dtype", [
    (lambda: torchkiln.Input((2, 3, 6, 6)), torch.float16),  # no dtype: the model's
    (lambda: torchkiln.Input((2, 3, 6, 6), dtype=torch.float), torch.float32),
    (lambda: torch.randn(2, 3, 6, 6), torch.float32),
    (_fp32_spec_set_after_construction, torch.float32),
], ids=["unset", "float32", "fp32-tensor", "set-after"])
def test_a_float16_model_runs_on_float32_or_dtype_less_inputs(make_spec, input_dtype, full):
    """Torch-TensorRT's fp16-weight cases: a dtype-less Input becomes float16 (the model's type); a float32 one
    stays float32 and is cast to float16 at the engine's entry. Outputs: the float16 model's on x.half()."""
    model = _half_model()
    x, y = torch.randn(2, 3, 6, 6), torch.randn(2, 4, 6, 6).half()
    compiled, report = compile_with_report(model, [make_spec(), torchkiln.Input((2, 4, 6, 6))],
                                           enabled_precisions={torch.float, torch.half},
                                           require_full_compilation=full)
    assert report.num_torch_blocks == 0 and report.blocks[0].inputs[0].dtype == input_dtype, report
    with torch.no_grad():
        out, ref = compiled(x.to(input_dtype), y), model(x.half(), y)
    assert out.dtype == torch.float16 and ref.abs().max() > 0.5
    assert_matches_eager(out.float(), ref.float(), rtol=1e-2, min_cosine=0.999)


def test_an_input_without_a_dtype_on_a_float32_model_stays_float32():
    torch.manual_seed(0)
    model = ConvBn().eval()
    x, y = torch.randn(2, 3, 6, 6), torch.randn(2, 4, 6, 6)
    compiled, report = compile_with_report(model, [torchkiln.Input((2, 3, 6, 6)), torchkiln.Input((2, 4, 6, 6))])
    assert report.blocks[0].inputs[0].dtype == torch.float32
    with torch.no_grad():
        assert_matches_eager(compiled(x, y), model(x, y))
