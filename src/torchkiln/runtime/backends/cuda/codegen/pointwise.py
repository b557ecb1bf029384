"""A Triton kernel for a fused group of pointwise layers, and its launcher.

`generate(layers, inputs, outputs)` turns an ordered DAG of pointwise layers (elementwise, unary, activation,
cast, scale, parametric ReLU, select, constant) into Triton source text: a deterministic function of the layers, their
parameters and dtypes, so a backend regenerates it when an engine loads (the source is never stored in an engine).
Every float value is computed in float32: operands are cast on load, results on store; a cast layer to float16 or
bfloat16 rounds where it stands, and one from such a type rounds its input to it first (the value of a
half-precision tensor, as the layers before it would have stored it). Bool values are int1, integer values (8 to 64
bits) their own type, with ATen's semantics: an op computes in its result's dtype (a comparison in its operands'
promoted one), operands converted to it as ATen converts them (floats truncated toward zero, integers wrapped, an
integer rounded to a half type where the op computes in one); arithmetic wraps in two's complement; floor division
and remainder are Python's. An integer division (floor, truncating, remainder, fmod) is fused only by a constant
divisor without 0 or -1: ATen raises on a zero divisor on the CPU, and INT_MIN // -1 overflows. Each op's
expression is its row in `torchkiln.ir.pointwise` (`integer` for integer results).

The kernel iterates over the outputs' shape (all outputs have one shape). Every operand (group input or weight) is
read through its strides broadcast to that shape (stride 0 along a broadcast dim), so sizes and strides are
run-time ints and one compiled kernel serves every shape. Where every full-size operand and output is dense with
the same strides (contiguous, channels-last, ...) and the others are single values or vary along one dim only
(a per-channel bias), the kernel takes its LINEAR path: the flat index is the memory offset, and such a vector is
read at (offset // the layout's stride of its dim) % its size — one div/mod instead of one per dim.

`PointwiseLauncher(kernel)(inputs)` allocates the outputs (the strides of the first dense full-size input, so a
channels-last input gives channels-last outputs; else contiguous; 4-D outputs channels-last where the planner says
their readers are channels-last convolutions) and launches the kernel.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from torchkiln.errors import EngineInputError, NetworkError
from torchkiln.ir import layers as L, pointwise as P
from torchkiln.ir.quantization import zero_point
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.cuda.codegen import PDL_PARAM, WAIT_LINES, chain_options, launch, needs_int64

BLOCK = 1024  # elements per program
WARPS = 4  # warps per program
KERNEL_NAME = "pointwise_kernel"
FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INTEGERS = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)
VALUE_DTYPES = (*FLOATS, torch.bool, *INTEGERS)
READ_DTYPES = (*VALUE_DTYPES, torch.float8_e4m3fn)  # what a kernel reads: fp8 values only a dequantize reads
TL = {torch.float32: "tl.float32", torch.float16: "tl.float16", torch.bfloat16: "tl.bfloat16", torch.bool: "tl.int1",
      torch.float8_e4m3fn: "tl.float8e4nv", **{d: f"tl.{str(d).removeprefix('torch.')}" for d in INTEGERS}}
_BOOL_RULES = (P.DtypeRule.COMPARE, P.DtypeRule.LOGICAL, P.DtypeRule.PREDICATE)
_BITWISE = (L.ElementWiseOperation.BITWISE_AND, L.ElementWiseOperation.BITWISE_OR, L.ElementWiseOperation.BITWISE_XOR)
_DIVISIONS = (L.ElementWiseOperation.FLOOR_DIV, L.ElementWiseOperation.TRUNC_DIV, L.ElementWiseOperation.REMAINDER,
              L.ElementWiseOperation.FMOD)
Value = tuple[str, torch.dtype]  # a kernel variable and the dtype it holds (`held`)
_KINDS = (L.ElementWiseLayer, L.UnaryLayer, L.ActivationLayer, L.CastLayer, L.ScaleLayer, L.ParametricReLULayer,
          L.ConstantLayer, L.SelectLayer, L.QuantizeLayer, L.DequantizeLayer)
# Every division of a generated kernel is IEEE (`tl.div_rn`), as ATen divides, except a half-precision activation's
# (`{div}` in its template: SiLU, sigmoid, softsign, CELU, softplus; continuous, and already through `tl.exp`'s
# approximation) in a kernel built with `approximate_division` (a GEMM's epilogue: codegen/gemm.py), where it is
# `_fast_div`, the GPU's approximate division (PTX div.full.f32, within 2 float32 ulp): the value rounded to half
# precision (2**-11) then differs from the IEEE quotient's in about 2 of 10,000 values, by one unit in its last place.
# A division layer's quotient stays IEEE (an exact quotient such as 6 / 3 stays exact for a floor or a comparison
# after it); a dividing quantize's is the correctly rounded quotient through a multiply and two fmas (`_QUOTIENT`).
# After a product's tensor-core loop the IEEE division's instructions are the program's critical path: a
# [25088,128] @ [128,512] product with SiLU took 38.7 us with it, 21.1 with `_fast_div`, 16.9 without the SiLU
# (H200). In a memory-bound kernel it costs nothing measurable.
#
# `_erf` is erf in float32 within 2 units in the last place (tests/test_cuda_codegen_pointwise.py measures it against
# float64), in about 20 instructions and one exp2, where libdevice's erff (`tl.erf`) costs as much again: below
# |x| = 0.875 it is x + x * p(x^2), above it 1 - 2^q(|x|) with q close to log2 erfc (|x| clamped to 4, where erf
# rounds to 1), NaN kept. The coefficients were fitted here (near-minimax by Lawson's reweighted least squares against
# 40-digit erf: relative error 8.5e-9 and 1.9e-9 before float32 rounding). A GELU over [4096, 3072] half values took
# 19.4 us with libdevice's erff, 16.1 with this (a copy 12.2); a GEMM with its GELU epilogue, int8 [4096, 768] @
# [768, 3072], 42.6 -> 35.9 us (H200).
HEADER = '''import triton
import triton.language as tl
from triton.language.extra import libdevice
from triton.language.extra.cuda import gdc_wait

INF = tl.constexpr(float("inf"))


@triton.jit
def _fast_div(a, b):
    return a / b


@triton.jit
def _erf(x):
    t = tl.abs(x)
    z = t * t
    p = tl.fma(z, -0.0006203289376571774, 0.0050321887247264385)
    p = tl.fma(p, z, -0.026791468262672424)
    p = tl.fma(p, z, 0.11282455176115036)
    p = tl.fma(p, z, -0.3761255145072937)
    p = tl.fma(p, z, 0.12837915122509003)
    u = tl.minimum(t, 4.0)
    q = tl.fma(u, 0.00028997662593610585, -0.004461238160729408)
    q = tl.fma(q, u, 0.032345548272132874)
    q = tl.fma(q, u, -0.15051279962062836)
    q = tl.fma(q, u, -0.9186176061630249)
    q = tl.fma(q, u, -1.627267837524414)
    q = tl.fma(q, u, -0.00019270471238996834)
    tail = 1.0 - tl.exp2(q)
    r = tl.where(t < 0.875, tl.fma(x, p, x), tl.where(x < 0, -tail, tail))
    return tl.where(x != x, x, r)
'''


def fusable(layer: L.Layer) -> str | None:
    """None if `layer` can be computed in a generated pointwise kernel, else why not."""
    if not isinstance(layer, _KINDS):
        return f"{layer.KIND} is not a pointwise layer kind the generator knows"
    if isinstance(layer, (L.QuantizeLayer, L.DequantizeLayer)):  # int8 and fp8 values: only these make or read them
        zero = layer.weights.get("zero_point")
        if layer.weights["scale"].numel() != 1 or (zero is not None and zero.numel() != 1):
            return f"a {layer.KIND} per channel"
        if isinstance(layer, L.DequantizeLayer):
            return None
        return None if layer.inputs[0].dtype in FLOATS else f"a quantize of {layer.inputs[0].dtype} values"
    dtypes = [t.dtype for t in (*layer.inputs, *layer.outputs)] + [w.dtype for w in layer.weights.values()]
    wrong = [d for d in dtypes if d not in VALUE_DTYPES]
    if wrong:
        return f"dtype {wrong[0]}: fused kernels compute float32, float16, bfloat16, bool and integer values only"
    out = layer.outputs[0].dtype
    if isinstance(layer, (L.ScaleLayer, L.ParametricReLULayer)) and not all(d.is_floating_point for d in dtypes):
        return f"a {layer.KIND} of {out} values"
    if not isinstance(layer, (L.ElementWiseLayer, L.UnaryLayer, L.ActivationLayer)):
        return None
    row, name, computed = _row(layer), _op_name(layer), computed_in(layer)
    bitwise_bools = out == torch.bool and isinstance(layer, L.ElementWiseLayer) and layer.op in _BITWISE
    if (out == torch.bool) != (row.dtype in _BOOL_RULES) and not bitwise_bools:
        return f"{name} giving {out} is computed by its reference only"
    template = row.triton if row.dtype in _BOOL_RULES or computed.is_floating_point else row.integer
    if template is None:
        return f"{name} of {computed} values has no Triton expression"
    if isinstance(layer, L.ElementWiseLayer) and layer.op in _DIVISIONS and not computed.is_floating_point:
        return _divisor_refusal(layer.inputs[1], computed)
    if isinstance(layer, L.ActivationLayer) and not computed.is_floating_point and \
            not all(math.isinf(v) or float(v).is_integer() for v in (layer.alpha, layer.beta)):
        return f"{name} of {computed} values with bounds {layer.alpha}, {layer.beta}"
    return None


def _divisor_refusal(divisor: Tensor, computed: torch.dtype) -> str | None:
    """Why an integer division by `divisor` stays on ATen, or None: a constant without 0 (ATen raises on the CPU, a
    kernel would give a value) or -1 (INT_MIN // -1 overflows, which devices answer differently)."""
    value = L.constant_value(divisor)
    if value is None:
        return "an integer division by a run-time divisor (ATen raises on a zero divisor; a kernel would not)"
    value = value.to(computed)
    if bool(((value == 0) | (value == -1)).any()):
        return "an integer division by a constant holding 0 or -1"
    return None


def computed_in(layer: L.Layer) -> torch.dtype:
    """The dtype an elementwise, unary or activation layer computes in: its operands' promoted dtype (torch's rules,
    0-d operands included) for a comparison, its result's otherwise."""
    if _row(layer).dtype == P.DtypeRule.COMPARE:
        return torch.result_type(*(torch.empty([0] if t.rank else [], dtype=t.dtype, device="meta")
                                   for t in layer.inputs))
    return layer.outputs[0].dtype


def held(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel holds a value of `dtype` in: float32 for every float, else `dtype` itself."""
    return torch.float32 if dtype.is_floating_point else dtype


def converted(value: Value, dtype: torch.dtype) -> str:
    """`value` as an operand of an op computing in `dtype`, as ATen converts it: to bool as `!= 0`; to an integer
    truncated toward zero (a float) or wrapped (an integer); an integer to a float through float32 (then rounded
    to a half type). A float stays float32 (ops compute half types in float32)."""
    var, have = value
    want = held(dtype)
    if have == want:
        return var
    if dtype == torch.bool:
        return f"({var} != 0)"
    if want != torch.float32:
        return _as_integer(var, have, dtype)
    as_float = f"{var}.to(tl.float32)"
    return as_float if dtype == torch.float32 or have == torch.bool else f"{as_float}.to({TL[dtype]}).to(tl.float32)"


def stored(value: Value, dtype: torch.dtype) -> str:
    """`value` as the element stored to a tensor of `dtype`."""
    var, have = value
    if have == dtype:
        return var
    return _as_integer(var, have, dtype) if dtype in INTEGERS else f"{var}.to({TL[dtype]})"


def _as_integer(var: str, have: torch.dtype, dtype: torch.dtype) -> str:
    """`var` (held as `have`) converted to the integer `dtype` as ATen converts: a float to uint8 through int64
    (c10's cast, so -1.5 gives 255 on every device; the GPU's own float-to-uint8 conversion clamps to 0)."""
    if dtype == torch.uint8 and have.is_floating_point:
        return f"{var}.to(tl.int64).to(tl.uint8)"
    return f"{var}.to({TL[dtype]})"


def pointer_load(name: str) -> str:
    """The load of operand `name` through its offsets `o_{name}`, under the tile's `mask`."""
    return f"tl.load({name} + o_{name}, mask=mask)"


def loaded(load: str, dtype: torch.dtype) -> str:
    """The expression of a value of `dtype` that `load` (a tl.load) reads, as the kernel holds it."""
    return f"{load}.to(tl.float32)" if dtype.is_floating_point else load


def _row(layer: L.Layer) -> P.PointwiseOp:
    """The table row computing `layer`; the bitwise not of bools is their logical not (`~mask`)."""
    if isinstance(layer, L.UnaryLayer) and layer.op == L.UnaryOperation.BITWISE_NOT \
            and layer.inputs[0].dtype == torch.bool:
        return P.UNARY[L.UnaryOperation.NOT]
    return P.row(layer)


def _op_name(layer: L.Layer) -> str:
    return f"{layer.KIND} {(layer.type if isinstance(layer, L.ActivationLayer) else layer.op).name}"


@dataclasses.dataclass(frozen=True)
class PointwiseKernel:
    """Generated source and what its launcher binds: the group's input tensors (in launch order), the weights
    it reads (shaped to broadcast against the outputs) and its outputs."""

    source: str
    inputs: tuple[Tensor, ...]
    weights: tuple[torch.Tensor, ...]
    outputs: tuple[Tensor, ...]
    rank: int


def literal(value: float) -> str:
    if math.isnan(value):  # (not a global NaN: Triton takes a global unequal to itself for one that changed)
        return "(INF - INF)"
    if math.isinf(value):
        return "INF" if value > 0 else "(-INF)"
    return repr(float(value))


_INLINED_DTYPES = (*FLOATS, *INTEGERS)


def scalar_literal(value: torch.Tensor | None) -> str | None:
    """A single float or integer value as the expression a kernel computes it with (the float32 value a load would
    give; an integer in its own type, so a value past int32 is no int32 literal), or None: a constant is then part
    of the source, not a load per element (a tanh-GELU's five constants made its kernel half again slower than one
    reading only its input)."""
    if value is None or value.numel() != 1 or value.dtype not in _INLINED_DTYPES:
        return None
    if value.dtype in INTEGERS:
        return f"tl.full([1], {int(value.reshape(()))}, {TL[value.dtype]})"
    return f"tl.full([1], {literal(float(value.reshape(()).float()))}, tl.float32)"


def _broadcastable(weight: torch.Tensor) -> torch.Tensor:
    """A weight as an operand: a single value as 0-d, else as is (its rank must fit the iteration space)."""
    return weight.reshape(()) if weight.numel() == 1 else weight


class Builder:
    """Source lines of one kernel body, with a variable per value."""

    def __init__(self, rank: int, approximate_division: bool = False) -> None:
        """`approximate_division`: a half-precision activation's divisions are `_fast_div` (see HEADER)."""
        self.rank = rank
        self.approximate_division = approximate_division
        self.lines: list[str] = []
        self.operands: list[str] = []  # pointer arguments read, in order
        self.weights: list[torch.Tensor] = []
        self.values: dict[int, Value] = {}  # id(tensor) -> its value

    def emit(self, expr: str, dtype: torch.dtype) -> Value:
        var = f"v{len(self.lines)}"
        self.lines.append(f"{var} = {expr}")
        return var, dtype

    def inlined(self, value: torch.Tensor | None) -> Value | None:
        """The value of a single float or integer constant, written into the source (`scalar_literal`); else None."""
        found = scalar_literal(value)
        return None if found is None else self.emit(found, held(value.dtype))

    def operand(self, name: str, t: Tensor) -> Value:
        """Group input `t`, bound as `name`: loaded, or its value where it is a single constant (the argument is
        still bound, and never read)."""
        found = self.inlined(L.constant_value(t))
        if found is None:
            return self.load(name, t.dtype)
        self.operands.append(name)
        return found

    def load(self, name: str, dtype: torch.dtype) -> Value:
        self.operands.append(name)
        return self.emit(loaded(pointer_load(name), dtype), held(dtype))

    def weight(self, weight: torch.Tensor) -> Value:
        """A weight's value: in the source where it is one float, else loaded (`load_weight`)."""
        return self.inlined(weight) or self.load_weight(weight)

    def load_weight(self, weight: torch.Tensor) -> Value:
        """A weight loaded through its broadcast strides."""
        w = _broadcastable(weight)
        if w.dim() > self.rank:
            raise NetworkError(f"a weight of shape {list(weight.shape)} does not broadcast to rank {self.rank}")
        self.weights.append(w)
        return self.load(f"w{len(self.weights) - 1}", w.dtype)

    @staticmethod
    def as_float(value: Value) -> str:
        return converted(value, torch.float32)


_HALVES = (torch.float16, torch.bfloat16)


def _rounded_to(b: Builder, x: Value, dtype: torch.dtype) -> Value:
    """`x`, a value of `dtype`, rounded to it where the kernel holds it in float32 unrounded (a half type's)."""
    if dtype in _HALVES and x[1] == torch.float32:
        return b.emit(f"{x[0]}.to({TL[dtype]}).to(tl.float32)", torch.float32)
    return x


# x / s correctly rounded from q = x * (1 / s) (the reciprocal correctly rounded, q within an ulp or two of x / s):
# the residual x - q * s, exact in one fma, times the reciprocal corrects q to the rounded quotient (Markstein's
# theorem; tests/test_cuda_quant_kernels.py checks quotients next to rounding ties against ATen's division). Five
# instructions where the GPU's IEEE division (tl.div_rn) takes a subroutine: after a quantized convolution's
# tensor-core loop that division was the program's critical path (a 3x3 convolution over [32,64,56,56] int8 took 43
# us with it, 24 with a multiply, H200). Where the correction is not a number (x infinite, or x * (1 / s)
# overflowing) q is kept: the quotient is infinite or NaN then, as q is.
_QUOTIENT = "tl.fma(tl.fma(-{q}, {s}, {x}), {r}, {q})"
_ROUNDING_BITS = 0x4B400000  # the bits of the float 1.5 * 2**23


def _bounded_source(b: Builder, layer: L.QuantizeLayer, x: str, scale: torch.Tensor) -> Value | None:
    """An integer quantize of `x` computed with `x` clamped first to [low * scale, high * scale] (low and high the
    integer range less the zero point, the products rounded to float32), or None where the scale or a bound is not a
    finite normal float. The same values as clamping the quotient: division by a positive scale is monotonic, and a
    bound's quotient is within an ulp or two of its integer, so it rounds to it. `tl.maximum` without NaN propagation is
    IEEE maxNum, so NaN gives the low bound (the reference's NaN -> quant_min), and infinities their bound; the
    quotient is finite, so its correction (`_QUOTIENT`) needs no NaN guard. Two fewer compare-and-selects an element:
    a 1x1 int8 convolution's epilogue (64 -> 256 channels over [32,64,56,56], H200) 31.5 -> 25.2 us with both
    guards gone."""
    zero = zero_point(layer)
    low, high = layer.quant_min - zero, layer.quant_max - zero
    bounds = torch.tensor([low, high], dtype=torch.float32) * scale
    tiny = torch.finfo(torch.float32).tiny
    if not (math.isfinite(float(scale)) and float(scale) > 0) or not bool(torch.isfinite(bounds).all()) \
            or any(v != 0 and abs(float(bound)) < tiny for v, bound in zip((low, high), bounds)):
        return None
    lo, hi = (b.as_float(b.inlined(v.reshape(()))) for v in bounds)
    x = b.emit(f"tl.minimum(tl.maximum({x}, {lo}), {hi})", torch.float32)[0]
    reciprocal = b.as_float(b.weight(torch.reciprocal(scale)))
    q = b.emit(f"{x} * {reciprocal}", torch.float32)[0]
    if layer.divide:
        q = b.emit(_QUOTIENT.format(x=x, q=q, s=b.as_float(b.weight(scale)), r=reciprocal), torch.float32)[0]
    return _rounded_int8(b, q, zero)  # the quotient is within [low, high] up to an ulp or two (|q| <= 256)


def _rounded_int8(b: Builder, x: str, zero: int) -> Value:
    """round(x) + zero as int8 for |x| <= 256: x + 1.5 * 2**23 rounds x half to even into the low bits of its float's
    bits; those bits less 1.5 * 2**23's are the rounded integer, with no float-to-integer conversion (a 1x1 int8
    convolution's epilogue with the conversion took 43 us, with the bits 34, H200)."""
    x = b.emit(f"({x} + 12582912.0).to(tl.int32, bitcast=True) - {_ROUNDING_BITS - zero}", torch.int32)[0]
    return b.emit(f"{x}.to(tl.int8)", torch.int8)


def emit_layer(b: Builder, layer: L.Layer, xs: list[Value]) -> Value:
    """Emit `layer`'s computation; its value."""
    out = layer.outputs[0].dtype
    is_bool = out == torch.bool
    if isinstance(layer, L.ConstantLayer):
        return b.weight(layer.weights["value"])
    if isinstance(layer, L.CastLayer):
        x, source = xs[0], layer.inputs[0].dtype
        if is_bool:
            return b.emit(f"{x[0]} != 0", torch.bool)
        x = _rounded_to(b, x, source)
        if out in _HALVES and x[1] == torch.float32 and out != source:  # rounds to the narrower float
            return b.emit(f"{x[0]}.to({TL[out]}).to(tl.float32)", torch.float32)
        return b.emit(converted(x, out), held(out))
    if isinstance(layer, L.ScaleLayer):
        x, rank = b.as_float(xs[0]), layer.inputs[0].rank
        for name, template in (("scale", "{x} * {w}"), ("shift", "{x} + {w}"), ("power", "libdevice.pow({x}, {w})")):
            w = layer.weights.get(name)
            if w is None:
                continue
            if layer.mode == L.ScaleMode.CHANNEL and w.numel() > 1:
                w = w.reshape([-1] + [1] * (rank - layer.channel_axis % rank - 1))
            x = b.emit(template.format(x=x, w=b.as_float(b.weight(w))), torch.float32)[0]
        return b.emit(x, torch.float32)
    if isinstance(layer, L.QuantizeLayer):  # per tensor (`fusable`): ir/reference.py's quantize
        scale, x, source = layer.weights["scale"].float().reshape(()), xs[0], layer.inputs[0].dtype
        x = b.as_float(_rounded_to(b, x, source))  # the half value is quantized
        if out != torch.float8_e4m3fn:
            bounded = _bounded_source(b, layer, x, scale)
            if bounded is not None:
                return bounded
        source_x = x
        reciprocal = b.as_float(b.weight(torch.reciprocal(scale)))
        x = b.emit(f"{x} * {reciprocal}", torch.float32)[0]
        if layer.divide:  # x / scale correctly rounded, as ATen divides (`_QUOTIENT`)
            c = b.emit(_QUOTIENT.format(x=source_x, q=x, s=b.as_float(b.weight(scale)), r=reciprocal),
                       torch.float32)[0]
            x = b.emit(f"tl.where({c} == {c}, {c}, {x})", torch.float32)[0]
        if out == torch.float8_e4m3fn:  # clamped to its finite range, NaN kept, rounded by the conversion
            low, high = L.QUANT_RANGE[out]
            x = b.emit(f"tl.where({x} != {x}, {x}, tl.minimum(tl.maximum({x}, {float(low)}), {float(high)}))",
                       torch.float32)[0]
            return b.emit(f"{x}.to({TL[out]})", out)
        # round(x) + zero clamped to [min, max] is round(x clamped to [min - zero, max - zero]) + zero (integer
        # bounds); NaN gives min
        zero = zero_point(layer)
        low, high = float(layer.quant_min - zero), float(layer.quant_max - zero)
        x = b.emit(f"tl.minimum(tl.maximum(tl.where({x} != {x}, {low}, {x}), {low}), {high})", torch.float32)[0]
        return _rounded_int8(b, x, zero)
    if isinstance(layer, L.DequantizeLayer):  # per tensor (`fusable`): (q - zero) * scale in float32
        x, zero = b.as_float(xs[0]), zero_point(layer)
        if zero:
            x = b.emit(f"{x} - {float(zero)}", torch.float32)[0]
        x = b.emit(f"{x} * {b.as_float(b.weight(layer.weights['scale'].float().reshape(())))}", torch.float32)
        return _rounded_to(b, x, out)
    if isinstance(layer, L.SelectLayer):  # torch.where
        cond, then, other = xs
        return b.emit(f"tl.where({converted(cond, torch.bool)}, {converted(then, out)}, {converted(other, out)})",
                      held(out))
    if isinstance(layer, L.ParametricReLULayer):
        slope, rank = layer.weights["slope"], layer.inputs[0].rank
        if slope.numel() > 1:
            slope = slope.reshape([-1] + [1] * (rank - 2))
        x = b.as_float(xs[0])
        return b.emit(f"tl.where({x} > 0, {x}, {b.as_float(b.weight(slope))} * {x})", torch.float32)
    row, computed = _row(layer), computed_in(layer)
    if row.dtype == P.DtypeRule.LOGICAL:
        operands = [var for var, _ in xs]
    elif row.dtype == P.DtypeRule.PREDICATE:
        operands = [b.as_float(x) for x in xs]
    else:
        operands = [converted(x, computed) for x in xs]
    if row.dtype not in _BOOL_RULES and not computed.is_floating_point:  # integers (bools: bitwise ops)
        names = dict(zip("ab", operands)) if isinstance(layer, L.ElementWiseLayer) else {"x": operands[0]}
        if isinstance(layer, L.ActivationLayer):
            names.update(alpha=_bound(layer.alpha, computed), beta=_bound(layer.beta, computed))
        return b.emit(row.integer.format(**names, t=TL[computed]), computed)
    power = _small_power(layer) if isinstance(layer, L.ElementWiseLayer) else None
    if power is not None:
        expr = power.format(x=operands[0])
    elif isinstance(layer, L.ElementWiseLayer):
        expr = row.triton.format(a=operands[0], b=operands[1])
    elif isinstance(layer, L.ActivationLayer):
        fast = b.approximate_division and out in _HALVES
        expr = row.triton.format(x=operands[0], alpha=literal(layer.alpha), beta=literal(layer.beta),
                                 div="_fast_div" if fast else "tl.div_rn")
    else:
        expr = row.triton.format(x=operands[0])
    return b.emit(expr, torch.bool if is_bool else torch.float32)


def _bound(value: float, dtype: torch.dtype) -> str:
    """An activation's parameter as a value of integer `dtype`: an infinite one is the type's limit."""
    info = torch.iinfo(dtype)
    return scalar_literal(torch.tensor(int(min(max(value, info.min), info.max)), dtype=dtype))


# x ** c for the constant exponents ATen's pow kernels compute by multiplication (its pow_tensor_scalar special
# cases, on the CPU and on CUDA): the same operations in the same order, so the same values; and libdevice.pow is
# ~10x the instructions of a multiply chain, enough to make a tanh-GELU's x ** 3 compute-bound.
_POWERS = {2.0: "{x} * {x}", 3.0: "{x} * {x} * {x}"}


def _small_power(layer: L.ElementWiseLayer) -> str | None:
    """The multiply-chain template of a pow by one of _POWERS' constant exponents, else None."""
    if layer.op != L.ElementWiseOperation.POW:
        return None
    exponent = L.constant_value(layer.inputs[1])
    if exponent is None or exponent.numel() != 1:
        return None
    return _POWERS.get(float(exponent.reshape(())))


def generate(layers: Sequence[L.Layer], inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> PointwiseKernel:
    """The kernel computing `outputs` from `inputs` through `layers` (in an order where each layer's inputs come
    first). Raises NetworkError naming the layer that cannot be fused, or a group that is not closed."""
    if not layers or not outputs:
        raise NetworkError("a pointwise group needs at least one layer and one output")
    shape = tuple(outputs[0].shape)
    if any(tuple(t.shape) != shape for t in outputs):
        raise NetworkError(f"pointwise group outputs of different shapes: {[list(t.shape) for t in outputs]}")
    rank = len(shape)
    b = Builder(rank)
    for i, t in enumerate(inputs):
        if t.rank > rank:
            raise NetworkError(f"group input {t.name!r} of rank {t.rank} does not broadcast to rank {rank}")
        if t.dtype not in READ_DTYPES:
            raise NetworkError(f"group input {t.name!r} of dtype {t.dtype}: fused kernels read "
                               f"float32, float16, bfloat16, fp8 e4m3, bool and integers")
        b.values[id(t)] = b.operand(f"in{i}", t)
    emit_layers(b, layers, outputs, inputs)
    return PointwiseKernel(_source(b, outputs), tuple(inputs), tuple(b.weights), tuple(outputs), rank)


def emit_layers(b: Builder, layers: Sequence[L.Layer], outputs: Sequence[Tensor], given: Sequence[Tensor]) -> None:
    """Emit `layers` in order into `b`, whose values already hold the `given` tensors; NetworkError names a layer
    that cannot be fused or reads a value from outside, or an output the layers do not compute."""
    for layer in layers:
        reason = fusable(layer)
        if reason is not None:
            raise NetworkError(f"{layer.KIND} layer {layer.name!r} cannot be fused: {reason}")
        missing = [t.name for t in layer.inputs if id(t) not in b.values]
        if missing:
            raise NetworkError(f"{layer.KIND} layer {layer.name!r} reads {missing}, which are neither group inputs "
                               f"nor outputs of earlier layers of the group")
        b.values[id(layer.outputs[0])] = emit_layer(b, layer, [b.values[id(t)] for t in layer.inputs])
    for t in outputs:
        if id(t) not in b.values or any(t is i for i in given):
            raise NetworkError(f"group output {t.name!r} is not computed by the group's layers")


def _source(b: Builder, outputs: Sequence[Tensor]) -> str:
    outs = [f"out{k}" for k in range(len(outputs))]
    dims = [f"s{d}" for d in range(b.rank)]
    strides = [f"{p}_t{d}" for p in b.operands + outs for d in range(b.rank)]
    params = [*b.operands, *outs, "numel", *dims, *strides,
              *[f"{p}_{k}" for p in b.operands for k in ("lin", "div", "mod")],
              *[f"{p}_MODE: tl.constexpr" for p in b.operands], "LINEAR: tl.constexpr", "INT64: tl.constexpr",
              "EVEN: tl.constexpr", "BLOCK: tl.constexpr", PDL_PARAM]
    body = [*WAIT_LINES, "if INT64:", "    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", "else:",
            "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
            "if EVEN:",  # every program full: a constant mask, so accesses are whole vectors
            "    mask = tl.full((BLOCK,), 1, tl.int1)",
            "else:",
            "    mask = offs < numel",
            "if LINEAR:"]
    for p in b.operands:  # MODE 0: one value; 1: the layout's strides; 2: varies along one dim only
        body += [f"    if {p}_MODE == 0:", f"        o_{p} = offs * 0", f"    elif {p}_MODE == 1:",
                 f"        o_{p} = offs", "    else:", f"        o_{p} = (offs // {p}_div) % {p}_mod * {p}_lin"]
    body += [f"    o_{p} = offs" for p in outs]
    body += ["else:", "    rem = offs"]
    for d in reversed(range(b.rank)):
        body += [f"    i{d} = rem % s{d}", f"    rem = rem // s{d}"] if d else [f"    i{d} = rem"]
    for p in b.operands + outs:
        terms = [f"i{d} * {p}_t{d}" for d in range(b.rank)] or ["offs * 0"]
        body.append(f"    o_{p} = {' + '.join(terms)}")
    body += b.lines
    for out, t in zip(outs, outputs):
        body.append(f"tl.store({out} + o_{out}, {stored(b.values[id(t)], t.dtype)}, mask=mask)")
    signature = ",\n        ".join(params)
    return (f"# Generated by {__name__} from the engine's layers; do not edit.\n{HEADER}\n\n"
            f"@triton.jit\ndef {KERNEL_NAME}(\n        {signature},\n):\n" + "".join(f"    {line}\n" for line in body))


def _dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: some order of the dims makes the strides those of a contiguous tensor."""
    expected = 1
    for d in sorted((d for d in range(t.dim()) if t.shape[d] != 1), key=t.stride):
        if t.stride(d) != expected:
            return False
        expected *= t.shape[d]
    return True


def _linear_mode(x: torch.Tensor, expanded: torch.Tensor, shape: torch.Size, layout: torch.Tensor
                 ) -> tuple[int, int, int, int] | None:
    """How an operand is read along the layout's memory order: (mode, lin, div, mod) as the kernel's LINEAR path
    takes them (mode 0: one value; 1: the layout's own strides; 2: a value per index of one dim d, at
    (offset // layout.stride(d)) % size(d) times its stride there, e.g. a per-channel bias), or None."""
    if x.numel() == 1:
        return 0, 0, 1, 1
    if x.shape == shape and _same_strides(x, layout):
        return 1, 1, 1, 1
    varying = [d for d in range(len(shape)) if expanded.stride(d) != 0 and shape[d] != 1]
    if len(varying) == 1:
        d = varying[0]
        return 2, expanded.stride(d), layout.stride(d), shape[d]
    return None


def _same_strides(a: torch.Tensor, b: torch.Tensor) -> bool:
    return all(a.stride(d) == b.stride(d) for d in range(a.dim()) if a.shape[d] != 1)


class GroupLauncher:
    """What the launchers of generated group kernels share: the kernel's weights on each device, and a call's checked
    operands (inputs, then weights) with their broadcast shape, padded to the kernel's rank."""

    WHAT = "pointwise"

    def __init__(self, kernel, channels_last: bool = False) -> None:
        self.kernel = kernel
        self.channels_last = channels_last  # 4-D outputs channels-last (their readers are channels-last convolutions)
        self._weights: dict[torch.device, list[torch.Tensor]] = {}

    def _device_weights(self, device: torch.device) -> list[torch.Tensor]:
        weights = self._weights.get(device)
        if weights is None:
            weights = self._weights[device] = [w.to(device) for w in self.kernel.weights]
        return weights

    def operands(self, inputs: Sequence[torch.Tensor]) -> tuple[torch.device, list[torch.Tensor], torch.Size]:
        kernel = self.kernel
        if len(inputs) != len(kernel.inputs):
            raise EngineInputError(f"the {self.WHAT} kernel takes {len(kernel.inputs)} inputs, got {len(inputs)}")
        for x, t in zip(inputs, kernel.inputs):
            if x.dtype != t.dtype or x.dim() != t.rank:
                raise EngineInputError(f"input {t.name!r}: expected {t.dtype} of rank {t.rank}, got {x.dtype} of "
                                       f"rank {x.dim()}")
        device = inputs[0].device if inputs else torch.device("cuda")
        operands = [*inputs, *self._device_weights(device)]
        try:
            shape = torch.broadcast_shapes(*(x.shape for x in operands))
        except RuntimeError as e:
            raise EngineInputError(f"inputs of shapes {[list(x.shape) for x in inputs]} do not broadcast "
                                   f"together: {e}") from None
        return device, operands, torch.Size([1] * (kernel.rank - len(shape)) + list(shape))


class PointwiseLauncher(GroupLauncher):
    """Runs a generated kernel on CUDA tensors (or on CPU tensors under Triton's interpreter)."""

    def __init__(self, kernel: PointwiseKernel, channels_last: bool = False) -> None:
        from torchkiln.runtime.backends.cuda.codegen.compile import load_source

        super().__init__(kernel, channels_last)
        self._fn = getattr(load_source(kernel.source), KERNEL_NAME)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The group's outputs for `inputs` (one tensor per group input, of its dtype and a broadcastable shape)."""
        kernel = self.kernel
        device, operands, shape = self.operands(inputs)
        if self.channels_last and len(shape) == 4:
            outputs = [torch.empty(shape, dtype=t.dtype, device=device, memory_format=torch.channels_last)
                       for t in kernel.outputs]
            layout = outputs[0]
        else:
            layout = next((x for x in inputs if x.shape == shape and _dense(x)), None)
            outputs = [torch.empty_like(layout, dtype=t.dtype) if layout is not None else
                       torch.empty(shape, dtype=t.dtype, device=device) for t in kernel.outputs]
        numel = shape.numel()
        if numel == 0:
            return outputs
        expanded = [x.expand(shape) for x in operands]
        modes = [_linear_mode(x, e, shape, layout) for x, e in zip(operands, expanded)] if layout is not None else []
        linear = layout is not None and all(m is not None for m in modes)
        if not linear:  # walk the space in the first output's memory order, so its stores (and like reads) coalesce
            modes = [(0, 0, 1, 1)] * len(operands)
            order = sorted(range(len(shape)), key=lambda d: -outputs[0].stride(d) if shape[d] != 1 else 0)
            shape = torch.Size(shape[d] for d in order)
            expanded, outputs_walked = [x.permute(order) for x in expanded], [o.permute(order) for o in outputs]
        else:
            outputs_walked = outputs
        strides = [s for x in (*expanded, *outputs_walked) for s in x.stride()]
        steps = [v for m in modes for v in m[1:]]
        names = [f"in{i}" for i in range(len(inputs))] + [f"w{k}" for k in range(len(kernel.weights))]
        flags = {f"{p}_MODE": m[0] for p, m in zip(names, modes)}
        grid = ((numel + BLOCK - 1) // BLOCK,)
        launch(self._fn, grid, *operands, *outputs, numel, *shape, *strides, *steps, **flags, LINEAR=linear,
               INT64=needs_int64(*expanded, *outputs), EVEN=numel % BLOCK == 0, BLOCK=BLOCK, num_warps=WARPS,
               **chain_options())
        return outputs


def compile_group(layers: Sequence[L.Layer], inputs: Sequence[Tensor], outputs: Sequence[Tensor],
                  channels_last: bool = False) -> PointwiseLauncher:
    """Generate, load and wrap the kernel of a pointwise group (4-D outputs channels-last if asked)."""
    return PointwiseLauncher(generate(layers, inputs, outputs), channels_last)
