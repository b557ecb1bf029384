"""Which of several engines built for one block is fastest on the block's own inputs: the timed choice behind the
bfloat16 tactic (builder/bfloat16_tactic.py) and the quantized-or-float choice (compiler's `_quantized_or_float`)."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from torchkiln.runtime.engine import Engine

logger = logging.getLogger(__name__)

ROUNDS = 5  # timed calls of an engine in a row, after two that warm it; the fastest is its time


def faster_engine(engines: Sequence[Engine], inputs: Sequence[torch.Tensor], labels: Sequence[str]) -> int:
    """The index of the engine whose fastest call on `inputs` is the fastest (logged with `labels`, one per engine).
    Each engine's calls run in a row, and the engines are timed forwards then backwards (a load that changes
    meanwhile weighs on both): interleaving single calls would time each engine against the other's still-spinning
    worker threads (ONNX Runtime's pool, OpenMP's), which a compiled module never runs beside. On a GPU each call
    is waited for, so it is timed whole."""
    fastest = [float("inf")] * len(engines)
    order = [*range(len(engines)), *reversed(range(len(engines)))]
    gpu = any(x.is_cuda for x in inputs)
    with torch.no_grad():
        for k in order:
            for call in range(2 + ROUNDS):
                start = time.perf_counter()
                engines[k].execute(list(inputs))
                if gpu:
                    torch.cuda.synchronize()
                if call >= 2:
                    fastest[k] = min(fastest[k], time.perf_counter() - start)
    best = min(range(len(engines)), key=fastest.__getitem__)
    logger.info("engine %s: %s", engines[0].name, ", ".join(
        f"{label} {t * 1e3:.3f} ms" + (" (kept)" if k == best else "")
        for k, (label, t) in enumerate(zip(labels, fastest))))
    return best
