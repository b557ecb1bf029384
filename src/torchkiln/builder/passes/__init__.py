"""Builder passes: each is `fn(network, settings) -> bool`, rewrites the network in place and says if it
changed it. The order they run in is `torchkiln.builder.pipeline.BUILD_PIPELINE`."""
from __future__ import annotations

from collections.abc import Callable

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir.network import Network

BuildPass = Callable[[Network, BuildSettings], bool]
