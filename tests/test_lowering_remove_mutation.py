"""Remove Mutation keeps the dtype of in-place comparisons (their functional forms return bool)."""
import torch
from harness import assert_matches_eager, check_compiled

from torchkiln.lowering import lower
from torchkiln.settings import CompileSettings


class InplaceComparison(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y.eq_(0.5)  # writes 0.0/1.0 into the float y
        z = x + 1
        z.logical_not_()
        return y + 1 + z


def test_inplace_comparison_keeps_its_dtype():
    x = torch.randn(3, 4)
    x[0, 0] = 0.25
    model = InplaceComparison()
    script = torch.jit.script(model)
    assert "aten::eq_" in str(script.graph)
    lowered = lower(script, CompileSettings.create([x]), passes=["remove_mutation"])
    text = str(lowered.graph)
    assert "aten::eq_" not in text and "aten::logical_not_" not in text
    assert "aten::eq(" in text and text.count("aten::copy_(") == 2
    out = lowered.module(x)
    assert out.dtype == torch.float32
    assert_matches_eager(out, model(x))


def test_inplace_comparison_compiles_to_eager_dtype():
    x = torch.randn(3, 4)
    x[1, 2] = 0.25
    check_compiled(InplaceComparison(), [x], engines=None, torch_blocks=None, min_block_size=1)
