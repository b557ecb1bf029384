"""The Python code a compile may have run, recorded with a compiled module and checked before it is reused.

Scripting reads the source of the module's classes and of every function they call; tracing runs them, and
whatever they reach (a library's attention function, a helper module). Neither can be known without doing it, so
the cache does what ccache's direct mode does with a compile's headers: the compile that stores a module records
every Python module loaded when it started and every module loaded when it ended, with each one's file and a
signature of that file; a later compile reuses it only if the import path is the same, the modules loaded when it
starts are the first set or more but within the second (code imported since could have changed what runs), each
is loaded from the same file, and no file's signature changed. A file under site-packages is signed by its size
and modification time (an installer writes new files); any other file (the user's own code, an editable install)
by a SHA-256 of its content. The standard library, torch and torchkiln are signed by their versions and
torchkiln's source digest, which the key holds.
"""
from __future__ import annotations

import hashlib
import os
import sys
import sysconfig
from typing import Any

import torch

_STDLIB = tuple(os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib"))
_BY_VERSION = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
               os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)  # torch, torchkiln
_INSTALLED = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")
_POSIX = os.name == "posix"


def _installed(path: str) -> bool:
    return _INSTALLED[0] in path or _INSTALLED[1] in path


def _signed(path: str) -> bool:
    """Whether the file's own signature is needed: not in the standard library, torch or torchkiln."""
    if _installed(path):
        return not path.startswith(_BY_VERSION)
    return not path.startswith(_STDLIB + _BY_VERSION)


def signature(path: str) -> str:
    """An installed file's size and modification time, or any other file's content SHA-256; "absent" if none."""
    try:
        if _installed(path):
            st = os.stat(path)
            return f"{st.st_size} {st.st_mtime_ns}"
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return "absent"


def loaded() -> frozenset[str]:
    """The names of the Python modules loaded now."""
    return frozenset(sys.modules)


def _file(module: Any) -> str | None:
    """The absolute path of a loaded module's file; None for a module without one."""
    # AttributeError only: a built-in module, a namespace package, something else put in sys.modules
    path = getattr(module, "__file__", None)
    if not isinstance(path, str):
        return None
    absolute = path.startswith("/") if _POSIX else os.path.isabs(path)  # (isabs: a third of the time)
    return path if absolute else os.path.abspath(path)


def record(at_start: frozenset[str]) -> dict[str, Any]:
    """What a compile that started with `at_start` loaded ran on: the import path, those names, those loaded since,
    the file of each, and the signature of each file (a link's target's: reading and stat follow links)."""
    paths = {name: path for name, path in ((n, _file(m)) for n, m in list(sys.modules.items())) if path is not None}
    files = {path: signature(path) for path in set(paths.values()) if _signed(path)}
    return {"sys_path": list(sys.path), "at_start": sorted(at_start), "since": sorted(set(sys.modules) - at_start),
            "paths": paths, "files": files}


def mismatch(recorded: Any, at_start: frozenset[str]) -> str | None:
    """Why a compile that starts with `at_start` may not reuse what was compiled on `recorded`; None if it may."""
    if not isinstance(recorded, dict) or not all(isinstance(recorded.get(k), list)
                                                 for k in ("sys_path", "at_start", "since")) \
            or not all(isinstance(recorded.get(k), dict) for k in ("paths", "files")):
        return "no record of its Python code"
    if recorded["sys_path"] != sys.path:
        return "the import path (sys.path) is not the one it was compiled with"
    started = set(recorded["at_start"])
    missing = started - at_start
    if missing:
        return f"Python module {sorted(missing)[0]} was loaded when it was compiled, and is not now"
    new = at_start - started - set(recorded["since"])
    if new:
        return f"Python module {sorted(new)[0]} is loaded now, and was not when it was compiled"
    paths, modules = recorded["paths"], sys.modules
    for name in at_start:
        path = _file(modules.get(name))
        if paths.get(name) != path:
            return f"Python module {name} is loaded from {path or 'no file'}, not from where it was when compiled"
    for path, signed in recorded["files"].items():
        if signature(path) != signed:
            return f"{path} changed"
    return None
