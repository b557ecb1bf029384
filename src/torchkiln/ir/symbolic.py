"""Symbolic dims: a dim is an int or an integer expression over named symbols, each with a known range.

Expressions are sympy expressions over `DimSymbol`s (sympy ships with torch). A symbol carries its own
range, so any code holding a dim can decide a comparison that the ranges settle (`decide`) and refuse
one they do not. Engines store an expression as a small JSON tree (`to_tree` / `from_tree`), never as
code: loading builds the expression node by node, with a bounded depth and size, and refuses one that could not
be stored again (a power above MAX_POWER) or whose expanded form is large (repeated squaring of sums), so that
what later expands or evaluates it runs in bounded time.

The torch-specific integer functions (FloorDiv, PythonMod, Max, Min...) that torch's symbolic shape
inference produces are read here too; this module and `symbolic_shapes` are the only users of torch's
internal sympy helpers.
"""
from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import Any, Union

import sympy
from torch.utils._sympy import functions as TF

Dim = Union[int, sympy.Expr]

MAX_TREE_DEPTH = 32
MAX_TREE_NODES = 512
MAX_POWER = 8  # the largest power of one factor a dim may hold (s0**8; a tree stores it as a product)
MAX_EXPANDED_TERMS = 256  # terms a dim's expanded form (products spread over sums) may have
MAX_EXTREMUM_ARGS = 4  # arguments of one Max or Min (sympy compares each pair when it makes one)


class SymbolicError(ValueError):
    """An expression this module cannot represent, bound, evaluate or serialize."""


class DimSymbol(sympy.Dummy):
    """A named dim with an integer range [lo, hi]; symbols are told apart by identity, not by name.

    `samples` are the values shape analysis saw for it at the inputs' min, opt and max shapes (compile time
    only; a loaded engine's symbols have none)."""

    def __new__(cls, name: str, lo: int, hi: int, samples: tuple[int, ...] | None = None) -> DimSymbol:
        if not 0 <= lo <= hi:
            raise SymbolicError(f"symbol {name}: bad range [{lo}, {hi}]")
        obj = super().__new__(cls, name, integer=True, nonnegative=True, positive=lo >= 1)
        obj.lo, obj.hi, obj.samples = int(lo), int(hi), samples
        return obj

    @property
    def opt(self) -> int:
        """The value the shapes were optimized for (the middle sample), or the low end of the range."""
        return self.samples[len(self.samples) // 2] if self.samples else self.lo

    def _sympystr(self, printer: Any) -> str:
        return self.name

    def _sympyrepr(self, printer: Any) -> str:
        return self.name


def is_symbolic(x: Any) -> bool:
    """Whether `x` is a symbolic dim (an expression with symbols), not an int."""
    return isinstance(x, sympy.Basic) and bool(x.free_symbols)


def has_symbols(value: Any) -> bool:
    """Whether a dim, a shape or any nesting of tuples and lists of them holds a symbolic dim."""
    if isinstance(value, (tuple, list)):
        return any(has_symbols(v) for v in value)
    return is_symbolic(value)


def symbols_of(value: Any) -> set[DimSymbol]:
    """The symbols a dim, a shape or a nesting of them uses."""
    if isinstance(value, (tuple, list)):
        found: set[DimSymbol] = set()
        for v in value:
            found |= symbols_of(v)
        return found
    return set(value.free_symbols) if is_symbolic(value) else set()


def as_dim(x: Any) -> Dim:
    """An int, or a symbolic expression; sympy integers become ints."""
    if isinstance(x, bool):
        raise SymbolicError(f"a dim must be an int, got {x!r}")
    if isinstance(x, int):
        return x
    if isinstance(x, sympy.Basic):
        if x.is_Integer:
            return int(x)
        if not x.free_symbols or not all(isinstance(s, DimSymbol) for s in x.free_symbols):
            raise SymbolicError(f"{x} is not an integer expression over dim symbols")
        return x
    try:
        return operator.index(x)
    except TypeError:
        raise SymbolicError(f"a dim must be an int or a symbolic dim, got {type(x).__name__} {x!r}") from None


def as_shape(shape: Iterable[Any]) -> tuple[Dim, ...]:
    return tuple(as_dim(d) for d in shape)


# ---- arithmetic that keeps the torch integer functions (so it serializes) ---------------------------

def floordiv(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a // b
    return as_dim(TF.FloorDiv(sympy.sympify(a), sympy.sympify(b)))


def mod(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return a % b
    return as_dim(TF.PythonMod(sympy.sympify(a), sympy.sympify(b)))


def dim_max(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    return as_dim(sympy.Max(a, b))


def dim_min(a: Dim, b: Dim) -> Dim:
    if isinstance(a, int) and isinstance(b, int):
        return min(a, b)
    return as_dim(sympy.Min(a, b))


def broadcast_shapes(*shapes: Iterable[Dim]) -> tuple[Dim, ...]:
    """torch.broadcast_shapes for shapes with symbolic dims; SymbolicError where the ranges do not settle it."""
    shapes = [tuple(s) for s in shapes]
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dim: Dim = 1
        for s in shapes:
            d = s[i - rank + len(s)] if i - rank + len(s) >= 0 else 1
            if isinstance(d, int) and d == 1 or d == dim or decide("eq", d, dim):
                continue
            if isinstance(dim, int) and dim == 1:
                dim = d
                continue
            raise SymbolicError(f"needs a static shape: cannot broadcast dims {dim} and {d}")
        out.append(dim)
    return tuple(out)


def product(dims: Iterable[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        out = as_dim(out * d)
    return out


# ---- evaluation and bounds ---------------------------------------------------------------------

_MAX = (sympy.Max, TF.Max)
_MIN = (sympy.Min, TF.Min)
_MOD = (TF.PythonMod, TF.Mod, sympy.Mod)
_FLOORDIV = (TF.FloorDiv, TF.CleanDiv)


def _walk(e: sympy.Basic, leaf: Callable[[DimSymbol], Any], ops: Mapping[str, Callable[..., Any]]) -> Any:
    if isinstance(e, DimSymbol):
        return leaf(e)
    if e.is_Integer:
        return ops["int"](int(e))
    if e.is_Rational:
        return ops["rational"](Fraction(int(e.p), int(e.q)))
    args = [_walk(a, leaf, ops) for a in e.args]
    if isinstance(e, sympy.Add):
        return ops["add"](args)
    if isinstance(e, sympy.Mul):
        return ops["mul"](args)
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 0:
        return ops["mul"]([args[0]] * int(e.exp))
    if isinstance(e, _FLOORDIV):
        return ops["floordiv"](*args)
    if isinstance(e, (sympy.floor, TF.FloorToInt)):
        return ops["floor"](args[0])
    if isinstance(e, (sympy.ceiling, TF.CeilToInt)):
        return ops["ceil"](args[0])
    if isinstance(e, TF.IntTrueDiv):
        return ops["truediv"](*args)
    if isinstance(e, _MOD):
        return ops["mod"](*args)
    if isinstance(e, _MAX):
        return ops["max"](args)
    if isinstance(e, _MIN):
        return ops["min"](args)
    raise SymbolicError(f"unsupported symbolic expression {e} ({type(e).__name__})")


def _exact_floordiv(a: Fraction, b: Fraction) -> int:
    if b == 0:
        raise SymbolicError("division by zero in a symbolic dim")
    return math.floor(a / b)


_EXACT = {
    "int": Fraction, "rational": lambda f: f, "add": sum, "mul": math.prod,
    "floordiv": lambda a, b: Fraction(_exact_floordiv(a, b)), "floor": lambda a: Fraction(math.floor(a)),
    "ceil": lambda a: Fraction(math.ceil(a)), "truediv": lambda a, b: a / b,
    "mod": lambda a, b: a - b * _exact_floordiv(a, b), "max": max, "min": min,
}


def evaluate(d: Dim, bindings: Mapping[DimSymbol, int]) -> int:
    """The int value of a dim once every symbol it uses is bound."""
    if isinstance(d, int):
        return d

    def leaf(s: DimSymbol) -> Fraction:
        if s not in bindings:
            raise SymbolicError(f"symbol {s.name} is not bound")
        return Fraction(bindings[s])

    value = _walk(d, leaf, _EXACT)
    if value.denominator != 1:
        raise SymbolicError(f"{d} is not an integer for {dict((k.name, v) for k, v in bindings.items())}")
    return int(value)


def substitute(value: Any, bindings: Mapping[DimSymbol, int]) -> Any:
    """`value` (a dim, or tuples and lists of dims and other data) with every symbolic dim evaluated."""
    if isinstance(value, tuple):
        return tuple(substitute(v, bindings) for v in value)
    if isinstance(value, list):
        return [substitute(v, bindings) for v in value]
    return evaluate(value, bindings) if is_symbolic(value) else value


def agree_on_samples(a: Any, b: Any) -> bool:
    """Whether two dims or shapes took the same values at every sample of their symbols (what shape analysis
    saw at min, opt and max); exact equality when neither is symbolic."""
    a, b = (tuple(x) if isinstance(x, list) else x for x in (a, b))
    if not has_symbols(a) and not has_symbols(b):
        return a == b
    if isinstance(a, (tuple, list)) != isinstance(b, (tuple, list)) or \
            isinstance(a, (tuple, list)) and len(a) != len(b):
        return False
    used = symbols_of(a) | symbols_of(b)
    if any(s.samples is None for s in used) or len({len(s.samples) for s in used}) != 1:
        return False
    for k in range(len(next(iter(used)).samples)):
        bindings = {s: s.samples[k] for s in used}
        if substitute(a, bindings) != substitute(b, bindings):
            return False
    return True


def shape_range(shape: Iterable[Dim]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(min, opt, max) shapes of a shape whose dims are ints or single symbols (an engine input)."""
    shape = tuple(shape)
    for d in shape:
        if is_symbolic(d) and not isinstance(d, DimSymbol):
            raise SymbolicError(f"an engine input dim must be an int or a single symbol, got {d}")
    pick = [lambda s: s.lo, lambda s: s.opt, lambda s: s.hi]
    return tuple(tuple(f(d) if isinstance(d, DimSymbol) else d for d in shape) for f in pick)


Interval = tuple[float, float]


def _imul(xs: list[Interval]) -> Interval:
    lo, hi = 1.0, 1.0
    for a, b in xs:
        corners = [0.0 if p == 0 or q == 0 else p * q for p in (lo, hi) for q in (a, b)]
        lo, hi = min(corners), max(corners)
    return lo, hi


def _ifloordiv(a: Interval, b: Interval) -> Interval:
    if b[0] <= 0 <= b[1]:
        return -math.inf, math.inf
    q = [x / y for x in a for y in b]
    return math.floor(min(q)), math.floor(max(q))


def _imod(a: Interval, b: Interval) -> Interval:
    if b[0] > 0:
        if a[0] >= 0 and a[1] < b[0]:
            return a
        return 0, b[1] - 1
    return -math.inf, math.inf


_BOUNDS = {
    "int": lambda v: (v, v), "rational": lambda f: (float(f), float(f)),
    "add": lambda xs: (sum(x[0] for x in xs), sum(x[1] for x in xs)), "mul": _imul,
    "floordiv": _ifloordiv, "floor": lambda a: (math.floor(a[0]), math.floor(a[1])),
    "ceil": lambda a: (math.ceil(a[0]), math.ceil(a[1])),
    "truediv": lambda a, b: (-math.inf, math.inf) if b[0] <= 0 <= b[1] else
    (min(x / y for x in a for y in b), max(x / y for x in a for y in b)),
    "mod": _imod, "max": lambda xs: (max(x[0] for x in xs), max(x[1] for x in xs)),
    "min": lambda xs: (min(x[0] for x in xs), min(x[1] for x in xs)),
}


def bounds(d: Dim) -> tuple[float, float]:
    """A range that surely holds the dim for every value of its symbols (interval arithmetic)."""
    if isinstance(d, int):
        return d, d
    try:
        return _walk(d, lambda s: (s.lo, s.hi), _BOUNDS)
    except SymbolicError:
        return -math.inf, math.inf


MAX_ENUMERATED_POINTS = 4096


def _enumerated_bounds(e: sympy.Expr, lo: float, hi: float) -> tuple[float, float]:
    """Exact min and max of `e` over every integer point of its symbols' ranges, where there are few points."""
    symbols = sorted(e.free_symbols, key=lambda s: s.name)
    if not all(isinstance(s, DimSymbol) for s in symbols) or \
            math.prod(s.hi - s.lo + 1 for s in symbols) > MAX_ENUMERATED_POINTS:
        return lo, hi
    values = []
    for point in itertools.product(*(range(s.lo, s.hi + 1) for s in symbols)):
        try:
            values.append(evaluate(e, dict(zip(symbols, point))))
        except SymbolicError:
            return lo, hi
    return min(values), max(values)


_COMPARE = {"eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
            "ge": operator.ge}


def decide(op: str, a: Any, b: Any) -> bool | None:
    """`a <op> b` (op: eq, ne, lt, le, gt, ge) when the symbols' ranges settle it, else None."""
    if not (is_symbolic(a) or is_symbolic(b)):
        return bool(_COMPARE[op](a, b))
    diff = sympy.expand(sympy.sympify(a) - sympy.sympify(b))
    lo, hi = (int(diff), int(diff)) if diff.is_Integer else bounds(diff)
    if lo < 0 <= hi or lo <= 0 < hi:  # intervals lose correlations: try every point of a small range box
        lo, hi = _enumerated_bounds(diff, lo, hi)
    if op == "eq":
        return True if lo == hi == 0 else (False if lo > 0 or hi < 0 else None)
    if op == "ne":
        result = decide("eq", a, b)
        return None if result is None else not result
    if op in ("lt", "le"):
        strict = op == "lt"
        if hi < 0 or (not strict and hi <= 0):
            return True
        if lo > 0 or (strict and lo >= 0):
            return False
        return None
    flipped = {"gt": "lt", "ge": "le"}[op]
    return decide(flipped, b, a)


# ---- text ----------------------------------------------------------------------------------------

def dim_str(d: Dim) -> str:
    return str(d) if isinstance(d, int) else sympy.sstr(d).replace(" ", "")


def shape_str(shape: Iterable[Dim]) -> str:
    """`s0,128` for a shape; used in reports and dumps."""
    return ",".join(dim_str(d) for d in shape)


def ranges_str(symbols: Iterable[DimSymbol]) -> str:
    """`s0 in [1, 8], s1 in [4, 64]`."""
    return ", ".join(f"{s.name} in [{s.lo}, {s.hi}]" for s in sorted(symbols, key=lambda s: s.name))


# ---- the JSON tree -------------------------------------------------------------------------------

_TREE_OPS = ("add", "mul", "floordiv", "mod", "max", "min")


def _short(d: Any, limit: int = 120) -> str:
    text = str(d)
    return text if len(text) <= limit else text[:limit] + "..."


def expanded_terms(e: sympy.Basic) -> int:
    """An upper bound on the terms of `sympy.expand(e)`, past MAX_EXPANDED_TERMS counted as one more; a function's
    arguments (FloorDiv, Max...) are expanded inside it and each counted the same way."""
    cap = MAX_EXPANDED_TERMS + 1
    if isinstance(e, sympy.Add):
        return min(sum(expanded_terms(a) for a in e.args), cap)
    if isinstance(e, sympy.Mul):
        count = 1
        for a in e.args:
            count = min(count * expanded_terms(a), cap)
        return count
    if isinstance(e, sympy.Pow) and e.exp.is_Integer:
        base = expanded_terms(e.base)
        return base if base == 1 else min(base ** min(abs(int(e.exp)), MAX_TREE_NODES), cap)
    return max([1] + [cap for a in e.args if expanded_terms(a) == cap])


def to_tree(d: Dim) -> Any:
    """A JSON-able tree of the dim: an int, or {"op": ..., "args": [...]} / {"op": "sym", "name": ...}."""
    if isinstance(d, int):
        return d
    if expanded_terms(d) > MAX_EXPANDED_TERMS:
        raise SymbolicError(f"symbolic dim {_short(d)} is too large to store: expanded, it has over "
                            f"{MAX_EXPANDED_TERMS} terms")
    count = [0]

    def rational_floor(x: sympy.Expr) -> Any:
        num, den = sympy.fraction(sympy.together(x))
        if not den.is_Integer or int(den) <= 0:
            raise SymbolicError(f"cannot store {d}: floor of {x}")
        return {"op": "floordiv", "args": [build(sympy.expand(num), 1), int(den)]}

    def build(e: sympy.Expr, depth: int) -> Any:
        count[0] += 1
        if depth > MAX_TREE_DEPTH or count[0] > MAX_TREE_NODES:
            raise SymbolicError(f"symbolic dim {d} is too large to store")
        if isinstance(e, DimSymbol):
            return {"op": "sym", "name": e.name}
        if e.is_Integer:
            return int(e)
        if isinstance(e, sympy.Add):
            return {"op": "add", "args": [build(a, depth + 1) for a in e.args]}
        if isinstance(e, sympy.Mul):
            return {"op": "mul", "args": [build(a, depth + 1) for a in e.args]}
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and 1 <= int(e.exp) <= MAX_POWER:
            return {"op": "mul", "args": [build(e.base, depth + 1)] * int(e.exp)}
        if isinstance(e, _FLOORDIV):
            return {"op": "floordiv", "args": [build(a, depth + 1) for a in e.args]}
        if isinstance(e, (sympy.floor, TF.FloorToInt)):
            return rational_floor(e.args[0])
        if isinstance(e, (sympy.ceiling, TF.CeilToInt)):  # ceil(x) = -floor(-x)
            inner = rational_floor(-e.args[0])
            return {"op": "mul", "args": [-1, inner]}
        if isinstance(e, _MOD):
            return {"op": "mod", "args": [build(a, depth + 1) for a in e.args]}
        if isinstance(e, _MAX + _MIN):
            if len(e.args) > MAX_EXTREMUM_ARGS:
                raise SymbolicError(f"cannot store symbolic dim {_short(d)}: a Max or Min of over "
                                    f"{MAX_EXTREMUM_ARGS} arguments")
            return {"op": "max" if isinstance(e, _MAX) else "min", "args": [build(a, depth + 1) for a in e.args]}
        if isinstance(e, sympy.Pow):
            raise SymbolicError(f"cannot store symbolic dim {_short(d)}: {_short(e)} is a power above {MAX_POWER}")
        raise SymbolicError(f"cannot store symbolic dim {_short(d)}: {type(e).__name__} is not supported")

    return build(sympy.sympify(d), 0)


def from_tree(tree: Any, symbols: Mapping[str, DimSymbol]) -> Dim:
    """Build a dim back from `to_tree`'s form; raises SymbolicError for anything malformed or too large, or that
    `to_tree` would not store (the nodes may combine: a product of nine s0 is s0**9)."""
    count = [0]

    def build(t: Any, depth: int) -> Any:
        count[0] += 1
        if depth > MAX_TREE_DEPTH or count[0] > MAX_TREE_NODES:
            raise SymbolicError("symbolic dim tree is too deep or too large")
        if isinstance(t, int) and not isinstance(t, bool):
            if abs(t) >= 1 << 62:
                raise SymbolicError(f"integer {t} out of range in a symbolic dim")
            return sympy.Integer(t)
        if not isinstance(t, dict) or not isinstance(t.get("op"), str):
            raise SymbolicError(f"malformed symbolic dim node {t!r:.80}")
        op = t["op"]
        if op == "sym":
            name = t.get("name")
            if set(t) != {"op", "name"} or not isinstance(name, str) or name not in symbols:
                raise SymbolicError(f"unknown symbol in symbolic dim node {t!r:.80}")
            return symbols[name]
        args = t.get("args")
        if op not in _TREE_OPS or set(t) != {"op", "args"} or not isinstance(args, list) or not args \
                or len(args) > 64:
            raise SymbolicError(f"malformed symbolic dim node {t!r:.80}")
        built = [build(a, depth + 1) for a in args]
        if op == "add":
            return sympy.Add(*built)
        if op == "mul":
            return sympy.Mul(*built)
        if op in ("max", "min"):
            if len(built) > MAX_EXTREMUM_ARGS:
                raise SymbolicError(f"a {op} of {len(built)} arguments (at most {MAX_EXTREMUM_ARGS})")
            extremum = (sympy.Max if op == "max" else sympy.Min)(*built)
            if isinstance(extremum, _MAX + _MIN) and len(extremum.args) > MAX_EXTREMUM_ARGS:  # nested ones merge
                raise SymbolicError(f"a {op} of over {MAX_EXTREMUM_ARGS} arguments")
            return extremum
        if len(built) != 2:
            raise SymbolicError(f"{op} takes 2 arguments, got {len(built)}")
        return (TF.FloorDiv if op == "floordiv" else TF.PythonMod)(*built)

    try:
        d = as_dim(build(tree, 0))
    except (TypeError, ZeroDivisionError) as e:
        raise SymbolicError(f"bad symbolic dim: {e}") from None
    to_tree(d)
    return d
