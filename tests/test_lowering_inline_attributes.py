"""Inline Attributes: attribute reads freezing leaves in the graph become constants."""
import torch
from harness import assert_matches_eager
from torch import nn

from torchkiln.lowering import lower
from torchkiln.settings import CompileSettings


class Attention(nn.Module):
    """nn.MultiheadAttention's Optional[Tensor] in_proj_weight/in_proj_bias survive freezing as attribute reads."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x, need_weights=False)[0]


def test_attribute_reads_become_constants():
    model = Attention().eval()
    x = torch.randn(2, 3, 8)
    script = torch.jit.script(model)
    before = lower(script, CompileSettings.create([x]), passes=[])
    assert 'prim::GetAttr[name="in_proj_weight"]' in str(before.graph)
    after = lower(script, CompileSettings.create([x]), passes=["inline_attributes"])
    assert after.fired == ["inline_attributes"]
    assert "prim::GetAttr" not in str(after.graph)
    with torch.no_grad():
        assert_matches_eager(after.module(x), model(x))
