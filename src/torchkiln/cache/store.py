"""The engine cache on disk: one file per key, written atomically, capped in size, least recently used out first."""
from __future__ import annotations

import json
import logging
import os
import pathlib
import re
import struct
import tempfile
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from torchkiln.runtime.backends.cuda.cache import cache_dir

logger = logging.getLogger("torchkiln.cache")

DEFAULT_MAX_BYTES = 5 * 2 ** 30
MAGIC = b"TKCACHE1"
_HEADER = struct.Struct("<8sI")  # magic, length of the JSON header that follows
MAX_HEADER = 16 << 20  # a module's entry records the Python modules it was compiled with (`sources`)
STALE_SECONDS = 3600  # a temporary file this old was left by a writer that died: eviction deletes it
SUFFIXES = (".engine", ".module")  # an engine; a whole compiled module (one folder and one size cap for both)
_KEY = re.compile(r"[0-9a-f]{64}")
_UNITS = {"": 1, "k": 2 ** 10, "m": 2 ** 20, "g": 2 ** 30, "t": 2 ** 40}


def engines_dir() -> pathlib.Path:
    """`engines/` in torchkiln's cache folder: $TORCHKILN_CACHE_DIR, by default ~/.cache/torchkiln."""
    return cache_dir() / "engines"


def max_bytes() -> int:
    """The size cap: $TORCHKILN_CACHE_SIZE in bytes, or with a K, M, G or T suffix (powers of 1024); 5G by default."""
    text = os.environ.get("TORCHKILN_CACHE_SIZE", "").strip()
    if not text:
        return DEFAULT_MAX_BYTES
    found = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?", text.lower())
    if not found:
        raise ValueError(f"TORCHKILN_CACHE_SIZE must be a size such as 5G, 500M or 1048576 (bytes), got {text!r}")
    return int(float(found.group(1)) * _UNITS[found.group(2)])


class EngineStore:
    """Entries of a directory: the header (a JSON object) and the bytes of one key each, an engine's (files
    `<key>.engine`) or with `suffix=".module"` a compiled module's; eviction counts both.

    Writes go to a temporary file in the directory renamed over the entry, so a reader sees a whole entry or
    none. A read refreshes the entry's modification time, which eviction orders by (oldest first)."""

    def __init__(self, directory: pathlib.Path | None = None, limit: int | None = None,
                 suffix: str = ".engine") -> None:
        if suffix not in SUFFIXES:
            raise ValueError(f"suffix must be one of {SUFFIXES}, got {suffix!r}")
        self.directory = directory if directory is not None else engines_dir()
        self.limit = limit if limit is not None else max_bytes()
        self.suffix = suffix

    def path(self, key: str) -> pathlib.Path:
        if not _KEY.fullmatch(key):
            raise ValueError(f"engine cache key must be 64 hex digits, got {key!r}")
        return self.directory / f"{key}{self.suffix}"

    def get(self, key: str, payload: Callable[[dict, BinaryIO], Any] = lambda header, f: f.read()
            ) -> tuple[dict, Any] | None:
        """The header stored for `key` and what `payload(header, file)` reads of the rest (by default the bytes, in
        one read, never copied after); None if there is none or it is damaged (the damaged entry is logged and
        deleted). `payload` raises ValueError for damage. The engine bytes are checked by whoever loads them."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                header = _read_header(f)
                if header.get("key") != key:
                    raise ValueError(f"it holds the entry of key {str(header.get('key'))[:12]!r}")
                data = payload(header, f)
        except FileNotFoundError:
            return None
        except OSError as e:
            logger.warning("engine cache: cannot read %s (%s); building the engine", path, e)
            return None
        except ValueError as e:
            self.discard(key, f"damaged entry ({e})")
            return None
        try:
            os.utime(path)
        except OSError:  # evicted or replaced meanwhile: the bytes read are still a whole entry
            pass
        return header, data

    def put(self, key: str, header: dict, *data: bytes | memoryview) -> None:
        """Store an entry (the header, then `data` one after the other) atomically, then evict the least recently
        used entries over the size cap. A cache that cannot be written is logged, never an error of the build."""
        path = self.path(key)
        text = json.dumps(dict(header, key=key), sort_keys=True).encode()
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:12]}.", suffix=".tmp", dir=self.directory)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(_HEADER.pack(MAGIC, len(text)) + text)
                    for part in data:
                        f.write(part)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError as e:
            logger.warning("engine cache: cannot write %s (%s); the engine is built but not cached", path, e)
            return
        self.evict()

    def discard(self, key: str, reason: str) -> None:
        """Delete an entry, logging why."""
        logger.warning("engine cache: %s for key %s; deleting it and building again", reason, key[:12])
        try:
            self.path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:  # on Windows, an entry a process maps (a cached module's engines) cannot be deleted
            logger.warning("engine cache: cannot delete %s (%s)", self.path(key), e)

    def entries(self) -> list[tuple[float, int, pathlib.Path]]:
        """(last use, size, path) of every entry, least recently used first."""
        found = []
        for path in (p for suffix in SUFFIXES for p in self.directory.glob(f"*{suffix}")):
            try:
                st = path.stat()
            except FileNotFoundError:  # evicted by another process meanwhile
                continue
            found.append((st.st_mtime, st.st_size, path))
        return sorted(found)

    def evict(self) -> None:
        """Delete the least recently used entries until the entries fit the size cap, and stale temporary files."""
        for tmp in self.directory.glob(".*.tmp"):
            try:
                if tmp.stat().st_mtime < time.time() - STALE_SECONDS:
                    tmp.unlink()
            except FileNotFoundError:  # renamed or deleted by its writer meanwhile
                pass
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        for _, size, path in entries:
            if total <= self.limit:
                break
            try:
                path.unlink()
                logger.info("engine cache: evicted %s (%d bytes; the cache holds at most %d)", path.name[:12], size,
                            self.limit)
            except FileNotFoundError:
                pass
            except OSError as e:  # as in `discard`
                logger.warning("engine cache: cannot evict %s (%s)", path, e)
            total -= size


def _read_header(f: BinaryIO) -> dict:
    """An entry's header, read from the start of its file; ValueError if it is not an entry's."""
    start = f.read(_HEADER.size)
    if len(start) < _HEADER.size:
        raise ValueError("truncated")
    magic, length = _HEADER.unpack(start)
    if magic != MAGIC or length > MAX_HEADER:
        raise ValueError("not an engine cache entry")
    text = f.read(length)
    if len(text) < length:
        raise ValueError("not an engine cache entry")
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"bad header: {e}") from None
    if not isinstance(header, dict):
        raise ValueError("bad header")
    return header
