"""The engine cache of one compile: a key per engine block, its engine loaded on a hit and stored after a build."""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchkiln.cache.key import block_key
from torchkiln.cache.weights import Unkeyable
from torchkiln.cache.store import EngineStore
from torchkiln.errors import EngineFormatError
from torchkiln.runtime.engine import Engine
from torchkiln.torchscript import Node, Value

logger = logging.getLogger("torchkiln.cache")


class EngineCache:
    """`reuse_cached_engines` and `cache_built_engines` of one compile, over the store in $TORCHKILN_CACHE_DIR."""

    def __init__(self, reuse: bool, store_built: bool, store: EngineStore | None = None) -> None:
        self.reuse = reuse
        self.store_built = store_built
        self.store = store if store is not None or not (reuse or store_built) else EngineStore()

    def key(self, nodes: Sequence[Node], inputs: Sequence[Value], outputs: Sequence[Value], order: Sequence[Node],
            metas: Mapping[int, Any], module: torch.nn.Module | None, settings: Any, build: Any,
            name: str) -> str | None:
        """The block's key; None when the cache is off or the block cannot be keyed (logged: it is built)."""
        if self.store is None:
            return None
        try:
            return block_key(nodes, inputs, outputs, order, metas, module, settings, build, name)
        except Unkeyable as e:
            logger.info("engine cache: engine %s is built, not cached: its key cannot describe %s", name, e)
            return None

    def load(self, key: str | None, name: str) -> tuple[Engine, list[list[str]]] | None:
        """The cached engine of `key` and the layers its calibration kept in fp32 ([layer, kind, node, reason]);
        None on a miss (a damaged entry is a logged miss, and deleted)."""
        if key is None or not self.reuse:
            return None
        found = self.store.get(key)
        if found is None:
            logger.info("engine cache miss for %s (key %s)", name, key[:12])
            return None
        header, data = found
        rows = header.get("fp32_layers", [])
        if not isinstance(rows, list) or not all(isinstance(r, list) and len(r) == 4 and
                                                 all(isinstance(f, str) for f in r) for r in rows):
            self.store.discard(key, "damaged header (fp32_layers)")
            return None
        try:
            engine = Engine.deserialize(data)
        except EngineFormatError as e:
            self.store.discard(key, f"damaged engine ({e})")
            return None
        logger.info("engine cache hit for %s (key %s): conversion and build skipped", name, key[:12])
        return engine, rows

    def save(self, key: str | None, engine: Engine, fp32_layers: Sequence[Sequence[str]]) -> None:
        """Store a built engine (with its planned targets) under `key`, when cache_built_engines is on."""
        if key is None or not self.store_built:
            return
        self.store.put(key, {"engine": engine.name, "fp32_layers": [list(row) for row in fp32_layers]},
                       engine.serialize())
        logger.info("engine cache: stored %s (key %s) in %s", engine.name, key[:12], self.store.directory)
