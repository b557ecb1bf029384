"""The Python face of a compiled module: engine errors come out as torchkiln's documented types.

TorchScript's interpreter turns any exception raised inside an op into a RuntimeError whose text holds the
original type's name; no Python class survives it. A module compiled by torchkiln (or loaded with
`torchkiln.load`) is a ScriptModule of a subclass whose `__call__` turns such a RuntimeError back into the
torchkiln error the engine raised (EngineInputError, EngineIndexError, EngineFormatError). torch.jit.save
writes it like any ScriptModule; torch.jit.load gives TorchScript's own class, whose errors stay RuntimeErrors.
"""
from __future__ import annotations

import os
from typing import IO, Any

import torch

from torchkiln.runtime.execute_op import reraise_engine_error


class RaisesEngineErrors:
    """Mixin for a ScriptModule: an engine's error raised inside it reaches the caller as its torchkiln type."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except (RuntimeError, torch.jit.Error) as e:  # jit.Error: the graph's own prim::RaiseException
            reraise_engine_error(e)
            raise


class CompiledModule(RaisesEngineErrors, torch.jit.RecursiveScriptModule):
    """A RecursiveScriptModule that raises engine errors as torchkiln's types (and so do its copies)."""

    def __copy__(self) -> torch.jit.ScriptModule:
        return self._keep_record(as_compiled_module(super().__copy__()))

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.jit.ScriptModule:
        return self._keep_record(as_compiled_module(super().__deepcopy__(memo)))

    def _keep_record(self, copy: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
        """The copy keeps what compile recorded for refit_module_weights (in memory, never saved)."""
        if hasattr(self, "_torchkiln_compile"):
            copy._torchkiln_compile = self._torchkiln_compile
        return copy


def as_compiled_module(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """`module` itself, now of a class that raises engine errors as torchkiln's types."""
    if type(module) is torch.jit.RecursiveScriptModule:
        module.__class__ = CompiledModule
    return module


def load(f: str | os.PathLike | IO[bytes], map_location: Any = None) -> torch.jit.ScriptModule:
    """torch.jit.load, returning a module whose engine errors are torchkiln's types (as `compile` returns)."""
    return as_compiled_module(torch.jit.load(f, map_location=map_location))
