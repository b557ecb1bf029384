"""Inline Attributes: attribute reads freezing leaves in the graph become constants."""
from typing import Dict, Optional

import torch
from harness import assert_falls_back, assert_matches_eager, check_compiled
from torch import nn

import torchkiln
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


class DeviceTables(nn.Module):
    """Per-device tables in dict attributes keyed by str(device), read only (a frequency table, scales)."""

    table: Dict[str, torch.Tensor]
    scales: Dict[str, float]

    def __init__(self) -> None:
        super().__init__()
        self.table = {"cpu": torch.randn(4), "cuda:0": torch.randn(4)}
        self.scales = {"cpu": 0.5, "cuda:0": 2.0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = str(x.device)
        return x * self.table[key] * self.scales[key]


class CountsCalls(nn.Module):
    """The tables inside a module that also writes an attribute of its own (a call counter)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc, self.tables, self.calls = nn.Linear(4, 4), DeviceTables(), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.tables(self.fc(x)).relu()


class Memoized(nn.Module):
    """A cache dict filled by forward itself: written, so only known at run time."""

    cache: Dict[str, torch.Tensor]

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.cache = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = str(x.device)
        if key not in self.cache:
            self.cache[key] = torch.arange(4, dtype=x.dtype, device=x.device) * 0.1
        return self.fc(x) * self.cache[key].cos()


def test_dict_attributes_that_are_not_written_are_static():
    _, report = check_compiled(torch.jit.script(CountsCalls().eval()), [torch.randn(2, 4)], min_block_size=1,
                               torch_blocks=None)
    engine_ops = [op for b in report.blocks if b.target == "engine" for op in b.ops]
    assert "aten::__getitem__.Dict_str" not in str(report) and "aten::mul.Scalar" in engine_ops, report


def test_a_written_cache_dict_stays_in_pytorch():
    model = torch.jit.script(Memoized().eval())
    _, report = check_compiled(model, [torch.randn(2, 4)], min_block_size=1, engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::__contains__.str", "computed at run time by prim::GetAttr")


class ClassToken(nn.Module):
    """timm's ViT-style models: an Optional[Tensor] token attribute expanded into a list that is appended to and
    concatenated (appending changes the list, not the token)."""

    def __init__(self, write: bool = False) -> None:
        super().__init__()
        self.cls_token: Optional[torch.Tensor] = nn.Parameter(torch.randn(1, 1, 8))
        self.write = write

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = []
        if self.cls_token is not None:
            parts.append(self.cls_token.expand(x.shape[0], -1, -1))
        parts.append(x)
        if self.write:
            parts[0].add_(1.0)  # writes through the list into the token: its memory changes
        return torch.cat(parts, 1) * 2


def test_a_token_appended_to_a_list_is_still_a_constant():
    check_compiled(ClassToken(), (torch.randn(2, 5, 8),), engines=1, torch_blocks=0, min_block_size=1)


def test_a_token_written_through_its_list_stays_an_attribute_read():
    model = ClassToken(write=True).eval()
    x = torch.randn(2, 5, 8)
    after = lower(torch.jit.script(model), CompileSettings.create([x]), passes=["inline_attributes"])
    assert 'prim::GetAttr[name="cls_token"]' in str(after.graph)


class WritesThroughADict(nn.Module):
    """A buffer stored in a dict and written through the dict's getter: the buffer changes every call."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("tok", torch.ones(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = self.tok
        d = {"k": x}
        d["k"] = t
        d["k"].mul_(3.0)
        return x + t


def test_a_buffer_written_through_a_dict_is_not_a_constant():
    """Dict getters carry no alias annotation: an item set must still count as a write into what it stores."""
    import copy

    model, x = WritesThroughADict().eval(), torch.randn(2)
    compiled = torchkiln.compile(copy.deepcopy(model), [torchkiln.Input((2,))], min_block_size=1)
    with torch.no_grad():
        for _ in range(2):
            assert_matches_eager(compiled(x), model(x))
