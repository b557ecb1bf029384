"""`torchkiln.logging`: Torch-TensorRT's logging names over Python's logging of the `torchkiln` logger.

`with torchkiln.logging.debug(): ...` logs torchkiln at DEBUG for the block (to stderr when no handler is set
up); `errors()`, `warnings()`, `info()`, `graphs()` and `internal_errors()` likewise. `Level.Graph` is below
DEBUG: the graph after each phase is logged at DEBUG, so both show it. The logging prefix and coloured output
style torchkiln's own stderr handler; a handler of yours formats as you set it up. `torchkiln.ts.logging` is
this module (Torch-TensorRT has both names).
"""
from __future__ import annotations

import contextlib
import enum
import logging as _logging

from torchkiln.log import STYLE, has_handler, logger, logging_at, stderr_handler

GRAPH = 5  # Python logging level of Level.Graph
_logging.addLevelName(GRAPH, "GRAPH")


class Level(enum.IntEnum):
    """Torch-TensorRT's log levels, valued as Python logging levels."""

    InternalError = _logging.CRITICAL
    Error = _logging.ERROR
    Warning = _logging.WARNING
    Info = _logging.INFO
    Debug = _logging.DEBUG
    Graph = GRAPH


def get_reportable_log_level() -> Level:
    """The level the torchkiln logger reports at (its effective level)."""
    effective = logger.getEffectiveLevel()
    return min((lvl for lvl in Level if lvl >= effective), default=Level.InternalError)


def set_reportable_log_level(level: Level | int) -> None:
    """Report torchkiln's messages at `level` and above from now on (to stderr where no handler is set up)."""
    logger.setLevel(int(level))
    if not has_handler():
        logger.addHandler(stderr_handler())


def get_logging_prefix() -> str:
    """The text torchkiln's stderr handler writes before each message."""
    return STYLE.prefix


def set_logging_prefix(prefix: str) -> None:
    """Write `prefix` before each message torchkiln's stderr handler writes."""
    if not isinstance(prefix, str):
        raise ValueError(f"set_logging_prefix takes a str, got {type(prefix).__name__}")
    STYLE.prefix = prefix


def get_is_colored_output_on() -> bool:
    """Whether torchkiln's stderr handler colours the level names."""
    return STYLE.colored


def set_is_colored_output_on(colored_output_on: bool) -> None:
    """Colour the level names torchkiln's stderr handler writes (ANSI codes), or not."""
    if not isinstance(colored_output_on, bool):
        raise ValueError(f"set_is_colored_output_on takes True or False, got {colored_output_on!r}")
    STYLE.colored = colored_output_on


def log(level: Level | int, message: str) -> None:
    """Log `message` on the torchkiln logger at `level`."""
    logger.log(int(level), message)


def _at(level: Level) -> contextlib.AbstractContextManager[None]:
    return logging_at(int(level))


def internal_errors() -> contextlib.AbstractContextManager[None]:
    """Report only internal errors (CRITICAL) inside the block."""
    return _at(Level.InternalError)


def errors() -> contextlib.AbstractContextManager[None]:
    """Report errors and worse inside the block."""
    return _at(Level.Error)


def warnings() -> contextlib.AbstractContextManager[None]:
    """Report warnings and worse inside the block."""
    return _at(Level.Warning)


def info() -> contextlib.AbstractContextManager[None]:
    """Report INFO and worse inside the block (each compile phase, engines built)."""
    return _at(Level.Info)


def debug() -> contextlib.AbstractContextManager[None]:
    """Report DEBUG and worse inside the block (graphs after each pass, the partition report)."""
    return _at(Level.Debug)


def graphs() -> contextlib.AbstractContextManager[None]:
    """Report everything inside the block."""
    return _at(Level.Graph)


__all__ = ["GRAPH", "Level", "debug", "errors", "get_is_colored_output_on", "get_logging_prefix",
           "get_reportable_log_level", "graphs", "info", "internal_errors", "log", "set_is_colored_output_on",
           "set_logging_prefix", "set_reportable_log_level", "warnings"]
