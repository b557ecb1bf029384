"""Unary elementwise ops through the whole pipeline against eager: every op on float, int and bool
inputs (integer inputs to float functions give float), special values, non-contiguous and 0-d
inputs, and int64 with truncate_long_and_double (in-place forms: test_ops_elementwise_inplace.py)."""
import pytest
import torch
from harness import check_fn, check_traced


def unary(op):
    def fn(x):
        return op(x)
    fn.__name__ = op.__name__
    return fn


def values(domain, shape=(3, 4), dtype=torch.float32):
    """Inputs inside an op's domain."""
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if not dtype.is_floating_point:
        low = 1 if domain in ("pos", "ge1") else (0 if domain == "unit" else -5)
        return torch.randint(low, 2 if domain == "unit" else 6, shape, dtype=dtype)
    x = torch.rand(shape)
    return {"any": x * 6 - 3, "pos": x * 4 + 0.1, "unit": x * 1.8 - 0.9, "ge1": x * 3 + 1.0}[domain].to(dtype)


# op, domain, whether it takes integer inputs, whether it takes bool inputs
UNARY = [
    (torch.abs, "any", True, False), (torch.neg, "any", True, False), (torch.sign, "any", True, True),
    (torch.reciprocal, "pos", True, True), (torch.square, "any", True, True),
    (torch.exp, "any", True, True), (torch.expm1, "any", True, False), (torch.log, "pos", True, False),
    (torch.log2, "pos", True, False), (torch.log10, "pos", True, False), (torch.log1p, "pos", True, True),
    (torch.sqrt, "pos", True, True), (torch.rsqrt, "pos", True, False), (torch.erf, "any", True, False),
    (torch.erfinv, "unit", True, False),
    (torch.sin, "any", True, False), (torch.cos, "any", True, False), (torch.tan, "unit", True, False),
    (torch.asin, "unit", True, False), (torch.acos, "unit", True, False), (torch.atan, "any", True, False),
    (torch.sinh, "any", True, False), (torch.cosh, "any", True, False), (torch.asinh, "any", True, False),
    (torch.acosh, "ge1", True, False), (torch.atanh, "unit", True, False),
    (torch.ceil, "any", True, False), (torch.floor, "any", True, False), (torch.round, "any", True, False),
    (torch.trunc, "any", True, False), (torch.logical_not, "any", True, True),
    (torch.bitwise_not, "any", True, True), (torch.isinf, "any", True, True), (torch.isnan, "any", True, True),
    (torch.isfinite, "any", True, True), (torch.isneginf, "any", True, True), (torch.isposinf, "any", True, True),
]
FLOAT_ONLY = {torch.bitwise_not}  # bitwise_not has no float kernel


@pytest.mark.parametrize("op, domain", [(op, d) for op, d, _, _ in UNARY if op not in FLOAT_ONLY],
                         ids=lambda v: getattr(v, "__name__", v))
def test_unary_float32(op, domain):
    check_fn(unary(op), values(domain))


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("op, domain", [(op, d) for op, d, ints, _ in UNARY if ints],
                         ids=lambda v: getattr(v, "__name__", v))
def test_unary_integer_gives_eager_dtype(op, domain, dtype):
    check_fn(unary(op), values(domain, dtype=dtype))


@pytest.mark.parametrize("op", [op for op, _, _, bools in UNARY if bools], ids=lambda v: v.__name__)
def test_unary_bool(op):
    check_fn(unary(op), values("any", dtype=torch.bool))


@pytest.mark.parametrize("op", [torch.sqrt, torch.abs, torch.sign, torch.exp, torch.bitwise_not, torch.round],
                         ids=lambda v: v.__name__)
def test_unary_int64_truncated(op):
    """With truncate_long_and_double the engine computes in int32; the output dtype is still eager's."""
    check_fn(unary(op), values("pos", dtype=torch.int64), truncate_long_and_double=True)


SPECIAL = torch.tensor([[0.5, 1.5, 2.5, -0.5, -2.5, 0.0], [float("inf"), -float("inf"), float("nan"), -0.0, 1e30, 3.7]])


@pytest.mark.parametrize("op", [torch.round, torch.isinf, torch.isneginf, torch.isposinf, torch.isnan, torch.isfinite,
                                torch.sign, torch.abs, torch.trunc, torch.ceil, torch.floor, torch.exp],
                         ids=lambda v: v.__name__)
def test_unary_special_values(op):
    """Half-to-even rounding, infinities, NaN and signed zero, as eager treats them."""
    check_fn(unary(op), SPECIAL)


@pytest.mark.parametrize("op", [torch.sqrt, torch.neg, torch.isfinite], ids=lambda v: v.__name__)
def test_unary_non_contiguous_input(op):
    check_fn(unary(op), torch.rand(4, 3).t())


@pytest.mark.parametrize("op", [torch.exp, torch.neg, torch.logical_not], ids=lambda v: v.__name__)
def test_unary_zero_dim_input(op):
    check_fn(unary(op), torch.tensor(0.7))


def python_abs(x):
    return abs(x)


def round_2(x):
    return torch.round(x, decimals=2)


def round_minus_1(x):
    return torch.round(x, decimals=-1)


def neg_then_mul(x):
    return -x * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("fn", [python_abs, round_2, round_minus_1, neg_then_mul], ids=lambda f: f.__name__)
def test_unary_forms(fn, dtype):
    check_fn(fn, (values("any") * 40).to(dtype))



COMPOSED = [torch.positive, torch.resolve_conj, torch.resolve_neg, torch.sgn, torch.deg2rad, torch.rad2deg,
            torch.exp2, torch.frac]


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("op", COMPOSED, ids=lambda v: v.__name__)
def test_composed_unary_special_values(op, backend):
    """Identities and compositions of existing layers, with eager's NaN and infinities (frac(+-inf) is NaN)."""
    check_fn(unary(op), SPECIAL, backend=backend)
    check_fn(unary(op), values("any") * 100, backend=backend)


@pytest.mark.parametrize("op", [op for op in COMPOSED if op is not torch.frac], ids=lambda v: v.__name__)
def test_composed_unary_integer_gives_eager_dtype(op):
    check_fn(unary(op), values("any", dtype=torch.int64))


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("op", [torch.ops.aten.alias, torch.ops.aten.alias_copy], ids=str)
def test_alias_is_identity(op, backend):
    check_traced(lambda x: op(x), SPECIAL, backend=backend)


# Special functions: rows whose meaning is their ATen op (ONNX has none: the onnxruntime backend runs their layers on
# the reference), on values in their domain, NaN, infinities, signed zeros, and integers (which give float).
SPECIAL_FUNCTIONS = [
    torch.lgamma, torch.digamma, torch.erfc, torch.special.erfcx, torch.sinc, torch.i0, torch.special.i0e,
    torch.special.i1, torch.special.i1e, torch.special.ndtr, torch.special.ndtri, torch.special.log_ndtr,
    torch.special.entr, torch.special.airy_ai, torch.special.bessel_j0, torch.special.bessel_j1,
    torch.special.bessel_y0, torch.special.bessel_y1, torch.special.modified_bessel_i0,
    torch.special.modified_bessel_i1, torch.special.modified_bessel_k0, torch.special.modified_bessel_k1,
    torch.special.scaled_modified_bessel_k0, torch.special.scaled_modified_bessel_k1,
    torch.special.spherical_bessel_j0, torch.signbit,
]


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("op", SPECIAL_FUNCTIONS, ids=lambda v: v.__name__)
def test_special_functions(op, backend):
    x = torch.cat([values("pos", (2, 6)) * 2, values("any", (1, 6)), SPECIAL, torch.tensor([[0.3, 0.7, -0.0, 1.0,
                                                                                              -1.0, 0.5]])])
    check_fn(unary(op), x, backend=backend)  # one engine, no op left in PyTorch
    check_fn(unary(op), values("pos", dtype=torch.int64), backend=backend)


@pytest.mark.parametrize("kwargs", [{}, {"nan": 1.5, "posinf": 9.0, "neginf": -9.0}, {"posinf": 2.0}])
def test_nan_to_num(kwargs):
    check_traced(lambda x: torch.nan_to_num(x, **kwargs), SPECIAL)
    check_traced(lambda x: torch.nan_to_num(x, **kwargs) + 1, SPECIAL.half())
    check_traced(lambda x: torch.nan_to_num(x, **kwargs), torch.arange(6).reshape(2, 3))  # integers: unchanged


@pytest.mark.parametrize("op", [torch.isreal, torch.angle], ids=lambda v: v.__name__)
def test_real_tensor_properties(op):
    check_fn(unary(op), SPECIAL)
