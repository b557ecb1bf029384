"""A Triton kernel for a fused group around reductions over the same axes of one iteration space, and its launcher.

The space is a shape of rank R, K of whose axes are reduced: its kept dims index *rows*, its reduced dims
*columns*. The kernel's own space puts the reduced dims last (`kernel_order`: a sum over the H and W of an
[N, H, W, C] tensor is a reduction of [N, C, H, W] rows), which its strides express, so no operand is copied
whatever axes are reduced. A group holds, in an order where each layer's inputs come first:
- pointwise layers (rows of `torchkiln.ir.pointwise`, casts, scales, constants: what `pointwise.fusable` takes)
  whose output is the whole space (*full* values) or the space with its reduced dims of size 1 (*row* values);
- reductions of a full value over those K axes: reduce (sum, mean, max, min; kept dims or not), softmax and
  log-softmax (K = 1), layer norm over the trailing K dims, instance norm (K = R - 2) and group norm. Each is
  lowered here into the same few primitives: a row reduction (sum, max or min) and pointwise expressions, so no
  norm has a kernel of its own (softmax: max, exp(x - max), sum, divide; a norm: mean, x - mean, mean of squares,
  rsqrt, scale and shift);
- scans along one axis (K = 1): cumulative sums and products, of floats (in float32) or integers (in the
  result's dtype: torch.cumsum of integers gives int64), whose result is a full value (`tl.associative_scan` over
  the row; in the looped body each pass carries the running total of the columns before it).

Values are held as in the pointwise generator (floats in float32, bools as int1, integers in their own type):
operands are cast on load, results rounded to their dtype on store, a cast layer to a half type rounds where it
stands. Reductions take and accumulate float32; max and min propagate NaN as torch's do.

Two bodies are generated from the same layers. Where a row fits one program's registers (at most
`MAX_PERSISTENT` columns), the *persistent* body loads each operand once, keeps the row in registers through
every reduction and stores each output once. Longer rows take the *looped* body: one pass over the row per
reduction depth (a softmax has two: the max, then the sum of exponentials), recomputing the pointwise values
from the operands in each pass, then a last pass that stores the full outputs.

Operands (group inputs and weights) and outputs are read and written through their strides broadcast to the
space, so one source serves every shape and layout (Triton compiles it once per value of the sizes where they are
compile-time constants: `constant_sizes`); row offsets are computed once per program, column offsets once per pass.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from torchkiln.errors import EngineInputError, NetworkError
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.cuda.codegen import (PDL_PARAM, WAIT_LINES, chain_options, launch, multiprocessors,
                                                    needs_int64)
from torchkiln.runtime.backends.cuda.codegen.pointwise import (FLOATS, HEADER, READ_DTYPES, TL, VALUE_DTYPES, Builder,
                                                                GroupLauncher, Value, converted, emit_layer, fusable,
                                                                held, loaded, stored)

KERNEL = "rows_kernel"
LOOPED = "rows_kernel_looped"
SPLIT_STATS, SPLIT_APPLY = "rows_split_stats_kernel", "rows_split_apply_kernel"
TRANSPOSED = "_t"  # a kernel's name suffix where its tile is [columns, rows] (`RowLauncher` says when)
SUB_ROWS = "_s"  # ... and a split norm's apply over sub-rows (`RowLauncher._split_short_runs`)
MAX_PERSISTENT = 16384  # columns a program keeps in registers; longer rows are reduced in passes
LOOP_BLOCK = 2048  # columns a pass of the looped body covers
_TILE = 1024  # elements per program that short rows are packed up to...
MIN_PROGRAMS = 256  # ... while that leaves at least this many programs (about two per streaming multiprocessor)
MIN_BLOCK = 2  # columns a tile holds at least (a row of 2, a radix-2 split's sum, is not padded to 16 lanes)
_ACROSS_TILE = 4096  # elements per program tile where rows are tiled across (`_interleaved_run`)
SPLIT_MIN_COLS = 4096  # a norm's rows at least this long may be reduced in spans (`RowLauncher._split_reduction`)
MAX_SPLITS = 256  # spans of a row at most
_SHORT_RUN_TILE = 8192  # elements per program of a split norm over short interleaved runs (`_split_short_runs`)
FEW_PROGRAM_WARPS = 8  # warps a program of a launch too small to fill the GPU may take (`_num_warps`)
_NEUTRAL = {"sum": "0.0", "max": "-INF", "min": "INF"}
# the reductions' combining functions (codegen/attention.py's kernel reduces with them too)
COMBINE = '''
@triton.jit
def _sum(a, b):  # combining functions, defined here: Triton's interpreter runs only this module's
    return a + b


@triton.jit
def _max(a, b):  # NaN wins, as in torch.amax
    return tl.where((a > b) | (a != a), a, b)


@triton.jit
def _min(a, b):
    return tl.where((a < b) | (a != a), a, b)


@triton.jit
def _prod(a, b):
    return a * b
'''
_REDUCE_OPS = {L.ReduceOperation.SUM: "sum", L.ReduceOperation.AVG: "sum", L.ReduceOperation.MAX: "max",
               L.ReduceOperation.MIN: "min"}
_SCANS = {L.CumulativeOperation.SUM: ("sum", "+", 0), L.CumulativeOperation.PROD: ("prod", "*", 1)}  # op, neutral
_SCANNED = (*FLOATS, torch.int64)  # the results a scan computes (torch.cumsum and cumprod widen integers to int64)


def _axes(rank: int, axes: Sequence[int]) -> tuple[int, ...] | None:
    """`axes` of a rank-`rank` tensor, normalized and sorted; None where there are none or one repeats."""
    normalized = sorted({a % rank for a in axes}) if rank else []
    return tuple(normalized) if normalized and len(normalized) == len(axes) else None


def reduced_axes(layer: L.Layer) -> tuple[int, ...] | None:
    """The axes `layer` reduces (sorted), if it is a reduction this generator computes; else None."""
    x = layer.inputs[0] if layer.inputs else None
    if x is None or x.rank == 0:
        return None
    if isinstance(layer, L.ReduceLayer):
        return _axes(x.rank, layer.axes) if layer.op in _REDUCE_OPS else None
    if isinstance(layer, (L.SoftMaxLayer, L.CumulativeLayer)):
        return (layer.axis % x.rank,)
    if isinstance(layer, L.NormalizationLayer):
        if layer.kind == L.NormalizationKind.LAYER:
            k = len(layer.normalized_shape)
            return tuple(range(x.rank - k, x.rank)) if 0 < k <= x.rank else None
        if layer.kind == L.NormalizationKind.INSTANCE and x.rank >= 3:
            return tuple(range(2, x.rank))
        if layer.kind == L.NormalizationKind.GROUP and x.rank >= 2:
            return tuple(range(1, x.rank))  # the channels (split into groups: `groups_of`) and the spatial dims
    return None


def kernel_order(rank: int, axes: Sequence[int]) -> tuple[int, ...] | None:
    """The tensor dims in the kernel space's order, kept dims first (in order) and `axes` last; None where `axes`
    are the trailing ones already (the space is the tensors' own)."""
    order = (*(d for d in range(rank) if d not in axes), *axes)
    return None if order == tuple(range(rank)) else order


def groups_of(layer: L.Layer) -> int | None:
    """G where `layer` is a group norm: its dim 1 is split into (G, C / G) and the rows are (N, G)."""
    return layer.num_groups if isinstance(layer, L.NormalizationLayer) and \
        layer.kind == L.NormalizationKind.GROUP else None


def reduction_fusable(layer: L.Layer) -> str | None:
    """None if `layer` is a reduction the generator computes, else why not."""
    axes = reduced_axes(layer)
    if axes is None:
        return f"{layer.KIND} is not a reduction the generator computes"
    if all(layer.inputs[0].shape[a] == 1 for a in axes):
        return "it reduces axes of size 1"
    if isinstance(layer, L.CumulativeLayer):
        if layer.inputs[0].dtype not in VALUE_DTYPES or layer.outputs[0].dtype not in _SCANNED:
            return f"a scan of {layer.inputs[0].dtype} giving {layer.outputs[0].dtype}: generated scans give " \
                   f"float32, float16, bfloat16 and int64 values"
        return None
    dtypes = [t.dtype for t in (*layer.inputs, *layer.outputs)] + [w.dtype for w in layer.weights.values()]
    wrong = [d for d in dtypes if d not in FLOATS]
    if wrong:
        return f"dtype {wrong[0]}: generated reductions compute float32, float16 and bfloat16 values"
    return None


@dataclasses.dataclass(frozen=True)
class RowKernel:
    """Generated source and what its launcher binds (see PointwiseKernel); `rank` and `reduced` describe the
    space, `row_outputs` which outputs are row values (stored once per row)."""

    source: str
    inputs: tuple[Tensor, ...]
    weights: tuple[torch.Tensor, ...]
    outputs: tuple[Tensor, ...]
    rank: int  # of the tensors; the kernel's space has one more dim where `groups` splits dim 1
    reduced: int
    order: tuple[int, ...] | None  # the tensor dims in the kernel space's order (`kernel_order`); None: their own
    row_outputs: tuple[bool, ...]
    has_max: bool
    groups: int | None = None
    depth: int = 1  # reductions chained (a norm: 2; scans only: 0): the looped body's passes before its stores
    splittable: bool = False  # the source has the split reduction's two kernels (`_Source.source` says when)
    split_sum: bool = False  # ... and they compute one sum with row outputs only: one apply program per row block


@dataclasses.dataclass
class _Op:
    """One step of the group, lowered: a pointwise layer, an expression over earlier values, or a reduction."""

    kind: str  # "layer", "expr", "weight", "reduce", "scan"
    out: object  # value key
    args: tuple = ()  # value keys read
    layer: L.Layer | None = None
    template: str = ""  # expr: Python format over the args' float values; reduce: the combining op
    mean: bool = False  # reduce: divide by the column count
    weight: torch.Tensor | None = None


class _Lowering:
    """A group's layers as _Ops, with each value's kind (row or full) and depth (reductions before it)."""

    def __init__(self, layers: Sequence[L.Layer], inputs: Sequence[Tensor], rank: int, axes: tuple[int, ...]
                 ) -> None:
        self.rank, self.axes, self.reduced = rank, axes, len(axes)
        self.ops: list[_Op] = []
        self.norms: list[tuple[object, object]] = []  # a norm's mean and variance reductions
        self.row: dict[object, bool] = {id(t): self.is_row_shape(t.shape) for t in inputs}
        self.depth: dict[object, int] = {id(t): 0 for t in inputs}
        for layer in layers:
            self.lower(layer)

    def is_row_shape(self, shape: Sequence) -> bool:
        """Whether a value of this shape (right-aligned to the space) is constant along the reduced axes."""
        padded = [1] * (self.rank - len(shape)) + list(shape)
        return all(isinstance(padded[a], int) and padded[a] == 1 for a in self.axes)

    def splittable(self) -> bool:
        """Whether the group's only reductions are one norm's mean and variance, which a split reduction computes
        from partial statistics of spans of each row (`_Source.split_stats`, `_Source.split_apply`)."""
        reductions = [op.out for op in self.ops if op.kind in ("reduce", "scan")]
        return len(self.norms) == 1 and reductions == list(self.norms[0])

    def one_sum(self) -> bool:
        """Whether the group's only reduction is one sum (or mean), which a split reduction computes from the
        partial sums of spans of each row (`_Source.split_sum_stats`, `_Source.split_sum_apply`)."""
        reductions = [op for op in self.ops if op.kind in ("reduce", "scan")]
        return len(reductions) == 1 and reductions[0].kind == "reduce" and reductions[0].template == "sum"

    def add(self, op: _Op, row: bool | None = None) -> object:
        if op.kind == "reduce":
            self.row[op.out], self.depth[op.out] = True, self.depth[op.args[0]] + 1
        elif op.kind == "scan":  # a full value, computed in the pass over the row that computes its input
            self.row[op.out], self.depth[op.out] = False, self.depth[op.args[0]]
        else:
            self.row[op.out] = all(self.row[a] for a in op.args) if row is None else row
            self.depth[op.out] = max((self.depth[a] for a in op.args), default=0)
        self.ops.append(op)
        return op.out

    def expr(self, key: object, template: str, *args: object) -> object:
        return self.add(_Op("expr", key, tuple(args), template=template))

    def reduce(self, key: object, x: object, combine: str, mean: bool = False) -> object:
        if self.row[x]:
            raise NetworkError(f"a generated reduction reads {key!r}'s input as one value per row")
        return self.add(_Op("reduce", key, (x,), template=combine, mean=mean))

    def lower(self, layer: L.Layer) -> None:
        missing = [t.name for t in layer.inputs if id(t) not in self.row]
        if missing:
            raise NetworkError(f"{layer.KIND} layer {layer.name!r} reads {missing}, which are neither group inputs "
                               f"nor outputs of earlier layers of the group")
        x, out = id(layer.inputs[0]) if layer.inputs else None, id(layer.outputs[0])
        name = layer.name
        if reduced_axes(layer) is None:
            reason = fusable(layer)
            if reason is not None:
                raise NetworkError(f"{layer.KIND} layer {name!r} cannot be fused: {reason}")
            if isinstance(layer, L.ConstantLayer):  # an operand, broadcast by its readers like a group input
                self.add(_Op("layer", out, layer=layer), row=self.is_row_shape(layer.outputs[0].shape))
                return
            if layer.outputs[0].rank > self.rank:
                raise NetworkError(f"{layer.KIND} layer {name!r} of rank {layer.outputs[0].rank} is not over the "
                                   f"group's space of rank {self.rank}")
            dropped = [t.name for t in layer.inputs if t.rank < self.rank and self.depth.get(id(t), 0)]
            if dropped:
                raise NetworkError(f"{layer.KIND} layer {name!r} reads {dropped}, reduced without their kept dims")
            self.add(_Op("layer", out, tuple(id(t) for t in layer.inputs), layer=layer))
            return
        if reduced_axes(layer) != self.axes or layer.inputs[0].rank != self.rank:
            raise NetworkError(f"{layer.KIND} layer {name!r} does not reduce the group's axes {list(self.axes)} "
                               f"of rank {self.rank}")
        if isinstance(layer, L.ReduceLayer):
            self.reduce(out, x, _REDUCE_OPS[layer.op], mean=layer.op == L.ReduceOperation.AVG)
        elif isinstance(layer, L.CumulativeLayer):
            if self.row[x]:
                raise NetworkError(f"a generated scan reads {name!r}'s input as one value per row")
            self.add(_Op("scan", out, (x,), layer=layer))
        elif isinstance(layer, L.SoftMaxLayer):
            m = self.reduce((name, "max"), x, "max")
            shifted = self.expr((name, "shifted"), "{} - {}", x, m)
            e = self.expr((name, "exp"), "tl.exp({})", shifted)
            s = self.reduce((name, "sum"), e, "sum")
            if layer.log:
                self.expr(out, "{} - tl.log({})", shifted, s)
            else:
                self.expr(out, "{} / {}", e, s)
        else:
            mean = self.reduce((name, "mean"), x, "sum", mean=True)
            centered = self.expr((name, "centered"), "{} - {}", x, mean)
            var = self.reduce((name, "var"), self.expr((name, "square"), "{} * {}", centered, centered), "sum",
                              mean=True)
            self.norms.append((mean, var))
            value = self.expr((name, "normed"), f"{{}} * tl.rsqrt({{}} + {layer.epsilon!r})", centered, var)
            for wname, template in (("scale", "{} * {}"), ("bias", "{} + {}")):
                w = layer.weights.get(wname)
                if w is None:
                    continue
                if layer.kind != L.NormalizationKind.LAYER:  # per channel
                    w = w.reshape([-1] + [1] * (self.rank - 2))
                key = self.add(_Op("weight", (name, wname), weight=w), row=self.is_row_shape(w.shape))
                value = self.expr((name, f"{wname}d"), template, value, key)
            self.expr(out, "{}", value)


class _Emitter(Builder):
    """Source lines of one pass: values named with the pass's prefix; loads of full or row operands."""

    def __init__(self, kernel: _Source, prefix: str, lines: list[str], carries: list[str] | None = None) -> None:
        super().__init__(kernel.rank)
        self.kernel, self.prefix, self.lines = kernel, prefix, lines
        self.count = 0
        self.carries = carries  # in a pass of the looped body: the lines before its loop (a scan's carry)
        self.loads: set[str] = set()  # the lines that load an operand (they read nothing the pass computes)

    def emit(self, expr: str, dtype: torch.dtype) -> Value:
        var = f"{self.prefix}{self.count}"
        self.count += 1
        self.lines.append(f"{var} = {expr}")
        return var, dtype

    def load(self, name: str, dtype: torch.dtype) -> Value:
        row = self.kernel.row_operand[name]
        where = f"{name} + ro_{name}" if row else f"{name} + ro_{name} + co_{name}"
        value = self.emit(loaded(f"tl.load({where}, mask={'rmask' if row else 'mask'}, other=0)", dtype), held(dtype))
        self.loads.add(self.lines[-1])
        return value

    def loads_first(self) -> list[str]:
        """The pass's lines with every load moved ahead of the rest, in order: a load then waits on no reduction
        (a layer norm's scale and shift, read after its two reductions, cost an H100 0.14 us more a [1,128,768]
        add + layer norm: 1.96 against 1.82 us)."""
        return [line for line in self.lines if line in self.loads] + \
            [line for line in self.lines if line not in self.loads]

    def load_weight(self, weight: torch.Tensor) -> Value:
        return self.load(self.kernel.weight_operand(weight), weight.dtype)


class _Source:
    """Both bodies of a group's kernel."""

    def __init__(self, lowering: _Lowering, inputs: Sequence[Tensor], outputs: Sequence[Tensor], split: bool,
                 static: bool = False) -> None:
        self.lowering = lowering
        self.static = static  # the space's sizes are known at build (`constant_sizes`)
        self.rank, self.reduced = lowering.rank + split, lowering.reduced  # the kernel's space
        self.inputs, self.outputs = list(inputs), list(outputs)
        self.row_operand = {f"in{i}": lowering.row[id(t)] for i, t in enumerate(inputs)}
        self.weights: list[torch.Tensor] = []
        self._weight_names: dict[tuple, str] = {}
        self.values: dict[object, Value] = {}
        self.transposed = False  # the tile is [columns, rows] (`across`, `along` and `axis` name its axes)

    @property
    def across(self) -> str:
        """The index suffix that lays a vector of rows along the tile's row axis."""
        return "[None, :]" if self.transposed else "[:, None]"

    @property
    def along(self) -> str:
        """The index suffix that lays a vector of columns along the tile's column axis."""
        return "[:, None]" if self.transposed else "[None, :]"

    @property
    def axis(self) -> int:
        """The tile's column axis (what a row's reduction reduces)."""
        return 0 if self.transposed else 1

    @property
    def row_shape(self) -> str:
        """The shape of a tile of one value per row (an accumulator's, a carry's)."""
        return "[1, ROWS]" if self.transposed else "[ROWS, 1]"

    def weight_operand(self, weight: torch.Tensor) -> str:
        """The operand name of a weight (each weight is bound once, however many passes read it)."""
        w = weight.reshape(()) if weight.numel() == 1 else weight
        key = (w.data_ptr(), tuple(w.shape), tuple(w.stride()), w.dtype)  # a layer's reshaped view: the same weight
        name = self._weight_names.get(key)
        if name is None:
            if w.dim() > self.rank:
                raise NetworkError(f"a weight of shape {list(weight.shape)} does not broadcast to rank {self.rank}")
            name = self._weight_names[key] = f"w{len(self.weights)}"
            self.weights.append(w)
            self.row_operand[name] = self.lowering.is_row_shape(w.shape)
        return name

    def emit_op(self, b: _Emitter, op: _Op) -> None:
        if op.kind == "scan":
            self.values[op.out] = self.scan(b, op)
        elif op.kind == "layer":
            self.values[op.out] = emit_layer(b, op.layer, [self.values[a] for a in op.args])
        elif op.kind == "weight":
            self.values[op.out] = b.weight(op.weight)
        else:
            self.values[op.out] = b.emit(op.template.format(*(Builder.as_float(self.values[a]) for a in op.args)),
                                         torch.float32)

    def scan(self, b: _Emitter, op: _Op) -> Value:
        """A scan along the row in the result's dtype; in a pass of the looped body, plus (times) the carry of the
        columns before, which the pass then advances by the block's total."""
        dtype = held(op.layer.outputs[0].dtype)
        name, combine, neutral = _SCANS[op.layer.op]
        x = converted(self.values[op.args[0]], dtype)
        x = x if x.isidentifier() else b.emit(x, dtype)[0]
        # (tl.cumsum: the interpreter runs this module's functions)
        scanned = f"tl.associative_scan({x}, {self.axis}, _{name})"
        if b.carries is None:
            return b.emit(scanned, dtype)
        carry = f"{b.prefix}carry{len(b.carries)}"
        b.carries.append(f"{carry} = tl.full({self.row_shape}, {neutral}, {TL[dtype]})")
        value = b.emit(f"{carry} {combine} {scanned}", dtype)
        b.lines.append(f"{carry} = {carry} {combine} tl.reduce({x}, {self.axis}, _{name}){self.across}")
        return value

    def load_inputs(self, b: _Emitter, row: bool) -> None:
        for i, t in enumerate(self.inputs):
            if self.row_operand[f"in{i}"] == row:
                self.values[id(t)] = b.inlined(L.constant_value(t)) or b.load(f"in{i}", t.dtype)

    def reduction(self, op: _Op) -> str:
        x = Builder.as_float(self.values[op.args[0]])
        return f"tl.reduce(tl.where(mask, {x}, {_NEUTRAL[op.template]}), {self.axis}, _{op.template}){self.across}"

    def finish(self, op: _Op, b: _Emitter, total: str) -> None:
        self.values[op.out] = b.emit(f"{total} / cols" if op.mean else total, torch.float32)

    def persistent(self) -> list[str]:
        body: list[str] = []
        b = _Emitter(self, "v", body)
        self.load_inputs(b, True)
        self.load_inputs(b, False)
        for op in self.lowering.ops:
            if op.kind == "reduce":
                self.finish(op, b, b.emit(self.reduction(op), torch.float32)[0])
            else:
                self.emit_op(b, op)
        body = b.loads_first() + self.stores(row=False) + self.stores(row=True)
        columns = [f"col = tl.arange(0, BLOCK){self.along}", "mask = rmask & (col < cols)", *self.column_offsets()]
        return self.offsets() + columns + body  # offsets last: emitting the body names the weights it reads

    def looped(self) -> list[str]:
        low = self.lowering
        lines: list[str] = []
        top = _Emitter(self, "r", lines)
        self.load_inputs(top, True)
        depths = max((low.depth[op.out] for op in low.ops), default=0)
        full_ops = [op for op in low.ops if op.kind != "reduce" and not low.row[op.out]]  # scans among them
        for depth in range(depths + 1):
            for op in low.ops:  # the row values of this depth, once per row
                if op.kind != "reduce" and low.row[op.out] and low.depth[op.out] == depth:
                    self.emit_op(top, op)
            reductions = [op for op in low.ops if op.kind == "reduce" and low.depth[op.out] == depth + 1]
            if not reductions:
                continue
            for k, op in enumerate(reductions):
                lines.append(f"acc{depth}_{k} = tl.full({self.row_shape}, {_NEUTRAL[op.template]}, tl.float32)")
            body, carries = [], []
            inner = _Emitter(self, f"p{depth}_", body, carries)
            self.load_inputs(inner, False)
            for op in full_ops:
                if low.depth[op.out] <= depth:
                    self.emit_op(inner, op)
            for k, op in enumerate(reductions):
                body.append(f"acc{depth}_{k} = _{op.template}(acc{depth}_{k}, {self.reduction(op)})")
            lines += carries + self.column_pass(body)
            for k, op in enumerate(reductions):
                self.finish(op, top, f"acc{depth}_{k}")
        if not all(self.row_outputs()):
            body, carries = [], []
            last = _Emitter(self, "q", body, carries)
            self.load_inputs(last, False)
            for op in full_ops:
                self.emit_op(last, op)
            lines += carries + self.column_pass(body + self.stores(row=False))
        return self.offsets() + lines + self.stores(row=True)

    def split_stats(self) -> list[str]:
        """A split reduction's first kernel: over one span of BLOCK columns of ROWS rows (program ids: row block, span),
        the norm input's mean and sum of squared deviations, stored to `st` as [row, span, 2] float32."""
        mean = next(op for op in self.lowering.ops if op.out == self.lowering.norms[0][0])
        body = self._span(mean)
        x = Builder.as_float(self.values[mean.args[0]])
        body += ["count = tl.minimum(cols - start, BLOCK).to(tl.float32)",
                 f"span_mean = tl.reduce(tl.where(mask, {x}, 0.0), {self.axis}, _sum){self.across} / count",
                 f"dev = tl.where(mask, {x} - span_mean, 0.0)",
                 f"span_m2 = tl.reduce(dev * dev, {self.axis}, _sum){self.across}",
                 "where = st + row * (splits * 2) + tl.program_id(1) * 2",
                 "tl.store(where, span_mean, mask=rmask)", "tl.store(where + 1, span_m2, mask=rmask)"]
        return self._span_kernel(body)

    def _span(self, reduction: _Op) -> list[str]:
        """A split kernel's body up to `reduction`: the operands loaded and the ops making its input, over one span
        of BLOCK columns."""
        body: list[str] = []
        b = _Emitter(self, "v", body)
        self.load_inputs(b, True)
        self.load_inputs(b, False)
        for op in self.lowering.ops:
            if op is reduction:
                break
            self.emit_op(b, op)
        return body

    def _span_kernel(self, body: list[str]) -> list[str]:
        """`body` over the span of columns program id 1 names."""
        columns = ["start = tl.program_id(1) * BLOCK", f"col = start + tl.arange(0, BLOCK){self.along}",
                   "mask = rmask & (col < cols)", *self.column_offsets()]
        return self.offsets() + columns + body

    def split_apply(self, sub_rows: bool = False) -> list[str]:
        """A split reduction's second kernel: each row's mean and variance merged from its spans' statistics (Chan's
        parallel formulas), then the group's values and stores over BLOCK columns (program ids: row block, block);
        with `sub_rows`, over sub-rows (`RowLauncher._split_short_runs`), reading their rows' merged statistics."""
        mean, var = self.lowering.norms[0]
        if sub_rows:  # its rows are sub-rows: their row's statistics, merged by SPLIT_MERGE after the spans'
            merge = ["where = st + rows * splits * 2 + row // SUB * 2",
                     "row_mean = tl.load(where, mask=rmask, other=0.0)",
                     "row_var = tl.load(where + 1, mask=rmask, other=0.0)"]
        else:
            merge = _merged_statistics(self.along, self.across, self.axis)
        self.values[mean], self.values[var] = ("row_mean", torch.float32), ("row_var", torch.float32)
        body: list[str] = []
        b = _Emitter(self, "v", body)
        self.load_inputs(b, True)
        self.load_inputs(b, False)
        for op in self.lowering.ops:
            if op.kind != "reduce":
                self.emit_op(b, op)
        body += self.stores(row=False)
        columns = [f"col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK){self.along}", "mask = rmask & (col < cols)",
                   *self.column_offsets()]
        return self.offsets() + merge + columns + body

    def split_sum_stats(self) -> list[str]:
        """The first kernel of a split sum: over one span of BLOCK columns of ROWS rows (program ids: row block,
        span), the span's sum of the reduction's input, stored to `st` as [row, span, 2] float32 (the first)."""
        (total,) = [op for op in self.lowering.ops if op.kind == "reduce"]
        body = self._span(total)
        body += [f"span_sum = {self.reduction(total)}",
                 "tl.store(st + row * (splits * 2) + tl.program_id(1) * 2, span_sum, mask=rmask)"]
        return self._span_kernel(body)

    def split_sum_apply(self) -> list[str]:
        """The second kernel of a split sum: each row's sum from its spans' (program ids: row block), then the
        group's row values and their stores."""
        (total,) = [op for op in self.lowering.ops if op.kind == "reduce"]
        merge = [f"span = tl.arange(0, SPLITS){self.along}",
                 "where = st + row * (splits * 2) + span * 2",
                 f"row_sum = tl.reduce(tl.load(where, mask=rmask & (span < splits), other=0.0), {self.axis}, _sum)"
                 f"{self.across}"]
        body: list[str] = []
        b = _Emitter(self, "v", body)
        self.load_inputs(b, True)
        self.finish(total, b, "row_sum")
        for op in self.lowering.ops:
            if op.kind != "reduce" and self.lowering.row[op.out]:
                self.emit_op(b, op)
        return self.offsets() + merge + body + self.stores(row=True)

    def column_pass(self, body: list[str]) -> list[str]:
        """A loop over the row's columns, BLOCK at a time, running `body`."""
        header = [f"col = start + tl.arange(0, BLOCK){self.along}", "mask = rmask & (col < cols)",
                  *self.column_offsets()]
        return ["for start in range(0, cols, BLOCK):", *(f"    {line}" for line in header + body)]

    def row_outputs(self) -> list[bool]:
        return [self.lowering.row[id(t)] for t in self.outputs]

    def names(self) -> list[str]:
        return [*self.row_operand, *(f"out{k}" for k in range(len(self.outputs)))]

    def offsets(self) -> list[str]:
        """Row indices, their mask and every operand's row offsets."""
        lead = self.rank - self.reduced
        lines = ["if INT64:", f"    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS){self.across}",
                 "else:", f"    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS){self.across}",
                 "rmask = row < rows", "rrem = row"]
        for d in reversed(range(lead)):
            lines += [f"i{d} = rrem % s{d}", f"rrem = rrem // s{d}"]
        for p in self.names():
            lines.append(f"ro_{p} = {' + '.join(f'i{d} * {p}_t{d}' for d in range(lead)) or 'row * 0'}")
        return lines

    def column_offsets(self) -> list[str]:
        """Every operand's column offsets, in int64 where INT64: a row's columns may lie 2**31 elements apart while
        every stride is below it (a channels-last sample of 2**31 elements), where int32 products would wrap."""
        lead = self.rank - self.reduced
        # not `rrem`: a pass's loop may not change the type of a value made before it
        lines = ["if INT64:", "    crem = col.to(tl.int64)", "else:", "    crem = col"]
        for d in reversed(range(lead, self.rank)):
            lines += [f"j{d} = crem % s{d}", f"crem = crem // s{d}"] if d > lead else [f"j{d} = crem"]
        for p, row in zip(self.names(), [*self.row_operand.values(), *self.row_outputs()]):
            if not row:
                lines.append(f"co_{p} = {' + '.join(f'j{d} * {p}_t{d}' for d in range(lead, self.rank))}")
        return lines

    def stores(self, row: bool) -> list[str]:
        lines = []
        for k, (t, is_row) in enumerate(zip(self.outputs, self.row_outputs())):
            if is_row != row:
                continue
            if id(t) not in self.values:
                raise NetworkError(f"group output {t.name!r} is not computed by the group's layers")
            value = stored(self.values[id(t)], t.dtype)
            where = f"out{k} + ro_out{k}" if row else f"out{k} + ro_out{k} + co_out{k}"
            lines.append(f"tl.store({where}, {value}, mask={'rmask' if row else 'mask'})")
        return lines

    def bodies(self) -> list[tuple[str, list[str], tuple[str, ...]]]:
        """(function name, body lines, extra parameters) of each kernel, in the tile orientation set."""
        bodies = [(KERNEL, self.persistent(), ()), (LOOPED, self.looped(), ())]
        split = ("st", "splits", "chunk")
        sub_rows = []
        if self.lowering.splittable() and not any(self.row_outputs()):  # one norm: statistics, then the values
            bodies += [(SPLIT_STATS, self.split_stats(), split), (SPLIT_APPLY, self.split_apply(), split)]
            if self.transposed and self.reduced > 1:  # the values again, over sub-rows
                sub_rows = [(SPLIT_APPLY + TRANSPOSED + SUB_ROWS, self.split_apply(sub_rows=True), split)]
        elif self.lowering.one_sum() and all(self.row_outputs()):  # partial sums, then each row's values
            bodies += [(SPLIT_STATS, self.split_sum_stats(), split), (SPLIT_APPLY, self.split_sum_apply(), split)]
        return [(fn + TRANSPOSED if self.transposed else fn, body, extra) for fn, body, extra in bodies] + sub_rows

    def source(self) -> str:
        """Every kernel, with rows along the tile's first axis and again along its second (`TRANSPOSED`)."""
        bodies = self.bodies()
        self.transposed = True
        bodies += self.bodies()
        self.transposed = False
        names = self.names()
        out = [f"# Generated by {__name__} from the engine's layers; do not edit.\n{HEADER}{COMBINE}"]
        for fn, body, extra in bodies:
            size = "{}: tl.constexpr" if constant_sizes(self.static, fn) else "{}"
            params = [*names, *extra, size.format("rows"), size.format("cols"),
                      *(size.format(f"s{d}") for d in range(self.rank)),
                      *(size.format(f"{p}_t{d}") for p in names for d in range(self.rank)),
                      "INT64: tl.constexpr", "ROWS: tl.constexpr", "BLOCK: tl.constexpr",
                      *((["SUB: tl.constexpr"] if fn.endswith(SUB_ROWS) else ["SPLITS: tl.constexpr"])
                        if fn.startswith(SPLIT_APPLY) else []), PDL_PARAM]
            signature = ",\n        ".join(params)
            out.append(f"\n\n@triton.jit\ndef {fn}(\n        {signature},\n):\n" +
                       "".join(f"    {line}\n" for line in (*WAIT_LINES, *body)))
        if any(fn.endswith(SUB_ROWS) for fn, _, _ in bodies):
            out.append(_SPLIT_MERGE)
        return "".join(out)


def _merged_statistics(along: str, across: str, axis: int, sub: bool = False) -> list[str]:
    """Source lines giving each row's mean and variance (`row_mean`, `row_var`) from its spans' statistics in `st`
    (Chan's parallel formulas): `splits` spans of `chunk` of the row's `cols` columns, [row, span, 2] float32; with
    `sub`, of each of its SUB sub-rows of `cols` columns, which lie one after another. A span range of SPLITS."""
    spans, first, total = ("SUB * splits", "span % splits * chunk", "(cols * SUB)") if sub else \
        ("splits", "span * chunk", "cols")
    return [f"span = tl.arange(0, SPLITS){along}", f"smask = rmask & (span < {spans})",
            f"where = st + row * ({spans} * 2) + span * 2",
            "span_mean = tl.load(where, mask=smask, other=0.0)",
            "span_m2 = tl.load(where + 1, mask=smask, other=0.0)",
            f"count = tl.where(span < {spans}, tl.minimum(cols - {first}, chunk), 0).to(tl.float32)",
            f"row_mean = tl.reduce(count * span_mean, {axis}, _sum){across} / {total}",
            "dev = span_mean - row_mean",
            f"row_var = tl.reduce(span_m2 + count * dev * dev, {axis}, _sum){across} / {total}"]


SPLIT_MERGE = "rows_split_merge_kernel"
_SPLIT_MERGE = f'''

@triton.jit
def {SPLIT_MERGE}(st, splits, chunk, rows, cols, SUB: tl.constexpr, ROWS: tl.constexpr, SPLITS: tl.constexpr,
        {PDL_PARAM}):
    # each of `rows` rows' mean and variance from the statistics of its SUB sub-rows' spans (cols columns each,
    # `splits` spans of `chunk`), which lie one after another; stored after them, as [row, 2]
''' + "".join(f"    {line}\n" for line in WAIT_LINES) + '''\
    row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[None, :]
    rmask = row < rows
''' + "".join(f"    {line}\n" for line in _merged_statistics("[:, None]", "[None, :]", 0, sub=True)) + '''\
    merged = st + rows * SUB * splits * 2 + row * 2
    tl.store(merged, row_mean, mask=rmask)
    tl.store(merged + 1, row_var, mask=rmask)
'''


def constant_sizes(static: bool, fn: str) -> bool:
    """Whether kernel `fn` takes the space's sizes (its rows, columns and dims, and its operands' strides) as
    compile-time constants: where they are known at build (no dynamic dim; each launch passes the same values, so
    Triton compiles once), except in the split kernels that tile rows across columns (`_transposed` false: rows
    interleaving in runs under 16 bytes). A constant size lets Triton prove how long the runs of consecutive
    columns are and load them as vectors. H100, fp16, CUDA graphs, us,
    constant against runtime sizes: group norm NCHW [32,128,64,64] 50 against 61; channels-last with 16-byte runs
    ([32,256,32,32]) 40 against 52, 20-byte runs 61 against 62; a softmax of [4096,768] 4.9 against 5.3; a mean of
    channels-last [32,240,28,28] 6.3 against 6.8. But a split group norm over 8-byte runs ([32,128,64,64]
    channels-last) took 160 against 120: vectors along a run of 8 bytes put a warp's lanes a position apart.
    Constant strides and row and column counts as well: a residual add + layer norm of [32,128,768] fp16 took 5.34 us
    against 5.77 with only the dims constant, [1,128,768] 1.91 against 2.00 (H200, CUDA graphs)."""
    return static and fn not in (SPLIT_STATS, SPLIT_APPLY)


def generate(layers: Sequence[L.Layer], inputs: Sequence[Tensor], outputs: Sequence[Tensor]) -> RowKernel:
    """The kernel computing `outputs` from `inputs` through `layers` (in an order where each layer's inputs come
    first), around their reductions over one set of axes. Raises NetworkError naming what cannot be generated."""
    found = [layer for layer in layers if reduced_axes(layer) is not None]
    if not found or not outputs:
        raise NetworkError("a reduction group needs a reduction the generator computes and at least one output")
    for layer in found:
        reason = reduction_fusable(layer)
        if reason is not None:
            raise NetworkError(f"{layer.KIND} layer {layer.name!r} cannot be generated: {reason}")
    space = found[0].inputs[0]
    groups = {groups_of(layer) for layer in found}
    if len(groups) > 1:
        raise NetworkError(f"a reduction group mixes group norms of other group counts with other reductions: "
                           f"{[layer.name for layer in found]}")
    split = groups.pop()
    for t in inputs:
        if t.dtype not in READ_DTYPES or t.rank > space.rank:
            raise NetworkError(f"group input {t.name!r} ({t.dtype}, rank {t.rank}) is not a float, bool or integer "
                               f"operand of rank at most {space.rank}")
    axes = reduced_axes(found[0])
    lowering = _Lowering(layers, inputs, space.rank, axes)
    kept = [space.shape[d] for d in range(space.rank) if d not in axes]
    for t in outputs:
        row = lowering.row.get(id(t))
        if row is None or any(t is i for i in inputs):
            raise NetworkError(f"group output {t.name!r} is not computed by the group's layers")
        whole = tuple(t.shape) == tuple(space.shape)
        per_row = row and not split and (list(t.shape) == kept or t.rank == space.rank and all(
            t.shape[d] == (1 if d in axes else space.shape[d]) for d in range(space.rank)))
        if not (whole or per_row):
            raise NetworkError(f"group output {t.name!r} of shape {list(t.shape)} is neither the space "
                               f"{list(space.shape)} nor one value per row of it" +
                               (" (a group norm's group returns no row values)" if split and row else ""))
    source = _Source(lowering, inputs, outputs, split is not None, not space.is_dynamic)
    text = source.source()
    has_max = any(op.kind == "reduce" and op.template != "sum" for op in lowering.ops)
    depth = max((lowering.depth[op.out] for op in lowering.ops if op.kind == "reduce"), default=0)
    splittable = SPLIT_STATS in text
    return RowKernel(text, tuple(inputs), tuple(source.weights), tuple(outputs), space.rank, lowering.reduced,
                     kernel_order(space.rank, axes), tuple(source.row_outputs()), has_max, split, depth, splittable,
                     splittable and all(source.row_outputs()))


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _num_warps(tile: int, programs: int = 0, sms: int = 0) -> int:
    """Warps per program for a tile of `tile` elements (H100, rows of 768 at 4096 rows: 2 warps for one row of
    1024 took 6.0 us, 4 warps for two rows 6.9). A launch of fewer `programs` than the GPU's `sms` leaves
    multiprocessors idle and each program's latency is the kernel's: up to `FEW_PROGRAM_WARPS`, as many as give a
    thread 4 elements."""
    warps = 2 if tile <= 1024 else 4 if tile <= 2048 else 8 if tile <= 8192 else 16
    return max(warps, min(FEW_PROGRAM_WARPS, tile // 128)) if programs < sms else warps


class RowLauncher(GroupLauncher):
    """Runs a generated reduction kernel on CUDA tensors (or on CPU tensors under Triton's interpreter)."""

    WHAT = "reduction"

    def __init__(self, kernel: RowKernel, channels_last: bool = False) -> None:
        from torchkiln.runtime.backends.cuda.codegen.compile import load_source

        super().__init__(kernel, channels_last)  # 4-D full outputs channels-last (read by channels-last convolutions)
        # the tensor dims a kernel over another order than theirs reduces (its keep-dims row outputs' dims of 1)
        self._reduced_dims = frozenset(kernel.order[kernel.rank - kernel.reduced:]) if kernel.order else frozenset()
        module = load_source(kernel.source)
        # per tile orientation (rows along its first axis, or along its second: TRANSPOSED)
        self._persistent, self._looped, self._split = {}, {}, {}
        for suffix, transposed in (("", False), (TRANSPOSED, True)):
            self._persistent[transposed] = getattr(module, KERNEL + suffix)
            self._looped[transposed] = getattr(module, LOOPED + suffix)
            self._split[transposed] = (getattr(module, SPLIT_STATS + suffix), getattr(module, SPLIT_APPLY + suffix)) \
                if kernel.splittable else None
        sub_rows = SPLIT_APPLY + TRANSPOSED + SUB_ROWS  # (statistics, apply, merge) over sub-rows
        self._split_sub_rows = (self._split[True][0], getattr(module, sub_rows), getattr(module, SPLIT_MERGE)) \
            if hasattr(module, sub_rows) else None

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        kernel = self.kernel
        device, operands, shape = self.operands(inputs)
        rank, groups = kernel.rank, kernel.groups
        if groups is not None and shape[1] % groups:
            raise EngineInputError(f"{shape[1]} channels do not split into {groups} groups")
        space = shape if groups is None else torch.Size([shape[0], groups, shape[1] // groups, *shape[2:]])
        order = kernel.order
        ordered = space if order is None else torch.Size([space[d] for d in order])  # the kernel's space
        lead = len(space) - kernel.reduced
        rows, cols = math.prod(ordered[:lead]), math.prod(ordered[lead:])
        if cols == 0 and kernel.has_max:
            dims = list(order[lead:]) if order else list(range(lead, len(space)))
            raise EngineInputError(f"a max or min over dims {dims} of a {list(shape)} tensor, which hold no elements")
        views = [self._in_space(x, space) for x in operands]
        strides = [list(v.stride()) for v in views]
        # rows in the operands' memory order, and row outputs written in it (`_row_order`)
        rows_walk = _row_order(strides, lead)
        # full outputs are channels-last for channels-last readers, or after a channels-last input; else contiguous
        last = len(shape) == 4 and (self.channels_last or any(
            x.shape == shape and x.is_contiguous(memory_format=torch.channels_last) for x in inputs))
        outputs = []
        for t, row in zip(kernel.outputs, kernel.row_outputs):
            if not row:
                outputs.append(torch.empty(shape, dtype=t.dtype, device=device,
                                           memory_format=torch.channels_last if last else torch.contiguous_format))
                continue
            if t.rank != rank:  # the reduced dims dropped: the kept ones, in order
                out_shape, kept = list(ordered[:lead]), list(range(lead))
            elif order is None:
                out_shape, kept = [*shape[:lead], *[1] * kernel.reduced], list(range(lead))
            else:
                out_shape = [1 if d in self._reduced_dims else n for d, n in enumerate(shape)]
                kept = list(order[:lead])
            outputs.append(_empty_in_order(out_shape, [kept[d] for d in rows_walk], t.dtype, device))
        if rows == 0:
            return outputs
        for out in outputs:
            strides.append(list(out.stride()) + [0] * kernel.reduced if out.dim() == lead else
                           list(self._in_space(out, space).stride()))
        walk = _column_order(strides[:len(views)], lead, len(ordered))
        sizes = [*(ordered[d] for d in rows_walk), *(ordered[d] for d in walk)]
        strides = [[s[d] for d in rows_walk] + [s[d] for d in walk] for s in strides]
        # Neighbouring rows share sectors (a row's contiguous run is shorter than one): a program takes `packed` of
        # them, as many as fill a sector while about one program per multiprocessor remains. Taken where it adds no
        # pass over the input: whole rows fit the tile, or one reduction deep (a mean), or rows too long for one.
        # A norm whose rows this leaves to one program each, over few rows or rows apart in memory, is reduced in
        # spans instead (`_split_reduction`); so is a sum (a mean) of long rows that would leave fewer than
        # MIN_PROGRAMS programs (a squeeze-excitation's mean of a [32,32,112,112] channels-last tensor: 128 programs
        # looping over 12544 columns read it at a sixth of the memory's rate).
        run = _interleaved_run(strides[:len(views)], sizes, lead, operands)
        sector = packed = _rows_filling(32, run)
        while packed > 1 and (rows + packed - 1) // packed < MIN_PROGRAMS // 2:
            packed //= 2
        whole = max(MIN_BLOCK, _next_power_of_two(cols))
        int64 = needs_int64(*views, *outputs)
        across = packed > 1 and (packed * whole <= MAX_PERSISTENT or kernel.depth <= 1 or cols > MAX_PERSISTENT)
        few = (rows + packed - 1) // packed < MIN_PROGRAMS  # programs of the launch below
        # A norm whose input rows do not interleave in short runs, written in a layout whose rows do (an NCHW
        # input's group norm written channels-last for a convolution), is reduced in spans over sub-rows too: its
        # tile's loads run along positions and its stores along channels, which Triton converts between (one row a
        # program would scatter its stores: a group norm + SiLU of an NCHW [32,128,64,64] fp16 input written
        # channels-last, 297 against 53 us, H100).
        # Rows of 2**31 columns or more are never split (a span's start is an int32 there).
        splittable = self._split[False] is not None and SPLIT_MIN_COLS <= cols < 2 ** 31
        if splittable and not kernel.split_sum and not _short(run) and \
                _short(_interleaved_run(strides[len(views):], sizes, lead, outputs)):
            self._split_short_runs(operands, outputs, rows, cols, sizes, strides, int64)
            return outputs
        if splittable and (
                (kernel.split_sum and few) or (not across and (sector > 1 or rows < MIN_PROGRAMS // 2))):
            self._split_reduction(operands, outputs, rows, cols, sizes, strides, int64, run)
            return outputs
        if across:
            if packed * whole <= MAX_PERSISTENT:  # whole rows; short ones packed up to a tile's worth
                block, packed = whole, _more_rows(packed, _TILE // whole, rows)
            else:
                block = max(16, _ACROSS_TILE // packed)
            fn = (self._persistent if cols <= block else self._looped)[_transposed(packed, run)]
        elif cols <= MAX_PERSISTENT:
            block = max(_next_power_of_two(cols), MIN_BLOCK)
            packed = _more_rows(1, _TILE // block, rows)
            fn = self._persistent[_transposed(packed, run)]
        else:
            fn, block, packed = self._looped[True], LOOP_BLOCK, 1
        grid = ((rows + packed - 1) // packed,)
        warps = 8 if not across and cols > MAX_PERSISTENT else \
            _num_warps(packed * block, grid[0], multiprocessors(device))
        launch(fn, grid, *operands, *outputs, rows, cols, *sizes, *(v for s in strides for v in s), INT64=int64,
               ROWS=packed, BLOCK=block, num_warps=warps, **chain_options())
        return outputs

    def _split_reduction(self, operands: list[torch.Tensor], outputs: list[torch.Tensor], rows: int, cols: int,
                         sizes: list[int], strides: list[list[int]], int64: bool, run: int | None) -> None:
        """A norm's partial statistics over spans of `chunk` columns of the rows that fill a 128-byte line together
        (rows interleaving in runs of `run` bytes; many programs, every read coalesced), then each row's statistics
        merged and the outputs made from them."""
        if _short(run) and not self.kernel.split_sum:
            self._split_short_runs(operands, outputs, rows, cols, sizes, strides, int64)
            return
        packed = min(_next_power_of_two(rows), 64, _rows_filling(128, run))
        chunk = max(16, _ACROSS_TILE // packed, _next_power_of_two((cols + MAX_SPLITS - 1) // MAX_SPLITS))
        fns = self._split[_transposed(packed, run)]
        self._launch_split(fns, operands, outputs, rows, cols, sizes, strides, int64, packed, chunk, 1)

    def _split_short_runs(self, operands: list[torch.Tensor], outputs: list[torch.Tensor], rows: int, cols: int,
                          sizes: list[int], strides: list[list[int]], int64: bool) -> None:
        """A norm over rows interleaving in runs under 16 bytes (a group norm of a channels-last tensor with a few
        channels a group), reduced in spans with the rows along the axis a warp walks first. Where a run's elements
        continue the rows' last dim in every operand (a group's channels continue its group index), they become
        sub-rows of their own (a row per channel: neighbouring rows are neighbouring elements, and the row index
        alone gives the address); a merge kernel then gives each row its sub-rows' statistics. H100, fp16, CUDA
        graphs, us: an instance norm of a channels-last [32,128,64,64] tensor (2-byte runs) 138 the other way
        against 55 this way; 32 rows and 256 columns a program were the fastest of 8-128 rows and 32-512 columns."""
        lead = len(sizes) - self.kernel.reduced
        # the innermost reduced dim that continues the rows' last in every operand (a group's channels)
        d = next((d for d in reversed(range(lead, len(sizes))) if sizes[d] > 1 and lead > 0 and
                  all(s[lead - 1] == sizes[d] * s[d] for s in strides)), None)
        if self._split_sub_rows is None or d is None:
            sub, fns = 1, self._split[True]
        else:  # it joins the rows' last; a reduced dim of 1 keeps the space's rank
            sub, fns = sizes[d], self._split_sub_rows
            sizes = [*sizes[:lead - 1], sizes[lead - 1] * sub, 1, *sizes[lead:d], *sizes[d + 1:]]
            strides = [[*s[:lead - 1], s[d], 0, *s[lead:d], *s[d + 1:]] for s in strides]
            rows, cols = rows * sub, cols // sub
        packed = min(_next_power_of_two(rows), 32)
        chunk = max(16, _SHORT_RUN_TILE // packed, _next_power_of_two((cols * sub + MAX_SPLITS - 1) // MAX_SPLITS))
        self._launch_split(fns, operands, outputs, rows, cols, sizes, strides, int64, packed, chunk, sub)

    def _launch_split(self, fns: tuple, operands: list[torch.Tensor], outputs: list[torch.Tensor], rows: int,
                      cols: int, sizes: list[int], strides: list[list[int]], int64: bool, packed: int, chunk: int,
                      sub: int) -> None:
        """The kernels of a split reduction (`fns`: statistics, apply, and where rows are sub-rows (`sub` > 1) the
        merge of each row's), over spans of `chunk` columns of `packed` rows a program."""
        splits = (cols + chunk - 1) // chunk
        merged = rows // sub * 2 if sub > 1 else 0
        stats = torch.empty(rows * splits * 2 + merged, dtype=torch.float32, device=outputs[0].device)
        grid = ((rows + packed - 1) // packed, splits)
        args = (*operands, *outputs, stats, splits, chunk, rows, cols, *sizes, *(v for s in strides for v in s))
        meta = {"INT64": int64, "ROWS": packed, "BLOCK": chunk, "num_warps": _num_warps(packed * chunk),
                **chain_options()}
        stats_fn, apply_fn = fns[:2]
        launch(stats_fn, grid, *args, **meta)
        if self.kernel.split_sum:
            launch(apply_fn, grid[:1], *args, SPLITS=_next_power_of_two(splits), **meta)
            return
        if sub > 1:
            entries = _next_power_of_two(splits * sub)
            per = max(1, min(_next_power_of_two(rows // sub), 1024 // entries))  # at most 1024 statistics a program
            launch(fns[2], ((rows // sub + per - 1) // per,), stats, splits, chunk, rows // sub, cols, SUB=sub,
                   ROWS=per, SPLITS=entries, num_warps=4, **chain_options())
            launch(apply_fn, grid, *args, SUB=sub, **meta)
        else:
            launch(apply_fn, grid, *args, SPLITS=_next_power_of_two(splits), **meta)

    def _in_space(self, x: torch.Tensor, space: torch.Size) -> torch.Tensor:
        """`x` as a view over the kernel's space: right-aligned to the tensors' rank, dim 1 split into groups for a
        group norm, broadcast to `space` (the tensors'), its dims in the kernel's order."""
        x = x.reshape([1] * (self.kernel.rank - x.dim()) + list(x.shape)) if x.dim() < self.kernel.rank else x
        if self.kernel.groups is not None:
            x = x.unsqueeze(1) if x.shape[1] == 1 else x.unflatten(1, (self.kernel.groups, -1))
        x = x.expand(space)
        return x if self.kernel.order is None else x.permute(self.kernel.order)


def _transposed(packed: int, run: int | None) -> bool:
    """Whether a program's `packed` rows lie along the tile's second axis (the `TRANSPOSED` kernels): where it holds
    one row, or rows that interleave in runs of at least 16 bytes. Measured on an H100 in fp16 (CUDA graphs, us,
    transposed against not): a group norm of an NCHW [32,128,64,64] input, one row a program, 62 against 91 (in
    spans, 62 against 1106); channels-last, 20-byte runs (10 channels a group, [32,320,32,32]) 63 against 159, but
    8-byte runs ([32,128,64,64]) 160 against 121; 2-byte runs (a mean of channels-last activations) the same."""
    return packed == 1 or (run is not None and run >= 16)


def _short(run: int | None) -> bool:
    """Whether rows interleave in runs under 16 bytes (`_interleaved_run`): the reductions over sub-rows."""
    return run is not None and run < 16


def _interleaved_run(strides: list[list[int]], sizes: Sequence[int], lead: int,
                     operands: Sequence[torch.Tensor]) -> int | None:
    """The bytes of a row's contiguous run of elements in the first operand that varies along the row, where the
    next row's run follows it in memory (rows interleave: a channels-last tensor reduced over its spatial dims, a
    row per channel; or a group norm's, a row per group of channels); else None."""
    found = next(((s, x) for s, x in zip(strides, operands) if any(s[d] for d in range(lead, len(s)))), None)
    if found is None or lead == 0:
        return None
    s, x = found
    run = 1  # elements of a row contiguous in memory from its first
    for d in sorted(range(lead, len(s)), key=lambda d: abs(s[d])):
        if abs(s[d]) != run:
            break
        run *= sizes[d]
    return run * x.element_size() if abs(s[lead - 1]) == run and sizes[lead - 1] > 1 else None


def _rows_filling(nbytes: int, run: int | None) -> int:
    """How many interleaved rows of `run` bytes each fill `nbytes` together, as a power of two (a program's rows are
    a tl.arange); 1 where rows do not interleave or one run fills it alone."""
    if run is None or run >= nbytes:
        return 1
    return max(2, 1 << ((nbytes // run).bit_length() - 1))


def _more_rows(packed: int, most: int, rows: int) -> int:
    """`packed` rows a program doubled up to `most` while at least MIN_PROGRAMS programs remain."""
    while packed * 2 <= most and (rows + packed * 2 - 1) // (packed * 2) >= MIN_PROGRAMS:
        packed *= 2
    return packed


def _row_order(strides: list[list[int]], lead: int) -> list[int]:
    """The kept dims in the order the kernel numbers rows, innermost last: by the strides of the first operand that
    varies along the row (else along the rows), largest first (ties in the dims' order). Neighbouring rows are then
    neighbours in memory where the operand allows: a sum over the radix dim of a channels-last [N, R, C, H, W] view
    numbers its rows (N, H, W, C), so a program's rows are neighbouring channels, not positions a row of the image
    apart."""
    full = next((s for s in strides if any(s[d] for d in range(lead, len(s)))), None) or \
        next((s for s in strides if any(s[d] for d in range(lead))), None)
    dims = list(range(lead))
    return dims if full is None else sorted(dims, key=lambda d: -abs(full[d]))


def _empty_in_order(shape: Sequence[int], order: Sequence[int], dtype: torch.dtype,
                    device: torch.device) -> torch.Tensor:
    """An empty tensor of `shape` whose dims `order` lie in memory outermost first (the others, of size 1 in a row
    output, anywhere): a row output written in the order the kernel numbers its rows."""
    rest = [d for d in range(len(shape)) if d not in order]
    layout = [*rest, *order]
    stored = torch.empty([shape[d] for d in layout], dtype=dtype, device=device)
    return stored.permute([layout.index(d) for d in range(len(shape))])


def _column_order(strides: list[list[int]], lead: int, rank: int) -> list[int]:
    """The reduced dims in the order the kernel walks a row, innermost last: by the strides of the first operand that
    varies along the row, largest first (a reduction may take its elements in any order, so a channels-last tensor's
    group is read along its channels)."""
    full = next((s for s in strides if any(s[d] for d in range(lead, rank))), None)
    dims = list(range(lead, rank))
    return dims if full is None else sorted(dims, key=lambda d: -abs(full[d]))


def compile_group(layers: Sequence[L.Layer], inputs: Sequence[Tensor], outputs: Sequence[Tensor],
                  channels_last: bool = False) -> RowLauncher:
    """Generate, load and wrap the kernel of a reduction group (4-D full outputs channels-last if asked)."""
    return RowLauncher(generate(layers, inputs, outputs), channels_last)
