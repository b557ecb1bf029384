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


class EngineFormatError(TorchkilnError):
    """Engine bytes are truncated, altered, of an unknown version or otherwise invalid."""


class EngineInputError(TorchkilnError, ValueError):
    """An engine was called with the wrong number, shape, dtype or device of inputs."""
