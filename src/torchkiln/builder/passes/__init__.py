"""Builder passes: each takes (network, settings), rewrites the network in place and says if it changed it.

Passes run in the order of BUILD_PASSES; adding one is a decorated function in a module here.
"""
from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable

from torchkiln.builder.settings import BuildSettings
from torchkiln.network.network import Network

BuildPass = Callable[[Network, BuildSettings], bool]
BUILD_PASSES: list[tuple[int, str, BuildPass]] = []


def build_pass(order: int) -> Callable[[BuildPass], BuildPass]:
    """Register a builder pass; lower `order` runs first."""
    def register(fn: BuildPass) -> BuildPass:
        BUILD_PASSES.append((order, fn.__name__, fn))
        BUILD_PASSES.sort(key=lambda p: p[0])
        return fn

    return register


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
