"""A progress display of a compile's phases and engine blocks on stderr, through tqdm.

`TORCHKILN_PROGRESS` decides: `0` off; `1` on from the start, whether or not stderr is a terminal; unset (or
`auto`), on where stderr is a terminal, once a compile has taken `DELAY` seconds (quick builds print nothing).
The phases report through `step`, a no-op where no display is running, so they need no display passed down.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import sys
from collections.abc import Iterator
from typing import TextIO

ENV = "TORCHKILN_PROGRESS"
DELAY = 3.0  # seconds a compile runs before an automatic display appears
_SWITCH = {"0": False, "off": False, "false": False, "no": False, "1": True, "on": True, "true": True, "yes": True,
           "auto": None, "": None}


def mode() -> bool | None:
    """TORCHKILN_PROGRESS as True (always), False (never) or None (on a terminal)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value not in _SWITCH:
        raise ValueError(f"{ENV} must be 0 (off), 1 (on) or auto (on where stderr is a terminal), got {value!r}")
    return _SWITCH[value]


class _Display:
    """A tqdm bar whose description names the model and the step running; drawn at each step once `delay`
    seconds have passed (tqdm's own delay holds back updates, not description changes)."""

    def __init__(self, name: str, steps: int, stream: TextIO, delay: float) -> None:
        from tqdm import tqdm  # imported when a display is shown, not with torchkiln

        self.name = name
        self.bar = tqdm(total=steps, desc=f"compiling {name}", unit="step", file=stream, delay=delay, mininterval=0,
                        miniters=1, dynamic_ncols=True, bar_format="{desc} |{bar}| {n_fmt}/{total_fmt} [{elapsed}]")
        self.started = False

    def step(self, label: str) -> None:
        self.bar.set_description_str(f"compiling {self.name}: {label}", refresh=False)
        if self.started:
            self.bar.update(1)
        elif self.bar.delay <= 0:
            self.bar.refresh()
        self.started = True


_current: contextvars.ContextVar[_Display | None] = contextvars.ContextVar("torchkiln_progress", default=None)


@contextlib.contextmanager
def display(name: str, steps: int, stream: TextIO | None = None) -> Iterator[None]:
    """Show the progress of compiling `name` through `steps` steps (more may be added: `add_steps`) while the
    body runs; log lines go above the bar meanwhile. A compile inside a compile shows only the outer one."""
    stream = stream if stream is not None else sys.stderr
    forced = mode()
    on = forced if forced is not None else bool(getattr(stream, "isatty", lambda: False)())
    if stream is None or not on or _current.get() is not None:  # no stderr at all: pythonw
        yield
        return
    from tqdm.contrib.logging import logging_redirect_tqdm

    shown = _Display(name, steps, stream, 0 if forced else DELAY)
    token = _current.set(shown)
    try:
        with logging_redirect_tqdm(loggers=_console_loggers()):
            yield
        shown.step("done")
    finally:
        _current.reset(token)
        shown.bar.close()


def _console_loggers() -> list[logging.Logger]:
    """The root and torchkiln loggers where they write to stdout or stderr: their lines go above the bar."""
    return [lg for lg in (logging.getLogger(), logging.getLogger("torchkiln"))
            if any(isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr) for h in lg.handlers)]


def step(label: str) -> None:
    """Start the step `label` (ending the one before it) on the running display, if any."""
    shown = _current.get()
    if shown is not None:
        shown.step(label)


def add_steps(n: int) -> None:
    """Add `n` steps to the running display (the engine blocks, once partitioning has found them)."""
    shown = _current.get()
    if shown is not None:
        shown.bar.total += n  # drawn at the next step
