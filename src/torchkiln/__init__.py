"""torchkiln: an ahead-of-time inference compiler for PyTorch (TorchScript in, engine-backed TorchScript out).

`import torchkiln` imports the API (torchkiln/api.py), and with it torch and torchkiln's TorchScript ops
(torch.jit.load of a compiled module needs torch.ops.torchkiln.execute_engine). The exception is the command line
starting (`python -m torchkiln`, the `torchkiln` script): it parses its arguments first, so that `--help` and
`--version` do not wait for torch, then imports the API for the command it runs; until then, using a name of the
API imports it.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from typing import TYPE_CHECKING, Any

from torchkiln._version import __version__


def _started_as_command() -> bool:
    """Whether this import is the command line starting: `python -m torchkiln` locating its __main__ (sys.argv[0]
    is "-m" until then), or the `torchkiln` console script."""
    argv0 = sys.argv[0] if sys.argv else ""
    if argv0 == "-m":
        orig = sys.orig_argv
        return any(a == "-mtorchkiln" or (a == "-m" and b == "torchkiln") for a, b in zip(orig, orig[1:] + [""]))
    name = os.path.basename(argv0)
    return name in ("torchkiln", "torchkiln.exe", "torchkiln-script.py")


def _import_api() -> None:
    """Import the API (torch with it, and torchkiln's TorchScript ops) into the package's namespace."""
    api = importlib.import_module("torchkiln.api")
    globals().update({name: getattr(api, name) for name in api.__all__}, __all__=api.__all__)


def __getattr__(name: str) -> Any:
    """A submodule not imported yet, or, while the command line starts, an API name: that imports the API."""
    if not name.startswith("__"):
        if importlib.util.find_spec(f"{__name__}.{name}") is not None:
            return importlib.import_module(f"{__name__}.{name}")
        _import_api()
        if name in globals():
            return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if TYPE_CHECKING:  # what type checkers and editors see: the API's names
    from torchkiln.api import *  # noqa: F403
if not _started_as_command():
    _import_api()
