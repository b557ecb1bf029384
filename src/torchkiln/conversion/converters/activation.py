"""Activation converters (and their in-place forms), softshrink, glu, logit, polygamma, mvlgamma and
rrelu (inference)."""
from __future__ import annotations

from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.activation import activation, clip
from torchkiln.conversion.impl.common import needs_static, normalize_dim
from torchkiln.conversion.impl.elementwise import binary, select, unary
from torchkiln.conversion.impl.slicing import slice_dim
from torchkiln.conversion.impl.inplace import register_inplace
from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.ir import layers as L
from torchkiln.ir.pointwise import ACTIVATION
from torchkiln.ir.tensor import Tensor

A, E = L.ActivationType, L.ElementWiseOperation


def _plain(kind: L.ActivationType):
    def convert(ctx: ConversionCtx, args: Args) -> Tensor:
        return activation(ctx, args.self, kind)

    return convert


# Activations without parameters: their rows name the ATen op. Each has an in-place form `op_` but log_sigmoid.
for _kind, _row in ACTIVATION.items():
    if _row.aten:
        _convert = converter(f"aten::{_row.aten}")(_plain(_kind))
        if _row.aten != "log_sigmoid":
            register_inplace(_convert, f"aten::{_row.aten}_")


@converter("aten::leaky_relu")
def leaky_relu(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, A.LEAKY_RELU, args.negative_slope)


def _default_elu(args: Args) -> str | None:
    if args.scale != 1 or args.input_scale != 1:
        return f"elu with scale={args.scale}, input_scale={args.input_scale} (only 1, 1 is supported)"
    return None


@converter("aten::elu", capability=_default_elu)
def elu(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, A.ELU, args.alpha)


@converter("aten::celu")
def celu(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, A.CELU, args.alpha)


_GELU = {"none": A.GELU_ERF, "tanh": A.GELU_TANH}


def _gelu_approximation(args: Args) -> str | None:
    return None if args.approximate in _GELU else f"unknown gelu approximate={args.approximate!r}"


@converter("aten::gelu", capability=_gelu_approximation)
def gelu(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, _GELU[args.approximate])


@converter("aten::hardtanh")
def hardtanh(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, A.HARD_TANH, args.min_val, args.max_val)


@converter("aten::relu6")
def relu6(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, A.HARD_TANH, 0.0, 6.0)


@converter("aten::threshold")
def threshold(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, A.THRESHOLDED_RELU, args.threshold, args.value)


register_inplace(leaky_relu, "aten::leaky_relu_")
register_inplace(elu, "aten::elu_", capability=_default_elu)
register_inplace(celu, "aten::celu_")
register_inplace(gelu, "aten::gelu_", capability=_gelu_approximation)
register_inplace(hardtanh, "aten::hardtanh_")
register_inplace(relu6, "aten::relu6_")
register_inplace(threshold, "aten::threshold_")


@converter("aten::softplus")
def softplus(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, A.SOFTPLUS, args.beta, args.threshold)


@converter("aten::prelu", capability=lambda args: needs_static(args, "weight"))
def prelu(ctx: ConversionCtx, args: Args) -> Tensor:
    return ctx.network.add_parametric_relu(ctx.to_tensor(args.self), args.weight).get_output()


@converter("aten::hardshrink")
def hardshrink(ctx: ConversionCtx, args: Args) -> Tensor:
    """0 where -lambd <= x <= lambd, else x (NaN stays NaN), as ATen computes it."""
    x, lambd = ctx.to_tensor(args.self), args.lambd
    inside = binary(ctx, binary(ctx, x, -lambd, E.GREATER_EQUAL), binary(ctx, x, lambd, E.LESS_EQUAL), E.AND)
    return select(ctx, inside, ctx.to_tensor(0, x.dtype), x)


def _floating_self(args: Args) -> str | None:
    return None if args.self.dtype.is_floating_point else f"a {args.self.dtype} tensor (eager raises)"


@converter("aten::softshrink", capability=_floating_self)
def softshrink(ctx: ConversionCtx, args: Args) -> Tensor:
    """x - lambd above lambd, x + lambd below -lambd, else x * 0 (NaN stays NaN), as ATen computes it."""
    x, lambd = ctx.to_tensor(args.self), args.lambd
    inner = select(ctx, binary(ctx, x, -lambd, E.LESS), binary(ctx, x, lambd, E.SUM), binary(ctx, x, 0.0, E.PROD))
    return select(ctx, binary(ctx, x, lambd, E.GREATER), binary(ctx, x, lambd, E.SUB), inner)


def _glu_ok(args: Args) -> str | None:
    size = args.self.shape[normalize_dim(args.dim, len(args.self.shape))]
    if not isinstance(size, int) or size % 2:
        return f"dim {args.dim} of size {size} (eager needs an even size)"
    return _floating_self(args)


@converter("aten::glu", capability=_glu_ok)
def glu(ctx: ConversionCtx, args: Args) -> Tensor:
    """a * sigmoid(b), a and b the halves of x along `dim`."""
    x = ctx.to_tensor(args.self)
    dim = normalize_dim(args.dim, x.rank)
    half = x.shape[dim] // 2
    a, b = slice_dim(ctx, x, dim, 0, half), slice_dim(ctx, x, dim, half, None)
    return binary(ctx, a, activation(ctx, b, A.SIGMOID), E.PROD)


@converter("aten::logit", capability=_floating_self)
def logit(ctx: ConversionCtx, args: Args) -> Tensor:
    """log(z / (1 - z)), z = x clamped to [eps, 1 - eps] when eps is given (NaN stays NaN)."""
    z = ctx.to_tensor(args.self)
    if args.eps is not None:
        z = clip(ctx, z, args.eps, 1.0 - args.eps)
    return unary(ctx, binary(ctx, z, binary(ctx, 1.0, z, E.SUB), E.DIV), L.UnaryOperation.LOG)


def _order(args: Args) -> str | None:
    if not args.self.dtype.is_floating_point:
        return f"a {args.self.dtype} tensor (only floating ones converted: the layer keeps its input's dtype)"
    return None


@converter("aten::polygamma", capability=_order)
def polygamma(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, A.POLYGAMMA, args.n)


@converter("aten::mvlgamma", capability=_order)
def mvlgamma(ctx: ConversionCtx, args: Args) -> Tensor:
    return activation(ctx, args.self, A.MVLGAMMA, args.p)


@converter("aten::rrelu", capability=lambda args: "training=True draws random slopes" if args.training else None)
def rrelu(ctx: ConversionCtx, args: Args) -> Tensor:
    """Not training: leaky_relu with the mean slope (lower + upper) / 2."""
    return activation(ctx, args.self, A.LEAKY_RELU, (args.lower + args.upper) / 2)
