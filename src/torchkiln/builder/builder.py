"""Network + build settings -> Engine."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch

from torchkiln.builder.pipeline import run_passes
from torchkiln.builder.settings import BuildSettings
from torchkiln.ir.network import Network
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.runtime.limits import check_network

logger = logging.getLogger("torchkiln.builder")


def build_engine(network: Network, bindings: Sequence[InputBinding], settings: BuildSettings,
                 name: str = "engine", plan: bool = True) -> Engine:
    """Optimize `network` in place with the builder pipeline, then wrap it as an Engine, planned for the
    settings' device unless `plan` is False (an engine only measured, never run by its backend)."""
    start = time.perf_counter()
    logger.info("building engine %s: %d layers", name, len(network.layers))
    fired = run_passes(network, settings)
    logger.info("built engine %s: %d layers in %.2fs; passes that changed it: %s", name, len(network.layers),
                time.perf_counter() - start, ", ".join(fired) or "none")
    engine = Engine(network, bindings, settings.device.type, settings.compute_dtype, name, settings.backend,
                    settings.backend_options)
    if plan:
        ship(engine, settings.device)
    return engine


def ship(engine: Engine, device: torch.device) -> None:
    """Check that loading the engine here would accept it (its layer count, and the memory and FLOPs it plans
    against the ceilings of `runtime/limits.py`: EngineFormatError naming the layer, now rather than at its first
    call), then plan it for `device` (on CUDA, its tactic timing happens now)."""
    budget = check_network(engine.network, device.type)
    logger.info("engine %s plans %.3g GiB at its peak and %.3g FLOPs per call (at its largest input shapes; "
                "ceilings %.3g GiB and %.3g FLOPs)", engine.name, budget.peak / 2 ** 30, budget.flops,
                budget.max_memory / 2 ** 30, budget.max_flops)
    made = engine.plan_for(device)
    if made is not None:
        logger.info("planned engine %s for %s: %s", engine.name, made.target.describe(),
                    ", ".join(f"{n} {kind} steps" for kind, n in made.summary().items()))
