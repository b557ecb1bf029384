"""The first level of the cache: a whole compiled module, stored by `module_key` and reused (loaded instead of
compiled) when the Python code it was compiled with is unchanged (`sources`).

An entry holds the module's TorchScript archive without its engines' bytes, then each engine's bytes
(`stitching.engines_apart`), read straight into the tensors the module holds; the header records their lengths and
CRC-32s, so a damaged entry is a miss (the engine's own SHA-256 is checked when it is first run)."""
from __future__ import annotations

import logging
import mmap
import os
import re
import zlib
from collections.abc import Mapping
from typing import Any, BinaryIO

import torch

from torchkiln.cache import sources
from torchkiln.cache.module_key import module_key
from torchkiln.cache.store import EngineStore
from torchkiln.cache.weights import Unkeyable
from torchkiln.runtime.backends.base import SessionModels

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

    def load(self, key: str | None, name: str) -> tuple[bytes, dict[str, torch.Tensor], dict[str, SessionModels],
                                                       dict[str, Any]] | None:
        """The saved module of `key` (its archive, engines and their sessions' ONNX models) and its entry's header;
        None on a miss (logged with why)."""
        if key is None or not self.reuse:
            return None

        def read(header: dict, f: BinaryIO) -> tuple[bytes, dict[str, torch.Tensor], dict[str, SessionModels]] | None:
            why = sources.mismatch(header.get("sources"), self.at_start)
            if why is not None:
                logger.info("module cache miss for %s (key %s): %s", name, key[:12], why)
                return None
            return _read_parts(header, f)

        found = self.store.get(key, read)
        if found is None:
            logger.info("module cache miss for %s (key %s)", name, key[:12])
            return None
        header, parts = found
        return None if parts is None else (*parts, header)

    def save(self, key: str | None, name: str, archive: bytes, blobs: Mapping[str, torch.Tensor],
             report: dict[str, Any], sessions: Mapping[str, SessionModels]) -> None:
        """Store a compiled module (its archive and engines, `engines_apart.save_apart`, with the ONNX models of an
        engine's sessions where `sessions` has them) and its partition report under `key`, when cache_built_engines
        is on."""
        if key is None or not self.store_built:
            return
        data = [memoryview(blob.detach().cpu().contiguous().numpy()) for blob in blobs.values()]
        engines = [[attr, d.nbytes, zlib.crc32(d)] for attr, d in zip(blobs, data)]
        models = [(attr, s, [memoryview(m) for m in s.models]) for attr, s in sessions.items()]
        header = {"module": name, "report": report, "sources": sources.record(self.at_start), "archive": len(archive),
                  "engines": engines,
                  "sessions": [[attr, s.engine_digest.hex(), s.ort_version, [[m.nbytes, zlib.crc32(m)] for m in ms]]
                               for attr, s, ms in models]}
        self.store.put(key, header, archive, *data, *(m for _, _, ms in models for m in ms))
        logger.info("module cache: stored %s (key %s) in %s", name, key[:12], self.store.directory)


def _sizes(e: Any) -> bool:
    """Whether `e` is a list of non-negative ints."""
    return isinstance(e, list) and all(isinstance(n, int) and n >= 0 for n in e)


def _read_parts(header: dict, f: BinaryIO) -> tuple[bytes, dict[str, torch.Tensor], dict[str, SessionModels]]:
    """An entry's archive, engines (uint8 tensors over a private map of the file, or read into new tensors where
    it cannot be mapped) and their sessions' ONNX models (views of the same map); ValueError if they are not as its
    header records."""
    size, engines, sessions = header.get("archive"), header.get("engines"), header.get("sessions", [])
    if not isinstance(size, int) or not isinstance(engines, list) or not all(
            isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and _sizes(e[1:]) for e in engines):
        raise ValueError("no layout of its module")
    if not isinstance(sessions, list) or not all(
            isinstance(s, list) and len(s) == 4 and isinstance(s[0], str) and isinstance(s[1], str)
            and re.fullmatch(r"[0-9a-f]{64}", s[1]) and isinstance(s[2], str) and isinstance(s[3], list)
            and all(_sizes(m) and len(m) == 2 for m in s[3]) for s in sessions):
        raise ValueError("no layout of its sessions' ONNX models")
    models = sum(n for s in sessions for n, _ in s[3])
    if size < 0 or size + sum(n for _, n, _ in engines) + models != os.fstat(f.fileno()).st_size - f.tell():
        raise ValueError("truncated or padded")
    archive = f.read(size)
    start, mapped = f.tell(), _mapped(f)
    blobs = {}
    for attr, n, crc in engines:
        with torch.inference_mode(False):  # a normal tensor, as `engine_blob` makes
            if mapped is None or n == 0:
                blob = torch.empty(n, dtype=torch.uint8)
                f.readinto(blob.numpy())
            else:
                blob = torch.frombuffer(mapped, dtype=torch.uint8, offset=start, count=n)
        if zlib.crc32(blob.numpy()) != crc:
            raise ValueError(f"engine {attr} is not the bytes stored (CRC-32)")
        blobs[attr] = blob
        start += n
    found = {}
    for attr, digest, version, parts in sessions:
        views = []
        for n, crc in parts:
            view = memoryview(mapped)[start:start + n] if mapped is not None else memoryview(f.read(n))
            if zlib.crc32(view) != crc:
                raise ValueError(f"an ONNX model of engine {attr} is not the bytes stored (CRC-32)")
            views.append(view)
            start += n
        found[attr] = SessionModels(bytes.fromhex(digest), version, tuple(views))
    return archive, blobs, found


def _mapped(f: BinaryIO) -> mmap.mmap | None:
    """A copy-on-write map of the whole file (the tensors over it hold it): the engines' pages are the page cache's,
    never zeroed and copied (a 14 MB engine: 2 ms with its CRC-32, 8 ms read into a new tensor). The store replaces
    and deletes entries, never writes into one, so the map keeps the bytes it was made of. None where the file
    cannot be mapped."""
    try:
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError):
        return None
