"""Exceptions raised by torchkiln; each names what was wrong and what was expected."""
from __future__ import annotations


class TorchkilnError(Exception):
    """Base class of every error torchkiln raises on purpose."""


class UnsupportedOperatorError(TorchkilnError):
    """A graph holds ops the engine cannot run and fallback to PyTorch is not allowed."""


class ConversionError(TorchkilnError):
    """A node could not be turned into network layers."""


class NetworkError(TorchkilnError):
    """A network layer was given inputs or parameters it cannot accept."""


class EngineFormatError(TorchkilnError, RuntimeError):
    """Engine bytes are truncated, altered, of an unknown version, not the engine the module expects, or
    otherwise invalid."""


class EngineInputError(TorchkilnError, ValueError, RuntimeError):
    """An engine was called with the wrong number, shape, dtype or device of inputs."""


class EngineIndexError(EngineInputError, IndexError):
    """An index an engine was given (embedding, index_select, gather, indexing) is out of range."""


class TracingError(TorchkilnError):
    """Tracing (used when a module cannot be scripted) baked data-dependent values into the graph."""


class TracingWarning(UserWarning):
    """Tracing warned that its graph may not hold for other inputs (the module could not be scripted)."""
