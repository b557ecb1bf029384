"""ONNX Runtime session settings measured when an engine is planned (runtime/backends/session_settings.py): the
choice is the plan's tactic, the sessions run with it, and it survives the engine's bytes; the choice from timings
sees through load (scripted timings); a loaded engine runs the threads asked for where it runs. No timing is
asserted: which candidate wins on this machine depends on it."""
import statistics
import time

import pytest
import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.backends import BackendOptions, make_plan, session_settings
from torchkiln.runtime.engine import Engine, InputBinding, usable_cores

pytest.importorskip("onnxruntime")
CPU = torch.device("cpu")


def _mlp(rows: int = 16, width: int = 32) -> Network:
    torch.manual_seed(0)
    net = Network("mlp")
    y = net.add_input("x", torch.float32, (rows, width))
    for _ in range(3):
        weight = torch.randn(width, width) / width ** 0.5
        y = net.add_matrix_multiply(y, L.MatrixOperation.NONE, net.add_constant(weight).get_output(),
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
    plan = make_plan("onnxruntime", _mlp(), CPU, BackendOptions())
    assert plan.kernels[0].tactic == session_settings.DEFAULT_SETTINGS


ONE_THREAD = (("one_thread", True),)
NO_SPIN = (("spin", False),)


def test_the_fastest_calls_decide_so_load_spikes_do_not_pick_one_thread():
    """The default's calls hit by load (9 ms where it takes 2 quiet) give it the worst median, but its fastest call
    is the quiet machine's: it stays."""
    ms = 1e-3
    default = [2.0 * ms, 9.0 * ms, 8.5 * ms, 2.1 * ms, 7.5 * ms, 9.5 * ms, 2.05 * ms]
    no_spin = [2.6 * ms, 2.7 * ms, 5.0 * ms, 2.65 * ms, 2.6 * ms, 6.0 * ms, 2.7 * ms]
    one_thread = [3.6 * ms, 3.5 * ms, 3.7 * ms, 3.55 * ms, 3.6 * ms, 3.65 * ms, 3.5 * ms]
    times = [default, no_spin, one_thread]
    assert statistics.median(no_spin) < statistics.median(one_thread) < statistics.median(default)  # medians: not it
    tactics = [session_settings.DEFAULT_SETTINGS, NO_SPIN, ONE_THREAD]
    assert session_settings.quiet_winner(tactics, times, other_load=0.0) == session_settings.DEFAULT_SETTINGS


def test_a_candidate_faster_by_the_margin_wins_unless_the_machine_was_loaded():
    tactics = [session_settings.DEFAULT_SETTINGS, ONE_THREAD]
    faster = [[2.0e-3, 2.2e-3, 2.1e-3], [1.0e-3, 1.3e-3, 1.1e-3]]
    assert session_settings.quiet_winner(tactics, faster, other_load=0.0) == ONE_THREAD
    within_margin = [[2.0e-3, 2.2e-3], [(1 - session_settings.MARGIN / 2) * 2.0e-3, 2.1e-3]]
    assert session_settings.quiet_winner(tactics, within_margin, other_load=0.0) == session_settings.DEFAULT_SETTINGS
    assert session_settings.quiet_winner(tactics, faster, other_load=0.5) == session_settings.DEFAULT_SETTINGS


class _Scripted:
    """A runner whose calls take the given seconds in turn (sleeping, so no CPU load of its own)."""

    def __init__(self, seconds: list[float]) -> None:
        self.seconds, self.calls = seconds, 0

    def run(self, xs) -> None:
        time.sleep(self.seconds[self.calls % len(self.seconds)])
        self.calls += 1


def test_choose_settings_keeps_the_default_whose_calls_load_slowed(monkeypatch):
    """A build while other processes load the machine: every other call of the default (2 ms quiet) takes 12 ms,
    one thread takes 3.5 ms throughout. The quiet machine's winner, the default, is kept."""
    monkeypatch.setattr(session_settings, "BUDGET_S", 0.05)
    scripts = {session_settings.DEFAULT_SETTINGS: [2e-3, 12e-3], ONE_THREAD: [3.5e-3]}
    chosen = session_settings.choose_settings(_mlp(), list(scripts), lambda tactic: _Scripted(scripts[tactic]))
    assert chosen == session_settings.DEFAULT_SETTINGS


def test_a_candidate_that_wins_is_timed_again_against_the_default(monkeypatch):
    """One thread wins the first rounds (1 ms against the default's 2): it is timed again against the default alone,
    and taken only if it wins those rounds too."""
    ms = 1e-3
    for again, kept in (([[2 * ms] * 5, [3 * ms] * 5], session_settings.DEFAULT_SETTINGS),
                        ([[2 * ms] * 5, [1 * ms] * 5], ONE_THREAD)):
        phases = iter([([[2 * ms] * 5, [1 * ms] * 5], 0.0), (again, 0.0)])
        timed = []
        monkeypatch.setattr(session_settings, "_interleaved",
                            lambda runners, xs, calls, rounds: timed.append(len(runners)) or next(phases))
        scripts = {session_settings.DEFAULT_SETTINGS: [2 * ms], ONE_THREAD: [1 * ms]}
        chosen = session_settings.choose_settings(_mlp(), list(scripts), lambda tactic: _Scripted(scripts[tactic]))
        assert chosen == kept and timed == [2, 2]


def test_a_plan_is_the_same_when_made_twice(monkeypatch):
    _measured(monkeypatch)
    net = _mlp(64, 512)
    first = make_plan("onnxruntime", net, CPU, BackendOptions())
    assert make_plan("onnxruntime", net, CPU, BackendOptions()).kernels == first.kernels


def test_a_loaded_engine_runs_the_threads_asked_for_where_it_runs(monkeypatch):
    """The default tactic stores no number of threads: an engine planned with torch's 2 threads runs torch's
    threads where it is loaded, and one asking for `ort_threads` runs those (at most one per usable core)."""
    threads = torch.get_num_threads()
    net = _mlp()
    binding = [InputBinding("x", torch.float32, (16, 32), (16, 32), (16, 32))]
    try:
        torch.set_num_threads(2)
        plan = make_plan("onnxruntime", net, CPU, BackendOptions(timing_iterations=0))
        blob = Engine(net, binding, "cpu", torch.float32, "mlp", "onnxruntime", plans=[plan]).serialize()
        pinned = Engine(net, binding, "cpu", torch.float32, "mlp", "onnxruntime", BackendOptions(ort_threads=2),
                        plans=[make_plan("onnxruntime", net, CPU, BackendOptions(ort_threads=2))]).serialize()
        for here in (1, 3):
            torch.set_num_threads(here)
            (options,) = [s.get_session_options() for s in _sessions(Engine.deserialize(blob))]
            assert options.intra_op_num_threads == here
            (options,) = [s.get_session_options() for s in _sessions(Engine.deserialize(pinned))]
            assert options.intra_op_num_threads == min(2, usable_cores())
    finally:
        torch.set_num_threads(threads)


def test_a_network_whose_loop_runs_as_its_data_says_is_not_measured():
    """A while loop's iterations depend on its data: on random inputs it may run until its max_trips guard, so the
    settings are not timed (no session is even made for them) and the default is kept. A for loop of a fixed count
    is measured as any network."""
    import torchkiln
    from harness import LongFor, WhileLoop, sole_engine

    def network(module, *inputs):  # example inputs the loops end on (random ones may not end a while loop)
        compiled = torchkiln.compile(module.eval(), inputs=list(inputs), backend="reference", min_block_size=1)
        return sole_engine(compiled).network

    def never(tactic):
        raise AssertionError("a session was made to time the settings")

    while_net = network(WhileLoop(), torch.randn(4) * 8, torch.full((4,), 0.01))
    assert any(isinstance(layer, L.LoopLayer) for layer in while_net.layers)
    assert session_settings.data_bound_loop(while_net)
    tactics = session_settings.candidates(True)
    assert session_settings.choose_settings(while_net, tactics, never) == session_settings.DEFAULT_SETTINGS
    for_net = network(LongFor(), torch.randn(2, 5), torch.randn(2, 5) * 0.1)
    assert any(isinstance(layer, L.LoopLayer) for layer in for_net.layers)
    assert not session_settings.data_bound_loop(for_net) and not session_settings.data_bound_loop(_mlp())
