"""torchkiln's loggers; `debug=True` shows each phase's graph, like TensorRT's kGraph level."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import warnings
from collections.abc import Iterator

logger = logging.getLogger("torchkiln")

_COLOURS = {logging.CRITICAL: "\033[1;31m", logging.ERROR: "\033[31m", logging.WARNING: "\033[33m",
            logging.INFO: "\033[32m"}


@dataclasses.dataclass
class LogStyle:
    """How torchkiln's own stderr handler writes a message: after `prefix`, its level name coloured if `colored`
    (Torch-TensorRT's logging prefix and coloured output)."""

    prefix: str = ""
    colored: bool = False


STYLE = LogStyle()


class Formatter(logging.Formatter):
    """`<prefix><LEVEL> <logger>: <message>`, the level coloured by ANSI codes when STYLE.colored."""

    def format(self, record: logging.LogRecord) -> str:
        level = record.levelname
        if STYLE.colored:
            level = f"{_COLOURS.get(record.levelno, '')}{level}\033[0m"
        return f"{STYLE.prefix}{level} {record.name}: {super().format(record)}"


def stderr_handler() -> logging.Handler:
    """A handler writing to stderr in torchkiln's format (Formatter)."""
    handler = logging.StreamHandler()
    handler.setFormatter(Formatter())
    return handler


def has_handler() -> bool:
    """Whether the torchkiln logger or the root logger has a handler set up."""
    return bool(logger.handlers or logging.getLogger().handlers)


@contextlib.contextmanager
def logging_at(level: int, handler: logging.Handler | None = None) -> Iterator[None]:
    """Log torchkiln at `level` for the duration, through `handler` (None: to stderr if no handler is set up),
    then restore."""
    previous = logger.level
    if handler is None and not has_handler():
        handler = stderr_handler()
    if handler is not None:
        logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(previous)
        if handler is not None:
            logger.removeHandler(handler)


@contextlib.contextmanager
def debug_logging(enabled: bool) -> Iterator[None]:
    """While compiling with debug=True, log torchkiln at DEBUG (to stderr if nothing else is set up)."""
    if not enabled:
        yield
        return
    with logging_at(logging.DEBUG):
        yield


def warn(log: logging.Logger, message: str) -> None:
    """Tell the user twice: a logging warning (for log readers) and a Python UserWarning (for notebooks and
    `pytest.warns`)."""
    log.warning(message)
    warnings.warn(message, UserWarning, stacklevel=3)
