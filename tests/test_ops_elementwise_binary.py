"""Binary elementwise ops through the whole pipeline against eager: arithmetic, comparison, logical
and bitwise ops on float, int and bool tensors, broadcasting, mixed dtypes, Python scalars and 0-d
tensors, non-contiguous inputs, int64 with truncate_long_and_double, and traced graphs."""
import pytest
import torch
from harness import assert_falls_back, assert_matches_eager, check_compiled, check_fn, check_traced

from torchkiln.compiler import compile_with_report


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


def div_trunc(x, y):
    return torch.div(x, y, rounding_mode="trunc")


ARITHMETIC = [(torch.add, "any"), (torch.sub, "any"), (torch.mul, "any"), (torch.div, "divisor"),
              (div_trunc, "divisor"), (torch.floor_divide, "divisor"), (torch.remainder, "divisor"),
              (torch.fmod, "divisor"), (torch.pow, "pow"), (torch.atan2, "any"), (torch.rsub, "any")]
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
    check_fn(binary(op), operand(domain, sa, torch.float32, "a"), operand(domain, sb, torch.float32, "b"))


DTYPES = [(torch.int64, torch.int64), (torch.int32, torch.int64), (torch.int64, torch.float32),
          (torch.int32, torch.float32)]


@pytest.mark.parametrize("op, domain, dtypes", [(op, domain, dtypes) for op, domain in NUMERIC + BITWISE
                                                 for dtypes in DTYPES
                                                 if (op, domain) not in BITWISE or not dtypes[1].is_floating_point],
                         ids=ids)
def test_binary_integer_and_mixed_dtypes(op, domain, dtypes):
    check_fn(integer_binary(op, domain, dtypes), operand(domain, (3, 4), dtypes[0], "a"),
          operand(domain, (3, 4), dtypes[1], "b"))


@pytest.mark.parametrize("op, domain", COMPARISON + LOGICAL + BITWISE, ids=ids)
def test_binary_bool(op, domain):
    check_fn(binary(op), operand(domain, (3, 4), torch.bool, "a"), operand(domain, (1, 4), torch.bool, "b"))


@pytest.mark.parametrize("op, domain", [(torch.floor_divide, "divisor"), (torch.remainder, "divisor"),
                                        (torch.pow, "pow"), (torch.eq, "any"), (torch.bitwise_xor, "any")], ids=ids)
def test_binary_int64_truncated(op, domain):
    """The engine computes in int32; the result dtype is still eager's."""
    check_fn(integer_binary(op, domain, [torch.int64]), operand(domain, (3, 4), torch.int64, "a"),
          operand(domain, (3, 4), torch.int64, "b"), truncate_long_and_double=True)


@pytest.mark.parametrize("other", [torch.tensor(1.5), torch.tensor(3), torch.tensor(True)], ids=str)
@pytest.mark.parametrize("op", [torch.mul, torch.add, torch.pow, torch.gt, torch.maximum], ids=ids)
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32], ids=str)
def test_binary_zero_dim_operand(op, other, dtype):
    """A 0-d tensor promotes like a scalar: int32 * 0-d int64 stays int32."""
    check_fn(binary(op), operand("pow", (3, 4), dtype, "a"), other)


@pytest.mark.parametrize("op, domain", [(torch.sub, "any"), (torch.atan2, "any"), (torch.remainder, "divisor")],
                         ids=ids)
def test_binary_non_contiguous_inputs(op, domain):
    check_fn(binary(op), operand(domain, (4, 3), torch.float32, "a").t(), operand(domain, (4, 3), torch.float32, "b").t())


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


def ge_int(x):
    return x >= 1


def max_other(x):
    return torch.max(x, x * 0.5)


def minus_float(x):
    return x - 1.5


def div_int(x):
    return x / 4


def div_floor_float(x):
    return torch.div(x, 2.5, rounding_mode="floor")


def div_trunc_int(x):
    return torch.div(x, -3, rounding_mode="trunc")


SCALAR_FORMS = [pow_2, pow_half, two_pow, float_pow, floordiv_2, floordiv_neg_float, mod_3, mod_neg_float,
                scalar_mod, fmod_float, fmod_neg_int, rsub_float, rsub_alpha, scalar_minus, eq_float, gt_int,
                le_float, ne_int, ge_int, max_other, minus_float, div_int, div_floor_float, div_trunc_int]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("fn", SCALAR_FORMS, ids=ids)
def test_binary_python_scalar(fn, dtype):
    """Python scalars promote like wrapped numbers: int tensor // 2 stays int, int tensor % -2.5 is float."""
    check_fn(fn, operand("pow", (3, 4), dtype, "a"))


def and_int(x):
    return x & 3


def or_masks(x):
    return (x > 0) | (x < -2)  # not `mask | True`: TorchScript passes True as the int 1, giving int64


def xor_int(x):
    return x ^ 5


def scalar_and(x):
    return torch.bitwise_and(6, x)


def or_int(x):
    return x | 5


def xor_masks(x):
    return (x > 0) ^ (x < 3)


def bitwise_scalar_forms(x):
    return (torch.bitwise_and(x, 3) + torch.bitwise_or(x, 3) + torch.bitwise_or(6, x) + torch.bitwise_xor(x, 3)
            + torch.bitwise_xor(6, x))


def and_masks(x):
    return (x > 0) & (x < 3)


def not_mask(x):
    return ~(x > 1)


@pytest.mark.parametrize("fn", [and_int, or_int, or_masks, xor_int, xor_masks, scalar_and, bitwise_scalar_forms,
                                and_masks, not_mask], ids=ids)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_bitwise_operators(fn, dtype):
    check_fn(fn, operand("any", (3, 4), dtype, "a"))


def test_int64_scalar_forms_truncated():
    def fn(x):
        return (x // 2) * 3 + x % 4 - (x > 1) * 5
    check_fn(fn, operand("any", (3, 4), torch.int64, "a"), truncate_long_and_double=True)




class TracedForms(torch.nn.Module):
    """Forms as tracing records them: rsub for `1 - x`, a 0-d constant tensor for `x // 2`."""

    def forward(self, x):
        m = x > 1
        return ((1 - x) * (2.5 - x), torch.where(m, x, 0), x.masked_fill(~m, -3), x ** 2, x // 2, x % 3,
                3 ** torch.abs(x), torch.max(x, -x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64], ids=str)
@pytest.mark.parametrize("truncate", [False, True], ids=["", "truncated"])
def test_traced_forms(dtype, truncate):
    x = operand("any", (3, 4), dtype, "a")
    check_compiled(torch.jit.trace(TracedForms(), x), [x], truncate_long_and_double=truncate, min_block_size=1)


def mixed_graph(x):
    y = torch.where(x > 0, x, 0.1 * x).clamp(-1.0, 2.0)
    return torch.sqrt(torch.abs(y)) - y.masked_fill(y < 0.2, -1.0) + (y == 0.5) + torch.remainder(y, 0.75)


def test_float16_precision():
    """With fp16 compute the comparisons, selects and casts still give eager's dtypes."""
    check_fn(mixed_graph, torch.randn(3, 4), enabled_precisions={torch.float16}, rtol=1e-2)


class TracedInplace(torch.nn.Module):
    """In-place forms as tracing records them: `m &= ...` is aten::__iand__, read through its output."""

    def forward(self, x):
        y = x * 2
        y.add_(1)
        y.clamp_(min=0)
        m = y > 1
        m &= y < 3
        m |= y > 4.5
        m ^= y == 0
        y.masked_fill_(m, 0.0)
        return y, m


def test_traced_inplace_forms():
    x = torch.randn(3, 4) * 3
    _, report = check_compiled(torch.jit.trace(TracedInplace(), x), [x], min_block_size=1)
    ops = report.blocks[0].ops
    assert {"aten::__iand__.Tensor", "aten::__ior__.Tensor", "aten::__ixor__.Tensor"} <= set(ops), ops


class Affine(torch.nn.Module):
    """timm ResMLP's Affine: torch.addcmul(beta, alpha, x)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.alpha = torch.nn.Parameter(torch.randn(dim))
        self.beta = torch.nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return torch.addcmul(self.beta, self.alpha, x, value=0.5)


class Standardize(torch.nn.Module):
    """Feature standardization with calibrated statistics: bias + gain * (x - mean) / std (addcdiv)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.register_buffer("mean", torch.randn(dim))
        self.register_buffer("std", torch.rand(dim) + 0.5)
        self.bias = torch.nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return torch.addcdiv(self.bias, x - self.mean, self.std, value=1.5)


class ResetState(torch.nn.Module):
    """A cell whose projected state is reset for a sequence batch (zero_ on an intermediate, in a branch)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        state = self.proj(x)
        if x.dim() == 3:
            state = state.zero_()
        return torch.tanh(x + state)


@pytest.mark.parametrize("model, op", [(Affine(6), "aten::addcmul"), (Standardize(6), "aten::addcdiv"),
                                       (ResetState(6), "aten::zero_")], ids=["addcmul", "addcdiv", "zero_"])
def test_ternary_and_zero_in_real_modules(model, op):
    check_compiled(torch.jit.script(model), [torch.randn(2, 5, 6)], op=op, min_block_size=1)



NAN, INF = float("nan"), float("inf")
# pairs covering NaN on either side, equal and opposite infinities, zeros, and values whose square overflows fp32
SPECIAL_A = torch.tensor([[INF, -INF, NAN, INF, -INF, 1.0, 0.0, 1e30, -3.0],
                          [2.0, NAN, INF, -INF, 0.0, -0.0, 5.0, 1e-30, 100.0]])
SPECIAL_B = torch.tensor([[INF, -INF, 1.0, -INF, 1.0, NAN, 0.0, 1e30, 4.0],
                          [NAN, INF, NAN, NAN, INF, 0.0, -5.0, 1e-30, -100.0]])
COMPOSED = [torch.logaddexp, torch.hypot, torch.fmax, torch.fmin, torch.xlogy]


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("op", COMPOSED, ids=lambda v: v.__name__)
def test_composed_binary_special_values(op, backend):
    """Compositions of existing layers with eager's rules: logaddexp's equal infinities, hypot(inf, nan) = inf
    without overflow, fmax/fmin's non-NaN operand wins, xlogy(0, y) = 0 unless y is NaN."""
    check_fn(binary(op), SPECIAL_A, SPECIAL_B, backend=backend)
    check_fn(binary(op), torch.randn(3, 4) * 5, torch.randn(4) * 5, backend=backend)


@pytest.mark.parametrize("op", [torch.fmax, torch.fmin, torch.xlogy], ids=lambda v: v.__name__)
def test_composed_binary_integer(op):
    check_fn(binary(op), torch.tensor([1, -2, 0, 7]), torch.tensor([3, 0, 2, 7]))


@pytest.mark.parametrize("fn", [lambda x: torch.xlogy(2.0, x), lambda x: torch.xlogy(x, 3.0)],
                         ids=["scalar_x", "scalar_y"])
def test_xlogy_scalar(fn):
    check_traced(fn, SPECIAL_A)


def test_fmax_of_mixed_dtypes_stays_in_pytorch():
    _, report = check_fn(binary(torch.fmax), torch.randn(4), torch.tensor([1, 2, 3, 4]), engines=0, torch_blocks=1)
    assert_falls_back(report, "aten::fmax", "only one real, non-bool dtype")


SPECIAL = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1.0, 2.5, -3.0])
# The special functions of two arguments: rows whose meaning is their ATen op (ONNX has none: the onnxruntime backend
# runs their layers on the reference); (op, a's values, b's values).
SPECIAL_BINARY = [
    (torch.special.zeta, "ge1", "pos"), (torch.igamma, "pos", "pos"), (torch.igammac, "pos", "pos"),
    (torch.nextafter, "any", "any"), (torch.copysign, "any", "any"), (torch.heaviside, "any", "any"),
    (torch.logaddexp2, "any", "any"), (torch.ldexp, "any", "int"), (torch.special.xlog1py, "any", "pos"),
    *((getattr(torch.special, f"{name}_polynomial_{k}"), "unit", "degree") for name, ks in (
        ("chebyshev", "tuvw"), ("shifted_chebyshev", "tuvw"), ("hermite", ("h", "he")), ("laguerre", "l"),
        ("legendre", "p")) for k in ks),
]


def _special_operand(domain, shape=(4, 8)):
    x = torch.rand(shape)
    return {"ge1": x * 3 + 1.1, "pos": x * 4 + 0.1, "any": x * 8 - 4, "unit": x * 1.8 - 0.9,
            "int": torch.randint(-3, 4, shape), "degree": torch.randint(0, 6, shape).float()}[domain]


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
@pytest.mark.parametrize("op, a, b", SPECIAL_BINARY, ids=lambda v: getattr(v, "__name__", None))
def test_special_functions_of_two_arguments(op, a, b, backend):
    x, y = _special_operand(a), _special_operand(b)
    x[0], y[1] = SPECIAL, SPECIAL  # NaN, infinities and signed zeros in each operand
    if op.__name__.endswith(("polynomial_u", "polynomial_w")):
        x[0, 0] = 0.25  # eager's Chebyshev U and W of NaN read uninitialized memory (a value that varies per call)
    if b in ("int", "degree"):
        y[1] = torch.arange(8) - 2
    check_fn(binary(op), x, y, backend=backend)  # one engine, no op left in PyTorch
    check_traced(lambda x: op(x, torch.tensor(2.0 if b != "int" else 2)), x, backend=backend)


@pytest.mark.parametrize("weight", [0.3, -0.7, 0.5, 2.0, "tensor"])
def test_lerp(weight):
    x, end = torch.randn(4, 8), torch.randn(4, 8)
    x[0], end[1] = SPECIAL, SPECIAL
    if weight == "tensor":
        w = torch.randn(4, 8)
        w[2] = SPECIAL
        check_fn(torch.lerp, x, end, w)
    else:
        check_traced(lambda a, b: torch.lerp(a, b, weight), x, end)


@pytest.mark.parametrize("invert", [False, True])
def test_isin(invert):
    x = torch.tensor([[1.0, 2.0, float("nan")], [float("inf"), 0.0, -0.0]])
    check_traced(lambda x, t: torch.isin(x, t, invert=invert), x, torch.tensor([0.0, 2.0, float("nan"), 7.0]))
    check_traced(lambda x: torch.isin(x, 2.0, invert=invert), x)


@pytest.mark.parametrize("right", [False, True])
@pytest.mark.parametrize("out_int32", [False, True])
def test_bucketize_with_sorted_constant_boundaries(right, out_int32):
    boundaries = torch.tensor([-1.0, 0.0, 0.0, 2.5, float("inf")])
    x = torch.tensor([[-2.0, -1.0, 0.0, 1.0, float("nan")], [2.5, 3.0, float("inf"), -float("inf"), -0.0]])
    check_traced(lambda x: torch.bucketize(x, boundaries, right=right, out_int32=out_int32), x)


def test_bucketize_with_unsorted_boundaries_stays_in_pytorch():
    _, report = check_traced(lambda x: torch.bucketize(x, torch.tensor([1.0, 0.0])) + 1, torch.randn(4), engines=None,
                             torch_blocks=None)
    assert_falls_back(report, "aten::bucketize.Tensor", "not a sorted 1-d tensor")


def test_float_power_computes_in_float64():
    x, y = torch.rand(3, 4) * 3, torch.randn(3, 4)
    x[0, :3] = SPECIAL[:3]
    check_fn(torch.float_power, x, y)
    check_traced(lambda x: torch.float_power(x, 2.5), x)
    check_fn(torch.float_power, torch.randint(1, 5, (3, 4)), torch.randint(0, 3, (3, 4)))


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_of_a_sorted_constant_sequence(side):
    sequence = torch.tensor([-1.0, 0.0, 0.0, 2.5])
    x = torch.tensor([[-2.0, -1.0, 0.0, 1.0, float("nan")], [2.5, 3.0, float("inf"), -float("inf"), -0.0]])
    check_traced(lambda x: torch.searchsorted(sequence, x, side=side), x)


@pytest.mark.parametrize("kwargs", [{}, {"equal_nan": True}, {"rtol": 0.0, "atol": 0.0}, {"rtol": 0.1, "atol": 0.5}])
def test_isclose(kwargs):
    a = torch.tensor([[1.0, float("nan"), float("inf"), -float("inf"), 0.0, 1e10],
                      [1.0, 2.0, 3.0, float("inf"), -0.0, 1e10 + 1e5]])
    check_traced(lambda a, b: torch.isclose(a, b, **kwargs), a, a.flip(0))


NUMPY_NAMES = """
graph(%x : Tensor, %y : Tensor):
  %two : int = prim::Constant[value=2]()
  %scale : float = prim::Constant[value=2.5]()
  %floor : str = prim::Constant[value="floor"]()
  %a : Tensor = aten::multiply(%x, %y)
  %b : Tensor = aten::multiply(%x, %scale)
  %c : Tensor = aten::subtract(%x, %y, %two)
  %d : Tensor = aten::divide(%x, %y)
  %e : Tensor = aten::divide(%x, %y, %floor)
  %r : (Tensor, Tensor, Tensor, Tensor, Tensor) = prim::TupleConstruct(%a, %b, %c, %d, %e)
  return (%r)
"""


def test_numpy_named_aliases():
    """multiply, subtract and divide: scripting renames them mul, sub and div, a trace of ConvBert keeps them
    (`torch.multiply(mixed_key_conv_attn_layer, mixed_query_layer)`)."""
    fn = torch._C._create_function_from_graph("numpy_names", torch._C.parse_ir(NUMPY_NAMES))
    x, y = torch.randn(3, 4), torch.randn(3, 4) + 3
    compiled, report = compile_with_report(fn, [x, y], min_block_size=1)
    assert report.num_engine_blocks == 1 and report.num_torch_blocks == 0, report
    assert_matches_eager(compiled(x, y), (torch.multiply(x, y), torch.multiply(x, 2.5), torch.subtract(x, y, alpha=2),
                                          torch.divide(x, y), torch.divide(x, y, rounding_mode="floor")))
