"""ONNX Runtime session settings chosen by measurement when an engine is planned, stored in its plan as the tactic
of its session kernels.

The candidates: the intra-op threads asked for or one thread (only where `ort_threads` is 0, "torch's threads"),
each with ORT's worker threads spinning while they wait for work or not. Each candidate runs the whole network on
random inputs of its static shapes, the candidates interleaved in rounds, several calls a round; the one with the
lowest median call time wins, the default (the threads asked for, spinning) on a tie within `MARGIN`. The choice
reflects the machine as it was when planned: on a machine other processes load, one thread that does not spin
often beats two, which wait on each other whenever one is preempted.

Not measured (the default kept): a network whose call takes under `MIN_CALL_S` (what the settings change is then
within the call overhead), dynamic shapes, and a network whose random inputs fail.
"""
from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import has_symbols

logger = logging.getLogger(__name__)

Tactic = tuple[tuple[str, bool], ...]
DEFAULT_SETTINGS: Tactic = ()  # the threads asked for, spinning
MIN_CALL_S = 1e-3
MARGIN = 0.03  # a candidate must beat the default's median by this share
BUDGET_S = 2.0  # about the time all candidates' calls take together
ROUNDS = (3, 7)  # fewest and most rounds


def candidates(threads_measured: bool) -> list[Tactic]:
    """The tactics measured, the default first: ("one_thread", True) runs one intra-op thread, ("spin", False)
    stops worker threads spinning."""
    spins = [(), (("spin", False),)]
    return spins + ([(("one_thread", True), *s) for s in spins] if threads_measured else [])


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


def choose_settings(network: Network, tactics: Sequence[Tactic], runner_for: Callable[[Tactic], object]) -> Tactic:
    """The tactic whose runner (`runner_for(tactic).run(inputs)`) has the lowest median call time on random
    inputs, or DEFAULT_SETTINGS where the network is not measured (module docstring)."""
    xs = random_inputs(network)
    if xs is None or len(tactics) < 2:
        return DEFAULT_SETTINGS
    try:
        runners = [runner_for(tactics[0])]
        first = _timed(runners[0], xs)  # also the warm-up
        if first < MIN_CALL_S:  # (the other candidates' sessions are then never made)
            return DEFAULT_SETTINGS
        for t in tactics[1:]:
            runners.append(runner_for(t))
            _timed(runners[-1], xs)
    except Exception as e:  # a network these inputs break (an index, a division) keeps the default
        logger.debug("network %s: session settings not measured: %s", network.name, e)
        return DEFAULT_SETTINGS
    calls = max(1, min(10, int(0.02 / first)))
    rounds = max(ROUNDS[0], min(ROUNDS[1], int(BUDGET_S / (first * calls * len(tactics)))))
    times: list[list[float]] = [[] for _ in tactics]
    for _ in range(rounds):
        for runner, ts in zip(runners, times):
            ts.extend(_timed(runner, xs) for _ in range(calls))
    medians = [statistics.median(ts) for ts in times]
    best = min(range(len(tactics)), key=medians.__getitem__)
    chosen = tactics[best] if medians[best] < medians[0] * (1 - MARGIN) else DEFAULT_SETTINGS
    logger.debug("network %s: session settings %s (median ms %s)", network.name, dict(chosen) or "default",
                 ", ".join(f"{dict(t) or 'default'}: {m * 1e3:.3f}" for t, m in zip(tactics, medians)))
    return chosen


def _timed(runner, xs: list[torch.Tensor]) -> float:
    start = time.perf_counter()
    runner.run(xs)
    return time.perf_counter() - start
