"""The first level of the cache: a whole compiled module, stored by `module_key` and reused (loaded instead of
compiled) when the Python code it was compiled with is unchanged (`sources`)."""
from __future__ import annotations

import logging
from typing import Any

import torch

from torchkiln.cache import sources
from torchkiln.cache.module_key import module_key
from torchkiln.cache.store import EngineStore
from torchkiln.cache.weights import Unkeyable

logger = logging.getLogger("torchkiln.cache")


class ModuleCache:
    """`reuse_cached_engines` and `cache_built_engines` of one compile, for the whole module."""

    def __init__(self, reuse: bool, store_built: bool, store: EngineStore | None = None) -> None:
        self.reuse = reuse
        self.store_built = store_built
        self.store = store if store is not None or not (reuse or store_built) else EngineStore(suffix=".module")
        self.at_start = sources.loaded() if self.store is not None else frozenset()

    def key(self, module: torch.nn.Module, settings: Any, name: str) -> str | None:
        """The module's key; None when the cache is off or the module cannot be keyed (logged: it is compiled,
        and its engines still use the engine cache)."""
        if self.store is None:
            return None
        try:
            return module_key(module, settings)
        except Unkeyable as e:
            logger.info("module cache: %s is compiled, not cached whole: its key cannot describe %s", name, e)
            return None

    def load(self, key: str | None, name: str) -> tuple[bytes, dict[str, Any]] | None:
        """The saved module of `key` and its entry's header; None on a miss (logged with why)."""
        if key is None or not self.reuse:
            return None
        found = self.store.get(key)
        if found is None:
            logger.info("module cache miss for %s (key %s)", name, key[:12])
            return None
        header, data = found
        why = sources.mismatch(header.get("sources"), self.at_start)
        if why is not None:
            logger.info("module cache miss for %s (key %s): %s", name, key[:12], why)
            return None
        return data, header

    def save(self, key: str | None, name: str, data: bytes, report: dict[str, Any]) -> None:
        """Store a saved compiled module and its partition report under `key`, when cache_built_engines is on."""
        if key is None or not self.store_built:
            return
        self.store.put(key, {"module": name, "report": report, "sources": sources.record(self.at_start)}, data)
        logger.info("module cache: stored %s (key %s) in %s", name, key[:12], self.store.directory)
