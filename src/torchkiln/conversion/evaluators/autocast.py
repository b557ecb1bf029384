"""Queries of PyTorch's global modes, answered at build time.

A compiled module is for inference: its engines' precision is fixed when they are built and they never
record gradients. So code asking whether autocast or grad mode is on is compiled for both off, the path
eager PyTorch takes under torch.inference_mode() (nn.MultiheadAttention's fast path, say).
"""
from __future__ import annotations

from torchkiln.analysis.registry import evaluator
from torchkiln.analysis.resolve import Args


@evaluator("aten::is_autocast_enabled", "aten::is_autocast_cpu_enabled")
def is_autocast_enabled(args: Args) -> bool:
    return False


@evaluator("aten::is_grad_enabled")
def is_grad_enabled(args: Args) -> bool:
    return False
