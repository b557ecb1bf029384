"""Every in-place overload (`y.op_(...)`) through the whole pipeline against eager.

Each case acts on an intermediate `y = x * 2` inside an `if` on x's rank: the `if` is folded only at
partitioning, after lowering's RemoveTensorMutation ran, so the in-place node itself reaches its
converter (asserted). The result keeps y's dtype: `y.eq_(z)` stays float, a half `y.add_(f)` stays half.
In-place ops that would lose a write (on a method input, through a view) stay in PyTorch.
"""
import pytest
import torch
from harness import check_fn

from torchkiln.analysis import registry
from torchkiln.conversion import load_all

VALUES = {
    "float": lambda: torch.randn(3, 4) * 3,
    "pos": lambda: torch.rand(3, 4) * 2 + 0.1,
    "unit": lambda: torch.rand(3, 4) * 0.8 - 0.4,  # y = 2x in (-0.8, 0.8)
    "ge1": lambda: torch.rand(3, 4) + 0.6,  # y = 2x in [1.2, 3.2]
    "int": lambda: torch.randint(-6, 7, (3, 4)),
    "half": lambda: torch.randn(3, 4).half(),
    "row": lambda: torch.randn(4),
    "int_row": lambda: torch.randint(-6, 7, (4,)),
    "mask": lambda: torch.rand(3, 4) > 0.5,
}

# (expression of y and other, the in-place overload it calls, x, other)
INPLACE = [
    ("y.abs_()", "aten::abs_", "float", None), ("y.neg_()", "aten::neg_", "int", None),
    ("y.sign_()", "aten::sign_", "float", None), ("y.reciprocal_()", "aten::reciprocal_", "pos", None),
    ("y.square_()", "aten::square_", "int", None), ("y.exp_()", "aten::exp_", "float", None),
    ("y.expm1_()", "aten::expm1_", "float", None), ("y.log_()", "aten::log_", "pos", None),
    ("y.log2_()", "aten::log2_", "pos", None), ("y.log10_()", "aten::log10_", "pos", None),
    ("y.log1p_()", "aten::log1p_", "pos", None), ("y.sqrt_()", "aten::sqrt_", "pos", None),
    ("y.rsqrt_()", "aten::rsqrt_", "pos", None), ("y.erf_()", "aten::erf_", "float", None),
    ("y.erfinv_()", "aten::erfinv_", "unit", None),
    ("y.sin_()", "aten::sin_", "float", None), ("y.cos_()", "aten::cos_", "float", None),
    ("y.tan_()", "aten::tan_", "unit", None), ("y.asin_()", "aten::asin_", "unit", None),
    ("y.acos_()", "aten::acos_", "unit", None), ("y.atan_()", "aten::atan_", "float", None),
    ("y.sinh_()", "aten::sinh_", "float", None), ("y.cosh_()", "aten::cosh_", "float", None),
    ("y.asinh_()", "aten::asinh_", "float", None), ("y.acosh_()", "aten::acosh_", "ge1", None),
    ("y.atanh_()", "aten::atanh_", "unit", None), ("y.ceil_()", "aten::ceil_", "float", None),
    ("y.floor_()", "aten::floor_", "float", None), ("y.round_()", "aten::round_", "float", None),
    ("y.round_(decimals=1)", "aten::round_.decimals", "float", None), ("y.trunc_()", "aten::trunc_", "float", None),
    ("y.bitwise_not_()", "aten::bitwise_not_", "int", None),
    ("y.add_(other)", "aten::add_.Tensor", "half", "float"), ("y.add_(2)", "aten::add_.Scalar", "int", None),
    ("y.sub_(other)", "aten::sub_.Tensor", "float", "row"), ("y.sub_(1.5)", "aten::sub_.Scalar", "float", None),
    ("y.mul_(other)", "aten::mul_.Tensor", "int", "int_row"), ("y.mul_(3)", "aten::mul_.Scalar", "int", None),
    ("y.div_(other)", "aten::div_.Tensor", "float", "row"), ("y.div_(4)", "aten::div_.Scalar", "float", None),
    ("y.div_(other, rounding_mode='floor')", "aten::div_.Tensor_mode", "float", "row"),
    ("y.div_(3, rounding_mode='trunc')", "aten::div_.Scalar_mode", "float", None),
    ("y.floor_divide_(other * 2 + 1)", "aten::floor_divide_.Tensor", "int", "int_row"),
    ("y.floor_divide_(2)", "aten::floor_divide_.Scalar", "int", None),
    ("y.remainder_(other)", "aten::remainder_.Tensor", "float", "row"),
    ("y.remainder_(3)", "aten::remainder_.Scalar", "int", None),
    ("y.fmod_(other)", "aten::fmod_.Tensor", "float", "row"), ("y.fmod_(2.5)", "aten::fmod_.Scalar", "float", None),
    ("y.pow_(other)", "aten::pow_.Tensor", "pos", "row"), ("y.pow_(2)", "aten::pow_.Scalar", "int", None),
    ("y.atan2_(other)", "aten::atan2_", "float", "row"),
    ("y.lgamma_()", "aten::lgamma_", "pos", None), ("y.digamma_()", "aten::digamma_", "pos", None),
    ("y.erfc_()", "aten::erfc_", "float", None), ("y.i0_()", "aten::i0_", "float", None),
    ("y.sinc_()", "aten::sinc_", "float", None), ("y.nan_to_num_()", "aten::nan_to_num_", "float", None),
    ("y.igamma_(other.abs())", "aten::igamma_", "pos", "row"),
    ("y.igammac_(other.abs())", "aten::igammac_", "pos", "row"),
    ("y.nextafter_(other)", "aten::nextafter_", "float", "row"),
    ("y.copysign_(other)", "aten::copysign_.Tensor", "float", "row"),
    ("y.copysign_(-1.0)", "aten::copysign_.Scalar", "float", None),
    ("y.heaviside_(other)", "aten::heaviside_", "float", "row"),
    ("y.ldexp_(other)", "aten::ldexp_", "float", "int_row"),
    ("y.lerp_(other, 0.3)", "aten::lerp_.Scalar", "float", "row"),
    ("y.lerp_(other, other)", "aten::lerp_.Tensor", "float", "row"),
    ("y.addcmul_(other, other, value=0.5)", "aten::addcmul_", "float", "row"),
    ("y.addcmul_(other, other, value=3)", "aten::addcmul_", "int", "int_row"),
    ("y.addcdiv_(other, other + 2.0, value=-2)", "aten::addcdiv_", "float", "pos"),
    ("y.zero_()", "aten::zero_", "int", None),
    ("y.bitwise_and_(other)", "aten::bitwise_and_.Tensor", "int", "int_row"),
    ("y.bitwise_and_(3)", "aten::bitwise_and_.Scalar", "int", None),
    ("y.bitwise_or_(other)", "aten::bitwise_or_.Tensor", "int", "int_row"),
    ("y.bitwise_or_(5)", "aten::bitwise_or_.Scalar", "int", None),
    ("y.bitwise_xor_(other)", "aten::bitwise_xor_.Tensor", "int", "int_row"),
    ("y.bitwise_xor_(6)", "aten::bitwise_xor_.Scalar", "int", None),
    ("y.__iand__(other)", "aten::__iand__.Tensor", "int", "int_row"),
    ("y.__iand__(3)", "aten::__iand__.Scalar", "int", None),
    ("y.__ior__(other)", "aten::__ior__.Tensor", "int", "int_row"),
    ("y.__ior__(5)", "aten::__ior__.Scalar", "int", None),
    ("y.__ixor__(other)", "aten::__ixor__.Tensor", "int", "int_row"),
    ("y.__ixor__(6)", "aten::__ixor__.Scalar", "int", None),
    ("y.clamp_(-1.5, 0.5)", "aten::clamp_", "float", None),
    ("y.clamp_(min=other)", "aten::clamp_.Tensor", "float", "row"),
    ("y.clamp_min_(0.2)", "aten::clamp_min_", "float", None),
    ("y.clamp_min_(other)", "aten::clamp_min_.Tensor", "float", "row"),
    ("y.clamp_max_(1)", "aten::clamp_max_", "int", None),
    ("y.clamp_max_(other)", "aten::clamp_max_.Tensor", "float", "row"),
    ("y.masked_fill_(other, -1.0)", "aten::masked_fill_.Scalar", "float", "mask"),
    ("y.masked_fill_(other > 0.0, other.sum())", "aten::masked_fill_.Tensor", "float", "float"),
    ("y.relu_()", "aten::relu_", "float", None), ("y.sigmoid_()", "aten::sigmoid_", "float", None),
    ("y.tanh_()", "aten::tanh_", "float", None), ("torch.selu_(y)", "aten::selu_", "float", None),
    ("torch.celu_(y, 0.7)", "aten::celu_", "float", None), ("torch.ops.aten.silu_(y)", "aten::silu_", "float", None),
    ("torch.ops.aten.mish_(y)", "aten::mish_", "float", None),
    ("torch.ops.aten.hardswish_(y)", "aten::hardswish_", "float", None),
    ("torch.ops.aten.hardsigmoid_(y)", "aten::hardsigmoid_", "float", None),
    ("torch.ops.aten.leaky_relu_(y, 0.3)", "aten::leaky_relu_", "float", None),
    ("torch.ops.aten.elu_(y, 0.6)", "aten::elu_", "float", None),
    ("torch.ops.aten.gelu_(y, approximate='tanh')", "aten::gelu_", "float", None),
    ("torch.ops.aten.hardtanh_(y, -1.5, 0.5)", "aten::hardtanh_", "float", None),
    ("torch.ops.aten.relu6_(y)", "aten::relu6_", "float", None),
    ("torch.ops.aten.threshold_(y, 0.2, -1.0)", "aten::threshold_", "float", None),
]


def inplace_fn(expression):
    """fn(x, other) evaluating `expression` on y = x * 2 behind an `if` that partitioning folds."""
    return torch.jit.CompilationUnit(f"""
def fn(x, other):
    y = x * 2
    if x.dim() == 2:
        z = {expression}
    else:
        z = y
    return z
""").fn


@pytest.mark.parametrize("expression, op, x, other", INPLACE, ids=[case[1] for case in INPLACE])
def test_inplace_converts_and_keeps_dtype(expression, op, x, other):
    _, report = check_fn(inplace_fn(expression), VALUES[x](), VALUES[other or "float"]())
    (block,) = report.blocks
    assert op in block.ops, f"{op} was not converted as such: {block.ops}"


def test_every_inplace_converter_is_in_the_table():
    load_all()
    registered = {key for key, c in registry.CONVERTERS.items() if c.fn.__qualname__.startswith("inplace.")}
    assert registered == {case[1] for case in INPLACE}


def sqrt_input_(x):
    return x.sqrt_()


def mul_through_view_(x):
    y = x * 2
    z = y.t()
    z.mul_(2)
    return y + 1


def clamp_then_read_view_(x):
    y = x * 2
    z = y.view(12)
    y.clamp_(min=0.5)
    return z * 1


@pytest.mark.parametrize("fn, op, reason", [
    (sqrt_input_, "aten::sqrt_", "method input"),
    (mul_through_view_, "aten::mul_.Scalar", "a view made by aten::t"),
    (clamp_then_read_view_, "aten::clamp_", "an alias made by aten::reshape"),  # view_to_reshape ran
], ids=["method-input", "through-a-view", "viewed-elsewhere"])
def test_inplace_that_would_lose_a_write_stays_in_pytorch(fn, op, reason):
    _, report = check_fn(fn, torch.rand(3, 4), engines=None, torch_blocks=None)
    (fallback,) = [f for b in report.blocks for f in b.fallback if f.op == op]
    assert reason in fallback.detail



BOOL_RESULT_INPLACE = [
    ("y.logical_not_()", "aten::logical_not_", "float", None),
    ("y.eq_(other)", "aten::eq_.Tensor", "int", "int_row"),
    ("y.eq_(0.0)", "aten::eq_.Scalar", "float", None),
    ("y.ne_(other)", "aten::ne_.Tensor", "float", "row"),
    ("y.ne_(2)", "aten::ne_.Scalar", "int", None),
    ("y.gt_(other)", "aten::gt_.Tensor", "float", "row"),
    ("y.gt_(0.5)", "aten::gt_.Scalar", "float", None),
    ("y.ge_(other)", "aten::ge_.Tensor", "int", "int_row"),
    ("y.ge_(1)", "aten::ge_.Scalar", "int", None),
    ("y.lt_(other)", "aten::lt_.Tensor", "float", "row"),
    ("y.lt_(-0.5)", "aten::lt_.Scalar", "float", None),
    ("y.le_(other)", "aten::le_.Tensor", "float", "row"),
    ("y.le_(2)", "aten::le_.Scalar", "int", None),
    ("y.logical_and_(other)", "aten::logical_and_", "float", "mask"),
    ("y.logical_or_(other)", "aten::logical_or_", "int", "mask"),
    ("y.logical_xor_(other)", "aten::logical_xor_", "float", "float"),
]


@pytest.mark.parametrize("expression, op, x, other", BOOL_RESULT_INPLACE, ids=[case[1] for case in BOOL_RESULT_INPLACE])
def test_inplace_comparison_converts_as_copy_of_its_functional_form(expression, op, x, other):
    """Lowering rewrites y.eq_(z) as y.copy_(y.eq(z)), which keeps y's dtype; both convert."""
    _, report = check_fn(inplace_fn(expression), VALUES[x](), VALUES[other or "float"]())
    (block,) = report.blocks
    functional = op.replace("_.", ".").removesuffix("_")
    assert "aten::copy_" in block.ops and functional in block.ops, block.ops
