"""Running a module in eval mode for a while without changing any submodule's own mode."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def eval_mode(module: torch.nn.Module) -> Iterator[None]:
    """Put `module` and its submodules in eval mode, then give each its own `training` flag back.

    `module.train(was_training)` would set every submodule alike, turning on dropout in an eval-mode
    submodule of a wrapper left in training mode.
    """
    saved = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, training in saved:
            m.training = training
