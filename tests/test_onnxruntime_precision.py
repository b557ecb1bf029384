"""fp32 precision of the onnxruntime backend on LeViT's building blocks (issue 23), rebuilt from plain torch: a
conv + batch norm + Hardswish stem (ORT fuses the Hardswish into its NCHWc convolution), attention whose linears
are batch-normed over the flattened tokens (LeViT's LinearNorm), biases gathered by a static index table, an
attention that subsamples its queries, Hardswish, residuals.

The model is kept well-conditioned (eager fp32 within 1e-5 of fp64, attention logits of a few units) so that a
failure is the engine's: random-weight LeViT with inputs larger than its batch norms were calibrated on has
attention logits in the tens of thousands, where softmax is an argmax with near-ties, and any two correct fp32
implementations (eager and ORT, or eager and fp64) then disagree by O(1) on some inputs."""
from __future__ import annotations

import copy
import itertools

import torch
from harness import check_compiled
from torch import nn

from torchkiln.examples.zoo import calibrate_batch_norm
from torchkiln.runtime.backends.onnxruntime import OrtRunner
from torchkiln.runtime.execute_op import engine_from_blob

CPU = torch.device("cpu")


class LinearNorm(nn.Module):
    """LeViT's Linear + BatchNorm1d over the flattened tokens."""

    def __init__(self, dim_in: int, dim_out: int) -> None:
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out, bias=False)
        self.bn = nn.BatchNorm1d(dim_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.linear(x)
        return self.bn(x.flatten(0, 1)).reshape_as(x)


def _bias_index(queries: int, keys: int, stride: int) -> torch.Tensor:
    """LeViT's attention-bias index table: the |dy|, |dx| offset of each query (on a grid subsampled by `stride`)
    from each key, numbered in order of first appearance."""
    q_side, k_side = int(queries ** 0.5), int(keys ** 0.5)
    q_points = [(stride * i, stride * j) for i, j in itertools.product(range(q_side), repeat=2)]
    k_points = list(itertools.product(range(k_side), repeat=2))
    offsets: dict[tuple[int, int], int] = {}
    idx = [[offsets.setdefault((abs(p[0] - k[0]), abs(p[1] - k[1])), len(offsets)) for k in k_points]
           for p in q_points]
    return torch.tensor(idx)


class Attention(nn.Module):
    """LeViT's attention (stride 1) and attention subsample (stride 2: queries from every other token)."""

    def __init__(self, dim: int, dim_out: int, tokens: int, heads: int = 2, key_dim: int = 8,
                 stride: int = 1) -> None:
        super().__init__()
        self.heads, self.key_dim, self.val_dim, self.stride = heads, key_dim, 2 * key_dim, stride
        self.scale = key_dim ** -0.5
        self.side = int(tokens ** 0.5)
        self.kv = LinearNorm(dim, heads * (key_dim + self.val_dim) + (0 if stride > 1 else heads * key_dim))
        self.q = LinearNorm(dim, heads * key_dim) if stride > 1 else None
        self.proj = LinearNorm(heads * self.val_dim, dim_out)
        idx = _bias_index(tokens // stride ** 2, tokens, stride)
        self.attention_biases = nn.Parameter(torch.randn(heads, int(idx.max()) + 1))
        self.register_buffer("attention_bias_idxs", idx, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, c = x.shape
        kv = self.kv(x).view(b, n, self.heads, -1)
        if self.q is None:
            q, k, v = kv.split([self.key_dim, self.key_dim, self.val_dim], dim=3)
        else:
            k, v = kv.split([self.key_dim, self.val_dim], dim=3)
            grid = x.view(b, self.side, self.side, c)[:, ::self.stride, ::self.stride].reshape(b, -1, c)
            q = self.q(grid).view(b, -1, self.heads, self.key_dim)
        q, k, v = q.permute(0, 2, 1, 3), k.permute(0, 2, 3, 1), v.permute(0, 2, 1, 3)
        attn = q @ k * self.scale + self.attention_biases[:, self.attention_bias_idxs]
        x = (attn.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, -1, self.heads * self.val_dim)
        return self.proj(nn.functional.hardswish(x))


class Mlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = LinearNorm(dim, 2 * dim), LinearNorm(2 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln2(nn.functional.hardswish(self.ln1(x)))


def _conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, 2, 1, bias=False), nn.BatchNorm2d(c_out))


class TinyLeViT(nn.Module):
    """Stem (two stride-2 conv + BN, Hardswish between), a residual attention and MLP block, a subsampling
    attention and MLP, mean-pooled tokens: 32x32 images -> 64 tokens of 32 -> 16 tokens of 48."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(_conv_bn(3, 16), nn.Hardswish(), _conv_bn(16, 32))
        self.attn, self.mlp = Attention(32, 32, 64), Mlp(32)
        self.down, self.down_mlp = Attention(32, 48, 64, stride=2), Mlp(48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        x = x + self.attn(x)
        x = x + self.mlp(x)
        x = self.down(x)
        x = x + self.down_mlp(x)
        return x.mean(1)


def test_levit_blocks_on_onnxruntime_match_eager_as_one_session():
    torch.manual_seed(0)
    model = TinyLeViT()
    calibrate_batch_norm(model, lambda: [torch.randn(8, 3, 32, 32)])
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():  # the test's premise: a well-conditioned model, so a failure is the engine's
        ref, exact = model(x), copy.deepcopy(model).double()(x.double())
    assert (ref.double() - exact).abs().max() <= 1e-5 * exact.abs().max()
    compiled, _ = check_compiled(model, [x], backend="onnxruntime")
    runner = engine_from_blob(compiled._torchkiln_engine_0).runner(CPU)
    assert isinstance(runner, OrtRunner) and runner.sessions == len(runner.steps) == 1
