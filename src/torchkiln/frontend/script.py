"""nn.Module -> TorchScript: script it, or trace it with example inputs when scripting fails."""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

logger = logging.getLogger("torchkiln.frontend")


def to_torchscript(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor]) -> torch.jit.ScriptModule:
    """Return `module` as a ScriptModule (itself if it is one)."""
    if isinstance(module, torch.jit.ScriptModule):
        return module
    if not isinstance(module, torch.nn.Module):
        raise ValueError(f"module must be a torch.nn.Module or torch.jit.ScriptModule, got {type(module).__name__}")
    try:
        return torch.jit.script(module)
    except Exception as e:  # TorchScript's compiler raises many kinds of errors
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        logger.warning("scripting %s failed (%s); tracing it with example inputs instead",
                       type(module).__name__, first_line)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            return torch.jit.trace(module, tuple(example_inputs), strict=False, check_trace=False)
    finally:
        module.train(was_training)
