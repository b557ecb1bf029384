"""Binding `inputs` to a method's arguments: the tensors it gives, and static values for the rest.

`inputs` as a list gives the leading arguments, by position; every argument after them takes its default
(`forward(x, attn_mask=None, is_causal=False)` compiles with `inputs=[Input(...)]`). `inputs` as a dict names
arguments: an Input (or a tensor, a shape, a collection of them) for a tensor argument, or a constant (None,
bool, int, float, str) that a non-tensor argument is fixed to; an argument it does not name takes its default.
Static arguments are folded into the graph; the compiled module keeps them in its signature with the same
defaults and refuses another value (see stitching/static_arguments.py).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchkiln.torchscript import StaticArgument

STATIC_TYPES = (type(None), bool, int, float, str)


def is_static(value: Any) -> bool:
    """Whether a dict `inputs` entry fixes its argument to a constant (rather than describing a tensor)."""
    return isinstance(value, STATIC_TYPES)


def _python_parameters(module: torch.nn.Module, method: str) -> list[str]:
    fn = getattr(module, method, None)
    if fn is None:
        raise ValueError(f"method_name: {type(module).__name__} has no method {method!r}")
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in inspect.signature(fn).parameters.values() if p.kind in kinds]


def argument_names(module: torch.nn.Module, method: str = "forward") -> list[str]:
    """The names of the method's positional arguments, self not counted."""
    if isinstance(module, torch.jit.ScriptModule):
        return [a.name for a in getattr(module, method).schema.arguments[1:]]
    return _python_parameters(module, method)


def split_named_inputs(module: torch.nn.Module, inputs: Mapping[str, Any], method: str = "forward"
                       ) -> tuple[list[Any], tuple[str, ...], tuple[tuple[str, Any], ...]]:
    """A dict `inputs` as (the tensor specs in argument order, their argument names, the static values)."""
    names = argument_names(module, method)
    unknown = [k for k in inputs if k not in names]
    if unknown:
        raise ValueError(f"inputs: {method}() has no argument {unknown[0]!r}; its arguments are {names}")
    specs = [(name, inputs[name]) for name in names if name in inputs]
    tensors = [(name, spec) for name, spec in specs if not is_static(spec)]
    statics = tuple((name, spec) for name, spec in specs if is_static(spec))
    return [spec for _, spec in tensors], tuple(name for name, _ in tensors), statics


def _fits(value: Any, t: torch._C.JitType) -> Any:
    """`value` as the argument's type wants it (an int for a float argument becomes a float), or raise."""
    if isinstance(t, torch._C.FloatType) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    inferred = torch._C._jit_try_infer_type(value)
    if not inferred.success() or not inferred.type().isSubtypeOf(t):
        raise TypeError(t)
    if value is not None and isinstance(t, torch._C.OptionalType):
        raise TypeError(t)  # the guard compares with ==, which an Optional argument does not have
    return value


def bind_static_arguments(script: torch.jit.ScriptModule, method: str, given: int,
                          input_names: Sequence[str], named: Sequence[tuple[str, Any]]) -> list[StaticArgument]:
    """The method's arguments that `inputs` gives no tensor for, each with the value it is compiled with.

    `given` tensors bind to the arguments `input_names` names, or without names to the leading arguments.
    An argument with no tensor takes the value `named` gives it, else its default; with neither it is a
    ValueError naming it.
    """
    arguments = getattr(script, method).schema.arguments[1:]
    names = [a.name for a in arguments]
    values = dict(named)
    missing = [n for n in list(input_names) + list(values) if n not in names]
    if missing:
        raise ValueError(f"inputs: {missing[0]!r} is not an argument of the compiled {method}() (arguments: "
                         f"{names}); a module that could not be scripted is traced, and its trace takes only the "
                         f"tensors given by position, with every other argument at its default")
    tensors = set(input_names) if input_names else set(names[:given])
    found = []
    for index, a in enumerate(arguments):
        if a.name in tensors:
            continue
        if a.name in values:
            value = values[a.name]
        elif a.has_default_value():
            value = a.default_value
        elif not input_names and given < len(arguments):
            raise ValueError(f"inputs: {method}() takes {len(arguments)} inputs but {given} were given, and "
                             f"argument {a.name!r} has no default value; give an Input for it")
        else:
            raise ValueError(f"inputs: {method}() argument {a.name!r} has no default value; give an Input for it")
        try:
            value = _fits(value, a.type)
        except TypeError:
            raise ValueError(f"inputs: {method}() argument {a.name!r} has type {a.type.annotation_str}; it cannot "
                             f"be fixed to {value!r} (give an Input for a tensor argument; a non-tensor argument "
                             f"takes None, a bool, an int, a float or a str)") from None
        is_default = a.has_default_value() and type(a.default_value) is type(value) and a.default_value == value
        found.append(StaticArgument(index, a.name, a.type, value, is_default))
    return found
