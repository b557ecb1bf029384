"""The engine format's layer kinds and bounds as plain data: what `scripts/render_layer_kinds.py` writes to
csrc/layer_kinds.json, so that the C++ loader checks engines against the description the Python loader uses."""
from __future__ import annotations

import enum
import types
import typing
from typing import Any

import torch

from torchkiln.ir import layers as L
from torchkiln.ir import symbolic
from torchkiln.runtime import limits
from torchkiln.runtime.backends.base import OPTIONS
from torchkiln.runtime import serialization as S


def type_name(hint: Any) -> str:
    """A parameter's type hint as text: int, float, bool, str, dtype, an enum's name, tuple[T], optional[T]."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        (inner,) = [a for a in args if a is not type(None)]
        return f"optional[{type_name(inner)}]"
    if origin is tuple:
        return f"tuple[{type_name(args[0])}]"
    if hint is torch.dtype:
        return "dtype"
    return hint.__name__


def _enums(hint: Any, found: dict[str, list[str]]) -> None:
    for arg in typing.get_args(hint):
        _enums(arg, found)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        found[hint.__name__] = [m.value for m in hint]


def _option(setting: Any) -> dict[str, Any]:
    """A backend option stored in engine metadata: its name and type, and an int's range."""
    check = setting.check
    if setting.type == "int":
        return {"name": setting.name, "type": "int", "low": check.low, "high": check.high, "note": check.note}
    return {"name": setting.name, "type": setting.type}


def describe() -> dict[str, Any]:
    """Layer kinds, enums, dtypes, the backend options of engine metadata and the loader's bounds."""
    kinds: dict[str, Any] = {}
    enums: dict[str, list[str]] = {}
    for name, kind in sorted(L.LAYER_KINDS.items()):
        hints = typing.get_type_hints(kind)
        params = []
        defaults = S.param_defaults(kind)
        for f in kind.param_fields():  # [name, type] or, where an engine may leave it out, [name, type, default]
            params.append([f.name, type_name(hints[f.name]), *([defaults[f.name]] if f.name in defaults else [])])
            _enums(hints[f.name], enums)
        kinds[name] = {"params": params, "weights": list(kind.WEIGHTS), "required_weights": list(kind.REQUIRED_WEIGHTS),
                       "weight_dtypes": [S.dtype_name(d) for d in kind.WEIGHT_DTYPES],
                       "min_inputs": kind.MIN_INPUTS, "max_inputs": kind.MAX_INPUTS,
                       **({"subnetworks": list(kind.SUBNETWORKS)} if kind.SUBNETWORKS else {})}
    bounds = {name: getattr(module, name) for module, names in (
        (S, ("FORMAT_VERSION", "MAX_SECTIONS", "MAX_GRAPH_BYTES", "MAX_META_BYTES", "MAX_LIST", "MAX_TENSORS",
             "MAX_INT_DIGITS", "MAX_STRING", "MAX_SYMBOLS", "MAX_NESTING")),
        (L, ("MAX_RANK", "MAX_EXTENT", "MAX_LOOP_TRIPS")), (limits, ("MAX_LAYERS",)),
        (symbolic, ("MAX_TREE_DEPTH", "MAX_TREE_NODES", "MAX_EXTREMUM_ARGS"))) for name in names}
    return {"bounds": bounds, "dtypes": [S.dtype_name(d) for d in L.TENSOR_DTYPES],
            "float_dtypes": [S.dtype_name(d) for d in L.FLOAT_DTYPES], "enums": dict(sorted(enums.items())),
            "backend_options": [_option(o) for o in OPTIONS], "kinds": kinds}
