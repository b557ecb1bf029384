"""The backend registry: every layer kind on every backend against the reference meanings; the onnxruntime
backend's segments (mixed ORT / reference runs, tiny runs, shared output views), its run-time index checks
and errors, its settings, and a saved module that runs on ORT in a new process."""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from harness import FP32_RTOL, assert_matches_eager, check_compiled, check_fn, session_graph
from test_onnx_export import ALL_CASES

import torchkiln
from torchkiln.errors import EngineFormatError, EngineIndexError
from torchkiln.ir import Network
from torchkiln.ir import layers as L
from torchkiln.ir.symbolic import DimSymbol, shape_range
from torchkiln.runtime.backends import BACKENDS
from torchkiln.examples import MLP
from torchkiln.runtime.backends.onnxruntime import TOO_SMALL, OrtRunner, _numpy, plan_segments
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.runtime.executor import ReferenceExecutor

CPU = torch.device("cpu")
E = L.ElementWiseOperation
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def engine_of(net: Network, backend: str, device: str = "cpu") -> Engine:
    bindings = [InputBinding(t.name, t.dtype, t.shape, t.shape, t.shape) for t in net.inputs]
    return Engine(net, bindings, device, torch.float32, net.name, backend)


def reference_outputs(net: Network, inputs: list[torch.Tensor]) -> list[torch.Tensor] | Exception:
    try:
        return ReferenceExecutor(net, CPU).run(inputs)
    except Exception as e:  # the error every backend must raise too
        return e


def _cuda_reference(net: Network, inputs: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """The reference meanings on the GPU (None where torch has no CUDA kernel for a layer)."""
    try:
        return [o.cpu() for o in ReferenceExecutor(net, torch.device("cuda")).run([x.cuda() for x in inputs])]
    except NotImplementedError:
        return None


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_every_layer_kind_matches_the_reference_meanings(backend):
    """Every case of every layer kind (the ONNX export's cases) as one engine on `backend` (the cuda backend
    on the GPU, where there is one)."""
    device = "cuda" if "cpu" not in BACKENDS[backend].devices else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for name, build in ALL_CASES:
        net, inputs = build(torch.Generator().manual_seed(0))
        ref = reference_outputs(net, inputs)
        engine = engine_of(net, backend, device)
        if name.startswith("activation-GELU") and torch.__version__ < "2.13":
            continue  # torch 2.11's GELU(+inf) is NaN (or, on the CPU, depends on the element's place); ours is +inf
        if device == "cuda" and not isinstance(ref, Exception):
            ref = _cuda_reference(net, inputs)  # on the same device (a scatter's duplicate indices resolve per device)
            if ref is None:
                continue  # e.g. an int64 matrix multiply: torch has no CUDA kernel, so eager cannot run it there either
        if isinstance(ref, Exception):
            if device == "cuda":  # a bad index trips CUDA's device-side assertion, which ends the process's CUDA
                continue
            with pytest.raises(type(ref)):
                engine.execute(inputs)
            continue
        out = [o.cpu() for o in engine.execute([x.to(device) for x in inputs])]
        # a second call takes the runner's steady path (ORT: the session's run alone, outputs checked already)
        again = [o.cpu() for o in engine.execute([x.to(device) for x in inputs])]
        torch.testing.assert_close(again, out, rtol=0, atol=0, equal_nan=True, msg=f"{name}: a second call differs")
        # a generated kernel rounds a half-precision chain once, at its end; the reference after every layer
        half = device == "cuda" and any(t.dtype in (torch.float16, torch.bfloat16)
                                        for layer in net.layers for t in layer.outputs)
        assert_matches_eager(out, ref, rtol=8e-3 if half else FP32_RTOL, path=name)
        for o, x in ((o, x) for o in out for x in inputs):
            assert not (o.numel() and x.numel() and o.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()), \
                f"{name}: an output shares memory with an input"


def test_one_session_whose_inputs_and_outputs_are_in_another_order_maps_them_at_every_call():
    """The session reads `b` first and not `unused`, and makes the outputs in the other order than the network
    returns them: the first call (outputs checked) and later ones (the session's run alone) map them alike."""
    net = Network("reordered")
    a = net.add_input("a", torch.float32, (3, 4))
    b = net.add_input("b", torch.float32, (3, 4))
    net.add_input("unused", torch.float32, (2,))
    first = net.add_activation(b, L.ActivationType.RELU).get_output()
    second = net.add_elementwise(first, a, E.SUM).get_output()
    net.mark_output(second)
    net.mark_output(first)
    engine = engine_of(net, "onnxruntime")
    runner = engine.runner(CPU)
    assert runner.sessions == 1 and len(runner.steps) == 1
    assert runner.steps[0][1] != runner.input_ids and runner.steps[0][2] != runner.output_ids
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        inputs = [torch.randn(3, 4, generator=g), torch.randn(3, 4, generator=g), torch.randn(2, generator=g)]
        out = engine.execute(inputs)
        assert len(out) == 2 and all(torch.equal(o, r) for o, r in zip(out, ReferenceExecutor(net, CPU).run(inputs)))


def test_outputs_kept_across_calls_keep_their_values():
    """ORT's outputs come back without a copy (numpy arrays over buffers of its own, made per call): an output a
    caller keeps is never memory a later call writes."""
    model = MLP().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input((2, 64))])
    xs = [torch.randn(2, 64, generator=torch.Generator().manual_seed(k)) for k in range(4)]
    kept = [compiled(x) for x in xs]
    with torch.no_grad():
        for x, out in zip(xs, kept):
            assert_matches_eager(out, model(x))
    assert len({out.data_ptr() for out in kept}) == len(kept)


def test_onnx_runtime_reads_a_contiguous_input_in_place():
    """What a session is fed for a contiguous input is a view of the tensor's own memory (requires_grad or not),
    which ORT's numpy conversion wraps without copying; a non-contiguous input is fed as a contiguous copy."""
    from onnxruntime import OrtValue

    for x in (torch.randn(2, 64), torch.randn(2, 64, requires_grad=True)):
        fed = _numpy(x)
        assert fed.ctypes.data == x.data_ptr() and fed.shape == (2, 64)
        assert OrtValue.ortvalue_from_numpy(fed).data_ptr() == x.data_ptr()
    x = torch.randn(64, 2).t()
    fed = _numpy(x)
    assert fed.flags["C_CONTIGUOUS"] and fed.ctypes.data != x.data_ptr() and torch.equal(torch.from_numpy(fed), x)


def _mixed_network() -> Network:
    net = Network("mixed")
    x = net.add_input("x", torch.float32, (4, 8))
    h = net.add_matrix_multiply(x, L.MatrixOperation.NONE, net.add_constant(torch.randn(8, 8)).get_output(),
                                L.MatrixOperation.NONE).get_output()
    h = net.add_activation(h, L.ActivationType.RELU).get_output()
    a = net.add_elementwise(h, x, E.ATAN2).get_output()  # ONNX has no atan2: the reference runs it
    y = net.add_matrix_multiply(a, L.MatrixOperation.NONE, net.add_constant(torch.randn(8, 3)).get_output(),
                                L.MatrixOperation.NONE).get_output()
    net.mark_output(net.add_activation(y, L.ActivationType.SIGMOID).get_output())
    net.mark_output(h)
    return net


def test_layers_onnx_cannot_express_run_between_sessions():
    net = _mixed_network()
    assert [(s.on_ort, [layer.KIND for layer in s.layers]) for s in plan_segments(net)] == [
        (True, ["constant", "matrix_multiply", "activation"]), (False, ["elementwise"]),
        (True, ["constant", "matrix_multiply", "activation"])]
    engine = engine_of(net, "onnxruntime")
    [(layer, kind, reason)] = engine.reference_layers()
    assert kind == "elementwise" and "ATAN2" in reason
    x = torch.randn(4, 8)
    assert_matches_eager(engine.execute([x]), ReferenceExecutor(net, CPU).run([x]))
    assert engine.runner(CPU).sessions == 2


def test_a_run_that_only_moves_data_gets_no_session():
    net = Network("tiny")
    x = net.add_input("x", torch.float32, (2, 6))
    a = net.add_elementwise(x, x, E.ATAN2).get_output()
    r = net.add_shuffle(a, reshape_dims=(3, 4)).get_output()
    net.mark_output(net.add_elementwise(r, r, E.ATAN2).get_output())
    [segment] = plan_segments(net)
    assert not segment.on_ort and TOO_SMALL in segment.reasons["shuffle"]
    x = torch.randn(2, 6)
    assert_matches_eager(engine_of(net, "onnxruntime").execute([x]), ReferenceExecutor(net, CPU).run([x]))


class Atan2Between(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)

    def forward(self, x):
        h = torch.relu(self.a(x))
        return torch.softmax(self.b(torch.atan2(h, x)), -1)


def test_compiled_model_with_a_layer_onnx_cannot_express(caplog):
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        compiled, report = check_compiled(Atan2Between(), [torch.randn(2, 16)], backend="onnxruntime")
    [found] = report.reference_layers
    assert found.kind == "elementwise" and "ATAN2" in found.reason and "atan2" in found.layer
    assert "run on the reference backend inside ONNX Runtime engines: 1 layer" in str(report)
    assert "1 of" in caplog.text and "layers run on the reference backend" in caplog.text


class Embed(torch.nn.Module):
    def __init__(self, shift: int) -> None:
        super().__init__()
        self.emb, self.shift = torch.nn.Embedding(10, 8), shift

    def forward(self, ids):
        return torch.tanh(self.emb(ids + self.shift) * 2)


@pytest.mark.parametrize("shift", [0, 1], ids=["input-indices", "computed-indices"])
@pytest.mark.parametrize("bad", [-1, 10])
def test_an_index_out_of_range_raises_as_on_the_reference(shift, bad):
    compiled, _ = check_compiled(Embed(shift), [torch.tensor([[1, 2, 3]])], backend="onnxruntime")
    with pytest.raises(EngineIndexError, match=f"index {bad}"):
        compiled(torch.tensor([[1, bad - shift, 3]]))


def test_integer_division_by_zero_raises_as_on_the_reference():
    def fn(x, y):
        return torch.div(x * 3, y, rounding_mode="floor") + 1

    compiled, _ = check_compiled(torch.jit.script(_Fn2(fn)), [torch.tensor([4, 5]), torch.tensor([2, 3])],
                                 backend="onnxruntime", min_block_size=1)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        compiled(torch.tensor([4, 5]), torch.tensor([0, 3]))


class _Fn2(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x, y):
        return self.fn(x, y)


def test_backend_is_recorded_in_the_engine_and_auto_means_onnxruntime_on_cpu():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval()
    for backend, expected in (("auto", "onnxruntime"), ("reference", "reference"), ("onnxruntime", "onnxruntime")):
        data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input((2, 4))], backend=backend)
        engine = Engine.deserialize(data)
        assert engine.backend == expected
        runner = engine.runner(CPU)
        assert isinstance(runner, OrtRunner) == (expected == "onnxruntime")


def test_fp16_on_onnxruntime_builds_fp32_and_says_so(caplog):
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()).eval()
    spec = [torchkiln.Input((2, 8))]
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        data = torchkiln.convert_method_to_engine(model, "forward", spec, enabled_precisions={torch.float16})
    assert "built in float32" in caplog.text and Engine.deserialize(data).precision == torch.float32
    data = torchkiln.convert_method_to_engine(model, "forward", spec, enabled_precisions={torch.float16},
                                              backend="reference")
    assert Engine.deserialize(data).precision == torch.float16


@pytest.mark.parametrize("bad", [dict(backend="tensorrt"), dict(ort_threads=-1), dict(ort_threads=True),
                                 dict(ort_threads=2.0)])
def test_bad_backend_settings_are_refused(bad):
    with pytest.raises(ValueError, match=next(iter(bad))):
        torchkiln.compile(torch.nn.ReLU(), [torchkiln.Input((2,))], **bad)


def test_ort_threads_reach_the_sessions():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
    data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input((2, 4))], ort_threads=1)
    engine = Engine.deserialize(data)
    assert engine.backend_options.ort_threads == 1
    [(step, _, _)] = engine.runner(CPU).steps
    assert step.session.get_session_options().intra_op_num_threads == 1


class ResidualNorm(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear, self.norm = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x + self.linear(x))


def test_sessions_run_a_residual_add_and_layer_norm_unfused(tmp_path):
    """ONNX Runtime 1.32's SkipLayerNormalization, its fusion of an add and the layer norm after it, takes 5-8x the
    time of the Add and LayerNormalization it replaces (x86, [1-32, 128, 256-768]): the backend's sessions run
    without that fusion."""
    model, x = ResidualNorm().eval(), torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(0))
    compiled = torchkiln.compile(model, [x])
    ops = [node.op_type for node in session_graph(compiled, [x], str(tmp_path))]
    assert "LayerNormalization" in ops and "SkipLayerNormalization" not in ops, ops
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))


class FeedForwardHead(torch.nn.Module):
    """A token-wise feed-forward block (linear layers of 3-d input, GELU between; `width` the narrower of their
    inner and output widths) and a 2-d classifier head."""

    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)
        self.head, self.out = torch.nn.Linear(width, 8), torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + self.down(F.gelu(self.up(x)))
        return self.out(torch.relu(self.head(y.mean(1))))


def test_sessions_run_linear_layers_of_3d_input_as_matmul_and_add(tmp_path):
    """ORT's MatMulAddFusion makes a linear layer of 3-d input Reshape + Gemm + Reshape, slower than MatMul + Add
    (and unfusing the GELU after it) where the layer is wide: the sessions run without it, so the up projection and
    its GELU are MatMul + BiasGelu, the down projection MatMul + Add; a 2-d linear layer is still a Gemm (its ReLU
    fused into it)."""
    model, x = FeedForwardHead().eval(), torch.randn(2, 8, 64, generator=torch.Generator().manual_seed(0))
    compiled = torchkiln.compile(model, [x])
    ops = [node.op_type for node in session_graph(compiled, [x], str(tmp_path))]
    assert ops.count("MatMul") == 2 and "BiasGelu" in ops and "Reshape" not in ops, ops
    assert ops.count("Gemm") + ops.count("FusedGemm") == 2 and "FusedGemm" in ops, ops
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))


def test_sessions_run_narrow_linear_layers_of_3d_input_as_gemm(tmp_path):
    """A linear layer of 3-d input whose inner or output width is at most NARROW_LINEAR is Reshape + Gemm + Reshape
    (the bias added in the product's output loop: an Add of a narrow bias over many rows costs as much as such a
    product); the values are eager's."""
    from torchkiln.onnx_export.exporters.nn import NARROW_LINEAR

    model, x = FeedForwardHead(NARROW_LINEAR // 2).eval(), torch.randn(2, 8, NARROW_LINEAR // 2)
    compiled = torchkiln.compile(model, [x])
    ops = [node.op_type for node in session_graph(compiled, [x], str(tmp_path))]
    assert "MatMul" not in ops and ops.count("Gemm") + ops.count("FusedGemm") == 4, ops
    assert ops.count("Add") == 1, ops  # the residual's: no bias added apart
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))


def test_saved_module_runs_on_onnxruntime_in_a_new_process(tmp_path):
    model = Atan2Between().eval()
    x = torch.randn(2, 16)
    compiled = torchkiln.compile(model, [x])
    path, data = tmp_path / "m.ts", tmp_path / "x.pt"
    torch.jit.save(compiled, str(path))
    with torch.no_grad():
        torch.save({"x": x, "ref": model(x)}, str(data))
    script = textwrap.dedent(f"""
        import torch, torchkiln
        from torchkiln.runtime.backends.onnxruntime import OrtRunner
        from torchkiln.runtime.execute_op import engine_from_blob
        m = torchkiln.load({str(path)!r})
        d = torch.load({str(data)!r})
        out = m(d["x"])
        runner = engine_from_blob(m._torchkiln_engine_0).runner(torch.device("cpu"))
        assert isinstance(runner, OrtRunner) and runner.sessions == 2, runner
        err = (out - d["ref"]).abs().max().item()
        assert err <= 1e-4 * d["ref"].abs().max().item(), err
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]


def test_without_onnxruntime_engines_run_on_the_reference_with_one_warning():
    script = textwrap.dedent("""
        import logging, sys
        sys.modules["onnxruntime"] = None  # as if not installed
        logging.basicConfig(level=logging.WARNING, format="%(message)s")
        import torch, torchkiln
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2)).eval()
        x = torch.randn(2, 4)
        for _ in range(2):
            out = torchkiln.compile(model, [x])(x)
            assert torch.allclose(out, model(x), atol=1e-6)
        print("ok")
    """)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-3000:]
    assert result.stderr.count("onnxruntime is not installed") == 1, result.stderr


def test_two_gathers_of_one_run_time_index_tensor_share_one_session_output():
    net = Network("two_gathers")
    x = net.add_input("x", torch.float32, (4, 3))
    i = net.add_input("i", torch.int64, (2,))
    j = net.add_elementwise(i, net.add_constant(torch.tensor(1)).get_output(), E.SUM).get_output()
    net.mark_output(net.add_gather(x, j, 0).get_output())
    net.mark_output(net.add_gather(x, j, 0).get_output())
    engine = engine_of(net, "onnxruntime")
    inputs = [torch.randn(4, 3), torch.tensor([0, 2])]
    assert_matches_eager(engine.execute(inputs), ReferenceExecutor(net, CPU).run(inputs))
    assert engine.runner(CPU).sessions == 1
    with pytest.raises(EngineIndexError):
        engine.execute([torch.randn(4, 3), torch.tensor([0, 3])])


# ---- dynamic shapes: one session whose symbolic parameters ORT computes from the input shapes ----------------
def _dynamic_engine(net: Network) -> Engine:
    bindings = [InputBinding(t.name, t.dtype, *shape_range(t.shape)) for t in net.inputs]
    return Engine(net, bindings, "cpu", torch.float32, net.name, "onnxruntime")


def _symbolic_network() -> Network:
    s0, s1 = DimSymbol("s0", 1, 8), DimSymbol("s1", 2, 5)
    net = Network("symbolic")
    x = net.add_input("x", torch.float32, (s0, s1, 4))
    i = net.add_input("i", torch.int64, (s0, 1))
    flat = net.add_shuffle(x, reshape_dims=(s0 * s1, 4)).get_output()
    tail = net.add_slice(flat, (s1, 0), (s0 * s1 - s1, 4), (1, 1)).get_output()  # all rows but the first s1
    count = net.add_layer(L.DimValueLayer, [], value=s0 * s1 - s1, dtype=torch.float32).get_output()
    net.mark_output(tail)
    net.mark_output(count)
    positions = net.add_fill(s0, 0, 1, torch.int64).get_output()
    net.mark_output(net.add_expand(net.add_shuffle(positions, reshape_dims=(s0, 1)).get_output(), (s0, s1))
                    .get_output())
    net.mark_output(net.add_gather(x, i, 0, L.GatherMode.ND).get_output())  # gather-nd of run-time indices
    return net


def test_dynamic_network_with_symbolic_parameters_runs_as_one_ort_session():
    net = _symbolic_network()
    engine = _dynamic_engine(net)
    assert not engine.reference_layers()
    for s0, s1 in [(1, 2), (8, 5), (3, 4), (5, 2)]:
        inputs = [torch.randn(s0, s1, 4), torch.randint(0, s0, (s0, 1))]
        out = engine.execute(inputs)
        for got, want in zip(out, ReferenceExecutor(net, CPU).run(inputs)):
            assert got.shape == want.shape and torch.equal(got, want), (s0, s1)
    runner = engine.runner(CPU)
    assert isinstance(runner, OrtRunner) and runner.sessions == 1 and len(runner.steps) == 1


def test_dynamic_gather_nd_of_a_negative_run_time_index_raises_engine_index_error():
    engine = _dynamic_engine(_symbolic_network())
    with pytest.raises(EngineIndexError, match="index -1"):
        engine.execute([torch.randn(3, 2, 4), torch.tensor([[0], [-1], [1]])])
    assert isinstance(engine.runner(CPU), OrtRunner)


def test_dynamic_network_with_a_layer_ort_cannot_run_uses_the_reference_backend(caplog):
    s0 = DimSymbol("s0", 1, 8)
    net = Network("dynamic_atan2")
    x = net.add_input("x", torch.float32, (s0, 3))
    net.mark_output(net.add_elementwise(net.add_activation(x, L.ActivationType.RELU).get_output(), x, E.ATAN2)
                    .get_output())
    engine = _dynamic_engine(net)
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        runner = engine.runner(CPU)
    assert isinstance(runner, ReferenceExecutor) and "ATAN2" in caplog.text and "elementwise" in caplog.text
    x = torch.randn(5, 3)
    assert_matches_eager(engine.execute([x]), ReferenceExecutor(net, CPU).run([x]))


def test_dynamic_gather_of_constant_indices_past_a_smaller_run_time_size_raises_engine_index_error():
    s0 = DimSymbol("s0", 2, 8)
    net = Network("constant_indices")
    x = net.add_input("x", torch.float32, (s0, 3))
    net.mark_output(net.add_gather(x, net.add_constant(torch.tensor([0, 4])).get_output(), 0).get_output())
    engine = _dynamic_engine(net)
    x = torch.randn(6, 3)
    assert_matches_eager(engine.execute([x]), ReferenceExecutor(net, CPU).run([x]))
    assert isinstance(engine.runner(CPU), OrtRunner) and engine.runner(CPU).sessions == 1
    with pytest.raises(EngineIndexError, match="index 4"):
        engine.execute([torch.randn(3, 3)])


# ---- shapes ONNX Runtime would refuse at every call: exported another way, or refused at build -----------------
def _conv_transpose_past_stride(x):
    return F.conv_transpose1d(x, torch.ones(2, 3, 3) / 4, torch.tensor([0.5, -1.0, 2.0]), stride=1,
                              output_padding=1, dilation=2)


def _replicate_pad_to_nothing(x):
    return F.pad(x, (1, 2, -2, -2), mode="replicate") * 2


def _reflect_pad_past_a_crop(x):
    return F.pad(x, (-3, 2), mode="reflect") * 2


def _cumsum_0d(x):
    return torch.cumsum(x * 2, 0)


def _repeat_by_zero(x):
    return (x * 2).repeat(0, 1, 1) + 1


def _tile_by_zero(x):
    return torch.tile(x * 2, (0,)) + 1


def _scatter_0d(x):
    return torch.scatter(x * 2, 0, torch.tensor(0), torch.tensor(5.0)) + 1


ROBUST = [  # (function, example, reason the onnxruntime backend gives where it refuses the layer at build)
    (_conv_transpose_past_stride, torch.randn(1, 2, 5), "output_padding=[1] not below stride=[1]"),
    (_replicate_pad_to_nothing, torch.randn(1, 2, 4, 5), None),
    (_reflect_pad_past_a_crop, torch.randn(1, 2, 5), "ONNX Runtime reflects only the 2 elements"),
    (_cumsum_0d, torch.tensor(3.0), None),
    (_repeat_by_zero, torch.randn(2, 3), None),
    (_tile_by_zero, torch.randn(2, 3), None),
    (_scatter_0d, torch.tensor(3.0), "0-d index"),
]


@pytest.mark.parametrize("fn,x,reason", ROBUST, ids=[c[0].__name__.strip("_") for c in ROBUST])
def test_shapes_onnx_runtime_refuses_at_run_time_are_settled_at_build(fn, x, reason, caplog):
    """Each gives eager's answer with no ONNX Runtime failure at run time: exported in a form ORT runs, or (with
    the reason in the partition report) run on the reference meaning inside the engine."""
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        compiled, report = check_fn(fn, x, backend="onnxruntime")
        compiled(x)
    assert "ONNX Runtime failed" not in caplog.text
    found = [r.reason for r in report.reference_layers]
    assert any(reason in r for r in found) if reason else not found, found


@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "dynamic"])
def test_an_ort_output_unlike_the_declared_one_raises_engine_format_error(dynamic):
    """ONNX Runtime only warns where an output's shape differs from the model's declared one. An engine whose
    network declares another shape than its export computes (as a wrong exporter would) raises, naming it."""
    s0 = DimSymbol("s0", 1, 8)
    net = Network("declared")
    x = net.add_input("x", torch.float32, (s0 if dynamic else 2, 3))
    y = net.add_unary(x, L.UnaryOperation.EXP).get_output()
    net.mark_output(y)
    y.shape = (3, s0) if dynamic else (3, 2)  # the declaration no longer matches what the layer computes
    engine = _dynamic_engine(net) if dynamic else engine_of(net, "onnxruntime")
    for _ in range(2):  # checked once per input shapes, raised every call while wrong
        with pytest.raises(EngineFormatError, match=r"float32\[2, 3\] for tensor 'unary:0'.*declares float32\[3, 2\]"):
            engine.execute([torch.randn(2, 3)])
