"""Selection converters through the whole pipeline: max/min along a dim with indices, argmax/argmin, topk."""
import pytest
import torch
from harness import assert_falls_back, check_fn, check_traced


def _ties(*shape: int) -> torch.Tensor:
    """Few distinct values, so ties are everywhere: indices must be the first occurrence, like eager."""
    return torch.randint(0, 3, shape).float()


CASES = [
    ("max-dim", lambda x: x.max(1), torch.randn(2, 5, 3), "aten::max.dim"),
    ("max-dim-keepdim-negative", lambda x: torch.max(x, -1, keepdim=True), torch.randn(2, 5, 3), "aten::max.dim"),
    ("min-dim", lambda x: x.min(0), torch.randn(4, 3), "aten::min.dim"),
    ("max-dim-ties", lambda x: x.max(1), _ties(3, 8), "aten::max.dim"),
    ("min-dim-ties-keepdim", lambda x: x.min(0, keepdim=True), _ties(8, 3), "aten::min.dim"),
    ("max-dim-values-only", lambda x: x.max(2)[0] * 2, torch.randn(2, 3, 4), "aten::max.dim"),
    ("max-dim-int64", lambda x: x.max(1), torch.randint(-9, 9, (3, 4)), "aten::max.dim"),
    ("max-dim-0d", lambda x: x.max(0), torch.tensor(2.5), "aten::max.dim"),
    ("argmax-dim", lambda x: x.argmax(1), _ties(3, 7, 2), "aten::argmax"),
    ("argmax-all", lambda x: x.argmax(), _ties(3, 7), "aten::argmax"),
    ("argmax-all-keepdim", lambda x: torch.argmax(x, keepdim=True), torch.randn(3, 2, 4), "aten::argmax"),
    ("argmin-negative-keepdim", lambda x: x.argmin(-2, keepdim=True), _ties(4, 6), "aten::argmin"),
    ("argmin-int", lambda x: x.argmin(0), torch.randint(0, 3, (6, 2), dtype=torch.int32), "aten::argmin"),
    ("argmax-non-contiguous", lambda x: x.transpose(0, 1).argmax(0), torch.randn(5, 3), "aten::argmax"),
    ("topk", lambda x: x.topk(3), torch.randn(2, 7), "aten::topk"),
    ("topk-smallest-dim", lambda x: torch.topk(x, 2, dim=0, largest=False), torch.randn(6, 3), "aten::topk"),
    ("topk-ties", lambda x: torch.topk(x, 4, dim=-1), _ties(3, 9), "aten::topk"),
    ("topk-k1-values", lambda x: torch.topk(x, 1, dim=1)[0], _ties(3, 9), "aten::topk"),
    ("topk-unsorted-k1-values", lambda x: torch.topk(x, 1, sorted=False)[0], torch.randn(3, 5), "aten::topk"),
]


@pytest.mark.parametrize("fn,x,op", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_selection(fn, x, op):
    check_traced(fn, x, op=op)


@pytest.mark.parametrize("fn", [lambda x: x.argmax(1), lambda x: x.max(0), lambda x: torch.topk(x, 2)])
def test_int64_selection_with_truncate_long_and_double(fn):
    check_traced(fn, torch.randint(-9, 9, (4, 5)), truncate_long_and_double=True)


def topk_unsorted(x):
    values, indices = torch.topk(x, 3, sorted=False)
    return values, indices


def topk_k1_indices(x):
    return torch.topk(x, 1)[1]


@pytest.mark.parametrize("fn,reason", [(topk_unsorted, "sorted=False"), (topk_k1_indices, "k=1")])
def test_topk_falls_back_where_only_pytorch_defines_the_order(fn, reason):
    _, report = check_fn(fn, torch.randn(3, 6), engines=0, torch_blocks=1)
    assert_falls_back(report, "aten::topk", reason)


def _with_nan(*shape: int) -> torch.Tensor:
    """NaN in some rows (twice in one, alone in one), beside infinities: eager's max/min return the first NaN."""
    x = torch.randn(*shape)
    x[0, 1], x[0, 3], x[1, 0] = float("nan"), float("nan"), float("inf")
    x[2, :] = float("nan")
    x[3, 2], x[3, 4] = float("-inf"), float("nan")
    return x


NAN_CASES = [
    ("argmin", lambda x: x.argmin(1), "aten::argmin"),
    ("argmax", lambda x: x.argmax(1), "aten::argmax"),
    ("argmin-dim0", lambda x: x.argmin(0), "aten::argmin"),
    ("argmax-all", lambda x: x.argmax(), "aten::argmax"),
    ("min-dim", lambda x: x.min(1), "aten::min.dim"),
    ("max-dim-keepdim", lambda x: x.max(1, keepdim=True), "aten::max.dim"),
    ("topk-k1-values", lambda x: torch.topk(x, 1, dim=1)[0], "aten::topk"),
    ("topk-k3", lambda x: torch.topk(x, 3, dim=1), "aten::topk"),
    ("topk-k3-smallest", lambda x: torch.topk(x, 3, dim=1, largest=False), "aten::topk"),
]


@pytest.mark.parametrize("fn,op", [c[1:] for c in NAN_CASES], ids=[c[0] for c in NAN_CASES])
def test_selection_with_nan_matches_eager(fn, op):
    check_traced(fn, _with_nan(4, 6), op=op)


def topk_k1_smallest(x):
    return torch.topk(x, 1, dim=1, largest=False)[0]


def test_topk_k1_smallest_of_floats_falls_back_as_it_skips_nan():
    _, report = check_fn(topk_k1_smallest, _with_nan(4, 6), engines=0, torch_blocks=1)
    assert_falls_back(report, "aten::topk", "skips NaN")


@pytest.mark.parametrize("name, fn", [
    ("msort", torch.msort),
    ("sort_values", lambda x: torch.sort(x, 1)[0]),
    ("sort_descending_values", lambda x: torch.sort(x, dim=0, descending=True).values),
    ("sort_stable_values", lambda x: torch.sort(x, stable=True)[0]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_sorted_values(name, fn):
    x = torch.randint(-3, 3, (5, 6)).float()  # ties
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    check_traced(fn, x)


def test_sort_with_read_indices_stays_in_pytorch():
    _, report = check_traced(lambda x: torch.sort(x)[1] + 1, torch.randn(3, 4), engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::sort", "its indices are read")


@pytest.mark.parametrize("op", [torch.median, torch.nanmedian], ids=lambda v: v.__name__)
@pytest.mark.parametrize("values", ["plain", "nan", "all_nan", "ints"])
def test_median_of_every_element(op, values):
    x = torch.randint(-3, 3, (4, 5)).float()
    if values == "nan":
        x[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
    elif values == "all_nan":
        x[:] = float("nan")
    elif values == "ints":
        x = x.long()
    check_traced(op, x)
    check_traced(op, x[:3])  # an odd count


@pytest.mark.parametrize("op", [torch.cummax, torch.cummin], ids=lambda v: v.__name__)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_running_max_and_min_with_ties_and_nan(op, dim):
    x = torch.randint(-2, 3, (4, 7)).float()  # many ties: the index is the last one holding the value
    x[1, 2], x[1, 5], x[2, 0], x[3, 3], x[3, 4] = float("nan"), float("nan"), float("inf"), -0.0, 0.0
    check_traced(lambda x: op(x, dim), x)
    check_traced(lambda x: op(x, 0), x[0])
