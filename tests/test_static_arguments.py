"""forward arguments with defaults need no Input: they compile as their defaults (or as the constants a dict
`inputs` names), and the compiled module keeps them in its signature, refusing any other value."""
import io
from typing import Optional

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from harness import assert_matches_eager, check_compiled

import torchkiln
from torchkiln.compiler import compile_with_report


class AttentionBlock(nn.Module):
    """A transformer attention block as timm / transformers write one: mask and causal flags defaulted."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.proj = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False,
                scale: float = 1.0) -> torch.Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
        return self.proj(y) * scale


class Refine(nn.Module):
    """RAFT's pattern: an iteration count as a defaulted int argument."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, num_flow_updates: int = 3) -> torch.Tensor:
        for _ in range(num_flow_updates):
            x = x + torch.tanh(self.conv(x))
        return x


def test_defaults_need_no_input_and_other_values_are_refused():
    model, x = AttentionBlock().eval(), torch.randn(2, 5, 16)
    compiled, _ = check_compiled(model, [x])
    assert "Tensor? attn_mask=None, bool is_causal=False, float scale=1." in str(compiled.forward.schema)
    with torch.no_grad():
        assert_matches_eager(compiled(x, None, False, 1.0), model(x))
        assert_matches_eager(compiled(x, is_causal=False), model(x))
    with pytest.raises(torchkiln.EngineInputError, match="'is_causal' must be False.*its default"):
        compiled(x, is_causal=True)
    with pytest.raises(torchkiln.EngineInputError, match="'attn_mask' must be None.*Input for 'attn_mask'"):
        compiled(x, torch.zeros(5, 5))
    with pytest.raises(torchkiln.EngineInputError, match="'scale' must be 1.0"):
        compiled(x, scale=2.0)


def test_a_defaulted_loop_count_unrolls_into_one_engine():
    model, x = Refine().eval(), torch.randn(1, 4, 6, 6)
    compiled, _ = check_compiled(model, [x])
    with pytest.raises(torchkiln.EngineInputError, match="'num_flow_updates' must be 3"):
        compiled(x, 12)
    compiled, report = compile_with_report(model, {"x": torchkiln.Input.from_tensor(x), "num_flow_updates": 5})
    assert report.num_engine_blocks == 1 and report.num_torch_blocks == 0, report
    with torch.no_grad():
        assert_matches_eager(compiled(x, 5), model(x, 5))


def test_a_dict_fixes_flags_and_gives_an_optional_tensor():
    model, x, mask = AttentionBlock().eval(), torch.randn(2, 5, 16), torch.randn(5, 5)
    causal, _ = compile_with_report(model, {"x": x, "is_causal": True, "scale": 2}, min_block_size=1)
    with torch.no_grad():
        assert_matches_eager(causal(x, None, True, 2.0), model(x, None, True, 2.0))
    with pytest.raises(torchkiln.EngineInputError, match="'is_causal' must be True.*the value inputs gave"):
        causal(x)
    masked, report = compile_with_report(model, {"x": x, "attn_mask": mask}, min_block_size=1)
    assert report.num_engine_blocks == 1 and report.num_torch_blocks == 0, report
    with torch.no_grad():
        assert_matches_eager(masked(x, mask), model(x, mask))
    with pytest.raises(torchkiln.EngineInputError, match="'attn_mask' must be a tensor"):
        masked(x)


def test_guards_survive_save_and_load():
    model, x = AttentionBlock().eval(), torch.randn(2, 5, 16)
    compiled = torchkiln.compile(model, [x], min_block_size=1)
    buffer = io.BytesIO()
    torch.jit.save(compiled, buffer)
    buffer.seek(0)
    loaded = torchkiln.load(buffer)
    with torch.no_grad():
        assert_matches_eager(loaded(x), model(x))
    with pytest.raises(torchkiln.EngineInputError, match="'is_causal' must be False"):
        loaded(x, None, True)


class NoDefault(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor, flag: bool = True) -> torch.Tensor:
        return x + y if flag else x - y


@pytest.mark.parametrize("inputs, message", [
    ([torch.randn(2)], "argument 'y' has no default value; give an Input for it"),
    ({"x": torch.randn(2)}, "argument 'y' has no default value"),
    ({"x": torch.randn(2), "z": 1}, "forward\\(\\) has no argument 'z'"),
    ({"x": torch.randn(2), "y": torch.randn(2), "flag": 3.5}, "'flag' has type bool; it cannot be fixed to 3.5"),
])
def test_bad_bindings_name_the_argument(inputs, message):
    with pytest.raises(ValueError, match=message):
        torchkiln.compile(NoDefault(), inputs)
