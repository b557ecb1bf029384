"""Exceptions raised by torchkiln; each names what was wrong and what was expected."""
from __future__ import annotations


_INTERPRETER_HEADER = "The following operation failed in the TorchScript interpreter"


def cause_line(error: BaseException) -> str:
    """The line of an exception's message that says what went wrong, for a message that wraps it.

    That is the first line, except for TorchScript interpreter errors, whose first line is a fixed header
    and whose last line is the original exception ('RuntimeError: Input type (c10::Half) and bias type...').
    """
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    return lines[-1] if lines[0].startswith(_INTERPRETER_HEADER) else lines[0]


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


class RefitError(TorchkilnError, ValueError):
    """New weights do not fit a compiled module: another graph, or a parameter of another shape or dtype."""


class TracingError(TorchkilnError):
    """Tracing (used when a module cannot be scripted) baked data-dependent values into the graph."""


class TracingWarning(UserWarning):
    """Tracing warned that its graph may not hold for other inputs (the module could not be scripted)."""
