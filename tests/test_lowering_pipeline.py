"""The lowering pipeline as a whole: its log, when it skips a pass, what it leaves whole, a small model zoo."""
from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F
from harness import assert_matches_eager, check_compiled, check_fn
from torch import nn

import torchkiln
from torchkiln.analysis.registry import CONVERTERS, is_registered
from torchkiln.lowering import lower
from torchkiln.lowering.pipeline import GRAPH_PIPELINE, MODULE_PIPELINE
from torchkiln.lowering.registry import PASSES
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import node_key


class Mixed(nn.Module):
    """A bit of everything lowering rewrites, the way model code writes it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.drop = nn.AlphaDropout(0.1)
        self.fc = nn.Linear(8, 6)
        self.bias = nn.Parameter(torch.randn(6))
        self.proj = nn.Parameter(torch.randn(6, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.hardswish(self.bn(self.conv(x)))
        y = y * F.hardsigmoid(y.mean((2, 3), keepdim=True))
        y = self.drop(self.up(F.silu(y))).contiguous()
        y = F.pad(y, (1, 1, 1, 1), mode="reflect").tile((1, 1, 1, 1))
        z = y.mean((2, 3))
        z = z.to(z.dtype).view(z.size(0), -1)
        z = torch.addmm(self.bias, F.gelu(self.fc(z)), self.proj)
        z = (z - z.mean(1, keepdim=True)) * torch.rsqrt(z.var(1, keepdim=True) + 1e-5)
        for i in range(x.size(0)):
            z = z + float(i)
        return F.log_softmax(z, 1)


@pytest.fixture(scope="module")
def mixed_lowered():
    model = Mixed().eval()
    x = torch.randn(2, 3, 8, 8)
    return model, x, lower(torch.jit.script(model), CompileSettings.create([x]))


def test_full_pipeline_matches_eager(mixed_lowered):
    model, x, lowered = mixed_lowered
    with torch.no_grad():
        assert_matches_eager(lowered.module(x), model(x))
    text = str(lowered.graph)
    for op in ("aten::addmm(", "aten::tile(", "aten::contiguous(", "aten::alpha_dropout(", "aten::view(",
               "aten::to(", "prim::Loop", "prim::RaiseException"):
        assert op not in text, f"{op} survived lowering:\n{text}"
    # What lowering leaves (hardswish, gelu, log_softmax... which decompositions would split) converts whole.
    left = {node_key(n) for n in lowered.graph.nodes()}
    assert {"aten::hardswish", "aten::gelu", "aten::log_softmax.int"} <= left
    assert all(is_registered(n) for n in lowered.graph.nodes()), sorted(left)


def test_debug_logs_every_pass_with_its_graph(caplog):
    with caplog.at_level(logging.DEBUG, logger="torchkiln"):
        torchkiln.compile(Mixed().eval(), [torchkiln.Input((2, 3, 8, 8))], debug=True)
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    for name in MODULE_PIPELINE:
        assert any(m.startswith(f"module pass {name} (") for m in messages), name
    for name in GRAPH_PIPELINE:
        logged = [m for m in messages if m.startswith(f"graph after lowering pass {name} (")]
        assert logged and all("\ngraph(%" in m for m in logged), name
    assert set(GRAPH_PIPELINE + MODULE_PIPELINE) == set(PASSES), "a registered pass is not in the pipeline"


def test_a_pass_never_rewrites_an_op_forced_to_pytorch():
    model = Mixed().eval()
    x = torch.randn(2, 3, 8, 8)
    settings = CompileSettings.create([x], torch_executed_ops=["aten::gelu", "aten::log_softmax.int"])
    text = str(lower(torch.jit.script(model), settings).graph)
    assert "aten::gelu(" in text and "aten::log_softmax(" in text


def gelu_twice_plus_one(x):
    return F.gelu(x) * 2 + 1


def test_forced_op_stays_in_pytorch_end_to_end():
    _, report = check_fn(gelu_twice_plus_one, torch.randn(4, 5), engines=1, torch_blocks=1,
                         torch_executed_ops=["aten::gelu"])
    (block,) = [b for b in report.blocks if b.target == "torch"]
    assert block.ops == ("aten::gelu",) and block.fallback[0].reason == "forced by torch_executed_ops"


def hardswish(x):
    return F.hardswish(x)


def test_a_decomposition_is_skipped_when_the_engine_converts_the_op():
    x = torch.randn(3, 8)
    assert "aten::hardswish" in CONVERTERS
    lowered = lower(torch.jit.script(nn.Hardswish().eval()), CompileSettings.create([x]))
    assert "aten::hardswish(" in str(lowered.graph) and "unpack_hardswish" not in lowered.fired
    check_fn(hardswish, x, op="aten::hardswish")


def test_a_decomposition_named_explicitly_runs():
    x = torch.randn(3, 8)
    lowered = lower(torch.jit.script(nn.Hardswish().eval()), CompileSettings.create([x]), passes=["unpack_hardswish"])
    assert "aten::hardswish(" not in str(lowered.graph) and lowered.fired == ["unpack_hardswish"]


class Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_scaled_dot_product_attention_is_kept_whole():
    q, k, v = (torch.randn(1, 2, 5, 4) for _ in range(3))
    lowered = lower(torch.jit.script(Attention()), CompileSettings.create([q, k, v]))
    assert [n.kind() for n in lowered.graph.nodes() if n.kind().startswith("aten::")] == [
        "aten::scaled_dot_product_attention"]
    assert_matches_eager(lowered.module(q, k, v), Attention()(q, k, v))


def test_freezing_leaves_no_attribute_reads(mixed_lowered):
    """LowerGraph's job (attributes -> explicit values) is done by freezing: weights are constants."""
    _, _, lowered = mixed_lowered
    kinds = {n.kind() for n in lowered.graph.nodes()}
    assert "prim::GetAttr" not in kinds and "prim::CallMethod" not in kinds


class _SharedTableMLPs(nn.Module):
    """Blocks that each run a small MLP (linear, in-place ReLU, linear) on one shared table and add it to their
    input, as windowed transformers make their position biases."""

    def __init__(self, blocks: int = 3) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(5, 2))
        self.mlps = nn.ModuleList(nn.Sequential(nn.Linear(2, 16), nn.ReLU(inplace=True), nn.Linear(16, 4))
                                  for _ in range(blocks))
        self.conv, self.bn = nn.Conv2d(3, 5, 1), nn.BatchNorm2d(5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.bn(self.conv(x)).flatten(2).transpose(1, 2)[:, :5, :4]
        for mlp in self.mlps:
            x = x + mlp(self.table)
        return x


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="torch concatenates shared-input linears only for weights on a GPU"))])
def test_freezing_keeps_linears_that_share_an_input_apart(device):
    """Freezing folds the batch norm into its convolution, as torch.jit.freeze does, but leaves the linears that
    read one table apart on every device (torch.jit.freeze concatenates them where their weights are on a GPU,
    and each in-place ReLU then writes into a slice: a PyTorch block for each): one engine."""
    from torchkiln.lowering.pipeline import freeze

    model = _SharedTableMLPs().eval().to(device)
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
    graph = freeze(torch.jit.script(model)).graph
    kinds = [n.kind() for n in graph.nodes()]
    assert kinds.count("aten::linear") == 6 and "aten::batch_norm" not in kinds
    x = torch.randn(2, 3, 4, 4, device=device)
    check_compiled(model, [x], backend="cuda" if device == "cuda" else None)


class _OnlyInfer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(3, 4, 1), nn.BatchNorm2d(4)

    @torch.jit.export
    def infer(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


def test_freezing_a_module_without_forward_folds_its_method():
    """A scripted module whose only method is exported (no forward) freezes with that method kept and its batch
    norm folded, as torch.jit.freeze does."""
    from torchkiln.lowering.pipeline import freeze

    kinds = [n.kind() for n in freeze(torch.jit.script(_OnlyInfer().eval()), "infer").infer.graph.nodes()]
    assert "aten::conv2d" in kinds and "aten::batch_norm" not in kinds


def test_compiled_mixed_model_matches_eager():
    check_compiled(Mixed(), [torch.randn(2, 3, 8, 8)], engines=None, torch_blocks=None, min_block_size=1)


class _Relu2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2


def _count_lints(monkeypatch) -> list[int]:
    """Count Graph.lint calls (each still runs the real lint)."""
    calls = [0]
    real = torch._C.Graph.lint

    def counted(graph):
        calls[0] += 1
        return real(graph)
    monkeypatch.setattr(torch._C.Graph, "lint", counted)
    return calls


def test_graph_is_linted_as_frozen_and_after_each_pass_that_changed_it(monkeypatch):
    calls = _count_lints(monkeypatch)
    settings = CompileSettings.create([torch.randn(2, 3)])
    script = torch.jit.script(_Relu2().eval())
    lowered = lower(script, settings, passes=["eliminate_dead_code", "unpack_gelu", "eliminate_dead_code"])
    assert lowered.fired == [] and calls[0] == 2  # nothing changed: linted as frozen and once at the end
    calls[0] = 0
    lowered = lower(script, settings, passes=["eliminate_dead_code", "remove_mutation"])
    assert 1 + len(lowered.fired) <= calls[0] <= 2 + len(lowered.fired)


@pytest.mark.parametrize("says_changed", [True, False], ids=["reported", "unreported"])
def test_a_pass_that_breaks_the_graph_is_caught_by_a_lint(monkeypatch, says_changed):
    """By the lint after it, or (where it says it changed nothing) by the lint at the end of lowering."""
    from torchkiln.lowering.registry import LoweringPass

    def breaks(graph, ctx):
        """Move the last node before its inputs' producer: a use before its definition."""
        nodes = list(graph.nodes())
        nodes[-1].moveBefore(nodes[0])
        return says_changed
    monkeypatch.setitem(PASSES, "breaks_graph", LoweringPass("breaks_graph", breaks, "graph", "", (), False))
    with pytest.raises(RuntimeError):
        lower(torch.jit.script(_Relu2().eval()), CompileSettings.create([torch.randn(2, 3)]), passes=["breaks_graph"])
