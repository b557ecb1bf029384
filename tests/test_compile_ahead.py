"""Compiling a plan's generated kernels ahead of its first run (`codegen.compiling_ahead`, `_Bound.compile_ahead`): a
launch inside runs nothing, the runner's dry run leaves its inputs and weights as they were and feeds no step garbage,
and the run after it computes the network. On a GPU, the first call compiles nothing in its own thread: every kernel
was compiled, loaded and given its launcher side by side in the dry run's threads."""
import logging
import threading

import pytest
import torch

pytest.importorskip("triton", reason="triton is not installed")

from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.runtime.backends import BackendOptions  # noqa: E402
from torchkiln.runtime.backends.cuda import codegen, planner, runner  # noqa: E402
from torchkiln.runtime.backends.cuda.codegen import compiling_ahead, pointwise  # noqa: E402
from torchkiln.runtime.backends.cuda.runner import bind_steps, place_weights  # noqa: E402
from torchkiln.runtime.symbols import SymbolBinder  # noqa: E402

pytestmark = pytest.mark.usefixtures("triton_interpreter")


def lookup_network(scale: float = 15.0) -> Network:
    """Indices made by generated kernels (x * scale, floored, cast to int64) read by a gather that stays an ATen call:
    uninitialized indices would be out of range."""
    net = Network("lookup")
    x = net.add_input("x", torch.float32, (4, 16))
    g = torch.Generator().manual_seed(0)
    table = net.add_constant(torch.randn(16, 8, generator=g)).get_output()
    k = net.add_constant(torch.full((1, 1), scale)).get_output()
    scaled = net.add_elementwise(x, k, L.ElementWiseOperation.PROD).get_output()
    idx = net.add_cast(net.add_unary(scaled, L.UnaryOperation.FLOOR).get_output(), torch.int64).get_output()
    looked = net.add_gather(table, idx, 0).get_output()
    net.mark_output(net.add_softmax(looked, 2).get_output())
    return net


def reference(net: Network, x: torch.Tensor, scale: float = 15.0) -> torch.Tensor:
    table = net.layers[0].weights["value"].to(x.device)
    return torch.softmax(table[torch.floor(x * scale).long()], 2)


def test_a_launch_inside_compiling_ahead_runs_nothing():
    x = torch.randn(64, 33, device="cuda" if torch.cuda.is_available() else "cpu")
    relu = Network("relu")
    t = relu.add_input("t", torch.float32, (64, 33))
    relu.mark_output(relu.add_activation(t, L.ActivationType.RELU).get_output())
    layer = relu.layers[0]
    launcher = pointwise.compile_group([layer], layer.inputs, layer.outputs)
    with compiling_ahead() as queue:
        assert codegen.is_compiling_ahead()
        skipped = launcher([x])[0]
        launcher([x])  # the same compile: queued once
        assert len(queue.futures) == 1
        launcher([x[:, 1:]])  # another pointer alignment and sizes: another compile
        assert len(queue.futures) == 2
    assert not codegen.is_compiling_ahead()
    assert not torch.equal(skipped, torch.relu(x))
    assert torch.equal(launcher([x])[0], torch.relu(x))


def test_the_dry_run_feeds_no_step_garbage_and_leaves_inputs_and_weights_alone(caplog):
    net = lookup_network()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    plan = planner.make_plan(net, device, BackendOptions(timing_iterations=0))
    kinds = [plan.kernels[s.kernel].kind for s in plan.steps]
    assert "generated" in kinds and "aten" in kinds, kinds
    weights = place_weights(net, plan, device)
    kept = [w.clone() for ws in weights for w in ws.values()]
    bound = bind_steps(net, plan, weights, SymbolBinder.for_network(net), [(4, 16)], device, False)
    assert bound.compiles
    x = torch.rand(4, 16, device=device)
    given = x.clone()
    with caplog.at_level(logging.DEBUG, logger=runner.__name__):
        bound.compile_ahead([x])
    assert "dry run" not in caplog.text  # the gather read zeros, not uninitialized indices
    assert not bound.compiles
    assert torch.equal(x, given)
    assert all(torch.equal(w, k) for w, k in zip((w for ws in weights for w in ws.values()), kept))
    got = bound.run_eagerly([x])[0]
    ref = reference(net, x)
    assert (got - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (Triton compiles for it)")
def test_a_first_call_compiles_its_kernels_in_the_dry_runs_threads(monkeypatch):
    import triton

    scale = 15.0 + torch.rand(()).item() / 1000  # a kernel source no earlier test compiled in this process
    net = lookup_network(scale)
    device = torch.device("cuda")
    options = BackendOptions(timing_iterations=0)
    plan = planner.make_plan(net, device, options)
    compiled = []

    def note(*args, **kwargs):
        compiled.append(threading.current_thread().name)
        return False

    loaded = []  # each kernel loaded onto the GPU, its launcher made (a C compile per signature)

    def load(*args):
        loaded.append(threading.current_thread().name)

    monkeypatch.setattr(triton.knobs.runtime, "jit_post_compile_hook", note)
    triton.knobs.runtime.kernel_load_start_hook.add(load)
    try:
        x = torch.rand(4, 16, device=device)
        got = runner.CudaRunner(net, plan, device, options).run([x])[0]
    finally:
        triton.knobs.runtime.kernel_load_start_hook.remove(load)
    assert compiled and all(name.startswith("torchkiln-compile") for name in compiled), compiled
    assert loaded and all(name.startswith("torchkiln-compile") for name in loaded), loaded
    ref = reference(net, x, scale)
    assert (got - ref).abs().max().item() <= 1e-4 * ref.abs().max().item()
