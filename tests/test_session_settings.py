"""ONNX Runtime session settings measured when an engine is planned (runtime/backends/session_settings.py): the
choice is the plan's tactic, the sessions run with it, and it survives the engine's bytes. No timing is asserted:
which candidate wins depends on the machine's load."""
import pytest
import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.backends import BackendOptions, make_plan, session_settings
from torchkiln.runtime.engine import Engine, InputBinding

pytest.importorskip("onnxruntime")
CPU = torch.device("cpu")


def _mlp() -> Network:
    torch.manual_seed(0)
    net = Network("mlp")
    y = net.add_input("x", torch.float32, (16, 32))
    for _ in range(3):
        y = net.add_matrix_multiply(y, L.MatrixOperation.NONE, net.add_constant(torch.randn(32, 32) / 6).get_output(),
                                    L.MatrixOperation.NONE).get_output()
        y = net.add_activation(y, L.ActivationType.RELU).get_output()
    net.mark_output(y)
    return net


def _measured(monkeypatch) -> None:
    """Measure networks however fast, in little time (the defaults skip calls under a millisecond)."""
    monkeypatch.setattr(session_settings, "MIN_CALL_S", 0.0)
    monkeypatch.setattr(session_settings, "BUDGET_S", 0.02)


def _sessions(engine: Engine) -> list:
    return [step.session for step, _, _ in engine.runner(CPU).steps if hasattr(step, "session")]


def test_the_measured_settings_are_the_plans_tactic_and_the_sessions_run_with_them(monkeypatch):
    _measured(monkeypatch)
    net = _mlp()
    plan = make_plan("onnxruntime", net, CPU, BackendOptions())
    (session_kernel,) = [k for k in plan.kernels if k.kind == "session"]
    assert session_kernel.tactic in session_settings.candidates(torch.get_num_threads() > 1)
    engine = Engine(net, [InputBinding("x", torch.float32, (16, 32), (16, 32), (16, 32))], "cpu", torch.float32,
                    "mlp", "onnxruntime", plans=[plan])
    again = Engine.deserialize(engine.serialize())
    assert again.plans[0].kernels == plan.kernels
    (options,) = [s.get_session_options() for s in _sessions(again)]
    threads = 1 if session_kernel.option("one_thread") else torch.get_num_threads()
    assert options.intra_op_num_threads == threads
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == \
        ("1" if session_kernel.option("spin", True) else "0")
    x = torch.randn(16, 32)
    ref = x
    for layer in net.layers:
        if isinstance(layer, L.MatrixMultiplyLayer):
            ref = ref @ L.constant_value(layer.inputs[1])
        elif isinstance(layer, L.ActivationLayer):
            ref = torch.relu(ref)
    torch.testing.assert_close(again.execute([x])[0], ref, rtol=0, atol=1e-4 * float(ref.abs().max()))


def test_explicit_threads_are_kept_and_no_timing_keeps_the_default(monkeypatch):
    """ort_threads set: only spinning is measured; num_avg_timing_iters=0: nothing is (the default settings)."""
    _measured(monkeypatch)
    net = _mlp()
    explicit = make_plan("onnxruntime", net, CPU, BackendOptions(ort_threads=1))
    assert not dict(explicit.kernels[0].tactic).get("one_thread")
    untimed = make_plan("onnxruntime", net, CPU, BackendOptions(timing_iterations=0))
    assert untimed.kernels[0].tactic == session_settings.DEFAULT_SETTINGS


def test_a_network_faster_than_a_millisecond_is_not_measured():
    assert make_plan("onnxruntime", _mlp(), CPU, BackendOptions()).kernels[0].tactic == session_settings.DEFAULT_SETTINGS
