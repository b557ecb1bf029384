"""torchkiln's loggers; `debug=True` shows each phase's graph, like TensorRT's kGraph level."""
from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

logger = logging.getLogger("torchkiln")


@contextlib.contextmanager
def logging_at(level: int, handler: logging.Handler | None = None) -> Iterator[None]:
    """Log torchkiln at `level` for the duration, through `handler` (None: to stderr if no handler is set up),
    then restore."""
    previous = logger.level
    if handler is None and not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
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
