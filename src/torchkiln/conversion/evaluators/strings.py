"""Evaluators of string ops: str(), str.format, str.find and warnings (issued once, at build time)."""
from __future__ import annotations

import logging
import math
from typing import Any

import torch

from torchkiln.analysis.registry import evaluator
from torchkiln.analysis.resolve import Args, NotStatic

logger = logging.getLogger("torchkiln.conversion")


def _script_str(x: Any) -> str:
    """How TorchScript prints a scalar inside str.format (floats differ from Python: 3. and %.17g)."""
    if isinstance(x, float):
        if math.isfinite(x) and -2.0 ** 63 <= x < 2.0 ** 63 and x == int(x):
            return f"{int(x)}."
        return f"{x:.17g}"
    if x is None or isinstance(x, (bool, int, str, torch.device)):
        return str(x)
    raise NotStatic(f"formatting a {type(x).__name__} is left to run time")


@evaluator("aten::format")
def format_(args: Args) -> str:
    """TorchScript's str.format: each '{}' takes the next argument."""
    template, *values = list(args)
    pieces = template.split("{}")
    if len(pieces) - 1 > len(values):
        raise NotStatic(f"{template!r} has more '{{}}' than the {len(values)} arguments")
    out = pieces[0]
    for piece, value in zip(pieces[1:], values):
        out += _script_str(value) + piece
    return out


@evaluator("aten::str")
def str_(args: Args) -> str:
    """TorchScript's str() of a scalar or a device (`str(x.device)` keys caches)."""
    return _script_str(args[0])


@evaluator("aten::find")
def find(args: Args) -> int:
    """str.find, which `substr in s` becomes."""
    return args[0].find(args[1], args[2], args[3])


@evaluator("aten::warn")
def warn(args: Args) -> None:
    """A warning in the engine's part of the graph is logged once, when the engine is built."""
    logger.warning("%s (warning from the model, issued at build time)", args[0])
