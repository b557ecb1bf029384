"""where, masked_fill and clamp through the whole pipeline against eager: tensor and scalar branches
and bounds, broadcasting, the dtype eager gives (an int tensor clamped to 0.5 is float), NaN,
int64 with truncate_long_and_double, and bounds the engine cannot hold."""
import pytest
import torch
from harness import check_fn

ids = lambda v: getattr(v, "__name__", str(v))  # noqa: E731


def ints(*shape):
    return torch.randint(-6, 7, shape)


def mask(*shape):
    return torch.rand(shape) > 0.5


# ---- where ---------------------------------------------------------------------------------
def where_tensors(c, x, y):
    return torch.where(c, x, y)


def where_scalar_other(x):
    return torch.where(x > 0, x, 0.0)


def where_scalar_self(x):
    return torch.where(x > 1, 1.5, x)


def where_float_scalars(x):
    return torch.where(x > 0, 1.0, 0)


def where_int_scalars(x):
    return torch.where(x > 0, 2, -1)


@pytest.mark.parametrize("x, y", [(torch.randn(3, 1, 5), torch.randn(4, 5)), (ints(3, 4), torch.randn(3, 4)),
                                  (ints(3, 4), ints(1, 4).int())], ids=["broadcast", "int-float", "int64-int32"])
def test_where_tensors(x, y):
    check_fn(where_tensors, mask(3, 4, 5) if x.dim() == 3 else mask(3, 4), x, y)


@pytest.mark.parametrize("fn", [where_scalar_other, where_scalar_self, where_float_scalars, where_int_scalars],
                         ids=ids)
@pytest.mark.parametrize("x", [torch.randn(3, 4) * 2, ints(3, 4)], ids=["float32", "int64"])
def test_where_scalars(fn, x):
    """Scalar branches promote like wrapped numbers: an int64 tensor with 0.0 gives float32."""
    check_fn(fn, x)


def test_where_int64_truncated():
    check_fn(where_int_scalars, ints(3, 4), truncate_long_and_double=True)


# ---- masked_fill -----------------------------------------------------------------------------
def fill_float(x, m):
    return x.masked_fill(m, 2.5)


def fill_neg_inf(x, m):
    return x.masked_fill(m, float("-inf"))


def fill_tensor(x, m, v):
    return x.masked_fill(m, v)


@pytest.mark.parametrize("fn", [fill_float, fill_neg_inf], ids=ids)
def test_masked_fill_scalar(fn):
    check_fn(fn, torch.randn(3, 4), mask(3, 4))


def test_masked_fill_float_value_on_int_tensor_truncates():
    check_fn(fill_float, ints(3, 4), mask(3, 4))


def test_masked_fill_mask_broadcasts_the_input():
    check_fn(fill_float, torch.randn(4), mask(2, 4))


@pytest.mark.parametrize("v", [torch.tensor(-7.0, dtype=torch.float64), torch.tensor(3)], ids=str)
def test_masked_fill_tensor_value_takes_input_dtype(v):
    check_fn(fill_tensor, torch.randn(3, 4), mask(1, 4), v)


def test_masked_fill_int64_truncated():
    check_fn(fill_float, ints(3, 4), mask(3, 4), truncate_long_and_double=True)


# ---- clamp -----------------------------------------------------------------------------------
def clamp_both(x):
    return torch.clamp(x, -0.5, 0.25)


def clamp_min_only(x):
    return torch.clamp(x, min=0.5)


def clamp_max_int(x):
    return torch.clamp(x, max=1)


def clamp_int_bounds(x):
    return x.clamp(-2, 3)


def clamp_integral_float_bounds(x):
    return torch.clamp(x, 0.0, 5.0)


def clip_both(x):
    return torch.clip(x, -1, 1)


def clamp_min_fn(x):
    return torch.clamp_min(x, 0.5)


def clamp_max_fn(x):
    return torch.clamp_max(x, 2)


SCALAR_CLAMPS = [clamp_both, clamp_min_only, clamp_max_int, clamp_int_bounds, clamp_integral_float_bounds,
                 clip_both, clamp_min_fn, clamp_max_fn]


@pytest.mark.parametrize("fn", SCALAR_CLAMPS, ids=ids)
@pytest.mark.parametrize("x", [torch.randn(3, 4) * 3, ints(3, 4), ints(3, 4).int()], ids=["float32", "int64", "int32"])
def test_clamp_scalar_bounds(fn, x):
    """Integer tensors stay integer with int bounds and become float with float bounds, as in eager."""
    check_fn(fn, x)


def test_clamp_keeps_nan_and_infinities():
    check_fn(clamp_both, torch.tensor([float("nan"), float("inf"), -float("inf"), 0.1, -3.0]))


@pytest.mark.parametrize("fn", [clamp_int_bounds, clamp_integral_float_bounds], ids=ids)
def test_clamp_int64_truncated(fn):
    check_fn(fn, ints(3, 4), truncate_long_and_double=True)


def clamp_tensors(x, lo, hi):
    return torch.clamp(x, lo, hi)


def clamp_tensor_min(x, lo):
    return torch.clamp(x, min=lo)


def clamp_min_tensor(x, lo):
    return torch.clamp_min(x, lo)


def clamp_max_tensor(x, hi):
    return torch.clamp_max(x, hi)


def test_clamp_tensor_bounds_broadcast():
    check_fn(clamp_tensors, torch.randn(3, 1, 5), torch.rand(4, 5) - 1, torch.rand(5))


@pytest.mark.parametrize("fn", [clamp_tensor_min, clamp_min_tensor, clamp_max_tensor], ids=ids)
@pytest.mark.parametrize("x, bound", [(torch.randn(3, 4), torch.randn(4)), (ints(3, 4), torch.randn(3, 4))],
                         ids=["float32", "int64-float-bound"])
def test_clamp_one_tensor_bound(fn, x, bound):
    check_fn(fn, x, bound)


def clamp_huge_int(x):
    return torch.clamp(x, max=4611686018427387905)  # 2**62 + 1 (TorchScript makes 2 ** 62 a float)


def test_clamp_bound_without_exact_float_stays_in_pytorch():
    _, report = check_fn(clamp_huge_int, ints(3, 4), engines=0, torch_blocks=1)
    assert "no exact float value" in report.blocks[0].fallback[0].detail
