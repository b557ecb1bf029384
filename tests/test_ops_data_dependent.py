"""Ops whose output size depends on the data (nonzero, masked_select, x[mask], unique, unique_consecutive) inside
one engine: their layers size their outputs when they run (an output allocator), and the ops after them work with
that size. Each module is compiled on one example and then called on inputs giving other sizes, empty ones
included, on the default backend and the reference one."""
from __future__ import annotations

import pytest
import torch
from harness import assert_falls_back, assert_matches_eager, check_compiled, check_fn, check_traced, wrap

import torchkiln

BACKENDS = [None, "reference"]  # None: the default backend


def _ints(*shape: int, seed: int = 0) -> torch.Tensor:
    """Small integers: repeats and zeros."""
    return torch.randint(-2, 3, shape, generator=torch.Generator().manual_seed(seed))


def _masked(x):
    y = x[x > 0]
    return y.sum() * 2, y * 3


def _rows(x):
    return x[x.sum(1) > 0] * 2


def _by_size(x):
    y = torch.masked_select(x, x < 0.5)
    return y * y.size(0) + y.numel()


def _nonzero(x):
    return torch.nonzero(x)


def _masked_select_broadcast(x):
    return torch.masked_select(x, x[0] > 0)


def _unique_all(x):
    values, inverse, counts = torch.unique(x, sorted=True, return_inverse=True, return_counts=True)
    return values * 2, inverse, counts


def _unique_values(x):
    return torch.unique(x) + 1


def _unsorted(x):
    return torch.unique(x, sorted=False, return_counts=True)


def _unique_consecutive(x):
    values, inverse, counts = torch.unique_consecutive(x, return_inverse=True, return_counts=True)
    return values, inverse, counts * 2


CASES = [  # name, fn, example, other inputs (each a different size; the last ones give empty results)
    ("masked-sum-mul", _masked, torch.randn(4, 5), [torch.randn(4, 5), -torch.ones(4, 5)]),
    ("masked-rows", _rows, torch.randn(5, 3), [torch.randn(5, 3), -torch.ones(5, 3)]),
    ("masked-select-size", _by_size, torch.randn(6), [torch.randn(6), torch.ones(6)]),
    ("nonzero", _nonzero, _ints(3, 4), [_ints(3, 4, seed=1), torch.zeros(3, 4, dtype=torch.int64)]),
    ("nonzero-float-nan", _nonzero, torch.tensor([[0.0, float("nan")], [-0.0, 2.0]]), [torch.zeros(2, 2)]),
    ("masked-select-broadcast", _masked_select_broadcast, torch.randn(4, 5), [torch.randn(4, 5), -torch.ones(4, 5)]),
    ("unique-int", _unique_all, _ints(4, 5), [_ints(4, 5, seed=1), torch.full((4, 5), 7)]),
    ("unique-float", _unique_all, torch.randn(3, 4).round(), [torch.randn(3, 4).round(), torch.zeros(3, 4)]),
    ("unique-values", _unique_values, _ints(7), [_ints(7, seed=1), torch.zeros(7, dtype=torch.int64)]),
    ("unique-unsorted", _unsorted, torch.randn(12).round(), [torch.randn(12).round(), torch.ones(12)]),
    ("unique-consecutive", _unique_consecutive, _ints(9), [_ints(9, seed=1), torch.ones(9, dtype=torch.int64)]),
]


@pytest.mark.parametrize("backend", BACKENDS, ids=["default", "reference"])
@pytest.mark.parametrize("fn,example,others", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_data_dependent_sizes_in_one_engine(fn, example, others, backend):
    compiled, report = check_fn(fn, example, backend=backend)  # one engine, no PyTorch block
    for x in others:
        with torch.no_grad():
            assert_matches_eager(compiled(x), fn(x))


def test_nonzero_as_tuple_traced():
    compiled, _ = check_traced(lambda x: torch.nonzero(x, as_tuple=True), _ints(3, 4), op="aten::nonzero_numpy")
    for x in (_ints(3, 4, seed=1), torch.zeros(3, 4, dtype=torch.int64)):
        assert_matches_eager(compiled(x), torch.nonzero(x, as_tuple=True))


def test_float_unique_runs_beside_onnx_runtime_sessions(caplog):
    """ONNX declines unique of floats: on the default backend it is a reference segment between ONNX Runtime
    sessions, each binding the sizes it reads off its inputs, instead of the whole engine on the reference backend."""
    x = torch.randn(3, 4).round()
    with caplog.at_level("WARNING", logger="torchkiln"):
        compiled, _ = check_fn(_unique_all, x, backend="onnxruntime")
        for y in (torch.randn(3, 4).round(), torch.zeros(3, 4)):
            assert_matches_eager(compiled(y), _unique_all(y))
    assert "cannot run here" not in caplog.text, caplog.text


def _masked_sum(x):
    return x[x > 0].sum() * 2


def test_mask_indexing_whose_size_changes_is_no_input_error():
    """The size x[mask] gave on the example used to be built into the engine after it (an EngineInputError)."""
    compiled, _ = check_fn(_masked_sum, torch.tensor([1.0, -1.0, 2.0]), engines=None, torch_blocks=None)
    for x in (torch.tensor([1.0, 2.0, 3.0]), torch.tensor([-1.0, -2.0, -3.0])):
        assert_matches_eager(compiled(x), _masked_sum(x))


def _column_and_indices(x):
    return x[x > 0].reshape(-1, 1) * 3, torch.nonzero(x)


@pytest.mark.parametrize("backend", BACKENDS, ids=["default", "reference"])
def test_data_dependent_sizes_with_dynamic_inputs(backend):
    model = torch.jit.script(wrap(_column_and_indices, 1))
    spec = torchkiln.Input(min_shape=(1, 5), opt_shape=(4, 5), max_shape=(8, 5))
    compiled, _ = check_compiled(model, [torch.randn(4, 5)], inputs=[spec], backend=backend, min_block_size=1)
    for x in (torch.randn(1, 5), torch.randn(8, 5), -torch.ones(3, 5)):
        assert_matches_eager(compiled(x), model(x))


def _consecutive_rows(x):
    return torch.unique_consecutive(x, dim=0)


def _mask_on_columns(x):
    return x[:, x[0] > 0]


@pytest.mark.filterwarnings("ignore:.*compiled with 0 engines")
@pytest.mark.parametrize("fn,op,reason", [
    (_consecutive_rows, "aten::unique_consecutive", "along a dim"),
    (_mask_on_columns, "aten::index.Tensor", "after the first index"),
], ids=["consecutive-dim", "mask-on-columns"])
def test_refused_forms_say_why(fn, op, reason):
    _, report = check_fn(fn, _ints(4, 5), engines=None, torch_blocks=None)
    assert_falls_back(report, op, reason)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fn,example,others", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_data_dependent_sizes_on_the_cuda_backend(fn, example, others):
    """On the GPU the cuda backend leaves these engines to the reference backend (its plans replay fixed sizes):
    the values are eager's on CUDA tensors, for every size."""
    device = torch.device("cuda")
    compiled, _ = check_fn(fn, example.to(device), backend="cuda")
    for x in others:
        x = x.to(device)
        with torch.no_grad():
            assert_matches_eager(compiled(x), fn(x))
