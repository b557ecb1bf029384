"""Deep graphs compile: no Python recursion proportional to graph depth, and work about linear in graph size.

The chains use small tensors, so every value is small enough to fold at build time if it were static: the
resolver must try each node once, and walk the chain without recursing.
"""
import cProfile
import pstats
import time

import pytest
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


def _partition_calls(n: int) -> int:
    """The Python function calls that partitioning an n-step chain makes: a count of its work that, unlike its time,
    no other process on the machine changes."""
    x = torch.randn(2, 16)
    model = _traced(AffineChain(n), x)
    profile = cProfile.Profile()
    profile.enable()
    report = torchkiln.partition_report(model, [x])
    profile.disable()
    assert report.num_engine_blocks == 1 and len(report.blocks[0].ops) == 2 * n
    return sum(stats[1] for stats in pstats.Stats(profile).stats.values())


def test_partitioning_work_grows_about_linearly():
    """4x the nodes (100 and 400) makes about 4x the calls (3.9x when written), where a pass quadratic in the graph's
    size would make 16x."""
    _partition_calls(10)  # warm up (imports, registries, caches)
    small, large = _partition_calls(50), _partition_calls(200)
    assert large < 6 * small, f"50 steps: {small} calls, 200 steps: {large}"


def test_gemma2_style_decoder_compiles_in_seconds():
    """Sliding-window and global attention with soft-capping, GQA, RMSNorm: its many shared subgraphs once took
    the resolver minutes (run-time tensors were not memoized, so each query re-walked every ancestor)."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       max_position_embeddings=64, sliding_window=8, attn_implementation="eager")
    model = transformers.Gemma2Model(config).eval()

    class LastHiddenState(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.model(input_ids=ids, use_cache=False).last_hidden_state

    ids = torch.randint(0, 128, (1, 16))
    start = time.perf_counter()
    check_compiled(LastHiddenState(), [ids])
    assert time.perf_counter() - start < 60
