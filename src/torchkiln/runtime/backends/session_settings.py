"""ONNX Runtime session settings chosen by measurement when an engine is planned, stored in its plan as the tactic
of its session kernels.

The candidates: the intra-op threads asked for or one thread (only where `ort_threads` is 0, "torch's threads"),
each with ORT's worker threads spinning while they wait for work or not; and, for a network that multiplies feature
maps by channel gates (squeeze-excitation), the graph with the gates at full size (full_gates.py). The tactic stores
no number of threads: the default runs the threads asked for where the engine runs (`ort_threads`, or torch's threads
there), so a plan made on a 2-core machine runs 16 threads on a 16-core one.

The rule, meant to give the same choice whether the build machine is quiet or loaded (the choice should be the
quiet machine's winner, what a deployment on a dedicated server gets):
1. Each candidate runs the whole network on random inputs of its static shapes, the candidates interleaved in
   rounds (the order rotated each round), several calls a round, after a rest of `SETTLE_S` for the worker threads
   of what ran just before (torch's OpenMP, the warm-up sessions) to stop spinning.
2. A candidate's time is its fastest call: other processes' load only adds time, so the fastest call estimates
   the quiet machine where load comes and goes.
3. The fastest candidate wins only where its fastest call is `MARGIN` below the default's (the threads asked for,
   spinning); otherwise the default.
4. Where other processes used more than `LOADED` of the machine's CPU time while the candidates ran, the default
   is kept: under steady load a call longer than the gaps in it never runs undisturbed, and the fastest calls then
   favour one thread that does not spin (measured on 2 cores with two busy-loop processes: a RegNet-style CNN
   whose call takes 7.8 ms quiet, default 15.9 ms fastest call, non-spinning 10.7; a token-mixing MLP network whose
   call takes 15.5 ms quiet, one thread 23.9 against the default's 31.5).
5. A candidate that wins is timed again against the default alone, in rounds of their own, and taken only if it
   wins again. On a noisy 2-core AVX2 VM, 8 builds of a small mobile CNN at batch 1 right after an ONNX export (as
   the bench builds) chose one thread 4 times without the rest and this check, and never with them; one thread
   then ran 1.90 ms a call against the default's 1.48 (medians, interleaved).
On a quiet 2-core x86 machine (2 threads asked for) the default won by its fastest calls in 19 of the 20 cases of 10
CPU zoo models at batch 1 and 8 (calls of 0.4-18 ms: one thread took 1.48-1.92x as long, non-spinning threads
1.01-1.78x), so a build there keeps the default quiet or loaded. One thread won only in calls under `MIN_CALL_S`:
a 4-layer MLP of 1 MFLOP (14 against 16 us; a tie at 8 MFLOP, two threads ahead from 17) and a small mobile CNN
of about 0.5 ms a call (0.28 against 0.45 ms).

Not measured (the default kept): a network whose fastest warm-up call takes under `MIN_CALL_S` (what the settings
change is then within the call overhead), dynamic shapes, a network whose random inputs fail, and one holding a loop
whose iterations its data decides (a while loop: on random inputs it may run until its `max_trips` guard; a
halving loop of four values ran 34 s a call that way, one call of a 107 s build).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.shape_only import decided_by_shapes
from torchkiln.ir.symbolic import has_symbols
from torchkiln.runtime.cpu_load import LOADED, LoadMeter

logger = logging.getLogger(__name__)

Tactic = tuple[tuple[str, bool], ...]
DEFAULT_SETTINGS: Tactic = ()  # the threads asked for, spinning
MIN_CALL_S = 1e-3
MARGIN = 0.05  # a candidate's fastest call must beat the default's by this share
BUDGET_S = 2.0  # about the time all candidates' calls take together
ROUNDS = (3, 7)  # fewest and most rounds
WARMUP = 3  # untimed calls of each candidate; the fastest of the default's decides whether to measure
SETTLE_S = 0.05  # rest before timing, for spinning worker threads to go idle (as the bench's interleaving rests)


def candidates(threads_measured: bool, gates: bool = False) -> list[Tactic]:
    """The tactics measured, the default first: ("one_thread", True) runs one intra-op thread, ("spin", False)
    stops worker threads spinning; where `gates`, ("full_gates", True) gives ORT the graph with its channel gates at
    full size (full_gates.py), with the default settings otherwise."""
    spins = [(), (("spin", False),)]
    return spins + ([(("one_thread", True), *s) for s in spins] if threads_measured else []) + \
        ([(("full_gates", True),)] if gates else [])


def random_inputs(network: Network) -> list[torch.Tensor] | None:
    """Inputs of the network's static shapes: normal floats, zero integers (valid indices), true bools; None where
    a shape is dynamic."""
    xs = []
    for t in network.inputs:
        if has_symbols(t.shape):
            return None
        if t.dtype.is_floating_point:
            xs.append(torch.randn(t.shape, generator=torch.Generator().manual_seed(0)).to(t.dtype))
        elif t.dtype == torch.bool:
            xs.append(torch.ones(t.shape, dtype=torch.bool))
        else:
            xs.append(torch.zeros(t.shape, dtype=t.dtype))
    return xs


def data_bound_loop(network: Network) -> bool:
    """Whether `network` (or a sub-network of one of its layers) holds a loop whose trip count or condition its data
    decides, so that random inputs say nothing of how long a call takes."""
    decided = decided_by_shapes(network)
    return any(isinstance(layer, L.LoopLayer) and j not in decided or
               any(data_bound_loop(getattr(layer, name)) for name in layer.SUBNETWORKS)
               for j, layer in enumerate(network.layers))


def choose_settings(network: Network, tactics: Sequence[Tactic], runner_for: Callable[[Tactic], object]) -> Tactic:
    """The tactic `quiet_winner` picks from interleaved timings of each runner (`runner_for(tactic).run(inputs)`)
    on random inputs, or DEFAULT_SETTINGS where the network is not measured (module docstring)."""
    xs = random_inputs(network)
    if xs is None or len(tactics) < 2 or data_bound_loop(network):
        return DEFAULT_SETTINGS
    try:
        runners = [runner_for(tactics[0])]
        first = min(_timed(runners[0], xs) for _ in range(WARMUP))
        if first < MIN_CALL_S:  # (the other candidates' sessions are then never made)
            return DEFAULT_SETTINGS
        for t in tactics[1:]:
            runners.append(runner_for(t))
            for _ in range(WARMUP):
                _timed(runners[-1], xs)
    except Exception as e:  # a network these inputs break (an index, a division) keeps the default
        logger.debug("network %s: session settings not measured: %s", network.name, e)
        return DEFAULT_SETTINGS
    calls = max(1, min(10, int(0.02 / first)))
    rounds = max(ROUNDS[0], min(ROUNDS[1], int(BUDGET_S / (first * calls * len(tactics)))))
    times, other_load = _interleaved(runners, xs, calls, rounds)
    chosen = quiet_winner(tactics, times, other_load)
    _log(network, "session settings", chosen, tactics, times, other_load)
    if chosen != DEFAULT_SETTINGS:  # confirmed against the default in rounds of their own, or not taken
        pair = [DEFAULT_SETTINGS, chosen]
        times, other_load = _interleaved([runners[0], runners[tactics.index(chosen)]], xs, calls, rounds)
        chosen = quiet_winner(pair, times, other_load)
        _log(network, "confirmed", chosen, pair, times, other_load)
    return chosen


def _interleaved(runners: Sequence[object], xs: list[torch.Tensor], calls: int, rounds: int
                 ) -> tuple[list[list[float]], float]:
    """Each runner's call times over `rounds` rounds of `calls` calls each, the order rotated every round, after
    SETTLE_S seconds' rest (the worker threads of torch's OpenMP and of the sessions just run stop spinning); and
    the share of the machine's CPU time other processes used meanwhile."""
    time.sleep(SETTLE_S)
    times: list[list[float]] = [[] for _ in runners]
    meter = LoadMeter().start()
    for r in range(rounds):
        for k in [*range(r % len(runners), len(runners)), *range(r % len(runners))]:
            times[k].extend(_timed(runners[k], xs) for _ in range(calls))
    return times, meter.stop()


def _log(network: Network, what: str, chosen: Tactic, tactics: Sequence[Tactic], times: Sequence[Sequence[float]],
         other_load: float) -> None:
    logger.debug("network %s: %s %s (other processes' load %.0f%%; fastest call ms %s)", network.name, what,
                 dict(chosen) or "default", 100 * other_load,
                 ", ".join(f"{dict(t) or 'default'}: {min(ts) * 1e3:.3f}" for t, ts in zip(tactics, times)))


def quiet_winner(tactics: Sequence[Tactic], times: Sequence[Sequence[float]], other_load: float) -> Tactic:
    """The tactic whose fastest call (`times`: each tactic's call times, the default's first) beats the default's
    by MARGIN, the fastest such; DEFAULT_SETTINGS where none does, or where other processes used more than
    LOADED of the machine's CPU time while they were timed (module docstring)."""
    if other_load > LOADED:
        return DEFAULT_SETTINGS
    fastest = [min(ts) for ts in times]
    best = min(range(len(tactics)), key=fastest.__getitem__)
    return tactics[best] if fastest[best] < fastest[0] * (1 - MARGIN) else DEFAULT_SETTINGS


def _timed(runner, xs: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    runner.run(xs)
    return time.perf_counter() - start
