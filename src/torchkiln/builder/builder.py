"""Network + build settings -> Engine."""
from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from torchkiln.builder.passes import BUILD_PASSES
from torchkiln.builder.settings import BuildSettings
from torchkiln.network.network import Network
from torchkiln.runtime.engine import Engine, InputBinding

logger = logging.getLogger("torchkiln.builder")


def build_engine(network: Network, bindings: Sequence[InputBinding], settings: BuildSettings,
                 name: str = "engine") -> Engine:
    """Optimize `network` in place with every builder pass, then wrap it as an Engine."""
    start = time.perf_counter()
    logger.info("building engine %s: %d layers", name, len(network.layers))
    for _, pass_name, fn in BUILD_PASSES:
        before = len(network.layers)
        if fn(network, settings):
            logger.debug("builder pass %s: %d -> %d layers\n%s", pass_name, before, len(network.layers), network)
    logger.info("built engine %s: %d layers in %.2fs", name, len(network.layers), time.perf_counter() - start)
    return Engine(network, bindings, settings.device.type, settings.compute_dtype, name)
