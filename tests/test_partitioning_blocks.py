"""Partitioning real scripted models: control flow, non-tensor values, forced ops, reordering, fallback.

Ops no converter will ever handle are custom ops of the `tk_blocks` namespace defined here.
"""
import logging

import pytest
import torch
from harness import assert_matches_eager, check_compiled

import torchkiln
from torchkiln.analysis.registry import CONVERTERS, converter
from torchkiln.partitioning.support import Fallback

_lib = torch.library.Library("tk_blocks", "DEF")
_lib.define("opaque(Tensor x) -> Tensor")
_lib.impl("opaque", lambda x: x * torch.sigmoid(x) + 0.25, "CompositeExplicitAutograd")
_lib.define("broken(Tensor x) -> Tensor")
_lib.impl("broken", lambda x: x * 3.0 - 1.0, "CompositeExplicitAutograd")
_lib.define("undecided(Tensor x) -> Tensor")
_lib.impl("undecided", lambda x: x * 2.0 + 0.5, "CompositeExplicitAutograd")

if "tk_blocks::broken" not in CONVERTERS:
    @converter("tk_blocks::broken")
    def _broken_converter(ctx, args):
        """A converter with a bug: it fails on every node it is given."""
        raise IndexError("list index out of range")

if "tk_blocks::undecided" not in CONVERTERS:
    def _raising_capability(args):
        """A capability check with a bug: it raises on every node it is asked about."""
        raise KeyError("no such argument")

    @converter("tk_blocks::undecided", capability=_raising_capability)
    def _undecided_converter(ctx, args):
        raise AssertionError("never reached: the capability check declines first")



def _torch_block(report, index=None):
    blocks = [b for b in report.blocks if b.target == "torch"]
    return blocks if index is None else blocks[index]


class DataDependentIf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.fc1(x)) + 1.0
        if bool(a.sum() > 20.0):
            y = a * 2.0
        else:
            y = a - 3.0
        return torch.sigmoid(self.fc2(y)) * 3.0


@pytest.mark.parametrize("scale", [0.1, 10.0])  # each branch is taken by one of them
def test_data_dependent_if_runs_inside_one_engine(scale):
    model = DataDependentIf().eval()
    compiled, report = check_compiled(model, [torch.randn(4, 8)], engines=1, torch_blocks=0, min_block_size=1)
    assert "prim::If" in report.blocks[0].ops
    x = torch.randn(4, 8) * scale
    assert_matches_eager(compiled(x), model(x))


@pytest.mark.parametrize("scale", [0.1, 10.0])
def test_data_dependent_if_forced_to_pytorch_stays_between_two_engines(scale):
    model = DataDependentIf().eval()
    compiled, report = check_compiled(model, [torch.randn(4, 8)], engines=2, torch_blocks=1, min_block_size=1,
                                      torch_executed_ops=["prim::If"])
    assert [b.target for b in report.blocks] == ["engine", "torch", "engine"]
    torch_block = _torch_block(report, 0)
    assert "prim::If" in torch_block.ops
    assert {f.reason for f in torch_block.fallback if f.op == "prim::If"} == {Fallback.FORCED_OP}
    # a, computed in the first engine, is read inside the If's branches: it is an engine output
    assert report.blocks[0].outputs[0].shape == (4, 8)
    x = torch.randn(4, 8) * scale
    assert_matches_eager(compiled(x), model(x))


class StaticIf(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.fc(x))
        if y.size(0) > 2:  # known from the input shape: folded at build time
            y = y * 2.0
        else:
            y = y - 1.0
        return torch.sigmoid(y)


def test_static_if_is_folded_into_one_engine():
    check_compiled(StaticIf(), [torch.randn(4, 8)], engines=1, torch_blocks=0, require_full_compilation=True)


class DataDependentLoop(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.fc1(x))
        b = torch.sigmoid(a) - 0.5
        n = int(x.sum().abs()) % 3 + 2  # the trip count depends on data
        y = a
        for _ in range(n):
            y = y * 0.5 + b  # b, an engine value, is read inside the loop body
        return torch.relu(self.fc2(y)) + 1.0


def test_loop_with_data_dependent_trip_count_runs_in_pytorch_between_engines():
    model = DataDependentLoop().eval()
    compiled, report = check_compiled(model, [torch.randn(3, 8)], engines=2, torch_blocks=1, min_block_size=1)
    torch_block = _torch_block(report, 0)
    assert "prim::Loop" in torch_block.ops and "aten::Int.Tensor" in torch_block.ops
    assert {"aten::relu", "aten::sigmoid"} <= set(report.blocks[0].ops)
    for scale in (0.01, 1.0, 7.0):  # different trip counts
        x = torch.randn(3, 8) * scale
        assert_matches_eager(compiled(x), model(x))


class ShapeArithmetic(torch.nn.Module):
    """Sizes of a tensor made in PyTorch, used by the engine after it: static, since shapes are fixed."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 6 * 6, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        z = torch.ops.tk_blocks.opaque(y)
        n, c, h, w = z.shape
        flat = z.reshape(n, c * h * w) / float(h * w)
        return self.fc(flat).view(z.size(0), -1)


def test_sizes_of_a_pytorch_tensor_are_static_for_the_next_engine():
    _, report = check_compiled(ShapeArithmetic(), [torch.randn(2, 3, 6, 6)], engines=2, torch_blocks=1,
                               min_block_size=1)
    assert _torch_block(report, 0).ops == ("tk_blocks::opaque",)
    assert "aten::reshape" in report.blocks[2].ops or "aten::view" in report.blocks[2].ops


class RunTimeInt(torch.nn.Module):
    """An int computed from tensor data in PyTorch cannot be baked into an engine: its consumer follows it."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.fc1(x))
        k = int(a.sum() > 4.0) + 1
        return torch.sigmoid(self.fc2(a * k))


def test_run_time_int_read_by_a_converter_keeps_the_converter_in_pytorch():
    model = RunTimeInt().eval()
    compiled, report = check_compiled(model, [torch.randn(2, 8)], engines=2, torch_blocks=1, min_block_size=1)
    left = {f.op: f for f in _torch_block(report, 0).fallback}
    assert left["aten::mul.Scalar"].reason == Fallback.NOT_STATIC
    assert "computed at run time" in left["aten::mul.Scalar"].detail
    for scale in (0.001, 100.0):  # both values of k
        x = torch.randn(2, 8) * scale
        assert_matches_eager(compiled(x), model(x))


class TwoBranches(torch.nn.Module):
    """An op in PyTorch that only depends on the input sits between two runs of engine ops."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor):
        a = torch.relu(self.fc1(x))
        t = torch.ops.tk_blocks.opaque(x)
        b = torch.sigmoid(self.fc2(a)) + a
        return b, t + 1.0


def test_independent_pytorch_op_is_moved_so_engine_runs_merge():
    graph = torch.jit.script(TwoBranches()).graph
    kinds = [n.kind() for n in graph.nodes() if n.kind() != "prim::Constant"]
    assert kinds.index("tk_blocks::opaque") < kinds.index("aten::sigmoid")  # in source order: engine, torch, engine
    _, report = check_compiled(TwoBranches(), [torch.randn(2, 8)], engines=1, torch_blocks=1, min_block_size=1)
    assert _torch_block(report, 0).ops == ("tk_blocks::opaque",)


class MutatesInput(torch.nn.Module):
    """x.add_ changes the method's input: nothing that reads x may move across it."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor):
        a = torch.relu(self.fc1(y))
        t = torch.ops.tk_blocks.opaque(x)
        x.add_(1.0)
        b = torch.sigmoid(self.fc2(x))
        return a + b, t


def test_reordering_never_crosses_an_in_place_op():
    model = MutatesInput().eval()
    x, y = torch.randn(2, 8), torch.randn(2, 8)
    compiled, report = torchkiln.compiler.compile_with_report(model, [x, y], min_block_size=1)
    # fc2(x) must read x after the add_: it cannot join the first engine, which runs before it
    assert [b.target for b in report.blocks] == ["engine", "torch", "engine"]
    assert set(_torch_block(report, 0).ops) == {"tk_blocks::opaque", "aten::add_.Scalar"}
    x_eager, x_compiled = x.clone(), x.clone()
    with torch.no_grad():
        ref = model(x_eager, y)
        out = compiled(x_compiled, y)
    assert_matches_eager(out, ref)
    assert torch.equal(x_compiled, x_eager)  # the caller sees the same mutation


class ForcedOps(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.fc1(x) + 1.0
        b = torch.relu(a) + x
        return torch.sigmoid(self.fc2(b)) * 2.0


def test_forced_op_runs_in_pytorch_and_splits_the_engine():
    _, report = check_compiled(ForcedOps(), [torch.randn(2, 8)], engines=2, torch_blocks=1, min_block_size=1,
                               torch_executed_ops=["aten::relu"])
    (forced,) = _torch_block(report, 0).fallback
    assert (forced.op, forced.reason) == ("aten::relu", Fallback.FORCED_OP)
    assert "'aten::relu' is in torch_executed_ops" in forced.detail


def test_forced_overload_only_forces_that_overload():
    # aten::add.Tensor (b = relu(a) + x) goes to PyTorch; aten::add.Scalar (fc1(x) + 1.0) does not
    _, report = check_compiled(ForcedOps(), [torch.randn(2, 8)], engines=2, torch_blocks=1, min_block_size=1,
                               torch_executed_ops=["aten::add.Tensor"])
    assert report.fallback_ops == {"aten::add.Tensor": 1}
    assert "aten::add.Scalar" in report.blocks[0].ops


def test_forcing_every_overload_of_an_op():
    _, report = check_compiled(ForcedOps(), [torch.randn(2, 8)], engines=None, torch_blocks=None,
                               min_block_size=1, torch_executed_ops=["aten::add"])
    assert report.fallback_ops == {"aten::add.Scalar": 1, "aten::add.Tensor": 1}


def test_min_block_size_sends_small_blocks_back_to_pytorch():
    # relu forced: engines [fc1, add] and [add, fc2, sigmoid, mul]; the first is below min_block_size=3
    _, report = check_compiled(ForcedOps(), [torch.randn(2, 8)], engines=1, torch_blocks=1, min_block_size=3,
                               torch_executed_ops=["aten::relu"])
    reasons = {f.op: f.reason for f in _torch_block(report, 0).fallback}
    assert reasons == {"aten::linear": Fallback.MIN_BLOCK_SIZE, "aten::add.Scalar": Fallback.MIN_BLOCK_SIZE,
                       "aten::relu": Fallback.FORCED_OP}


class WithBrokenConverter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.fc1(x))
        b = torch.ops.tk_blocks.broken(a)
        return torch.sigmoid(self.fc2(b))


def test_a_converter_that_fails_falls_back_to_pytorch_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        _, report = check_compiled(WithBrokenConverter(), [torch.randn(2, 8)], engines=2, torch_blocks=1,
                                   min_block_size=1)
    (failed,) = _torch_block(report, 0).fallback
    assert (failed.op, failed.reason) == ("tk_blocks::broken", Fallback.CONVERSION_FAILED)
    assert "IndexError: list index out of range" in failed.detail
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("tk_blocks::broken" in m and "IndexError" in m for m in warnings), warnings


class WithRaisingCapability(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(torch.ops.tk_blocks.undecided(torch.relu(self.fc(x))))


def test_a_capability_check_that_raises_declines_the_op():
    """The exception escaped the partitioner and the whole compile failed; now only that op stays in PyTorch."""
    _, report = check_compiled(WithRaisingCapability(), [torch.randn(2, 8)], engines=2, torch_blocks=1,
                               min_block_size=1)
    (declined,) = _torch_block(report, 0).fallback
    assert (declined.op, declined.reason) == ("tk_blocks::undecided", Fallback.CAPABILITY)
    assert "capability check raised KeyError" in declined.detail and "no such argument" in declined.detail


def test_a_converter_that_fails_is_an_error_with_require_full_compilation():
    with pytest.raises(torchkiln.ConversionError, match=r"tk_blocks::broken.*IndexError"):
        torchkiln.compile(WithBrokenConverter().eval(), [torchkiln.Input((2, 8))], require_full_compilation=True)


def test_require_full_compilation_lists_every_op_left_in_pytorch():
    with pytest.raises(torchkiln.UnsupportedOperatorError) as info:
        torchkiln.compile(DataDependentLoop().eval(), [torchkiln.Input((3, 8))], require_full_compilation=True)
    message = str(info.value)
    assert "prim::Loop x1 (dynamic control flow) at " in message
    assert "aten::Int.Tensor x1 (an argument is only known at run time)" in message
    assert "test_partitioning_blocks.py:" in message


def test_require_full_compilation_ignores_min_block_size():
    model = torch.nn.Sequential(torch.nn.ReLU()).eval()
    check_compiled(model, [torch.randn(2, 3)], engines=1, torch_blocks=0, min_block_size=5,
                   require_full_compilation=True)


class ListSplitByPyTorch(torch.nn.Module):
    """The list feeding aten::cat is built before a PyTorch op and read after it."""

    def forward(self, x: torch.Tensor):
        parts = [torch.relu(x), torch.sigmoid(x)]
        t = torch.ops.tk_blocks.opaque(x)
        return torch.cat(parts, 1) * 2.0, t


def test_list_construct_moves_next_to_its_cat():
    _, report = check_compiled(ListSplitByPyTorch(), [torch.randn(2, 3)], engines=1, torch_blocks=1,
                               min_block_size=1)
    assert report.blocks[0].ops == ("aten::relu", "aten::sigmoid", "aten::cat", "aten::mul.Scalar")
    assert report.fallback_ops == {"tk_blocks::opaque": 1}


class DependsOnPyTorch(torch.nn.Module):
    """The result needs t, which needs a: a and the result cannot share an engine (that would be a cycle)."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 8)
        self.fc2 = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.relu(self.fc1(x))
        t = torch.ops.tk_blocks.opaque(a)
        b = torch.sigmoid(self.fc2(x))
        return (a + t) * b


def test_engine_node_after_a_pytorch_dependency_gets_its_own_block():
    _, report = check_compiled(DependsOnPyTorch(), [torch.randn(2, 8)], engines=2, torch_blocks=1,
                               min_block_size=1)
    first, _, last = report.blocks
    assert first.ops[:2] == ("aten::linear", "aten::relu")
    assert last.ops[-2:] == ("aten::add.Tensor", "aten::mul.Tensor")
