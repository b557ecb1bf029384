"""Layer kinds of the network, TensorRT-shaped: typed parameters, weights owned by the layer.

A layer's meaning (what it computes) is defined once, in `torchkiln.ir.reference`.
Parameters are plain data (ints, floats, bools, strings, enums, dtypes and tuples of them)
so a layer serializes without pickle.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Iterable
from typing import Any, ClassVar, NoReturn

import torch

from torchkiln.errors import NetworkError
from torchkiln.ir.symbolic import DimSymbol, bounds, product
from torchkiln.ir.tensor import Tensor

LAYER_KINDS: dict[str, type[Layer]] = {}
MAX_RANK = 16  # the most dims a network tensor may have
MAX_EXTENT = 1 << 20  # the largest stride, padding, dilation or window a layer may declare
MAX_LOOP_TRIPS = 1 << 20  # the most iterations a loop layer may declare (its cost is its body's times this)
TENSOR_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                 torch.int16, torch.int8, torch.uint8, torch.bool, torch.float8_e4m3fn)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
# The types a QuantizeLayer makes, with their range: int8 with a zero point, fp8 (E4M3, no infinities) without.
QUANT_RANGE: dict[torch.dtype, tuple[float, float]] = {torch.int8: (-128.0, 127.0),
                                                       torch.float8_e4m3fn: (-448.0, 448.0)}


def layer_kind(cls: type[Layer]) -> type[Layer]:
    """Register a layer class under its KIND, making it a keyword-only dataclass."""
    cls = dataclasses.dataclass(eq=False, kw_only=True)(cls)
    if cls.KIND in LAYER_KINDS:
        raise ValueError(f"layer kind {cls.KIND!r} registered twice")
    LAYER_KINDS[cls.KIND] = cls
    return cls


@dataclasses.dataclass(eq=False, kw_only=True)
class Layer:
    """Base of every layer kind: a name, input and output tensors, and named weights."""

    KIND: ClassVar[str] = ""
    WEIGHTS: ClassVar[tuple[str, ...]] = ()  # weight names this kind may hold
    REQUIRED_WEIGHTS: ClassVar[tuple[str, ...]] = ()
    WEIGHT_DTYPES: ClassVar[tuple[torch.dtype, ...]] = TENSOR_DTYPES  # dtypes its weights may have
    MIN_INPUTS: ClassVar[int] = 1
    MAX_INPUTS: ClassVar[int | None] = 1
    SUBNETWORKS: ClassVar[tuple[str, ...]] = ()  # fields holding sub-networks (control flow), not parameters

    name: str = ""
    inputs: list[Tensor] = dataclasses.field(default_factory=list)
    outputs: list[Tensor] = dataclasses.field(default_factory=list)
    weights: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def get_output(self, index: int = 0) -> Tensor:
        return self.outputs[index]

    @classmethod
    @functools.cache
    def param_fields(cls) -> tuple[dataclasses.Field, ...]:
        """The kind's own parameters (not name, inputs, outputs or weights)."""
        return tuple(f for f in dataclasses.fields(cls)
                     if f.name not in ("name", "inputs", "outputs", "weights", *cls.SUBNETWORKS))

    @classmethod
    @functools.cache
    def param_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in cls.param_fields())

    def params(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in self.param_fields()}

    def validate(self) -> None:
        """Check inputs, weights and parameters before shape inference; a problem is a NetworkError.

        A kind adds its own checks by overriding this (calling super) next to its definition, so they
        hold when a network is built and when an engine is loaded."""
        n = len(self.inputs)
        if n < self.MIN_INPUTS or (self.MAX_INPUTS is not None and n > self.MAX_INPUTS):
            self.fail(f"got {n} inputs")
        missing = [w for w in self.REQUIRED_WEIGHTS if w not in self.weights]
        unknown = [w for w in self.weights if w not in self.WEIGHTS]
        if missing or unknown:
            self.fail(f"missing weights {missing}, unknown weights {unknown}")
        for wname, w in self.weights.items():
            if w.dtype not in self.WEIGHT_DTYPES:
                self.fail(f"weight {wname!r} has dtype {w.dtype}; this kind takes {_names(self.WEIGHT_DTYPES)}")
            if w.dim() > MAX_RANK:
                self.fail(f"weight {wname!r} has rank {w.dim()}, over the limit of {MAX_RANK}")

    def fail(self, problem: str) -> NoReturn:
        """Raise a NetworkError naming this layer."""
        raise NetworkError(f"{self.KIND} layer {self.name!r}: {problem}")

    def check_range(self, what: str, values: Iterable[int], lo: int, hi: int = MAX_EXTENT) -> None:
        """Each value in [lo, hi]; a symbolic dim over its whole range (one whose range is unknown is evaluated
        and checked by its run-time use)."""
        for i, v in enumerate(values):
            least, most = bounds(v)
            if least < lo and math.isfinite(least) or most > hi and math.isfinite(most):
                self.fail(f"{what}[{i}] = {v} is outside [{lo}, {hi}]")

    def check_axis(self, what: str, axis: int, rank: int) -> None:
        """torch's rule: an axis of a rank-r tensor lies in [-r, r) (a scalar takes -1 and 0)."""
        r = max(rank, 1)
        if not -r <= axis < r:
            self.fail(f"{what} {axis} is out of range for a tensor of rank {rank}")

    def check_constant_indices(self, indices: Tensor, lo: int, hi: int) -> None:
        """Indices that a ConstantLayer gives must lie in [lo, hi) (checked now, not inside ATen later)."""
        value = constant_value(indices)
        hi = bounds(hi)[1]  # a dynamic dim at its largest: smaller sizes are checked when the gather runs
        if value is not None and value.numel() and not (lo <= int(value.min()) and int(value.max()) < hi):
            self.fail(f"indices hold values in [{int(value.min())}, {int(value.max())}], outside [{lo}, {hi})")


def transposition(layer: Layer | None) -> tuple[int, ...] | None:
    """The axes of a shuffle layer that only transposes (a view: nothing reshaped), else None."""
    if not isinstance(layer, ShuffleLayer) or layer.reshape_dims is not None or layer.second_transpose is not None \
            or layer.first_transpose is None:
        return None
    return tuple(layer.first_transpose)


def matrix_transposed(tensor: Tensor) -> Tensor | None:
    """x where `tensor` is x with its last two dims swapped by a transposing shuffle, else None."""
    rank = tensor.rank
    swap = (*range(rank - 2), rank - 1, rank - 2)
    return tensor.producer.inputs[0] if rank >= 2 and transposition(tensor.producer) == swap else None


def constant_value(tensor: Tensor) -> torch.Tensor | None:
    """The value of a tensor a ConstantLayer produces, else None."""
    producer = tensor.producer
    return producer.weights.get("value") if isinstance(producer, ConstantLayer) else None


def _names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).removeprefix("torch.") for d in dtypes)


class ActivationType(enum.Enum):
    RELU = "relu"
    SIGMOID = "sigmoid"
    TANH = "tanh"
    LEAKY_RELU = "leaky_relu"  # alpha: negative slope
    ELU = "elu"  # alpha, beta: scale, input_scale (torch.nn.functional.elu's alpha, scale, input_scale)
    SELU = "selu"
    CELU = "celu"  # alpha
    SOFTSIGN = "softsign"
    SOFTPLUS = "softplus"  # alpha: beta, beta: threshold (torch's names)
    CLIP = "clip"  # alpha: min, beta: max (either may be -inf/inf)
    HARD_SIGMOID = "hard_sigmoid"  # torch.nn.functional.hardsigmoid
    HARD_SWISH = "hard_swish"
    HARD_TANH = "hard_tanh"  # alpha: min, beta: max
    THRESHOLDED_RELU = "thresholded_relu"  # alpha: threshold, beta: value (torch.threshold)
    GELU_ERF = "gelu_erf"
    GELU_TANH = "gelu_tanh"
    SILU = "silu"
    MISH = "mish"
    LOG_SIGMOID = "log_sigmoid"
    POLYGAMMA = "polygamma"  # alpha: the order n of the derivative of digamma
    MVLGAMMA = "mvlgamma"  # alpha: the dimension p of the multivariate log-gamma


class ElementWiseOperation(enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    SUB = "sub"
    DIV = "div"  # true division
    FLOOR_DIV = "floor_div"
    TRUNC_DIV = "trunc_div"
    POW = "pow"
    REMAINDER = "remainder"  # Python-style modulus (sign of the divisor)
    FMOD = "fmod"  # C-style modulus (sign of the dividend)
    ATAN2 = "atan2"
    AND = "and"
    OR = "or"
    XOR = "xor"
    EQUAL = "equal"
    NOT_EQUAL = "not_equal"
    GREATER = "greater"
    GREATER_EQUAL = "greater_equal"
    LESS = "less"
    LESS_EQUAL = "less_equal"
    BITWISE_AND = "bitwise_and"
    BITWISE_OR = "bitwise_or"
    BITWISE_XOR = "bitwise_xor"
    # special functions of two arguments (computed by their reference; ONNX has none)
    ZETA = "zeta"  # Hurwitz zeta(x, q)
    IGAMMA = "igamma"  # regularized lower incomplete gamma
    IGAMMAC = "igammac"  # regularized upper incomplete gamma
    NEXTAFTER = "nextafter"
    COPYSIGN = "copysign"
    HEAVISIDE = "heaviside"
    LOGADDEXP2 = "logaddexp2"
    LDEXP = "ldexp"  # a * 2**b
    XLOG1PY = "xlog1py"
    CHEBYSHEV_T = "chebyshev_t"  # polynomial(x, n) of degree n
    CHEBYSHEV_U = "chebyshev_u"
    CHEBYSHEV_V = "chebyshev_v"
    CHEBYSHEV_W = "chebyshev_w"
    SHIFTED_CHEBYSHEV_T = "shifted_chebyshev_t"
    SHIFTED_CHEBYSHEV_U = "shifted_chebyshev_u"
    SHIFTED_CHEBYSHEV_V = "shifted_chebyshev_v"
    SHIFTED_CHEBYSHEV_W = "shifted_chebyshev_w"
    HERMITE_H = "hermite_h"
    HERMITE_HE = "hermite_he"
    LAGUERRE_L = "laguerre_l"
    LEGENDRE_P = "legendre_p"


class UnaryOperation(enum.Enum):
    EXP = "exp"
    EXPM1 = "expm1"
    LOG = "log"
    LOG2 = "log2"
    LOG10 = "log10"
    LOG1P = "log1p"
    SQRT = "sqrt"
    RSQRT = "rsqrt"
    RECIP = "recip"
    ABS = "abs"
    NEG = "neg"
    SIN = "sin"
    COS = "cos"
    TAN = "tan"
    SINH = "sinh"
    COSH = "cosh"
    ASIN = "asin"
    ACOS = "acos"
    ATAN = "atan"
    ASINH = "asinh"
    ACOSH = "acosh"
    ATANH = "atanh"
    CEIL = "ceil"
    FLOOR = "floor"
    ROUND = "round"  # half to even, like torch.round
    TRUNC = "trunc"
    ERF = "erf"
    ERFINV = "erfinv"
    SIGN = "sign"
    NOT = "not"  # logical not; output bool
    BITWISE_NOT = "bitwise_not"
    ISINF = "isinf"
    ISNEGINF = "isneginf"
    ISPOSINF = "isposinf"
    ISNAN = "isnan"
    ISFINITE = "isfinite"
    SQUARE = "square"
    SIGNBIT = "signbit"  # output bool
    # special functions (computed by their reference; ONNX has none)
    LGAMMA = "lgamma"
    DIGAMMA = "digamma"
    ERFC = "erfc"
    ERFCX = "erfcx"
    SINC = "sinc"
    I0 = "i0"
    I0E = "i0e"
    I1 = "i1"
    I1E = "i1e"
    NDTR = "ndtr"
    NDTRI = "ndtri"
    LOG_NDTR = "log_ndtr"
    ENTR = "entr"
    AIRY_AI = "airy_ai"
    BESSEL_J0 = "bessel_j0"
    BESSEL_J1 = "bessel_j1"
    BESSEL_Y0 = "bessel_y0"
    BESSEL_Y1 = "bessel_y1"
    MODIFIED_BESSEL_I0 = "modified_bessel_i0"
    MODIFIED_BESSEL_I1 = "modified_bessel_i1"
    MODIFIED_BESSEL_K0 = "modified_bessel_k0"
    MODIFIED_BESSEL_K1 = "modified_bessel_k1"
    SCALED_MODIFIED_BESSEL_K0 = "scaled_modified_bessel_k0"
    SCALED_MODIFIED_BESSEL_K1 = "scaled_modified_bessel_k1"
    SPHERICAL_BESSEL_J0 = "spherical_bessel_j0"


class PoolingType(enum.Enum):
    MAX = "max"
    AVERAGE = "average"


class MatrixOperation(enum.Enum):
    NONE = "none"
    TRANSPOSE = "transpose"  # swap the last two dims
    VECTOR = "vector"  # a 1-d operand (matmul's vector broadcasting rules)


class ReduceOperation(enum.Enum):
    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    AVG = "avg"
    ANY = "any"
    ALL = "all"


class ScaleMode(enum.Enum):
    UNIFORM = "uniform"  # one scale/shift/power for the whole tensor
    CHANNEL = "channel"  # one per index of channel_axis
    ELEMENTWISE = "elementwise"  # broadcast against the input


class TopKOperation(enum.Enum):
    MAX = "max"
    MIN = "min"


class GatherMode(enum.Enum):
    DEFAULT = "default"  # out = data.shape[:axis] + indices.shape + data.shape[axis+1:]
    ELEMENT = "element"  # torch.gather
    ND = "nd"  # indices' last dim indexes data's leading dims


class PaddingMode(enum.Enum):
    CONSTANT = "constant"
    REFLECT = "reflect"
    REPLICATE = "replicate"
    CIRCULAR = "circular"


class NormalizationKind(enum.Enum):
    LAYER = "layer"  # normalize over the trailing len(normalized_shape) dims
    GROUP = "group"  # normalize over (C/G, *spatial) per group
    INSTANCE = "instance"  # normalize over spatial dims per (N, C)


class CumulativeOperation(enum.Enum):
    SUM = "sum"
    PROD = "prod"


class FillOperation(enum.Enum):
    LINSPACE = "linspace"  # start + step * index along a 1-d output


# ---- layer kinds ---------------------------------------------------------------------------

@layer_kind
class ConstantLayer(Layer):
    KIND: ClassVar[str] = "constant"
    WEIGHTS: ClassVar[tuple[str, ...]] = ("value",)
    REQUIRED_WEIGHTS: ClassVar[tuple[str, ...]] = ("value",)
    MIN_INPUTS: ClassVar[int] = 0
    MAX_INPUTS: ClassVar[int | None] = 0


@layer_kind
class IdentityLayer(Layer):
    KIND: ClassVar[str] = "identity"


@layer_kind
class CastLayer(Layer):
    KIND: ClassVar[str] = "cast"
    to_type: torch.dtype


def _check_scales(layer: Layer, scale: torch.Tensor, count: int | None, what: str) -> None:
    """`scale` is float32, finite and positive, with one value or (`count` not None) `count` values."""
    if scale.dtype != torch.float32 or scale.dim() > 1 or not bool(torch.isfinite(scale).all() & (scale > 0).all()):
        layer.fail(f"{what} must be finite positive float32 values in at most one dim")
    expected = 1 if count is None else count
    if isinstance(expected, int) and scale.numel() != expected:  # a symbolic channel count is checked when it runs
        layer.fail(f"{what} has {scale.numel()} values for {expected} channels")


@dataclasses.dataclass(eq=False, kw_only=True)
class _QuantizeBase(Layer):
    """Scales (and int8 zero points), per tensor or per channel along `axis`."""

    WEIGHTS: ClassVar[tuple[str, ...]] = ("scale", "zero_point")
    REQUIRED_WEIGHTS: ClassVar[tuple[str, ...]] = ("scale",)
    axis: int | None = None  # None: one scale for the tensor
    quant_type: torch.dtype = torch.int8  # int8 or float8_e4m3fn

    def validate(self) -> None:
        super().validate()
        if self.quant_type not in QUANT_RANGE:
            self.fail(f"quant_type {self.quant_type} is not one of {_names(QUANT_RANGE)}")
        x = self.inputs[0]
        if self.axis is not None:
            self.check_axis("axis", self.axis, x.rank)
        _check_scales(self, self.weights["scale"], None if self.axis is None else x.shape[self.axis], "scale")
        zero = self.weights.get("zero_point")
        if zero is not None and (self.quant_type != torch.int8 or zero.dtype != torch.int8
                                 or zero.shape != self.weights["scale"].shape):
            self.fail("zero_point must be int8 with the scale's shape, and only for int8")

    def shaped(self, w: torch.Tensor, rank: int) -> torch.Tensor:
        """A scale or zero point shaped to broadcast over a tensor of rank `rank`."""
        if self.axis is None:
            return w.reshape(())
        return w.reshape([-1] + [1] * (rank - self.axis % rank - 1))


@layer_kind
class QuantizeLayer(_QuantizeBase):
    """q = clamp(round_half_even(x * (1 / scale)) + zero_point) in quant_type (torch.fake_quantize_*'s rounding);
    with `divide`, x / scale in place of x * (1 / scale) (ONNX's QuantizeLinear)."""

    KIND: ClassVar[str] = "quantize"
    quant_min: int = -128  # int8: the range the value is clamped to (a QAT graph's may be narrower)
    quant_max: int = 127
    divide: bool = False  # x / scale: the quantizers calibration places (no eager graph defines their arithmetic)

    def validate(self) -> None:
        super().validate()
        if not -128 <= self.quant_min <= self.quant_max <= 127:
            self.fail(f"[quant_min, quant_max] = [{self.quant_min}, {self.quant_max}] is not a range of int8")
        if not self.inputs[0].dtype.is_floating_point:
            self.fail(f"input of dtype {self.inputs[0].dtype}; quantize takes a float tensor")


@layer_kind
class DequantizeLayer(_QuantizeBase):
    """x = (q - zero_point) * scale, in `to_type`."""

    KIND: ClassVar[str] = "dequantize"
    to_type: torch.dtype = torch.float32

    def validate(self) -> None:
        super().validate()
        if self.inputs[0].dtype != self.quant_type or self.to_type not in FLOAT_DTYPES:
            self.fail(f"dequantizes {self.inputs[0].dtype} to {self.to_type}; it takes {self.quant_type} to a float")


@layer_kind
class ConvolutionLayer(Layer):
    """N-d convolution or transposed convolution; kernel rank gives N. With `kernel_scale`, the kernel holds
    values quantized per output channel to `kernel_type` (stored dequantized: q * scale, in float32)."""

    KIND: ClassVar[str] = "convolution"
    WEIGHTS: ClassVar[tuple[str, ...]] = ("kernel", "bias", "kernel_scale")
    REQUIRED_WEIGHTS: ClassVar[tuple[str, ...]] = ("kernel",)
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] = ()
    kernel_type: torch.dtype | None = None  # with kernel_scale: int8 or float8_e4m3fn

    WEIGHT_DTYPES: ClassVar[tuple[torch.dtype, ...]] = FLOAT_DTYPES

    def validate(self) -> None:
        super().validate()
        kernel = self.weights["kernel"]
        nd = kernel.dim() - 2
        if nd not in (1, 2, 3):
            self.fail(f"kernel of rank {kernel.dim()}; a 1-, 2- or 3-d convolution needs rank 3, 4 or 5")
        if self.inputs[0].rank not in (nd + 1, nd + 2):
            self.fail(f"input of rank {self.inputs[0].rank} for a {nd}-d kernel")
        for what, values, lo, lengths in (("stride", self.stride, 1, (1, nd)), ("padding", self.padding, 0, (1, nd)),
                                          ("dilation", self.dilation, 1, (1, nd)),
                                          ("output_padding", self.output_padding, 0, (0, 1, nd))):
            if len(values) not in lengths:
                self.fail(f"{what} {values} needs {nd} entries")
            self.check_range(what, values, lo)
        if not 1 <= self.groups <= MAX_EXTENT or (not self.transposed and kernel.shape[0] % self.groups):
            self.fail(f"groups {self.groups} does not divide the {kernel.shape[0]} kernels")
        out_channels = kernel.shape[1] * self.groups if self.transposed else kernel.shape[0]
        bias = self.weights.get("bias")
        if bias is not None and tuple(bias.shape) != (out_channels,):
            self.fail(f"bias of shape {list(bias.shape)} for {out_channels} output channels")
        scale = self.weights.get("kernel_scale")
        if (scale is None) != (self.kernel_type is None) or (scale is not None and (
                self.transposed or self.kernel_type not in QUANT_RANGE or kernel.dtype != torch.float32)):
            self.fail("a quantized kernel needs kernel_scale and kernel_type (int8 or float8_e4m3fn) together, a "
                      "float32 kernel, and no transposition")
        if scale is not None:
            _check_scales(self, scale, out_channels, "kernel_scale")


@layer_kind
class ScaleLayer(Layer):
    """out = (x * scale + shift) ** power, per tensor, per channel or elementwise."""

    KIND: ClassVar[str] = "scale"
    WEIGHTS: ClassVar[tuple[str, ...]] = ("scale", "shift", "power")
    mode: ScaleMode
    channel_axis: int = 1

    def validate(self) -> None:
        super().validate()
        x = self.inputs[0]
        if self.mode == ScaleMode.CHANNEL:
            self.check_axis("channel_axis", self.channel_axis, x.rank)
            channels = x.shape[self.channel_axis] if x.rank else 1
            for wname, w in self.weights.items():
                if w.numel() not in (1, channels):
                    self.fail(f"weight {wname!r} has {w.numel()} values for {channels} channels")
        elif self.mode == ScaleMode.UNIFORM:
            for wname, w in self.weights.items():
                if w.numel() != 1:
                    self.fail(f"uniform weight {wname!r} has {w.numel()} values, not one")


@layer_kind
class ActivationLayer(Layer):
    KIND: ClassVar[str] = "activation"
    type: ActivationType
    alpha: float = 0.0
    beta: float = 0.0


@layer_kind
class ParametricReLULayer(Layer):
    """torch.nn.functional.prelu with the slope as a weight."""

    KIND: ClassVar[str] = "parametric_relu"
    WEIGHTS: ClassVar[tuple[str, ...]] = ("slope",)
    REQUIRED_WEIGHTS: ClassVar[tuple[str, ...]] = ("slope",)
    WEIGHT_DTYPES: ClassVar[tuple[torch.dtype, ...]] = FLOAT_DTYPES


@layer_kind
class ElementWiseLayer(Layer):
    """A binary op with numpy broadcasting and torch's type promotion."""

    KIND: ClassVar[str] = "elementwise"
    MIN_INPUTS: ClassVar[int] = 2
    MAX_INPUTS: ClassVar[int | None] = 2
    op: ElementWiseOperation


@layer_kind
class UnaryLayer(Layer):
    KIND: ClassVar[str] = "unary"
    op: UnaryOperation


@layer_kind
class PoolingLayer(Layer):
    """N-d max or average pooling; window rank gives N."""

    KIND: ClassVar[str] = "pooling"
    type: PoolingType
    window: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...] = ()
    ceil_mode: bool = False
    count_include_pad: bool = True
    divisor_override: int | None = None

    def validate(self) -> None:
        super().validate()
        nd = len(self.window)
        for what, values, lo, lengths in (("window", self.window, 1, (nd,)), ("stride", self.stride, 1, (0, 1, nd)),
                                          ("padding", self.padding, 0, (1, nd)),
                                          ("dilation", self.dilation, 1, (0, 1, nd))):
            if len(values) not in lengths:
                self.fail(f"{what} {values} does not fit a {nd}-d window")
            self.check_range(what, values, lo)
        if self.divisor_override is not None and not 1 <= self.divisor_override <= MAX_EXTENT:
            self.fail(f"divisor_override {self.divisor_override} is outside [1, {MAX_EXTENT}]")


@layer_kind
class MatrixMultiplyLayer(Layer):
    """matmul(op0(a), op1(b)) [+ bias]; the builder folds a following bias add into the `bias` weight."""

    KIND: ClassVar[str] = "matrix_multiply"
    WEIGHTS: ClassVar[tuple[str, ...]] = ("bias",)
    MIN_INPUTS: ClassVar[int] = 2
    MAX_INPUTS: ClassVar[int | None] = 2
    op0: MatrixOperation = MatrixOperation.NONE
    op1: MatrixOperation = MatrixOperation.NONE


@layer_kind
class ShuffleLayer(Layer):
    """Transpose, reshape (0 copies the input dim, -1 is inferred), transpose."""

    KIND: ClassVar[str] = "shuffle"
    first_transpose: tuple[int, ...] | None = None
    reshape_dims: tuple[int, ...] | None = None
    second_transpose: tuple[int, ...] | None = None
    zero_is_placeholder: bool = True

    def keeps_last_dim(self) -> bool:
        """Whether it only regroups the leading dims (no transpose, the last dim kept): every value keeps its
        index along the last dim (a matrix multiply's column)."""
        x, out = self.inputs[0], self.outputs[0]
        still = all(p is None or list(p) == sorted(p) for p in (self.first_transpose, self.second_transpose))
        return still and x.rank >= 1 and out.rank >= 1 and x.shape[-1] == out.shape[-1]


@layer_kind
class ReduceLayer(Layer):
    KIND: ClassVar[str] = "reduce"
    op: ReduceOperation
    axes: tuple[int, ...]
    keep_dims: bool = False

    def validate(self) -> None:
        super().validate()
        rank = self.inputs[0].rank
        for axis in self.axes:
            self.check_axis("axis", axis, rank)
        if len({a % max(rank, 1) for a in self.axes}) != len(self.axes):
            self.fail(f"axes {self.axes} repeat an axis")


@layer_kind
class SoftMaxLayer(Layer):
    KIND: ClassVar[str] = "softmax"
    axis: int
    log: bool = False

    def validate(self) -> None:
        super().validate()
        self.check_axis("axis", self.axis, self.inputs[0].rank)


@layer_kind
class ConcatenationLayer(Layer):
    KIND: ClassVar[str] = "concatenation"
    MAX_INPUTS: ClassVar[int | None] = None
    axis: int

    def validate(self) -> None:
        super().validate()
        self.check_axis("axis", self.axis, self.inputs[0].rank)


@layer_kind
class SliceLayer(Layer):
    """Per dim: take `shape[d]` elements from `start[d]` every `stride[d]` (stride may be negative)."""

    KIND: ClassVar[str] = "slice"
    start: tuple[int, ...]
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@layer_kind
class ExpandLayer(Layer):
    """Broadcast size-1 dims to `shape` (torch.Tensor.expand; -1 keeps a dim)."""

    KIND: ClassVar[str] = "expand"
    shape: tuple[int, ...]

    def validate(self) -> None:
        super().validate()
        if not self.inputs[0].rank <= len(self.shape) <= MAX_RANK:
            self.fail(f"shape {self.shape} has fewer dims than the input or more than {MAX_RANK}")
        self.check_range("shape", self.shape, -1, 1 << 62)


@layer_kind
class GatherLayer(Layer):
    """Inputs: data, indices (integer)."""

    KIND: ClassVar[str] = "gather"
    MIN_INPUTS: ClassVar[int] = 2
    MAX_INPUTS: ClassVar[int | None] = 2
    axis: int = 0
    mode: GatherMode = GatherMode.DEFAULT

    def validate(self) -> None:
        super().validate()
        data, indices = self.inputs
        if indices.dtype not in ((torch.int64,) if self.mode == GatherMode.ELEMENT else (torch.int64, torch.int32)):
            self.fail(f"{self.mode.value} gather indices of dtype {indices.dtype}")
        if self.mode == GatherMode.ND:
            depth = indices.shape[-1] if indices.rank else 0
            if not 1 <= depth <= data.rank:
                self.fail(f"nd indices of shape {list(indices.shape)} for data of rank {data.rank}")
            value = constant_value(indices)
            if value is not None and value.numel():
                columns = value.reshape(-1, depth)
                for k, (lo, hi) in enumerate(zip(columns.amin(0).tolist(), columns.amax(0).tolist())):
                    if not (0 <= lo and hi < data.shape[k]):
                        self.fail(f"indices for dim {k} hold values in [{lo}, {hi}], outside [0, {data.shape[k]})")
            return
        self.check_axis("axis", self.axis, data.rank)
        size = data.shape[self.axis] if data.rank else 1
        self.check_constant_indices(indices, 0, size)  # a gather never wraps (see its meaning)


@layer_kind
class ScatterLayer(Layer):
    """Inputs: data, indices, updates; torch.scatter along `axis`."""

    KIND: ClassVar[str] = "scatter"
    MIN_INPUTS: ClassVar[int] = 3
    MAX_INPUTS: ClassVar[int | None] = 3
    axis: int = 0

    def validate(self) -> None:
        super().validate()
        data, indices, _ = self.inputs
        self.check_axis("axis", self.axis, data.rank)
        if indices.dtype != torch.int64:
            self.fail(f"indices must be int64, got {indices.dtype}")
        self.check_constant_indices(indices, 0, data.shape[self.axis] if data.rank else 1)


@layer_kind
class SelectLayer(Layer):
    """Inputs: condition (bool), then, else; torch.where."""

    KIND: ClassVar[str] = "select"
    MIN_INPUTS: ClassVar[int] = 3
    MAX_INPUTS: ClassVar[int | None] = 3


@layer_kind
class TopKLayer(Layer):
    """Outputs: values, indices (int64) of the k largest or smallest along `axis`."""

    KIND: ClassVar[str] = "topk"
    op: TopKOperation
    k: int
    axis: int

    def validate(self) -> None:
        super().validate()
        x = self.inputs[0]
        self.check_axis("axis", self.axis, x.rank)
        size = x.shape[self.axis] if x.rank else 1
        if not 0 <= self.k <= size:
            self.fail(f"k {self.k} is outside [0, {size}] on axis {self.axis}")


@layer_kind
class ResizeLayer(Layer):
    """torch.nn.functional.interpolate with either `size` or `scales`."""

    KIND: ClassVar[str] = "resize"
    mode: str  # nearest, nearest-exact, linear, bilinear, bicubic, trilinear
    size: tuple[int, ...] | None = None
    scales: tuple[float, ...] | None = None
    align_corners: bool | None = None

    MODES: ClassVar[tuple[str, ...]] = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear",
                                        "area")

    def validate(self) -> None:
        super().validate()
        if self.mode not in self.MODES:
            self.fail(f"unknown mode {self.mode!r}")
        if self.size is not None:
            self.check_range("size", self.size, 1, 1 << 40)
        for i, s in enumerate(self.scales or ()):
            if not (math.isfinite(s) and 0 < s <= MAX_EXTENT):
                self.fail(f"scales[{i}] = {s} is not a positive finite factor")


@layer_kind
class PaddingLayer(Layer):
    """torch.nn.functional.pad; `pad` in its order (last dim first: begin, end, ...)."""

    KIND: ClassVar[str] = "padding"
    pad: tuple[int, ...]
    mode: PaddingMode = PaddingMode.CONSTANT
    value: float = 0.0

    def validate(self) -> None:
        super().validate()
        if len(self.pad) % 2 or len(self.pad) > 2 * self.inputs[0].rank:
            self.fail(f"pad {self.pad} needs a (begin, end) pair for each of at most {self.inputs[0].rank} dims")
        self.check_range("pad", self.pad, -MAX_EXTENT)  # negative pads crop, as in torch


@layer_kind
class NormalizationLayer(Layer):
    """Layer, group or instance normalization with optional affine scale and bias weights."""

    KIND: ClassVar[str] = "normalization"
    WEIGHTS: ClassVar[tuple[str, ...]] = ("scale", "bias")
    kind: NormalizationKind
    epsilon: float
    normalized_shape: tuple[int, ...] = ()  # LAYER
    num_groups: int = 1  # GROUP

    WEIGHT_DTYPES: ClassVar[tuple[torch.dtype, ...]] = FLOAT_DTYPES

    def validate(self) -> None:
        super().validate()
        x = self.inputs[0]
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            self.fail(f"epsilon {self.epsilon} is not a non-negative number")
        if self.kind == NormalizationKind.LAYER:
            expected = self.normalized_shape
        else:
            if x.rank < 2:
                self.fail(f"{self.kind.value} normalization needs an input of rank 2 or more, got {x.rank}")
            expected = (x.shape[1],)
            groups = self.num_groups
            if self.kind == NormalizationKind.GROUP and not (groups >= 1 and x.shape[1] % groups == 0):
                self.fail(f"num_groups {self.num_groups} does not divide the {x.shape[1]} channels")
        for wname, w in self.weights.items():
            if tuple(w.shape) != tuple(expected):
                self.fail(f"weight {wname!r} of shape {list(w.shape)}, expected {list(expected)}")


@layer_kind
class EinsumLayer(Layer):
    KIND: ClassVar[str] = "einsum"
    MAX_INPUTS: ClassVar[int | None] = None
    equation: str

    def validate(self) -> None:
        super().validate()
        if len(self.equation) > 1024:
            self.fail(f"equation of {len(self.equation)} characters")


@layer_kind
class CumulativeLayer(Layer):
    KIND: ClassVar[str] = "cumulative"
    op: CumulativeOperation
    axis: int

    def validate(self) -> None:
        super().validate()
        self.check_axis("axis", self.axis, self.inputs[0].rank)


@layer_kind
class FillLayer(Layer):
    """A 1-d tensor start + step * i for i in range(length), of `dtype`."""

    KIND: ClassVar[str] = "fill"
    MIN_INPUTS: ClassVar[int] = 0
    MAX_INPUTS: ClassVar[int | None] = 0
    op: FillOperation
    length: int
    start: float
    step: float
    dtype: torch.dtype

    def validate(self) -> None:
        super().validate()
        if self.length < 0:
            self.fail(f"negative length {self.length}")


@layer_kind
class ShapeLayer(Layer):
    """The input's shape as a 1-d int64 tensor."""

    KIND: ClassVar[str] = "shape"


@layer_kind
class GridSampleLayer(Layer):
    """Inputs: input, grid; torch.nn.functional.grid_sample."""

    KIND: ClassVar[str] = "grid_sample"
    MIN_INPUTS: ClassVar[int] = 2
    MAX_INPUTS: ClassVar[int | None] = 2
    mode: str = "bilinear"
    padding_mode: str = "zeros"
    align_corners: bool = False

    def validate(self) -> None:
        super().validate()
        if self.mode not in ("bilinear", "nearest", "bicubic") or self.padding_mode not in ("zeros", "border",
                                                                                           "reflection"):
            self.fail(f"unknown mode {self.mode!r} or padding_mode {self.padding_mode!r}")


@layer_kind
class AttentionLayer(Layer):
    """Inputs: query, key, value[, mask]; torch.nn.functional.scaled_dot_product_attention. With `enable_gqa`, key
    and value have H / G heads (dim -3) for the query's H: query head h reads key and value head h // G."""

    KIND: ClassVar[str] = "attention"
    MIN_INPUTS: ClassVar[int] = 3
    MAX_INPUTS: ClassVar[int | None] = 4
    causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False


@layer_kind
class DimValueLayer(Layer):
    """A 0-d tensor holding `value`, an int dim that may be symbolic (dynamic shapes: `x + x.size(0)`)."""

    KIND: ClassVar[str] = "dim_value"
    MIN_INPUTS: ClassVar[int] = 0
    MAX_INPUTS: ClassVar[int | None] = 0
    value: int
    dtype: torch.dtype = torch.int64


@dataclasses.dataclass(eq=False, kw_only=True)
class _DataDependentBase(Layer):
    """A kind whose output size is known only once it has run (TensorRT's IOutputAllocator): `count` is the symbol
    the layer defines, in [0, the input's largest element count]. Its readers' shapes use it as a dynamic dim with
    no profile range; the runtime binds it from the layer's first output when the layer has run."""

    count: int

    def validate(self) -> None:
        super().validate()
        most = bounds(product(self.inputs[0].shape))[1]
        if not (isinstance(self.count, DimSymbol) and self.count.lo == 0 and self.count.hi == most):
            self.fail(f"count {self.count} must be a symbol of its own in [0, {most}] (the input's element count)")


def data_dependent_symbol(layer: Layer) -> DimSymbol | None:
    """The symbol a data-dependent layer defines (its output size, bound when it has run), else None."""
    return layer.count if isinstance(layer, _DataDependentBase) else None


@layer_kind
class NonZeroLayer(_DataDependentBase):
    """Output: the indices of the input's nonzero elements, int64 [count, rank], in row-major order (torch.nonzero;
    TensorRT's INonZeroLayer gives its transpose)."""

    KIND: ClassVar[str] = "non_zero"


@layer_kind
class UniqueLayer(_DataDependentBase):
    """Outputs: the distinct values in ascending order [count]; for each input element the index of its value among
    them (int64, the input's shape); how often each occurs (int64 [count]). torch.unique (sorted, without a dim), or
    with `consecutive` torch.unique_consecutive (runs of equal values, in input order)."""

    KIND: ClassVar[str] = "unique"
    consecutive: bool = False


# ---- control flow (TensorRT's IIfConditionalLayer and ILoopLayer) ---------------------------------------------
# A branch or body is a sub-network (an ir.network.Network, typed Any here: the network module imports this one)
# whose inputs are its own tensors: what it reads of the outer network is passed as the layer's inputs.

def _check_signature(layer: Layer, what: str, tensors: list[Tensor], expected: list[Tensor]) -> None:
    """`tensors` (a sub-network's inputs or outputs) have the count, dtypes and shapes of `expected`."""
    if len(tensors) != len(expected):
        layer.fail(f"{what}: {len(tensors)} tensors for {len(expected)}")
    for k, (t, e) in enumerate(zip(tensors, expected)):
        if t.dtype != e.dtype or tuple(t.shape) != tuple(e.shape):
            layer.fail(f"{what} {k} is {t.dtype}{list(t.shape)}, expected {e.dtype}{list(e.shape)}")


def _check_flag(layer: Layer, what: str, t: Tensor, dtypes: tuple[torch.dtype, ...]) -> None:
    if t.rank != 0 or t.dtype not in dtypes:
        layer.fail(f"{what} must be a 0-d {_names(dtypes)} tensor, got {t.dtype}{list(t.shape)}")


@layer_kind
class ConditionalLayer(Layer):
    """Inputs: a 0-d bool predicate, then the operands. Outputs: those of `then_branch` run on the operands where the
    predicate is true, else those of `else_branch` (both sub-networks take the operands and give alike outputs)."""

    KIND: ClassVar[str] = "conditional"
    MAX_INPUTS: ClassVar[int | None] = None
    SUBNETWORKS: ClassVar[tuple[str, ...]] = ("then_branch", "else_branch")
    then_branch: Any
    else_branch: Any

    def validate(self) -> None:
        super().validate()
        _check_flag(self, "the predicate", self.inputs[0], (torch.bool,))
        for branch in (self.then_branch, self.else_branch):
            _check_signature(self, f"{branch.name} input", branch.inputs, self.inputs[1:])
        if not self.then_branch.outputs:
            self.fail("a branch gives no outputs")
        _check_signature(self, "else_branch output", self.else_branch.outputs, self.then_branch.outputs)

    def result_types(self) -> list[tuple[tuple[Any, ...], torch.dtype]]:
        return [(t.shape, t.dtype) for t in self.then_branch.outputs]

    def input_dtypes(self) -> list[torch.dtype]:
        """The dtype each input must have: the predicate's, then what the branches take."""
        return [torch.bool, *(t.dtype for t in self.then_branch.inputs)]


@layer_kind
class LoopLayer(Layer):
    """Inputs: the trip count (0-d int), the condition (0-d bool), `num_carried` carried values, then the values the
    body only reads. While the condition holds and fewer than `trip count` iterations ran, `body` runs on (the
    iteration as a 0-d int64, the carried values, the read values) and gives (the next condition, the next carried
    values). Outputs: the carried values at the end. An iteration past `max_trips` is an EngineInputError."""

    KIND: ClassVar[str] = "loop"
    MIN_INPUTS: ClassVar[int] = 3
    MAX_INPUTS: ClassVar[int | None] = None
    SUBNETWORKS: ClassVar[tuple[str, ...]] = ("body",)
    num_carried: int
    max_trips: int
    body: Any

    def validate(self) -> None:
        super().validate()
        if not 1 <= self.num_carried <= len(self.inputs) - 2:
            self.fail(f"num_carried {self.num_carried} is outside [1, {len(self.inputs) - 2}]")
        if not 0 <= self.max_trips <= MAX_LOOP_TRIPS:
            self.fail(f"max_trips {self.max_trips} is outside [0, {MAX_LOOP_TRIPS}]")
        _check_flag(self, "the trip count", self.inputs[0], (torch.int64, torch.int32))
        _check_flag(self, "the condition", self.inputs[1], (torch.bool,))
        body = self.body.inputs
        if not body:
            self.fail("the body takes no iteration input")
        _check_flag(self, "the body's iteration input", body[0], (torch.int64,))
        _check_signature(self, "body input", body[1:], self.inputs[2:])
        outputs = self.body.outputs
        if not outputs:
            self.fail("the body gives no condition")
        _check_flag(self, "the body's condition output", outputs[0], (torch.bool,))
        _check_signature(self, "body carried output", outputs[1:], self.inputs[2:2 + self.num_carried])

    def result_types(self) -> list[tuple[tuple[Any, ...], torch.dtype]]:
        return [(t.shape, t.dtype) for t in self.inputs[2:2 + self.num_carried]]

    def input_dtypes(self) -> list[torch.dtype]:
        """The dtype each input must have: the trip count's and condition's, then what the body takes."""
        return [self.inputs[0].dtype, torch.bool, *(t.dtype for t in self.body.inputs[1:])]
