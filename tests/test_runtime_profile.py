"""runtime/profile.py: each engine step timed (bench --profile's table, like trtexec's --dumpProfile). Times are only
checked to be positive and to add up to the call; what is fast is not a test's business."""
import pytest
import torch
from harness import assert_matches_eager, check_compiled

from torchkiln.examples.models import randomize_batch_norm
from torchkiln.ir import layers as L
from torchkiln.onnx_export import network_to_onnx
from torchkiln.runtime.execute_op import engine_from_blob
from torchkiln.runtime.profile import StepProfiler, _layers_named, format_profile
from torchkiln.stitching.stitch import engine_attrs

CALLS = 4  # profiled calls per test, after one profiled warm-up


class ConvHead(torch.nn.Module):
    """conv + batch norm + relu + max pool, then flatten, linear and GELU: fusable on every backend."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16),
                                            torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.head = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16 * 8 * 8, 32), torch.nn.GELU())
        randomize_batch_norm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class TopKBetween(torch.nn.Module):
    """linear + relu, a top-k of k > 1 (which the onnxruntime backend runs on the reference), linear + sigmoid."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(16, 32), torch.nn.Linear(3, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.a(x)).reshape(4, 8, 4)
        return self.b(torch.topk(y, 3, dim=-1).values).sigmoid()


def _engines(module):
    return [engine_from_blob(getattr(module, attr)) for attr in engine_attrs(module)]


def _profile(compiled, x, model):
    """Each engine's profile over CALLS calls of `compiled` (after one warm-up), and checks that every profiled call
    gives eager's values."""
    with torch.no_grad():
        ref = model(x)
        with StepProfiler(warmup=1) as profiler:
            for _ in range(CALLS + 1):
                assert_matches_eager(compiled(x), ref)
    return [p.to_json() for p in profiler.profiles()]


def _check_sums(profile):
    """Positive times; the steps of a call add up to at most the call, and to most of it (medians: one call the
    host stalls in outside its steps, on a busy 2-core machine, does not decide it)."""
    assert profile["calls"] == CALLS
    total, steps = profile["total_ms"], profile["steps_sum_ms"]
    assert 0 < steps["mean"] <= total["mean"] and steps["median"] >= 0.5 * total["median"], profile
    assert total["median"] > 0
    assert sum(r["percent"] for r in profile["steps"]) == pytest.approx(100 * steps["mean"] / total["mean"])
    assert [r["index"] for r in profile["steps"]] == list(range(len(profile["steps"])))


def test_reference_backend_times_every_layer():
    model = ConvHead().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled, _ = check_compiled(model, [x], backend="reference")
    [engine] = _engines(compiled)
    [profile] = _profile(compiled, x, model)
    assert profile["engine"] == engine.name and profile["backend"] == "reference"
    rows = profile["steps"]
    assert [r["layers"] for r in rows] == [[layer.name] for layer in engine.network.layers]
    assert [r["name"] for r in rows] == [layer.name for layer in engine.network.layers]
    assert [r["kind"] for r in rows] == [f"aten {layer.KIND}" for layer in engine.network.layers]
    assert all(r["mean_ms"] > 0 and r["median_ms"] > 0 for r in rows)
    _check_sums(profile)


def test_onnxruntime_nodes_map_back_to_their_layers():
    model = ConvHead().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled, _ = check_compiled(model, [x], backend="onnxruntime")
    [engine] = _engines(compiled)
    [profile] = _profile(compiled, x, model)
    assert profile["backend"] == "onnxruntime"
    rows = profile["steps"]
    nodes, rest = rows[:-1], rows[-1]
    assert rest["name"] == "session 0: outside its kernels" and rest["layers"] == [] and rest["mean_ms"] > 0
    assert nodes and all(r["kind"].startswith("onnxruntime ") and r["node"] for r in nodes)
    assert all(r["mean_ms"] >= 0 for r in nodes) and sum(r["mean_ms"] for r in nodes) > 0  # ORT counts whole us
    order = {layer.name: j for j, layer in enumerate(engine.network.layers)}
    computed = [layer.name for layer in engine.network.layers if not isinstance(layer, L.ConstantLayer)]
    assert {n for r in nodes for n in r["layers"]} == set(computed)  # every layer is some node's, by its name
    for r in nodes:
        assert r["layers"] == sorted(r["layers"], key=order.get) and r["name"] == " + ".join(r["layers"])
    conv, relu = (next(layer.name for layer in engine.network.layers if isinstance(layer, kind))
                  for kind in (L.ConvolutionLayer, L.ActivationLayer))
    assert any({conv, relu} <= set(r["layers"]) for r in nodes)  # ORT fuses the relu into the convolution
    _check_sums(profile)


def test_onnxruntime_reference_segments_and_several_engines():
    """A top-k ORT cannot run is its own row between the sessions' nodes; a torch block between two engines gives
    two profiles, in the order the engines ran."""
    model = TopKBetween().eval()
    x = torch.randn(4, 16)
    compiled, _ = check_compiled(model, [x], backend="onnxruntime")
    [profile] = _profile(compiled, x, model)
    kinds = [r["kind"] for r in profile["steps"]]
    topk = kinds.index("aten topk")
    assert kinds[topk - 1] == kinds[-1] == "onnxruntime session"  # session 0 ends before it, session 1 at the end
    assert profile["steps"][topk - 1]["name"] == "session 0: outside its kernels"
    assert profile["steps"][-1]["name"] == "session 1: outside its kernels"
    assert profile["steps"][topk]["mean_ms"] > 0
    _check_sums(profile)

    compiled, _ = check_compiled(model, [x], backend="onnxruntime", engines=2, torch_blocks=1,
                                 torch_executed_ops=["aten::topk"], min_block_size=1)
    profiles = _profile(compiled, x, model)
    assert [p["engine"] for p in profiles] == [e.name for e in _engines(compiled)]
    for p in profiles:
        _check_sums(p)


def test_table_order_and_sort_by_time():
    model = ConvHead().eval()
    x = torch.randn(2, 3, 16, 16)
    compiled, _ = check_compiled(model, [x], backend="reference")
    [profile] = _profile(compiled, x, model)
    table = format_profile(profile).splitlines()
    steps = profile["steps"]
    assert len(table) == 2 + len(steps) + 2 and "sum of the steps" in table[-2] and "engine call" in table[-1]
    assert [int(line.split()[0]) for line in table[2:-2]] == [r["index"] for r in steps]
    by_time = format_profile(profile, "time").splitlines()
    assert [int(line.split()[0]) for line in by_time[2:-2]] == \
        [r["index"] for r in sorted(steps, key=lambda r: -r["mean_ms"])]
    with pytest.raises(ValueError, match="sort must be one of"):
        format_profile(profile, "name")


def test_exported_names_map_back_to_their_layer():
    """The ONNX export names a layer's nodes `{layer}/{Op}`, their outputs `{layer}/{Op}:{i}` and its initializers
    `{layer}/...`; ONNX Runtime's fused nodes are "fused {node}"; the longest layer name wins."""
    model = ConvHead().eval()
    compiled, _ = check_compiled(model, [torch.randn(2, 3, 16, 16)], backend="reference")
    [engine] = _engines(compiled)
    names = {layer.name for layer in engine.network.layers}
    onnx_model = network_to_onnx(engine.network)
    exported = [n for n in onnx_model.graph.node if not n.name.endswith("/output")]  # the outputs' Identity nodes
    assert exported
    for node in exported:
        [layer] = _layers_named(node.name, names)
        assert node.name.startswith(layer + "/") and all(_layers_named(o, names) == [layer] for o in node.output)
        assert _layers_named(f"fused {node.name}", names) == [layer]
    assert _layers_named("a/b/Relu", {"a", "a/b"}) == ["a/b"] and _layers_named("ab/Relu", {"a"}) == []


def test_warmup_is_checked_and_a_profiler_runs_once():
    with pytest.raises(ValueError, match="warmup"):
        StepProfiler(warmup=-1)
    profiler = StepProfiler()
    with profiler:
        pass
    assert profiler.profiles() == []
    with pytest.raises(RuntimeError, match="once"):
        profiler.__enter__()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the cuda backend runs on a GPU")
def test_cuda_backend_times_every_plan_step():
    model = ConvHead().eval().cuda()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # eager in true fp32, as the engine
        compiled, _ = check_compiled(model, [x], backend="cuda")
        [profile] = _profile(compiled, x, model)
    [engine] = _engines(compiled)
    plan = engine.plan_for(x.device)
    assert profile["backend"] == "cuda"
    rows = profile["steps"]
    assert [r["layers"] for r in rows] == [[engine.network.layers[j].name for j in s.layers] for s in plan.steps]
    assert [r["kind"] for r in rows] == [f"{plan.kernels[s.kernel].kind} {plan.kernels[s.kernel].op}"
                                         for s in plan.steps]
    assert all(r["mean_ms"] >= 0 for r in rows)  # a step that launches nothing (a constant) may take no GPU time
    assert all(r["mean_ms"] > 0 for r in rows if r["kind"].split()[0] in ("generated", "library"))
    _check_sums(profile)
    # the steps left apart, and why (tests/test_cuda_fusion_report.py), end the table
    from torchkiln.runtime.backends.cuda.fusion_report import format_edges

    assert profile["unfused"] == format_edges(engine.network, plan) and profile["unfused"]
    assert format_profile(profile).splitlines()[-len(profile["unfused"]):] == [f"  {e}" for e in profile["unfused"]]
