"""Binary elementwise ops through the whole pipeline against eager: arithmetic, comparison, logical
and bitwise ops on float, int and bool tensors, broadcasting, mixed dtypes, Python scalars and 0-d
tensors, non-contiguous inputs, int64 with truncate_long_and_double, and the in-place forms."""
import pytest
import torch
from harness import check_fn
from ops_testing import check, inplace_in_engine, through_if2


def binary(op):
    def fn(x, y):
        return op(x, y)
    fn.__name__ = op.__name__
    return fn


def odd_divisor(op):
    """op(x, 2y + 1): an odd integer divisor is never 0, also on the random inputs that shape analysis
    runs the graph on (an integer division by 0 raises)."""
    def fn(x, y):
        return op(x, y * 2 + 1)
    fn.__name__ = op.__name__
    return fn


def integer_binary(op, domain, dtypes):
    return odd_divisor(op) if domain == "divisor" and not any(d.is_floating_point for d in dtypes) else binary(op)


def operand(domain, shape, dtype, role):
    """A tensor inside the op's domain: `role` is 'a' (first operand) or 'b' (second)."""
    if dtype == torch.bool:
        return torch.rand(shape) > 0.5
    if dtype.is_floating_point:
        x = torch.rand(shape)
        if domain == "pow":
            return (x * 2 + 0.5 if role == "a" else x * 4 - 2).to(dtype)
        if domain == "divisor" and role == "b":
            return ((x * 4 + 0.5) * torch.where(torch.rand(shape) > 0.5, 1.0, -1.0)).to(dtype)
        return (x * 8 - 4).to(dtype)
    if domain == "pow":
        return torch.randint(0, 4, shape, dtype=dtype)
    if domain == "divisor" and role == "b":
        return torch.randint(1, 5, shape, dtype=dtype) * (torch.randint(0, 2, shape, dtype=dtype) * 2 - 1)
    return torch.randint(-6, 7, shape, dtype=dtype)


ARITHMETIC = [(torch.add, "any"), (torch.sub, "any"), (torch.mul, "any"), (torch.div, "divisor"),
              (torch.floor_divide, "divisor"), (torch.remainder, "divisor"), (torch.fmod, "divisor"),
              (torch.pow, "pow"), (torch.atan2, "any"), (torch.rsub, "any")]
COMPARISON = [(op, "any") for op in (torch.eq, torch.ne, torch.gt, torch.ge, torch.lt, torch.le,
                                     torch.maximum, torch.minimum, torch.max, torch.min)]
LOGICAL = [(op, "any") for op in (torch.logical_and, torch.logical_or, torch.logical_xor)]
BITWISE = [(op, "any") for op in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor)]
NUMERIC = ARITHMETIC + COMPARISON + LOGICAL
ids = lambda v: getattr(v, "__name__", str(v))  # noqa: E731

SHAPES = [((3, 4), (3, 4)), ((3, 1, 5), (4, 5)), ((4,), (2, 3, 4))]


@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("op, domain", NUMERIC, ids=ids)
def test_binary_float32_broadcasting(op, domain, shapes):
    (sa, sb) = shapes
    check(binary(op), operand(domain, sa, torch.float32, "a"), operand(domain, sb, torch.float32, "b"))


DTYPES = [(torch.int64, torch.int64), (torch.int32, torch.int64), (torch.int64, torch.float32),
          (torch.int32, torch.float32)]


@pytest.mark.parametrize("op, domain, dtypes", [(op, domain, dtypes) for op, domain in NUMERIC + BITWISE
                                                 for dtypes in DTYPES
                                                 if (op, domain) not in BITWISE or not dtypes[1].is_floating_point],
                         ids=ids)
def test_binary_integer_and_mixed_dtypes(op, domain, dtypes):
    check(integer_binary(op, domain, dtypes), operand(domain, (3, 4), dtypes[0], "a"),
          operand(domain, (3, 4), dtypes[1], "b"))


@pytest.mark.parametrize("op, domain", COMPARISON + LOGICAL + BITWISE, ids=ids)
def test_binary_bool(op, domain):
    check(binary(op), operand(domain, (3, 4), torch.bool, "a"), operand(domain, (1, 4), torch.bool, "b"))


@pytest.mark.parametrize("op, domain", [(torch.floor_divide, "divisor"), (torch.remainder, "divisor"),
                                        (torch.pow, "pow"), (torch.eq, "any"), (torch.bitwise_xor, "any")], ids=ids)
def test_binary_int64_truncated(op, domain):
    """The engine computes in int32; the result dtype is still eager's."""
    check(integer_binary(op, domain, [torch.int64]), operand(domain, (3, 4), torch.int64, "a"),
          operand(domain, (3, 4), torch.int64, "b"), truncate_long_and_double=True)


@pytest.mark.parametrize("other", [torch.tensor(1.5), torch.tensor(3), torch.tensor(True)], ids=str)
@pytest.mark.parametrize("op", [torch.mul, torch.add, torch.pow, torch.gt, torch.maximum], ids=ids)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=str)
def test_binary_zero_dim_operand(op, other, dtype):
    """A 0-d tensor promotes like a scalar: int32 * 0-d int64 stays int32."""
    check(binary(op), operand("pow", (3, 4), dtype, "a"), other)


@pytest.mark.parametrize("op, domain", [(torch.sub, "any"), (torch.atan2, "any"), (torch.remainder, "divisor")],
                         ids=ids)
def test_binary_non_contiguous_inputs(op, domain):
    check(binary(op), operand(domain, (4, 3), torch.float32, "a").t(), operand(domain, (4, 3), torch.float32, "b").t())


# Python-scalar operands: each a named function, as a scripted graph holds them.
def pow_2(x):
    return x ** 2


def pow_half(x):
    return torch.abs(x) ** 0.5


def two_pow(x):
    return 2 ** x


def float_pow(x):
    return 1.5 ** x


def floordiv_2(x):
    return x // 2


def floordiv_neg_float(x):
    return x // -1.5


def mod_3(x):
    return x % 3


def mod_neg_float(x):
    return x % -2.5


def scalar_mod(x):
    return torch.remainder(5, x * 2 + 1)


def fmod_float(x):
    return torch.fmod(x, 2.5)


def fmod_neg_int(x):
    return torch.fmod(x, -2)


def rsub_float(x):
    return torch.rsub(x, 2.5)


def rsub_alpha(x):
    return torch.rsub(x, 4, alpha=2)


def scalar_minus(x):
    return 1 - x


def eq_float(x):
    return x == 0.5


def gt_int(x):
    return x > 1


def le_float(x):
    return x <= 2.5


def ne_int(x):
    return x != 2


def max_other(x):
    return torch.max(x, x * 0.5)


SCALAR_FORMS = [pow_2, pow_half, two_pow, float_pow, floordiv_2, floordiv_neg_float, mod_3, mod_neg_float,
                scalar_mod, fmod_float, fmod_neg_int, rsub_float, rsub_alpha, scalar_minus, eq_float, gt_int,
                le_float, ne_int, max_other]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("fn", SCALAR_FORMS, ids=ids)
def test_binary_python_scalar(fn, dtype):
    """Python scalars promote like wrapped numbers: int tensor // 2 stays int, int tensor % -2.5 is float."""
    check(fn, operand("pow", (3, 4), dtype, "a"))


def and_int(x):
    return x & 3


def or_masks(x):
    return (x > 0) | (x < -2)  # not `mask | True`: TorchScript passes True as the int 1, giving int64


def xor_int(x):
    return x ^ 5


def scalar_and(x):
    return torch.bitwise_and(6, x)


def and_masks(x):
    return (x > 0) & (x < 3)


def not_mask(x):
    return ~(x > 1)


@pytest.mark.parametrize("fn", [and_int, or_masks, xor_int, scalar_and, and_masks, not_mask], ids=ids)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_bitwise_operators(fn, dtype):
    check(fn, operand("any", (3, 4), dtype, "a"))


def test_int64_scalar_forms_truncated():
    def fn(x):
        return (x // 2) * 3 + x % 4 - (x > 1) * 5
    check(fn, operand("any", (3, 4), torch.int64, "a"), truncate_long_and_double=True)


# In-place forms of binary ops.
def add_(y, other):
    return y.add_(other)


def eq_(y, other):
    return y.eq_(other)


def gt_scalar_(y, other):
    return y.gt_(0.5)


def floor_divide_(y, other):
    return y.floor_divide_(other * 2 + 1)


def remainder_(y, other):
    return y.remainder_(other)


def pow_(y, other):
    return y.pow_(2)


def logical_and_(y, other):
    return y.logical_and_(other)


def bitwise_and_(y, other):
    return y.bitwise_and_(other)


INPLACE = [
    (add_, "aten::add_.Tensor", torch.float16, torch.float32),  # the half target stays half
    (eq_, "aten::eq_.Tensor", torch.float32, torch.float32),  # stays float, unlike eq
    (gt_scalar_, "aten::gt_.Scalar", torch.float32, torch.float32),
    (floor_divide_, "aten::floor_divide_.Tensor", torch.int64, torch.int64),
    (remainder_, "aten::remainder_.Tensor", torch.float32, torch.float32),
    (pow_, "aten::pow_.Scalar", torch.int32, torch.int32),
    (logical_and_, "aten::logical_and_", torch.float32, torch.bool),
    (bitwise_and_, "aten::bitwise_and_.Tensor", torch.int64, torch.int64),
]


@pytest.mark.parametrize("fn, op, dtype, other_dtype", INPLACE, ids=ids)
def test_binary_inplace_converts(fn, op, dtype, other_dtype):
    inplace_in_engine(through_if2(fn), op, operand("divisor", (3, 4), dtype, "a"),
                      operand("divisor", (3, 4), other_dtype, "b"))


def test_binary_inplace_on_a_view_stays_in_pytorch():
    """`y.t().mul_(2)` writes through a view: converting it functionally would lose the write."""
    def fn(x):
        y = x * 2
        z = y.t()
        z.mul_(2)
        return y + 1
    _, report = check_fn(fn, torch.randn(3, 4), engines=None, torch_blocks=None)
    assert "aten::mul_.Scalar" in report.fallback_ops
