"""Module fallback: modules listed in torch_executed_modules stay in PyTorch, through lowering and partitioning."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from harness import assert_matches_eager, check_compiled
from torch import nn

from torchkiln.lowering import lower
from torchkiln.partitioning.support import FALLBACK_ATTR
from torchkiln.settings import CompileSettings


class Block(nn.Module):
    """Ops that lowering rewrites (hardswish, log_softmax, an in-place add) inside a forced module."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardswish(self.conv(x))
        y += 1
        return F.log_softmax(y, 1)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.body = nn.Sequential(Block(), nn.ReLU(), Block())
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(torch.relu(self.stem(x)))))


BLOCK = f"{Block.__module__}.{Block.__name__}"


def _marks(graph: torch._C.Graph) -> dict[str, list[str]]:
    """Op kind -> the fallback details of its marked nodes."""
    found: dict[str, list[str]] = {}
    for node in graph.nodes():
        if node.hasAttribute(FALLBACK_ATTR):
            found.setdefault(node.kind(), []).append(node.s(FALLBACK_ATTR))
    return found


@pytest.mark.parametrize("entry", [BLOCK, "Block"], ids=["qualified", "bare"])
def test_every_node_of_a_listed_module_is_marked(entry):
    model = Net().eval()
    x = torch.randn(1, 3, 6, 6)
    script = torch.jit.script(model)
    lowered = lower(script, CompileSettings.create([x], torch_executed_modules=[entry]))
    assert {"notate_module_for_fallback", "mark_nodes_for_fallback"} <= set(lowered.fired)
    marks = _marks(lowered.graph)
    # rewritten ops (add_ made functional) kept their module; hardswish and log_softmax convert whole
    assert {k: len(v) for k, v in marks.items()} == {
        "aten::conv2d": 2, "aten::hardswish": 2, "aten::add": 2, "aten::log_softmax": 2}
    details = {d for ds in marks.values() for d in ds}
    assert details == {f"body.0 ({BLOCK})", f"body.2 ({BLOCK})"}
    unmarked = [n.kind() for n in lowered.graph.nodes() if not n.hasAttribute(FALLBACK_ATTR)
                and n.kind() != "prim::Constant"]
    assert unmarked == ["aten::conv2d", "aten::relu", "aten::relu", "aten::relu", "aten::conv2d"]  # stem, ReLU, head
    with torch.no_grad():
        assert_matches_eager(lowered.module(x), model(x))


def test_listed_module_compiles_to_a_torch_block_with_the_reason():
    model = Net().eval()
    _, report = check_compiled(model, [torch.randn(1, 3, 8, 8)], engines=None, torch_blocks=None,
                               torch_executed_modules=[BLOCK], min_block_size=1)
    torch_blocks = [b for b in report.blocks if b.target == "torch"]
    assert len(torch_blocks) == 2
    for block in torch_blocks:
        assert block.fallback and {f.reason for f in block.fallback} == {"forced by torch_executed_modules"}
        assert "aten::log_softmax.int" in block.ops
    assert {f.detail for b in torch_blocks for f in b.fallback} == {f"body.0 ({BLOCK})", f"body.2 ({BLOCK})"}
    assert report.num_engine_blocks == 3  # stem, the ReLU between the blocks, head


def test_traced_module_falls_back_too():
    model = Net().eval()
    x = torch.randn(1, 3, 6, 6)
    traced = torch.jit.trace(model, (x,))
    lowered = lower(traced, CompileSettings.create([x], torch_executed_modules=[BLOCK]))
    assert {d for ds in _marks(lowered.graph).values() for d in ds} == {f"body.0 ({BLOCK})", f"body.2 ({BLOCK})"}


def test_listing_the_top_module_keeps_everything_in_pytorch():
    name = f"{Net.__module__}.{Net.__name__}"
    _, report = check_compiled(Net(), [torch.randn(1, 3, 6, 6)], engines=0, torch_blocks=1,
                               torch_executed_modules=[name], min_block_size=1)
    assert {f.detail for f in report.blocks[0].fallback} == {f"<top module> ({name})"}


def test_an_unknown_class_is_reported(caplog):
    with caplog.at_level(logging.WARNING, logger="torchkiln"), pytest.warns(UserWarning, match="mypkg.Nope"):
        lower(torch.jit.script(Net().eval()), CompileSettings.create([torch.randn(1, 3, 6, 6)],
                                                                     torch_executed_modules=["mypkg.Nope"]))
    assert any("no submodule" in r.getMessage() and "mypkg.Nope" in r.getMessage() for r in caplog.records)


class Unused(nn.Module):
    """Holds a Block that forward never calls."""

    def __init__(self) -> None:
        super().__init__()
        self.spare = Block()
        self.conv = nn.Conv2d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_a_listed_module_that_forward_never_calls_is_reported():
    with pytest.warns(UserWarning, match=r"\['spare'\] of class .*Block.* contribute no op"):
        lower(torch.jit.script(Unused().eval()), CompileSettings.create([torch.randn(1, 4, 6, 6)],
                                                                        torch_executed_modules=["Block"]))


def test_the_users_script_module_is_not_changed():
    script = torch.jit.script(Net().eval())
    graphs = {name: str(m.graph) for name, m in script.named_modules()}
    lower(script, CompileSettings.create([torch.randn(1, 3, 6, 6)], torch_executed_modules=[BLOCK]))
    assert {name: str(m.graph) for name, m in script.named_modules()} == graphs


class BasicBlock(nn.Module):
    """torchvision's ResNet BasicBlock: conv-bn-relu-conv-bn, plus the identity, then relu."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += x
        return self.relu(out)


class ResNetLike(nn.Module):
    """torchvision's ResNet structure: forward reaches the layers through the helper self._forward_impl."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = nn.Sequential(BasicBlock(8), BasicBlock(8))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8, 5)

    def _forward_impl(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer1(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward_impl(x)


def _resnet_like() -> nn.Module:
    torch.manual_seed(0)
    model = ResNetLike()
    for m in model.modules():  # non-trivial running statistics, so batch norm is not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval()


@pytest.mark.parametrize("entry", ["BasicBlock", f"{BasicBlock.__module__}.BasicBlock"])
def test_blocks_reached_through_a_helper_method_fall_back(entry):
    """forward -> self._forward_impl -> layer1: the hierarchy starts with SELF(...), not a path segment."""
    _, report = check_compiled(torch.jit.script(_resnet_like()), [torch.randn(2, 3, 8, 8)], engines=None,
                               torch_blocks=None, torch_executed_modules=[entry], min_block_size=1)
    details = {f.detail for b in report.blocks if b.target == "torch" for f in b.fallback}
    assert details == {f"layer1.0 ({BasicBlock.__module__}.BasicBlock)",
                       f"layer1.1 ({BasicBlock.__module__}.BasicBlock)"}
    assert report.num_engine_blocks == 2  # the stem, and the pool and fc


def test_a_fallback_that_matches_nothing_warns_with_the_module_types():
    with pytest.warns(UserWarning, match=r"torch_executed_modules.*'mypkg\.Nope'.*BasicBlock"):
        check_compiled(_resnet_like(), [torch.randn(1, 3, 8, 8)], engines=1, torch_blocks=0,
                       torch_executed_modules=["mypkg.Nope"], min_block_size=1)
