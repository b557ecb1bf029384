"""aten::diff through the whole pipeline against eager."""
import pytest
import torch
from harness import check_fn


def diff_last(x):
    return torch.diff(x)


def diff_twice_dim0(x):
    return torch.diff(x, n=2, dim=0)


def diff_prepend_append(x, y):
    return torch.diff(x, dim=1, prepend=y, append=y[:, :1])


def diff_n0_prepend_append(x, y):
    """n=0 returns the input: torch adds no prepend or append then (OpInfo diff)."""
    return torch.diff(x, n=0, dim=0, prepend=y[:1], append=y)


def diff_bool(x):
    return torch.diff(x > 0, dim=-1)


@pytest.mark.parametrize("fn, example", [
    (diff_last, [torch.randn(3, 5)]),
    (diff_last, [torch.randint(-9, 9, (2, 6))]),
    (diff_twice_dim0, [torch.randn(5, 4)]),
    (diff_prepend_append, [torch.randn(3, 4), torch.randn(3, 2)]),
    (diff_n0_prepend_append, [torch.randn(5, 5), torch.randn(2, 5)]),
    (diff_bool, [torch.randn(4, 5)]),
], ids=["float", "int64", "n2-dim0", "prepend-append", "n0-prepend-append", "bool"])
def test_diff(fn, example):
    check_fn(fn, *example, op="aten::diff")
