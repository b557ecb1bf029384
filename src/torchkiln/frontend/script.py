"""nn.Module -> TorchScript: script it, or trace it with example inputs when scripting fails."""
from __future__ import annotations

import logging
import typing
from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.errors import cause_line
from torchkiln.frontend.trace import trace_checked

logger = logging.getLogger("torchkiln.frontend")


def _function_module(fn: torch.jit.ScriptFunction) -> torch.jit.ScriptModule:
    """A ScriptModule whose forward calls the scripted function with the same arguments."""
    schema = fn.schema
    if len(schema.returns) != 1 or any(a.kwarg_only for a in schema.arguments):
        raise TypeError(f"module: the scripted function {fn.name!r} has keyword-only arguments or several "
                        f"returns; wrap it in a torch.nn.Module to compile it")
    params = ", ".join(f"{a.name}: {a.type.annotation_str}" for a in schema.arguments)
    names = ", ".join(a.name for a in schema.arguments)
    module = type(fn.name, (torch.jit.ScriptModule,), {"__module__": "torchkiln.frontend"})()
    scope = {"_torchkiln_function": fn, "torch": torch, "Tensor": torch.Tensor, "List": typing.List,
             "Tuple": typing.Tuple, "Dict": typing.Dict, "Optional": typing.Optional}
    source = (f"def forward(self, {params}) -> {schema.returns[0].type.annotation_str}:\n"
              f"    return _torchkiln_function({names})\n")
    module._c._define(module._concrete_type, source, scope.get)
    return module


def as_module(obj: Any) -> torch.nn.Module:
    """What the API takes as a module: an nn.Module (or ScriptModule), or a scripted function (wrapped in a
    module); anything else is a TypeError."""
    if isinstance(obj, torch.nn.Module):
        return obj
    if isinstance(obj, torch.jit.ScriptFunction):
        return _function_module(obj)
    raise TypeError(f"module must be a torch.nn.Module, a torch.jit.ScriptModule or a torch.jit.ScriptFunction, "
                    f"got {type(obj).__name__} {getattr(obj, '__name__', '')!s}".rstrip()
                    + "; wrap a plain function in a torch.nn.Module whose forward calls it")


def check_method(module: torch.jit.ScriptModule, method: str) -> None:
    """Raise ValueError naming `method` and the module's methods unless it has that method, one of its own (not a
    container's `__len__` or `__contains__`, which TorchScript compiles but Python answers)."""
    names = module._c._method_names()
    if method not in names:
        raise ValueError(f"method_name: {module.original_name} has no TorchScript method {method!r}; available "
                         f"methods: {sorted(names)} (a Python method other than forward must be marked "
                         f"@torch.jit.export to be scripted)")
    if not isinstance(getattr(module, method, None), torch._C.ScriptMethod):
        raise ValueError(f"method_name: {method!r} of {module.original_name} is the container's own {method}, not a "
                         f"method that computes tensors; compile forward or a method marked @torch.jit.export")


def to_torchscript(module: torch.nn.Module, example_inputs: Sequence[Any]) -> torch.jit.ScriptModule:
    """Return `module` as a ScriptModule (itself if it is one)."""
    module = as_module(module)
    if isinstance(module, torch.jit.ScriptModule):
        return module
    try:
        return torch.jit.script(module)
    except Exception as e:  # TorchScript's compiler raises many kinds of errors
        unscriptable = cause_line(e)
        logger.warning("scripting %s failed (%s); tracing it with example inputs instead",
                       type(module).__name__, unscriptable)
    return trace_checked(module, example_inputs, unscriptable)
