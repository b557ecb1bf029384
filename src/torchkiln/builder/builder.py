"""Network + build settings -> Engine."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from torchkiln.builder.pipeline import run_passes
from torchkiln.builder.settings import BuildSettings
from torchkiln.ir.network import Network
from torchkiln.runtime.engine import Engine, InputBinding

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
        made = engine.plan_for(settings.device)  # the target's choices (on CUDA, its tactic timing) happen now
        if made is not None:
            logger.info("planned engine %s for %s: %s", name, made.target.describe(),
                        ", ".join(f"{n} {kind} steps" for kind, n in made.summary().items()))
    return engine
