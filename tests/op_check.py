"""Helpers of the tests/test_ops_*.py tables: compile one op through the whole pipeline and check it."""
from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from harness import check_compiled, check_fn
from torchkiln.partitioning.report import PartitionReport


class Traced(torch.nn.Module):
    """A module whose forward is `fn(*inputs)`; traced, so `fn` may be any Python callable (a lambda; tensors it
    captures become constants, but a module it captures must be `fn` itself to have its weights frozen)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.fn(*inputs)


def check_traced(fn: Callable[..., Any], *example: torch.Tensor, op: str | None = None, engines: int = 1,
                 torch_blocks: int = 0, **settings: Any) -> PartitionReport:
    """Trace `fn` on `example`, compile it (min_block_size=1), compare with eager; `op` must run in an engine."""
    settings.setdefault("min_block_size", 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(Traced(fn).eval(), example, check_trace=False)
    _, report = check_compiled(traced, example, engines=engines, torch_blocks=torch_blocks, **settings)
    if op is not None:
        assert_converted(report, op)
    return report


def check_scripted(fn: Callable[..., Any], *example: torch.Tensor, op: str | None = None, engines: int = 1,
                   torch_blocks: int = 0, **settings: Any) -> PartitionReport:
    """check_fn (a scripted named function), and `op` must run in an engine."""
    _, report = check_fn(fn, *example, engines=engines, torch_blocks=torch_blocks, **settings)
    if op is not None:
        assert_converted(report, op)
    return report


def assert_converted(report: PartitionReport, op: str) -> None:
    engine_ops = {o for b in report.blocks if b.target == "engine" for o in b.ops}
    assert op in engine_ops, f"{op} did not run in an engine:\n{report}"


def assert_falls_back(report: PartitionReport, op: str, reason: str) -> None:
    """`op` stayed in PyTorch, and its fallback detail mentions `reason`."""
    details = [f.detail for b in report.blocks for f in b.fallback if f.op == op]
    assert details, f"{op} did not fall back:\n{report}"
    assert any(reason in d for d in details), f"{op} fell back for another reason: {details}"
