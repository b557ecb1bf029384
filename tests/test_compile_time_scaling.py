"""Deep graphs compile: no Python recursion proportional to graph depth, and time about linear in graph size.

The chains use small tensors, so every value is small enough to fold at build time if it were static: the
resolver must try each node once, and walk the chain without recursing.
"""
import time

import torch
from harness import check_compiled

import torchkiln


class LinearChain(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(n)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class AffineChain(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.n):
            x = x * 1.0001 + 1
        return x


class StaticChain(torch.nn.Module):
    """A chain on a tensor made in the method: every step folds at build time."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n = n

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.ones(4, 4)
        for _ in range(self.n):
            t = t * 1.0001 + 1
        return x + t


def _traced(model: torch.nn.Module, x: torch.Tensor) -> torch.jit.ScriptModule:
    return torch.jit.trace(model.eval(), x)


def test_200_linear_layers_compile_and_match_eager():
    x = torch.randn(2, 16)
    check_compiled(LinearChain(200), [x])


def test_500_affine_steps_compile_and_match_eager():
    x = torch.randn(2, 16)
    check_compiled(_traced(AffineChain(500), x), [x])


def test_500_static_steps_fold_at_build_time():
    x = torch.randn(4, 4)
    _, report = check_compiled(_traced(StaticChain(500), x), [x], engines=None, torch_blocks=None, min_block_size=1)
    assert sum(len(b.ops) for b in report.blocks) <= 2  # the chain folded: only x + t is left to run


def _partition_seconds(n: int) -> float:
    x = torch.randn(2, 16)
    model = _traced(AffineChain(n), x)
    start = time.perf_counter()
    report = torchkiln.partition_report(model, [x])
    elapsed = time.perf_counter() - start
    assert report.num_engine_blocks == 1 and len(report.blocks[0].ops) == 2 * n
    return elapsed


def test_partitioning_time_grows_about_linearly():
    """4x the nodes takes well under 16x the time (quadratic); the bound is generous for noisy machines."""
    _partition_seconds(20)  # warm up (imports, registries)
    small = min(_partition_seconds(100) for _ in range(2))
    large = _partition_seconds(400)
    assert large < 8 * small, f"100 steps: {small:.2f}s, 400 steps: {large:.2f}s"
