"""Evaluators of int/float/bool arithmetic and conversions (TorchScript's scalar ops)."""
from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from torchkiln.analysis.registry import evaluator
from torchkiln.analysis.resolve import Args, NotStatic
from torchkiln.ir.symbolic import as_dim, decide, dim_max, dim_min, floordiv, has_symbols, is_symbolic, mod


def _number(x: Any) -> bool | int | float:
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise NotStatic("a tensor of more than one element is not a number")
        return x.item()
    if not isinstance(x, (bool, int, float)):
        raise NotStatic(f"{type(x).__name__} is not known before run time")
    return x


def _as_output_type(args: Args, value: Any) -> Any:
    """TorchScript's result type: pow(int, int) and max(int, float) give floats where Python may not."""
    kind = args.node.output().type().kind()
    if kind == "FloatType" and isinstance(value, int):
        return float(value)
    return value


@evaluator("aten::Int", "aten::Int.Tensor")
def to_int(args: Args) -> int:
    x = args[0]
    if is_symbolic(x):  # int() of a dynamic dim
        return x
    return int(x) if isinstance(x, str) else int(_number(x))


@evaluator("aten::Float", "aten::Float.Tensor")
def to_float(args: Args) -> float:
    x = args[0]
    return float(x) if isinstance(x, str) else float(_number(x))


@evaluator("aten::Bool", "aten::Bool.Tensor")
def to_bool(args: Args) -> bool:
    return bool(_number(args[0]))


@evaluator("aten::ScalarImplicit")
def scalar_implicit(args: Args) -> bool | int | float:
    """A 0-d tensor's value as a Scalar; a dynamic dim (traced shape arithmetic: `arange(past, past + seq)`) stays
    symbolic."""
    x = args[0]
    if is_symbolic(x):
        return x
    if not isinstance(x, torch.Tensor) or x.dim() != 0:
        raise NotStatic("ScalarImplicit needs a 0-d tensor known at build time")
    return x.item()


@evaluator("prim::NumToTensor.Scalar")
def num_to_tensor(args: Args) -> torch.Tensor:
    """A number as a 0-d tensor: int64 for ints, float64 for floats, bool for bools (as TorchScript makes it).
    A dynamic dim stays symbolic (an int64 0-d tensor of it: traced shape arithmetic)."""
    if is_symbolic(args[0]):
        return args[0]
    return torch.tensor(_number(args[0]))


def _round_to_zero_floordiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _range_length(lo: int, hi: int, step: int) -> int:
    if step == 0:
        raise ValueError("range() arg 3 must not be zero")
    return len(range(lo, hi, step))


def _extremum(pick: Callable) -> Callable[[Args], Any]:
    def evaluate(args: Args) -> Any:
        values = list(args)
        return _as_output_type(args, pick(values[0]) if len(values) == 1 else pick(values[0], values[1]))
    return evaluate


def _binary(fn: Callable) -> Callable[[Args], Any]:
    def evaluate(args: Args) -> Any:
        a, b = args[0], args[1]
        if has_symbols(a) or has_symbols(b):
            return _symbolic_binary(fn, a, b)
        return _as_output_type(args, fn(a, b))
    return evaluate


_COMPARISONS = {operator.eq: "eq", operator.ne: "ne", operator.lt: "lt", operator.gt: "gt", operator.le: "le",
                operator.ge: "ge"}
_SYMBOLIC_ARITHMETIC = {operator.add: operator.add, operator.sub: operator.sub, operator.mul: operator.mul,
                        operator.floordiv: floordiv, operator.mod: mod}


def _symbolic_binary(fn: Callable, a: Any, b: Any) -> Any:
    """Int arithmetic on a symbolic dim stays symbolic; a comparison is known only where the symbols' ranges
    settle it. Anything else (true division, powers, float operands) is a run-time value."""
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if fn not in (operator.eq, operator.ne) or not isinstance(a, (list, tuple)) or \
                not isinstance(b, (list, tuple)):
            return fn(a, b)
        equal = len(a) == len(b) and _all_equal(a, b)
        return equal if fn is operator.eq else not equal
    if isinstance(a, (float, bool)) or isinstance(b, (float, bool)):
        raise NotStatic("arithmetic of a dynamic dim with a float or bool is a run-time value")
    if fn in _COMPARISONS:
        result = decide(_COMPARISONS[fn], a, b)
        if result is None:
            raise NotStatic(f"{a} {_COMPARISONS[fn]} {b} depends on the input shapes")
        return result
    op = _SYMBOLIC_ARITHMETIC.get(fn)
    if op is None:
        raise NotStatic(f"{getattr(fn, '__name__', fn)} of the dynamic dim {a if is_symbolic(a) else b}")
    return as_dim(op(a, b))


def _all_equal(a: Any, b: Any) -> bool:
    """Element-wise equality of two lists holding dynamic dims, where their ranges settle every element."""
    results = [decide("eq", x, y) if is_symbolic(x) or is_symbolic(y) else x == y for x, y in zip(a, b)]
    if False in results:
        return False
    if None in results:
        raise NotStatic(f"{list(a)} == {list(b)} depends on the input shapes")
    return True


for _name, _fn in {
    "aten::add": operator.add, "aten::sub": operator.sub, "aten::mul": operator.mul,
    "aten::div": operator.truediv, "aten::floordiv": operator.floordiv,
    "aten::remainder": operator.mod,
    "aten::pow": operator.pow,
    "aten::eq": operator.eq, "aten::ne": operator.ne, "aten::lt": operator.lt, "aten::gt": operator.gt,
    "aten::le": operator.le, "aten::ge": operator.ge,
    "aten::__and__": operator.and_, "aten::__or__": operator.or_, "aten::__xor__": operator.xor,
    "aten::__round_to_zero_floordiv": _round_to_zero_floordiv,
}.items():
    evaluator(_name)(_binary(_fn))

evaluator("prim::max")(_extremum(lambda *xs: _symbolic_extremum(max, dim_max, xs)))
evaluator("prim::min")(_extremum(lambda *xs: _symbolic_extremum(min, dim_min, xs)))


def _symbolic_extremum(plain: Callable, symbolic: Callable, xs: tuple) -> Any:
    values = list(xs[0]) if len(xs) == 1 else list(xs)
    if not any(is_symbolic(v) for v in values):
        return plain(*xs)
    if any(isinstance(v, (float, bool)) for v in values):
        raise NotStatic("max/min of a dynamic dim and a float")
    out = values[0]
    for v in values[1:]:
        out = symbolic(out, v)
    return out


@evaluator("aten::__not__")
def not_(args: Args) -> bool:
    if not isinstance(args[0], (bool, int, float)):
        raise NotStatic(f"not of {type(args[0]).__name__}")
    return not args[0]


@evaluator("aten::__derive_index")
def derive_index(args: Args) -> int:
    """The loop variable of `for i in range(start, ..., step)` at iteration `index`."""
    return as_dim(args.start + args.index * args.step)


@evaluator("aten::__range_length")
def range_length(args: Args) -> int:
    """How many iterations `range(lo, hi, step)` makes."""
    if any(is_symbolic(v) for v in (args.lo, args.hi, args.step)):
        raise NotStatic("the length of a range over a dynamic dim is a run-time value")
    return _range_length(args.lo, args.hi, args.step)


# Not the bare "aten::neg": that key is the tensor overload, which has a converter.
@evaluator("aten::neg.int", "aten::neg.float", "aten::neg.Scalar")
def neg(args: Args):
    return as_dim(-args[0]) if is_symbolic(args[0]) else -args[0]


@evaluator("aten::sum.int", "aten::sum.float")
def sum_(args: Args) -> int | float:
    """`sum(self.shift_size)` (Swin); int sums of dynamic dims stay symbolic."""
    values = list(args[0])
    if not any(is_symbolic(v) for v in values):
        return sum(values)
    if any(isinstance(v, (float, bool)) for v in values):
        raise NotStatic("the sum of a dynamic dim and a float is a run-time value")
    out = 0
    for v in values:
        out = as_dim(out + v)
    return out


@evaluator("aten::ceil.float", "aten::ceil.int")
def ceil(args: Args) -> int:
    """`math.ceil(h / s)` (TF-"same" padding)."""
    return math.ceil(_number(args[0]))


@evaluator("aten::floor.float", "aten::floor.int")
def floor(args: Args) -> int:
    return math.floor(_number(args[0]))


@evaluator("aten::sqrt.int", "aten::sqrt.float")
def sqrt(args: Args) -> float:
    """`int(math.sqrt(N))`: the side of a square grid of N tokens (NesT's blocks)."""
    return math.sqrt(_number(args[0]))
