"""Layer kinds of the network, TensorRT-shaped: typed parameters, weights owned by the layer.

A layer's meaning (what it computes) is defined once, in `torchkiln.runtime.reference`.
Parameters are plain data (ints, floats, bools, strings, enums, dtypes and tuples of them)
so a layer serializes without pickle.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import ClassVar

import torch

from torchkiln.network.tensor import Tensor

LAYER_KINDS: dict[str, type[Layer]] = {}


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
    MIN_INPUTS: ClassVar[int] = 1
    MAX_INPUTS: ClassVar[int | None] = 1

    name: str = ""
    inputs: list[Tensor] = dataclasses.field(default_factory=list)
    outputs: list[Tensor] = dataclasses.field(default_factory=list)
    weights: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)

    def get_output(self, index: int = 0) -> Tensor:
        return self.outputs[index]

    @classmethod
    def param_fields(cls) -> list[dataclasses.Field]:
        """The kind's own parameters (not name, inputs, outputs or weights)."""
        return [f for f in dataclasses.fields(cls) if f.name not in ("name", "inputs", "outputs", "weights")]

    def params(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in self.param_fields()}


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
    SIGN = "sign"
    NOT = "not"  # logical not; output bool
    BITWISE_NOT = "bitwise_not"
    ISINF = "isinf"
    ISNAN = "isnan"
    ISFINITE = "isfinite"
    SQUARE = "square"


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


@layer_kind
class ConvolutionLayer(Layer):
    """N-d convolution or transposed convolution; kernel rank gives N."""

    KIND: ClassVar[str] = "convolution"
    WEIGHTS: ClassVar[tuple[str, ...]] = ("kernel", "bias")
    REQUIRED_WEIGHTS: ClassVar[tuple[str, ...]] = ("kernel",)
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int = 1
    transposed: bool = False
    output_padding: tuple[int, ...] = ()


@layer_kind
class ScaleLayer(Layer):
    """out = (x * scale + shift) ** power, per tensor, per channel or elementwise."""

    KIND: ClassVar[str] = "scale"
    WEIGHTS: ClassVar[tuple[str, ...]] = ("scale", "shift", "power")
    mode: ScaleMode
    channel_axis: int = 1


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


@layer_kind
class ReduceLayer(Layer):
    KIND: ClassVar[str] = "reduce"
    op: ReduceOperation
    axes: tuple[int, ...]
    keep_dims: bool = False


@layer_kind
class SoftMaxLayer(Layer):
    KIND: ClassVar[str] = "softmax"
    axis: int
    log: bool = False


@layer_kind
class ConcatenationLayer(Layer):
    KIND: ClassVar[str] = "concatenation"
    MAX_INPUTS: ClassVar[int | None] = None
    axis: int


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


@layer_kind
class GatherLayer(Layer):
    """Inputs: data, indices (integer)."""

    KIND: ClassVar[str] = "gather"
    MIN_INPUTS: ClassVar[int] = 2
    MAX_INPUTS: ClassVar[int | None] = 2
    axis: int = 0
    mode: GatherMode = GatherMode.DEFAULT


@layer_kind
class ScatterLayer(Layer):
    """Inputs: data, indices, updates; torch.scatter along `axis`."""

    KIND: ClassVar[str] = "scatter"
    MIN_INPUTS: ClassVar[int] = 3
    MAX_INPUTS: ClassVar[int | None] = 3
    axis: int = 0


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


@layer_kind
class ResizeLayer(Layer):
    """torch.nn.functional.interpolate with either `size` or `scales`."""

    KIND: ClassVar[str] = "resize"
    mode: str  # nearest, nearest-exact, linear, bilinear, bicubic, trilinear
    size: tuple[int, ...] | None = None
    scales: tuple[float, ...] | None = None
    align_corners: bool | None = None


@layer_kind
class PaddingLayer(Layer):
    """torch.nn.functional.pad; `pad` in its order (last dim first: begin, end, ...)."""

    KIND: ClassVar[str] = "padding"
    pad: tuple[int, ...]
    mode: PaddingMode = PaddingMode.CONSTANT
    value: float = 0.0


@layer_kind
class NormalizationLayer(Layer):
    """Layer, group or instance normalization with optional affine scale and bias weights."""

    KIND: ClassVar[str] = "normalization"
    WEIGHTS: ClassVar[tuple[str, ...]] = ("scale", "bias")
    kind: NormalizationKind
    epsilon: float
    normalized_shape: tuple[int, ...] = ()  # LAYER
    num_groups: int = 1  # GROUP


@layer_kind
class EinsumLayer(Layer):
    KIND: ClassVar[str] = "einsum"
    MAX_INPUTS: ClassVar[int | None] = None
    equation: str


@layer_kind
class CumulativeLayer(Layer):
    KIND: ClassVar[str] = "cumulative"
    op: CumulativeOperation
    axis: int


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


@layer_kind
class AttentionLayer(Layer):
    """Inputs: query, key, value[, mask]; torch.nn.functional.scaled_dot_product_attention."""

    KIND: ClassVar[str] = "attention"
    MIN_INPUTS: ClassVar[int] = 3
    MAX_INPUTS: ClassVar[int | None] = 4
    causal: bool = False
    scale: float | None = None


@layer_kind
class DimValueLayer(Layer):
    """A 0-d tensor holding `value`, an int dim that may be symbolic (dynamic shapes: `x + x.size(0)`)."""

    KIND: ClassVar[str] = "dim_value"
    MIN_INPUTS: ClassVar[int] = 0
    MAX_INPUTS: ClassVar[int | None] = 0
    value: int
    dtype: torch.dtype = torch.int64
