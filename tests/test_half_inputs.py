"""A float16/bfloat16 Input on a float32 model: cast to float32 as the engine's first layer (as Torch-TensorRT)."""
import pytest
import torch
from harness import assert_matches_eager
from torch import nn

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


def test_a_half_precision_input_of_the_wrong_shape_keeps_the_original_error():
    with pytest.raises(ValueError, match=r"failed \(RuntimeError: .*Half"):
        torchkiln.compile(ConvBn().eval(), [torchkiln.Input((2, 5, 6, 6), dtype=torch.float16),
                                            torchkiln.Input((2, 4, 6, 6))])


def test_a_float16_model_takes_float16_inputs_uncast():
    model = ConvBn().eval().half()
    x, y = torch.randn(2, 3, 6, 6).half(), torch.randn(2, 4, 6, 6).half()
    compiled, report = compile_with_report(model, [x, y], backend="reference")
    assert not any(op.startswith("aten::to") for b in report.blocks for op in b.ops)
    with torch.no_grad():
        assert_matches_eager(compiled(x, y), model(x, y), rtol=1e-2)
