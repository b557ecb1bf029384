"""Aliasing edge cases of the container and view-write rewrites, each a silent wrong answer before its fix:
compiled against eager over several calls (state that persists between calls included)."""
import copy
from typing import Dict, List

import pytest
import torch

import torchkiln
from harness import assert_matches_eager


class ReassignedAttribute(torch.nn.Module):
    l: List[torch.Tensor]

    def __init__(self):
        super().__init__()
        self.l = []

    def forward(self, x):
        self.l = [x]
        self.l = x.split(1)  # not followed: reads of self.l must not see [x]
        return self.l[0] + len(self.l)


class DictWithRunTimeKey(torch.nn.Module):
    def forward(self, x):
        l = [x]
        k = int(x.sum() > 100)
        d: Dict[int, List[torch.Tensor]] = {k: l}
        d[k].append(x * 2)  # appends to l through the dict
        return l[-1]


class CachedValueWrittenInPlace(torch.nn.Module):
    cache: Dict[str, torch.Tensor]

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))
        self.cache = {}

    def forward(self, x):
        if "k" not in self.cache:
            self.cache["k"] = self.w * 2
        b = self.cache["k"]
        b.add_(1)  # eager keeps this in the cache: every call adds one more
        return x + b


class CopyThenSourceWritten(torch.nn.Module):
    def forward(self, x):
        y = torch.zeros(4, 3)
        v = y[0:2]
        v.copy_(x)
        x.add_(1)  # v holds the old x
        return v * 1


class BaseStoredInAttribute(torch.nn.Module):
    buf: torch.Tensor

    def __init__(self):
        super().__init__()
        self.buf = torch.zeros(4, 3)

    def forward(self, x):
        y = x * 2
        self.buf = y
        y[0:2].add_(1)  # self.buf sees the write
        return self.buf + 0


@pytest.mark.parametrize("module,shape", [(ReassignedAttribute, (2, 3)), (DictWithRunTimeKey, (2, 3)),
                                          (CachedValueWrittenInPlace, (2, 3)), (CopyThenSourceWritten, (2, 3)),
                                          (BaseStoredInAttribute, (4, 3))], ids=lambda p: getattr(p, "__name__", ""))
def test_rewrites_keep_eager_semantics_under_aliasing(module, shape):
    model = torch.jit.script(module()).eval()
    eager = copy.deepcopy(model)
    compiled = torchkiln.compile(model, [torchkiln.Input(shape)])
    x = torch.randn(shape)
    for _ in range(3):
        assert_matches_eager(compiled(x.clone()), eager(x.clone()))


class IndexFromDynamicDim(torch.nn.Module):
    def forward(self, x):
        l = [x, x + 1, x + 2, x + 3, x + 4]
        out = l[x.size(0) - 2]
        for i in range(x.size(0)):  # a trip count of a dynamic dim: not unrolled to the opt value
            out = out + x[i:i + 1]
        return out


def test_a_dynamic_dim_is_not_its_opt_value_in_lowering():
    model = torch.jit.script(IndexFromDynamicDim())
    compiled = torchkiln.compile(model, [torchkiln.Input(min_shape=(2, 3), opt_shape=(3, 3), max_shape=(5, 3))],
                                 min_block_size=1)
    for batch in (2, 3, 4, 5):
        x = torch.randn(batch, 3)
        assert_matches_eager(compiled(x), model(x))
