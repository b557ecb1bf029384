"""Control flow inside engines: a data-dependent `prim::If` becomes a conditional layer and a `prim::Loop` too long to
unroll (or with a data-dependent trip count) a loop layer, each with sub-networks, instead of splitting the graph.
Compiled on the default backend and the reference, compared with eager on inputs taking each path."""
from __future__ import annotations

import io
import pathlib
import warnings

import pytest
import torch
from harness import Endless, LongFor, WhileLoop, assert_falls_back, check_compiled

import torchkiln
from torchkiln.conversion import control_flow as CF
from torchkiln.ir.shape_only import shape_only_predicate

BACKENDS = [None, "reference"]  # None: the default backend


class DataIf(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if y.sum() > 0:
            z = torch.relu(y) * 2.0 + x
        else:
            z = torch.sigmoid(y) - x
        return z * 0.5


def _kinds(report) -> set[str]:
    return {op for b in report.blocks if b.target == "engine" for op in b.ops}


@pytest.mark.parametrize("backend", BACKENDS)
def test_data_dependent_if_is_one_engine_and_takes_each_branch(backend):
    torch.manual_seed(0)
    model = DataIf().eval()
    x = torch.randn(3, 6)
    compiled, report = check_compiled(model, [x], backend=backend, min_block_size=1)
    assert "prim::If" in _kinds(report), report
    sums = []
    for x in (torch.randn(3, 6) * 4 + 3, torch.randn(3, 6) * 4 - 3, torch.zeros(3, 6)):
        with torch.no_grad():
            want, got = model(x), compiled(x)
            sums.append(float(model.linear(x).sum()) > 0)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * float(want.abs().max()))
    assert True in sums and False in sums


@pytest.mark.parametrize("backend", BACKENDS)
def test_while_loop_with_a_data_dependent_trip_count_is_one_engine(backend):
    model = WhileLoop().eval()
    step = torch.full((4,), 0.01)
    compiled, report = check_compiled(model, [torch.randn(4) * 8, step], backend=backend, min_block_size=1)
    assert "prim::Loop" in _kinds(report), report
    for scale in (0.1, 3.0, 100.0):  # no iteration, a few, many
        x = torch.randn(4) * scale
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, step), model(x, step), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_for_loop_of_1000_iterations_carrying_a_tensor_is_one_engine(backend):
    x, w = torch.randn(2, 5), torch.randn(2, 5) * 0.1
    _, report = check_compiled(LongFor(), [x, w], backend=backend, min_block_size=1)
    assert "prim::Loop" in _kinds(report), report


@pytest.mark.parametrize("backend", BACKENDS)
def test_for_loop_holding_a_data_dependent_if_is_one_engine(backend):
    class Nested(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x
            for _ in range(100):
                if h.mean() > 0.5:
                    h = h * 0.9
                else:
                    h = h + 0.1
            return h

    for x in (torch.rand(3), torch.rand(3) + 5.0):
        check_compiled(Nested(), [x], backend=backend, min_block_size=1)


def test_a_branch_with_an_op_forced_to_pytorch_keeps_the_if_in_pytorch():
    _, report = check_compiled(DataIf(), [torch.randn(3, 6)], engines=None, torch_blocks=1, min_block_size=1,
                               torch_executed_ops=["aten::sigmoid"])
    assert_falls_back(report, "prim::If", "aten::sigmoid is forced to run in PyTorch in its blocks")


def test_a_loop_whose_carried_tensor_changes_shape_falls_back_with_its_reason():
    class Grow(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = x
            while h.sum() < 100.0:
                h = torch.cat([h, h + 1.0])
            return h.sum(0, keepdim=True)

    _, report = check_compiled(Grow(), [torch.rand(2, 3)], engines=None, torch_blocks=None, min_block_size=1)
    assert_falls_back(report, "prim::Loop", "body carried output 0 is torch.float32[4, 3], expected "
                                            "torch.float32[2, 3]")


def test_a_compiled_while_loop_saves_and_loads():
    step = torch.full((4,), 0.01)
    compiled, _ = check_compiled(WhileLoop(), [torch.randn(4) * 8, step], min_block_size=1)
    buffer = io.BytesIO()
    torch.jit.save(compiled, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    x = torch.randn(4) * 20
    torch.testing.assert_close(loaded(x, step), WhileLoop()(x, step), rtol=1e-5, atol=1e-6)


def test_the_default_backend_runs_both_layers_in_onnx_runtime():
    """If and Loop (the while loop's too: its max_trips guard is ONNX) export, so no layer runs on the reference."""
    for model, example in ((DataIf(), [torch.randn(3, 6)]), (WhileLoop(), [torch.randn(4) * 8, torch.full((4,), 0.01)]),
                           (LongFor(), [torch.randn(2, 5), torch.randn(2, 5) * 0.1])):
        _, report = check_compiled(model, example, min_block_size=1, backend="onnxruntime")
        assert not report.reference_layers, report


@pytest.mark.parametrize("model, example", [(DataIf(), [torch.randn(3, 6)]),
                                            (LongFor(), [torch.randn(2, 5), torch.randn(2, 5) * 0.1])],
                         ids=["if", "for"])
def test_control_flow_in_a_half_precision_engine_keeps_its_sub_networks_dtypes(model, example):
    """The precision pass lowers the layers around a conditional or loop; the layer reads its inputs in the dtypes
    its sub-networks were converted in (fp32 here): cosine >= 0.999 and within 1e-2 of max|eager|."""
    check_compiled(model, example, backend="reference", enabled_precisions={torch.float16}, min_block_size=1,
                   rtol=1e-2, min_cosine=0.999)


def test_dynamic_shapes_if_is_one_engine_and_a_branch_with_dim_arithmetic_falls_back():
    """A branch on dynamic shapes converts; one whose layer parameters are computed from the dynamic dims (a
    reshape to x.size(0) * 6) stays in PyTorch, with the reason: the runtimes bind dims in the outer network only."""
    class Reshaping(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x * 2.0
            if y.sum() > 0:
                z = y.reshape(y.size(0) * 6) + 1.0
            else:
                z = y.flatten() - 1.0
            return z

    dynamic = [torchkiln.Input(min_shape=(1, 6), opt_shape=(3, 6), max_shape=(8, 6))]
    model = DataIf().eval()
    compiled, _ = check_compiled(model, [torch.randn(3, 6)], inputs=dynamic, min_block_size=1)
    for n, shift in ((2, 4.0), (5, -4.0), (8, 4.0)):
        x = torch.randn(n, 6) + shift
        with torch.no_grad():
            want = model(x)
            torch.testing.assert_close(compiled(x), want, rtol=0, atol=1e-4 * float(want.abs().max()))
    _, report = check_compiled(Reshaping(), [torch.randn(3, 6)], inputs=dynamic, engines=None, torch_blocks=1,
                               min_block_size=1)
    assert_falls_back(report, "prim::If", "has a parameter computed from dynamic dims")


class LongSequences(torch.nn.Module):
    """A branch on the input's shape: the sequence length (a dynamic dim) against 64."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        if x.size(1) > 64:
            z = torch.relu(y) * 2.0 + x
        else:
            z = torch.sigmoid(y) - x
        return z * 0.5


class SquareBlocks(torch.nn.Module):
    """A branch on two dynamic dims and the element count: x.size(0) * 16 == x.shape[1] or x.numel() >= 1024."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 3.0
        if x.size(0) * 16 == x.shape[1]:
            y = y + 1.0
        if x.numel() >= 1024:
            y = torch.tanh(y)
        return y - x


class CombinedConditions(torch.nn.Module):
    """`or`, `and` and `not` of conditions on dynamic dims (TorchScript writes `a and b` as an If giving a bool)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 3.0
        if x.size(1) > 100 or not x.size(0) * 16 < x.size(1) and x.size(0) != 3:
            y = y + 1.0
        else:
            y = torch.sigmoid(y)
        return y - x


class ShapeAndData(torch.nn.Module):
    """A condition on a dynamic dim and on the data: not decided by the shapes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 3.0
        if x.size(1) > 64 and bool(x.sum() > 0):
            y = y + 1.0
        return y - x


class RowSteps(torch.nn.Module):
    """A for loop over range(x.size(0)), a dynamic dim, carrying a tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 1.0
        for i in range(x.size(0)):
            h = torch.sigmoid(h * 0.9 + i)
        return h


class WithinWindow(torch.nn.Module):
    """`bool()` of a tensor made from a dynamic dim alone (an arange compared and reduced): a branch on the shape."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inside = torch.arange(x.size(1), device=x.device) < 40
        if bool(inside.all()):
            y = x + 1.0
        else:
            y = x * 2.0
        return y


WINDOWS = torchkiln.Input(min_shape=(1, 32), opt_shape=(2, 40), max_shape=(4, 128))
class Flattened(torch.nn.Module):
    """Branches reading x.flatten(): s0 * s1 elements, an expression of the input's dynamic dims. The condition
    is on the data (`on_data`) or on the shape."""

    def __init__(self, on_data: bool) -> None:
        super().__init__()
        self.on_data = on_data

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.flatten() * 2.0
        if (self.on_data and bool(y.sum() > 0)) or (not self.on_data and x.size(1) > 64):
            z = y + 1.0
        else:
            z = torch.sigmoid(y)
        return z


ROWS = torchkiln.Input(min_shape=(1, 8), opt_shape=(3, 8), max_shape=(8, 8))
SEQUENCES = torchkiln.Input(min_shape=(1, 32, 8), opt_shape=(2, 64, 8), max_shape=(4, 128, 8))


def _layers(compiled: torch.jit.ScriptModule, kind: str) -> list:
    return [layer for e in _engines(compiled) for layer in e.network.layers if layer.KIND == kind]


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_if_on_a_dynamic_dim_is_one_engine_and_takes_the_branch_of_each_shape(backend):
    """`if x.size(1) > 64` on a dynamic dim: a conditional layer whose predicate the engine computes from the input
    shapes (it stayed in PyTorch, splitting the engine in two); calls alternating between shapes on either side give
    eager's answers."""
    model = LongSequences().eval()
    compiled, report = check_compiled(model, [torch.randn(2, 64, 8)], inputs=[SEQUENCES], backend=backend,
                                      min_block_size=1)
    assert "prim::If" in _kinds(report), report
    [engine] = _engines(compiled)
    [conditional] = [layer for layer in engine.network.layers if layer.KIND == "conditional"]
    assert shape_only_predicate(engine.network, conditional)
    if backend is None:  # onnxruntime: the dims, the comparison and the If are ONNX
        assert not report.reference_layers, report
    for shape in ((2, 100, 8), (3, 40, 8), (1, 65, 8), (1, 64, 8), (4, 128, 8), (2, 100, 8)):
        x = torch.randn(shape)
        with torch.no_grad():
            want = model(x)
            torch.testing.assert_close(compiled(x), want, rtol=0, atol=1e-4 * float(want.abs().max()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ifs_on_dim_arithmetic_and_the_element_count_are_one_engine(backend):
    dynamic = [torchkiln.Input(min_shape=(1, 8), opt_shape=(2, 32), max_shape=(8, 256))]
    model = SquareBlocks().eval()
    compiled, _ = check_compiled(model, [torch.randn(2, 32)], inputs=dynamic, backend=backend, min_block_size=1)
    assert len(_layers(compiled, "conditional")) == 2
    for shape in ((2, 32), (4, 64), (8, 128), (3, 40), (8, 200), (1, 8)):  # each combination of the two conditions
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-4 * float(model(x).abs().max()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_and_or_not_of_conditions_on_dynamic_dims_are_one_engine(backend):
    """s1 > 100 or (not 16 * s0 < s1 and s0 != 3): shapes taking each way through the condition give eager's answers."""
    dynamic = [torchkiln.Input(min_shape=(1, 8), opt_shape=(2, 32), max_shape=(8, 256))]
    model = CombinedConditions().eval()
    compiled, report = check_compiled(model, [torch.randn(2, 32)], inputs=dynamic, backend=backend, min_block_size=1)
    assert len(_layers(compiled, "conditional")) == 1
    if backend is None:
        assert not report.reference_layers, report
    for shape in ((2, 128), (2, 40), (4, 40), (3, 40), (8, 256)):  # then, else, then, else, then
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-4 * float(model(x).abs().max()))


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_for_loop_over_a_dynamic_dim_is_one_engine(backend):
    model = RowSteps().eval()
    compiled, _ = check_compiled(model, [torch.randn(3, 8)], inputs=[ROWS], backend=backend, min_block_size=1)
    assert len(_layers(compiled, "loop")) == 1
    for rows in (1, 8, 2):
        x = torch.randn(rows, 8)
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-4 * float(model(x).abs().max()))


@pytest.mark.parametrize("on_data", [True, False], ids=["data", "shape"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_branches_reading_a_tensor_sized_by_an_expression_of_dynamic_dims(backend, on_data):
    """A branch's input of s0 * s1 elements: a sub-network's input dims are bound by the outer network (the
    reference backend refused to bind them, EngineFormatError)."""
    model = Flattened(on_data).eval()
    compiled, _ = check_compiled(model, [torch.randn(2, 80)], inputs=[WINDOWS], backend=backend,
                                 min_block_size=1)
    assert len(_layers(compiled, "conditional")) == 1
    for shape, shift in (((2, 100), 1.0), ((2, 40), -1.0), ((4, 50), 1.0), ((3, 70), -1.0)):
        x = torch.randn(shape) + shift
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-4 * float(model(x).abs().max()))


def test_a_condition_on_a_dim_and_on_the_data_keeps_its_if_in_pytorch():
    dynamic = [torchkiln.Input(min_shape=(1, 8), opt_shape=(2, 32), max_shape=(8, 256))]
    model = ShapeAndData().eval()
    compiled, report = check_compiled(model, [torch.randn(2, 32)], inputs=dynamic, engines=None, torch_blocks=1,
                                      min_block_size=1)
    assert_falls_back(report, "prim::If", "an engine carries tensors")
    for shape, shift in (((2, 100), 1.0), ((2, 100), -1.0), ((2, 40), 1.0)):
        x = torch.randn(shape) + shift
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=1e-4 * float(model(x).abs().max()))


@pytest.mark.parametrize("spec", [torchkiln.Input(min_shape=(1, 65, 8), opt_shape=(2, 80, 8), max_shape=(4, 128, 8)),
                                  torchkiln.Input((2, 80, 8))], ids=["range-decides", "static"])
def test_an_if_on_a_dim_its_range_decides_is_folded(spec):
    """Where every shape in range takes one branch, the If folds at build time: no conditional layer."""
    compiled, _ = check_compiled(LongSequences().eval(), [torch.randn(2, 80, 8)], inputs=[spec], min_block_size=1)
    assert not _layers(compiled, "conditional")


def test_a_branch_that_raises_keeps_the_if_in_pytorch():
    """A raise (or a warning) must happen when its branch runs: such an If stays in PyTorch, and raises there."""
    class Checked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() < -100.0:
                raise ValueError("too negative")
            return x * 2.0

    compiled, report = check_compiled(Checked(), [torch.randn(4)], engines=None, torch_blocks=None,
                                      min_block_size=1)
    assert_falls_back(report, "prim::If", "is a side effect")
    with pytest.raises(torch.jit.Error, match="too negative"):
        compiled(torch.full((4,), -100.0))


def test_a_branch_that_warns_keeps_the_if_in_pytorch_and_warns_when_it_runs():
    class Warning(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum() > 0:
                warnings.warn("positive input")
                y = x * 2.0
            else:
                y = x - 1.0
            return y

    compiled, report = check_compiled(Warning(), [-torch.rand(4)], engines=None, torch_blocks=None, min_block_size=1)
    assert_falls_back(report, "prim::If", "aten::warn is a side effect")
    with pytest.warns(UserWarning, match="positive input"):
        compiled(torch.rand(4))


def test_a_while_loop_gets_the_iterations_its_body_cost_allows_and_a_costly_one_stays_in_pytorch(monkeypatch):
    class Refine(torch.nn.Module):
        def __init__(self, n: int) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(n, n) / n)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            while x.abs().sum() > 1e30:  # false here: eager and shape analysis run no product
                x = x @ self.w
            return x + 1.0

    compiled, report = check_compiled(Refine(64), [torch.randn(64, 64)], min_block_size=1, backend="reference")
    loop = next(layer for e in _engines(compiled) for layer in e.network.layers if layer.KIND == "loop")
    body = 2 * 64 ** 3 + 64 * 64  # the product and the condition's reads
    assert CF.MIN_WHILE_TRIPS <= loop.max_trips <= CF.WHILE_LOOP_FLOPS / body
    monkeypatch.setattr(CF, "WHILE_LOOP_FLOPS", 32 * body)  # fewer than MIN_WHILE_TRIPS iterations fit
    _, report = check_compiled(Refine(64), [torch.randn(64, 64)], engines=None, torch_blocks=None,
                               min_block_size=1, backend="reference")
    assert_falls_back(report, "prim::Loop", "iterations fit an engine's")


_ENDLESS = """
import sys
sys.path.insert(0, {tests!r})
import torchkiln
from harness import Endless

data = torchkiln.convert_method_to_engine(Endless().eval(), "forward", [torchkiln.Input((4,))], backend="reference")
print("converted", len(data))
"""


def test_a_while_loop_the_random_example_inputs_never_end_converts(tmp_path):
    """Shape analysis runs the method on random example inputs (Input specs alone); a while loop that never ends on
    them runs at most PROBE_TRIPS iterations there, so conversion finishes (before: it ran without end). Run in a
    process of its own with a time limit, so that a regression fails rather than hangs."""
    import subprocess
    import sys

    script = tmp_path / "endless.py"
    script.write_text(_ENDLESS.format(tests=str(pathlib.Path(__file__).parent)))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "converted" in done.stdout


def test_a_calibration_sample_the_loop_guard_refuses_is_skipped_with_a_warning(monkeypatch, caplog):
    """Precision safety calibrates a half-precision engine on random inputs when none are given; a while loop past its
    iteration guard on them refuses the sample, which is skipped with a warning instead of failing the build."""
    monkeypatch.setattr(CF, "WHILE_LOOP_FLOPS", CF.MIN_WHILE_TRIPS * 64.0)  # a small guard: a quick refusal
    with caplog.at_level("WARNING", logger="torchkiln"):
        compiled = torchkiln.compile(Endless().eval(), inputs=[torchkiln.Input((4,))], backend="reference",
                                     enabled_precisions={torch.float16}, min_block_size=1)
    assert "calibration sample 0 is skipped: the network refuses it" in caplog.text
    with pytest.raises(Exception, match="these inputs need more than its"):
        compiled(torch.randn(4))


def _engines(compiled: torch.jit.ScriptModule) -> list:
    from torchkiln.runtime.execute_op import engine_from_blob
    from torchkiln.stitching.stitch import engine_attrs

    return [engine_from_blob(getattr(compiled, attr)) for attr in engine_attrs(compiled)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_control_flow_engines_run_on_the_cuda_backend():
    """The cuda backend runs each branch and loop body by its own plan (no CUDA graph around the engine): a
    data-dependent if on inputs taking each branch, a while loop of a data-dependent trip count, and an if inside a
    loop, against eager on the GPU."""
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = DataIf().to(device).eval()
    compiled, report = check_compiled(model, [torch.randn(3, 6, device=device)], backend="cuda", min_block_size=1)
    assert "prim::If" in _kinds(report), report
    for x in (torch.randn(3, 6) * 4 + 3, torch.randn(3, 6) * 4 - 3):
        x = x.to(device)
        with torch.no_grad():
            want = model(x)
            torch.testing.assert_close(compiled(x), want, rtol=0, atol=1e-4 * float(want.abs().max()))
    step = torch.full((4,), 0.01, device=device)
    compiled, _ = check_compiled(WhileLoop(), [torch.randn(4, device=device) * 8, step], backend="cuda",
                                 min_block_size=1)
    for scale in (0.1, 3.0, 100.0):
        x = torch.randn(4, device=device) * scale
        with torch.no_grad():
            torch.testing.assert_close(compiled(x, step), WhileLoop()(x, step), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["if", "bool-of-sizes", "flattened", "for", "constant-for"])
def test_control_flow_the_shapes_decide_is_captured_as_a_cuda_graph_per_shape(name):
    """The cuda runner decides `if x.size(1) > 64`, `if bool((arange(x.size(1)) < 40).all())`, `for i in
    range(x.size(0))` and a for loop of 1000 iterations from the bound shapes and captures one CUDA graph per shape
    (hence per branch and trip count): shapes alternating between the branches or counts, each first run eagerly and
    then replayed, give eager's answers. An engine with a data-dependent if is still run uncaptured."""
    torch.manual_seed(0)
    device = torch.device("cuda")
    model, spec, shapes = {
        "if": (LongSequences(), SEQUENCES, [(2, 100, 8), (3, 40, 8), (1, 65, 8), (1, 64, 8)]),
        "bool-of-sizes": (WithinWindow(), WINDOWS, [(2, 40), (2, 41), (3, 33)]),
        "flattened": (Flattened(on_data=False), WINDOWS, [(2, 100), (2, 40), (4, 50)]),
        "for": (RowSteps(), ROWS, [(1, 8), (5, 8), (8, 8)]),
        "constant-for": (LongFor(), None, [(2, 5)]),
    }[name]
    model = model.to(device).eval()
    example = [torch.randn(shapes[0], device=device) for _ in range(2 if name == "constant-for" else 1)]
    compiled, _ = check_compiled(model, example, inputs=None if spec is None else [spec], backend="cuda",
                                 device="cuda", min_block_size=1)
    for shape in shapes * 3:
        xs = [torch.randn(shape, device=device) * (0.1 if k else 1.0) for k in range(len(example))]
        with torch.no_grad():
            want = model(*xs)
        torch.testing.assert_close(compiled(*xs), want, rtol=0, atol=1e-4 * float(want.abs().max()))
    [engine] = _engines(compiled)
    runner = engine.runner(xs[0].device)  # the runner the calls above used (runners are kept per device)
    assert runner._graphs
    assert {key[0] for key in runner._bound} >= set(shapes)
    assert all(bound.graph is not None for bound in runner._bound.values())
    data, _ = check_compiled(DataIf().to(device).eval(), [torch.randn(3, 6, device=device)], backend="cuda",
                             min_block_size=1)
    assert not _engines(data)[0].runner(xs[0].device)._graphs
