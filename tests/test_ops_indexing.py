"""Indexing converters through the whole pipeline against eager: advanced indexing (aten::index),
index_select, gather, scatter, meshgrid."""
import pytest
import torch
from harness import assert_falls_back, assert_matches_eager, check_fn, check_traced

IDX = torch.tensor([2, 0, -1])


def index_one(x, i):
    return x[i], x[:, i], x[:, :, i]


def index_after_ellipsis(x, i):  # TorchScript cannot script this: traced
    return x[..., i]


def index_two_adjacent(x, i, j):
    return x[:, i, j]


def index_two_separated(x, i, j):
    return x[i, :, j]


def index_broadcast(x, i, j):
    return x[i.unsqueeze(1), j]


def index_constant_negative(x):
    return x[:, torch.tensor([-1, 0, -2])] * 2


def index_constant_mask(x):
    return x[torch.tensor([True, False, True])] + 1


def index_runtime_mask(x, mask):
    y = x * 2
    return y[mask]


def index_select(x, i):
    return x.index_select(1, i), torch.index_select(x, -2, i[:2])


def gather(x, i):
    return x.gather(1, i), torch.gather(x, -2, i[:2])


def scatter_src(x, i, s):
    return x.scatter(1, i, s), torch.scatter(x, 0, i[:1], s[:1, :2])


def scatter_value(x, i):
    return x.scatter(1, i, 2.5), x.scatter(-1, i[:, :1], -1)


def meshgrid_ij(a, b):
    x, y = torch.meshgrid(a, b, indexing="ij")
    return x * 2 + y


def meshgrid_xy(a, b, c):
    x, y, z = torch.meshgrid([a, b, c], indexing="xy")
    return x + y * z


def meshgrid_default(a, b):
    x, y = torch.meshgrid([a, b])
    return x, y


R = torch.randn
CASES = [
    (index_one, [R(4, 4, 3), torch.tensor([1, -1, 0, 2])[:3]]),
    (index_two_adjacent, [R(2, 4, 5, 3), torch.tensor([0, 3, -2]), torch.tensor([4, -1, 0])]),
    (index_two_separated, [R(4, 2, 5), torch.tensor([0, 3, -2]), torch.tensor([4, -1, 0])]),
    (index_broadcast, [R(4, 5, 2), torch.tensor([0, 3, -2]), torch.tensor([4, -1])]),
    (index_constant_negative, [R(2, 3)]),
    (index_constant_mask, [R(3, 2)]),
    (index_select, [R(3, 4), torch.tensor([2, 0, 1])]),
    (gather, [R(3, 4), torch.tensor([[0, 2], [1, 1], [2, 0]])]),
    (scatter_src, [R(3, 4), torch.tensor([[0, 2], [1, 2], [2, 0]]), R(3, 2)]),
    (scatter_value, [R(3, 4), torch.tensor([[0, 3], [1, 2], [2, 0]])]),
    (meshgrid_ij, [R(3), R(4)]),
    (meshgrid_xy, [R(3), R(4), R(2)]),
    (meshgrid_default, [R(3), R(())]),
]


@pytest.mark.parametrize("fn, example", CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_indexing_op(fn, example):
    check_fn(fn, *example)


def test_index_after_ellipsis_traced():
    check_traced(index_after_ellipsis, R(4, 4, 3), torch.tensor([1, -1, 0]), op="aten::index.Tensor")


@pytest.mark.parametrize("truncate", [False, True])
def test_int32_and_int64_indices(truncate):
    x, i, j = torch.randint(-9, 9, (5, 4, 3)), torch.tensor([0, 3, -2]), torch.tensor([2, -1, 0], dtype=torch.int32)
    check_fn(index_two_adjacent, x.transpose(0, 1), i[:2], j[:2], truncate_long_and_double=truncate)


def test_runtime_bool_mask_converts_with_its_data_dependent_size():
    # the output size depends on the data: a nonzero layer sizes it when it runs (tests/test_ops_data_dependent.py)
    compiled, _ = check_fn(index_runtime_mask, R(3, 4), R(3, 4) > 0, op="aten::index.Tensor")
    x = R(3, 4)
    for mask in (x > 0.5, torch.zeros(3, 4, dtype=torch.bool), torch.ones(3, 4, dtype=torch.bool)):
        assert_matches_eager(compiled(x, mask), index_runtime_mask(x, mask))


@pytest.mark.parametrize("truncate", [False, True])
def test_gather_with_int32_indices(truncate):
    """torch.gather takes int32 indices too (OpInfo gather); the converter failed on them and fell back."""
    x, i = R(4, 5), torch.randint(0, 4, (3, 5), dtype=torch.int32)
    check_traced(lambda t, j: torch.gather(t, 0, j), x, i, op="aten::gather", truncate_long_and_double=truncate)


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("x, index", [
    (torch.tensor(3.5), torch.tensor([0])),
    (torch.tensor(3.5), torch.tensor([0, 0], dtype=torch.int32)),
    (torch.tensor(3.5), torch.tensor(0, dtype=torch.int32)),
    (torch.tensor([1.5, -2.0, 4.0]), torch.tensor(2)),
], ids=["0-d self", "0-d self int32", "0-d both", "0-d index"])
def test_gather_of_0d_tensor(x, index, backend):
    """torch takes a 0-d self or index of gather as 1-d (OpInfo gather); the gather layer refused it and fell back."""
    check_traced(lambda t, i: torch.gather(t, 0, i) * 2, x, index, op="aten::gather", backend=backend)


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_scatter_with_int32_indices(backend):
    """torch.scatter takes int32 indices too (OpInfo scatter); the scatter layer refused them and fell back."""
    x, src = R(3, 4), R(3, 2)
    i = torch.tensor([[0, 1], [2, 3], [1, 0]], dtype=torch.int32)
    check_traced(lambda t, j, s: torch.scatter(t, 1, j, s), x, i, src, op="aten::scatter.src", backend=backend)
    check_traced(lambda t, j: torch.scatter(t, 0, j, -1.5), x, i.flip(0) % 3, op="aten::scatter.value", backend=backend)


@pytest.mark.parametrize("index", [torch.tensor([0]), torch.tensor(0)], ids=["1-d", "0-d"])
def test_index_select_of_0d_tensor(index):
    """torch picks a 0-d tensor by its one index 0 (OpInfo index_select); the gather layer refused a 0-d input."""
    check_traced(lambda t, i: torch.index_select(t, 0, i) * 2, torch.tensor(3.5), index, op="aten::index_select")


@pytest.mark.parametrize("dim", [0, 1, -1, None])
def test_take_along_dim_of_constant_indices(dim):
    x = torch.randn(3, 5)
    x[0, 0] = float("nan")
    index = torch.randint(0, 5, (1, 5)) if dim in (1, -1) else torch.randint(0, 3, (2, 1)) if dim == 0 else \
        torch.randint(0, 15, (4,))
    check_traced(lambda x: torch.take_along_dim(x, index, dim), x)


def test_take_along_dim_of_run_time_indices_stays_in_pytorch():
    _, report = check_traced(lambda x, i: torch.take_along_dim(x, i, 1) * 2, torch.randn(3, 5), torch.tensor([[-6]]),
                             engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::take_along_dim", "wraps negative ones")


@pytest.mark.parametrize("r, with_replacement", [(1, False), (2, False), (3, False), (2, True)])
def test_combinations(r, with_replacement):
    x = torch.tensor([1.0, float("nan"), -float("inf"), 4.0])
    check_traced(lambda x: torch.combinations(x, r, with_replacement), x)


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_fill_of_constant_indices(dim):
    index = torch.tensor([0, -1, 1])
    check_traced(lambda x: x.index_fill(dim, index, float("nan")), torch.randn(3, 4))
    check_traced(lambda x, v: x.index_fill(dim, index, v), torch.randn(3, 4), torch.tensor(2.5))


@pytest.mark.parametrize("dim", [0, 1])
def test_index_copy_of_constant_indices(dim):
    index = torch.tensor([2, 0])
    source = torch.randn(2, 4) if dim == 0 else torch.randn(3, 2)
    source.view(-1)[0] = float("nan")
    check_traced(lambda x, s: x.index_copy(dim, index, s), torch.randn(3, 4), source)


def test_index_copy_of_repeated_indices_stays_in_pytorch():
    _, report = check_traced(lambda x, s: x.index_copy(0, torch.tensor([1, 1]), s) * 2, torch.randn(3, 4),
                             torch.randn(2, 4), engines=None, torch_blocks=None)
    assert_falls_back(report, "aten::index_copy", "repeated indices")


def test_take_of_constant_indices():
    x = torch.randn(3, 4)
    x[1, 1] = float("nan")
    check_traced(lambda x: torch.take(x, torch.tensor([[0, 5], [11, 5]])), x)
