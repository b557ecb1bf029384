"""A Triton kernel for a group of pointwise and movement layers: every value computed at the index it is read at.

Movement layers (shuffle: transpose, reshape, transpose; slice; concatenation; constant padding; expand) move
values without computing them, so inside a kernel each is index arithmetic, not a copy. The kernel walks its
output's elements; for each it asks for the output's value at that index, and each layer answers by asking its
inputs at the indices it maps the index to (tinygrad's views as index expressions):
- pointwise layers (what `pointwise.emit_layer` computes, the same expressions): the same index, 0 along a
  broadcast dim;
- a shuffle: the transposes undone, and the reshape's flat position re-split over the input's dims;
- a slice: start + index * step; an expand: 0 along an expanded dim; a nearest-neighbour resize by a whole ratio:
  the index divided (growth) or multiplied (shrink) by it; a linear or bilinear resize: its corners read and
  weighed as ATen weighs them;
- a concatenation: each input at the index shifted by its start, where the index falls in it (a masked read), the
  value chosen by `tl.where`;
- constant padding: the index shifted by the leading pad, masked where it falls outside; the pad value there;
- a max or average pool (a window layer, not a move, but read the same way): its input at every tap of the
  window, masked where the tap falls in the padding, combined as ATen's kernels combine them;
- a matrix multiply that sums at most `SMALL_PRODUCT_K` products an output (a linear across attention heads, the
  talking heads of CaiT-style attention): both operands at the output's row and column and each of the K positions
  of the reduced dim, the products summed in float32 in order, then the bias. Its operands are read through their
  strides, so a permuted input is not copied for a GEMM that would be memory-bound anyway.
A group input or weight is read at the index it is asked for, through its own strides. A value asked for at two
indices (a concatenation of two slices of one tensor) is computed at both; values are computed in float32 as in
the pointwise generator (a cast to a half type rounds where it stands), and stored in the output's dtype.

Shapes are static (a kernel serves one shape; the planner groups only layers whose shapes are), so every index
map is a constant expression that Triton's compiler simplifies.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Sequence

import numpy as np
import torch

from torchkiln.errors import EngineInputError, NetworkError
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor
from torchkiln.ir.value_ranges import proved_range
from torchkiln.runtime.backends.cuda.codegen import PDL_PARAM, WAIT_LINES, chain_options, launch, needs_int64
from torchkiln.runtime.backends.cuda.codegen.pooling import window_dims
from torchkiln.runtime.backends.cuda.codegen.pointwise import (BLOCK, HEADER, VALUE_DTYPES, Builder, Value,
                                                                INTEGERS, converted, emit_layer, fusable, held,
                                                                literal, loaded, scalar_literal, stored)

KERNEL_NAME = "indexed_kernel"
MOVEMENT = (L.ShuffleLayer, L.SliceLayer, L.ConcatenationLayer, L.PaddingLayer, L.ExpandLayer, L.ResizeLayer,
            L.GatherLayer, L.PoolingLayer)  # (a pool reads its input at index arithmetic too: its window's taps)
MAX_LAYERS = 256  # layers one kernel computes (each value's expression is built by recursion over the group)
MAX_TAPS = 49  # a pool's window positions one kernel unrolls (7x7)
SMALL_PRODUCT_K = 8  # products per output a matrix multiply the kernel computes sums at most


def movement_fusable(layer: L.Layer) -> str | None:
    """None if `layer` is a movement layer the generator computes as index arithmetic, else why not."""
    if not isinstance(layer, MOVEMENT):
        return f"{layer.KIND} is not a movement layer"
    tensors = [*layer.inputs, *layer.outputs]
    if any(t.dtype not in VALUE_DTYPES for t in tensors):
        return "fused kernels move float32, float16, bfloat16, bool and integer values only"
    if any(not isinstance(d, int) for t in tensors for d in t.shape):
        return "its shapes are dynamic"
    if isinstance(layer, L.PaddingLayer) and layer.mode != L.PaddingMode.CONSTANT:
        return f"{layer.mode.value} padding"
    if isinstance(layer, L.ConcatenationLayer) and any(t.dtype != layer.outputs[0].dtype for t in layer.inputs):
        return "it concatenates tensors of different dtypes"
    if isinstance(layer, L.ResizeLayer):
        return _resize_refusal(layer)
    if isinstance(layer, L.GatherLayer):
        return _gather_refusal(layer)
    if isinstance(layer, L.PoolingLayer):
        return _pooling_refusal(layer)
    return None


def _pooling_refusal(layer: L.PoolingLayer) -> str | None:
    """None if the generator computes a pool: of floats, over the trailing dims of a batched or unbatched input,
    with at most MAX_TAPS window positions (each is one read per output)."""
    x = layer.inputs[0]
    if not x.dtype.is_floating_point:
        return f"it pools {x.dtype} values (the kernel pools floats)"
    if x.rank not in (len(layer.window) + 1, len(layer.window) + 2) or len(layer.outputs) != 1:
        return f"a {len(layer.window)}-d window over a rank-{x.rank} input with {len(layer.outputs)} outputs"
    taps = math.prod(layer.window)
    if taps > MAX_TAPS:
        return f"its window has {taps} positions (a kernel unrolls at most {MAX_TAPS})"
    return None


def _gather_refusal(layer: L.GatherLayer) -> str | None:
    """None if every index the gather can read is known to lie in its data's range: constant indices (checked when
    the layer was made), or computed ones whose proved range (`ir/value_ranges.py`) lies inside. A generated kernel
    reads its data at the index unchecked; ATen's gather checks each (a device-side assertion), so a gather of
    indices read at run time, such as token ids, stays there."""
    data, indices = layer.inputs
    if data.rank == 0:
        return "it gathers from a scalar"
    if L.constant_value(indices) is not None:
        return None
    if layer.mode == L.GatherMode.ND:
        return "its nd indices are computed at run time"
    size = data.shape[layer.axis % data.rank]
    found = proved_range(indices)
    if found is None:
        return "its indices are read at run time and not proved in range (ATen's gather checks them)"
    if not (0 <= found[0] and found[1] < size):
        return f"its indices may hold values in [{found[0]}, {found[1]}], outside [0, {size})"
    return None


def _resize_refusal(layer: L.ResizeLayer) -> str | None:
    """None if the generator computes a resize: linear or bilinear interpolation of floats
    (`_Emitter._interpolated`), or a nearest-neighbour resize (or nearest-exact) read at an index computed exactly:
    every dim kept, grown by a power of two or shrunk by a whole factor. ATen computes a nearest source index as
    floor(index * scale) in float32 with scale = 1 / scale_factor where one is given, else input / output size; for
    these ratios that is index // k or index * k exactly (nearest-exact: floor((index + 0.5) * scale), index // k or
    index * k + k // 2). Any other nearest ratio (or a given factor that is not the sizes' ratio) stays on ATen,
    whose float rounding decides the index."""
    if layer.mode in _INTERPOLATED:  # (ATen rounds an integer interpolation its own way: left to it)
        return None if layer.inputs[0].dtype.is_floating_point else f"a {layer.mode} resize of {layer.inputs[0].dtype}"
    if layer.mode not in ("nearest", "nearest-exact"):
        return f"{layer.mode} interpolation"
    x, out = layer.inputs[0].shape, layer.outputs[0].shape
    scales = [None] * (len(x) - len(layer.scales or ())) + list(layer.scales or ())
    for n, m, scale in zip(x, out, scales):
        grown = n == 1 or (m % n == 0 and (m // n) & (m // n - 1) == 0)
        if not (grown or n % m == 0) or (scale is not None and scale != m / n):
            return f"a dim of {n} resized to {m}: not a power-of-two growth or a whole shrink with that factor"
    return None


def small_product_refusal(layer: L.MatrixMultiplyLayer) -> str | None:
    """None if `layer` is a matrix multiply of floats, static shapes and matrix operands (no vector) whose outputs
    each sum at least one and at most SMALL_PRODUCT_K products, which the generator computes as index arithmetic;
    else why not."""
    a, b = layer.inputs
    if L.MatrixOperation.VECTOR in (layer.op0, layer.op1) or a.rank < 2 or b.rank < 2:
        return "a vector operand"
    if any(not t.dtype.is_floating_point or t.dtype not in VALUE_DTYPES for t in (a, b, layer.outputs[0])):
        return "it multiplies values that are not float32, float16 or bfloat16"
    if any(not isinstance(d, int) for t in (a, b, layer.outputs[0]) for d in t.shape):
        return "its shapes are dynamic"
    k = _terms(layer)
    if not 0 < k <= SMALL_PRODUCT_K:
        return f"its outputs sum {k} products each (the kernel unrolls 1 to {SMALL_PRODUCT_K})"
    return None


def _terms(layer: L.MatrixMultiplyLayer) -> int:
    """The products each output of a matrix multiply sums: op0(a)'s last dim."""
    a = layer.inputs[0]
    return a.shape[-2] if layer.op0 == L.MatrixOperation.TRANSPOSE else a.shape[-1]


def indexed_fusable(layer: L.Layer) -> str | None:
    """None if the generator computes `layer` (a pointwise layer of static shapes, a movement layer, or a small
    product)."""
    if isinstance(layer, MOVEMENT):
        return movement_fusable(layer)
    if isinstance(layer, L.MatrixMultiplyLayer):
        return small_product_refusal(layer)
    if any(not isinstance(d, int) for t in (*layer.inputs, *layer.outputs) for d in t.shape):
        return "its shapes are dynamic"
    return fusable(layer)


@dataclasses.dataclass(frozen=True)
class IndexedKernel:
    """Generated source and what its launcher binds: the group's inputs (launch order), the weights it reads (as
    the layers hold them) and its outputs, all of one static shape."""

    source: str
    inputs: tuple[Tensor, ...]
    weights: tuple[torch.Tensor, ...]
    outputs: tuple[Tensor, ...]
    shape: tuple[int, ...]


Index = tuple[str, ...]  # one expression (a variable or a literal) per dim
_NAME = re.compile(r"[A-Za-z_]\w*")
_BLOCK_NAME = re.compile(r"[iv]\d+")  # the output's indices and emitted values


class _Emitter(Builder):
    """The kernel body: index variables and values, each value computed at an index under a mask."""

    def __init__(self, layers: Sequence[L.Layer], inputs: Sequence[Tensor]) -> None:
        super().__init__(0)
        self.made = {id(layer.outputs[0]): layer for layer in layers}
        self.given = {id(t): i for i, t in enumerate(inputs)}
        self.inputs = list(inputs)
        self.ranks: dict[str, int] = {f"in{i}": t.rank for i, t in enumerate(inputs)}
        self.memo: dict[tuple[int, Index, str], Value] = {}
        self.at: tuple[Index, str, tuple[int, ...]] = ((), "mask", ())  # where the layer being emitted computes
        self.blocks: set[str] = set()  # index variables holding a block (`is_block`)

    def index(self, expr: str) -> str:
        """`expr` as an index variable (a literal or a variable stays as it is)."""
        if expr.isidentifier() or expr.lstrip("-").isdigit():
            return expr
        var = f"j{len(self.lines)}"
        self.lines.append(f"{var} = {expr}")
        if any(self.is_block(name) for name in _NAME.findall(expr)):
            self.blocks.add(var)
        return var

    def is_block(self, name: str) -> bool:
        """Whether a variable holds a block: the output's indices (`i0`), values, the mask, and index variables made
        from those; one made from literal indices alone (x[6:7] of a concatenation: `6 - 5`) holds one value."""
        return name in self.blocks or name == "mask" or _BLOCK_NAME.fullmatch(name) is not None

    def read(self, name: str, dtype: torch.dtype, shape: Sequence[int], idx: Index, mask: str) -> Value:
        """Operand `name` (of `shape`) at `idx` (its dims), through its strides `{name}_t{d}`."""
        used = [(d, i) for d, (i, n) in enumerate(zip(idx, shape)) if n != 1 and i != "0"]
        terms = [f"{i} * {name}_t{d}" for d, i in used]
        # an offset of no block index (a one-element operand, or one read at literal indices: x[2:3]) is one value: a
        # masked load needs a block of pointers, so it starts from a block of zeros
        if not any(self.is_block(i) for _, i in used):
            terms.insert(0, "offs * 0")
        return self.emit(loaded(f"tl.load({name} + {' + '.join(terms)}, mask={mask}, other=0)", dtype), held(dtype))

    def load_weight(self, weight: torch.Tensor) -> Value:
        """A weight of the layer being emitted, broadcast to its output and read at its index."""
        idx, mask, shape = self.at
        w = weight.reshape(()) if weight.numel() == 1 else weight
        if w.dim() > len(shape):
            raise NetworkError(f"a weight of shape {list(weight.shape)} does not broadcast to {list(shape)}")
        self.weights.append(w)
        name = f"w{len(self.weights) - 1}"
        self.ranks[name] = w.dim()
        return self.read(name, w.dtype, w.shape, _broadcast(idx, shape, w.shape), mask)

    def value(self, t: Tensor, idx: Index, mask: str) -> Value:
        """The variable holding `t` at `idx` (valid where `mask`)."""
        key = (id(t), idx, mask)
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = self._compute(t, idx, mask)
        return found

    def _compute(self, t: Tensor, idx: Index, mask: str) -> Value:
        layer = self.made.get(id(t))
        if layer is None:
            if id(t) not in self.given:
                raise NetworkError(f"{t.name!r} is neither a group input nor made by the group's layers")
            return self.inlined(L.constant_value(t)) or \
                self.read(f"in{self.given[id(t)]}", t.dtype, t.shape, idx, mask)
        out = layer.outputs[0]
        if isinstance(layer, L.GatherLayer):
            return self._gathered(layer, idx, mask)
        if isinstance(layer, L.ConcatenationLayer):
            return self._concatenation(layer, idx, mask)
        if isinstance(layer, L.PaddingLayer):
            return self._padding(layer, idx, mask)
        if isinstance(layer, L.ResizeLayer) and layer.mode in _INTERPOLATED:
            return self._interpolated(layer, idx, mask)
        if isinstance(layer, L.PoolingLayer):
            return self._pooled(layer, idx, mask)
        if isinstance(layer, L.MatrixMultiplyLayer):
            return self._product(layer, idx, mask)
        if isinstance(layer, MOVEMENT):
            return self.value(layer.inputs[0], self._moved(layer, idx), mask)
        reason = fusable(layer)
        if reason is not None:
            raise NetworkError(f"{layer.KIND} layer {layer.name!r} cannot be fused: {reason}")
        xs = [self.value(x, _broadcast(idx, out.shape, x.shape), mask) for x in layer.inputs]
        self.at = (idx, mask, tuple(out.shape))
        return emit_layer(self, layer, xs)

    def _moved(self, layer: L.Layer, idx: Index) -> Index:
        """The index of a shuffle's, slice's or expand's input that holds its output at `idx`."""
        x, out = layer.inputs[0], layer.outputs[0]
        if isinstance(layer, L.SliceLayer):
            return tuple(self.index(_affine(i, start, step)) if n != 1 else str(start)
                         for i, start, step, n in zip(idx, layer.start, layer.stride, layer.shape))
        if isinstance(layer, L.ExpandLayer):
            return _broadcast(idx, out.shape, x.shape)
        if isinstance(layer, L.ResizeLayer):  # whole ratios only (_resize_refusal); nearest-exact: a run's middle
            middle = layer.mode == "nearest-exact"
            return tuple(i if n == m else "0" if n == 1 else self.index(f"{i} // {m // n}") if m > n
                         else self.index(f"{i} * {n // m}" + (f" + {n // m // 2}" if middle else ""))
                         for i, n, m in zip(idx, x.shape, out.shape))
        before = list(x.shape) if layer.first_transpose is None else [x.shape[p] for p in layer.first_transpose]
        after = list(out.shape)
        if layer.second_transpose is not None:  # out dim k is the reshaped tensor's dim second[k]
            reshaped = [""] * len(idx)
            for k, p in enumerate(layer.second_transpose):
                reshaped[p] = idx[k]
            after = [out.shape[layer.second_transpose.index(p)] for p in range(len(after))]
            idx = tuple(reshaped)
        if before != after:
            idx = self._resplit(idx, after, before)
        if layer.first_transpose is not None:  # the transposed tensor's dim k is x's dim first[k]
            original = [""] * len(idx)
            for k, p in enumerate(layer.first_transpose):
                original[p] = idx[k]
            idx = tuple(original)
        return idx

    def _resplit(self, idx: Index, shape: Sequence[int], into: Sequence[int]) -> Index:
        """The index over `into` of the element at `idx` over `shape` (both row-major over the same elements). Dims
        the two share at the front and at the back keep their index; the dims between are flattened and re-split."""
        head = 0
        while head < min(len(shape), len(into)) and shape[head] == into[head]:
            head += 1
        tail = 0
        while tail < min(len(shape), len(into)) - head and shape[-1 - tail] == into[-1 - tail]:
            tail += 1
        middle, into_middle = shape[head:len(shape) - tail], into[head:len(into) - tail]
        flat = " + ".join(f"{i} * {math.prod(middle[d + 1:])}" if math.prod(middle[d + 1:]) != 1 else i
                          for d, i in enumerate(idx[head:len(idx) - tail]) if middle[d] != 1) or "0"
        flat = self.index(flat)
        split = tuple("0" if n == 1 else self.index(f"({flat} // {math.prod(into_middle[d + 1:])}) % {n}")
                      for d, n in enumerate(into_middle))
        return idx[:head] + split + idx[len(idx) - tail:]

    def _gathered(self, layer: L.GatherLayer, idx: Index, mask: str) -> Value:
        """A gather at `idx`: its indices read where the output's index says, then its data read at them (indices
        in range: `_gather_refusal`)."""
        data, indices = layer.inputs
        if layer.mode == L.GatherMode.ND:  # indices [..., depth] name data's first depth dims
            lead, depth = indices.rank - 1, indices.shape[-1]
            at = tuple(self.index(self.value(indices, idx[:lead] + (str(k),), mask)[0]) for k in range(depth))
            return self.value(data, at + idx[lead:], mask)
        axis = layer.axis % data.rank
        if layer.mode == L.GatherMode.ELEMENT:  # indices of the output's shape replace its index along the axis
            at = self.index(self.value(indices, idx, mask)[0])
            return self.value(data, idx[:axis] + (at,) + idx[axis + 1:], mask)
        # default: the indices' dims stand in for data's axis
        at = self.index(self.value(indices, idx[axis:axis + indices.rank], mask)[0])
        return self.value(data, idx[:axis] + (at,) + idx[axis + indices.rank:], mask)

    def _concatenation(self, layer: L.ConcatenationLayer, idx: Index, mask: str) -> Value:
        axis = layer.axis % layer.outputs[0].rank
        dtype = held(layer.outputs[0].dtype)
        start, parts = 0, []
        for x in layer.inputs:
            size = x.shape[axis]
            if size:
                shifted = idx[:axis] + (self.index(f"{idx[axis]} - {start}") if start else idx[axis],) + idx[axis + 1:]
                inside = self.index(f"{mask} & ({idx[axis]} >= {start}) & ({idx[axis]} < {start + size})")
                part = self.value(x, shifted, inside)
                parts.append((converted(part, dtype), start + size))
            start += size
        value = parts[-1][0]
        for part, end in reversed(parts[:-1]):
            value = self.emit(f"tl.where({idx[axis]} < {end}, {part}, {value})", dtype)[0]
        return value, dtype

    def _interpolated(self, layer: L.ResizeLayer, idx: Index, mask: str) -> Value:
        """A linear or bilinear resize at `idx`, as ATen's kernels compute it in float32: per resized dim, the source
        coordinate (clamped at 0 without aligned corners), its floor i0 and the next index i1 (i0 again at the
        last), their weights 1 - l and l; then the corners read and weighed, the last dim innermost."""
        x, out = layer.inputs[0], layer.outputs[0]
        resized = range(x.rank - _INTERPOLATED[layer.mode], x.rank)
        scales = list(layer.scales or [None] * len(resized))[-len(resized):]
        corners: list[list[tuple[str, str]]] = []  # per resized dim: (index, weight) of its two sources
        for d, factor in zip(resized, scales):
            scale = literal(_source_scale(x.shape[d], out.shape[d], bool(layer.align_corners), factor))
            at = f"{idx[d]}.to(tl.float32)" if idx[d].isidentifier() else f"tl.full([BLOCK], {idx[d]}, tl.float32)"
            src = self.emit(f"{at} * {scale}" if layer.align_corners else
                            f"tl.maximum(({at} + 0.5) * {scale} - 0.5, 0.0)", torch.float32)[0]
            i0 = self.index(f"{src}.to(tl.int32)")
            i1 = self.index(f"{i0} + ({i0} < {x.shape[d] - 1}).to(tl.int32)")
            l1 = self.emit(f"{src} - {i0}.to(tl.float32)", torch.float32)[0]
            corners.append([(i0, self.emit(f"1.0 - {l1}", torch.float32)[0]), (i1, l1)])

        def weighed(k: int, at: Index) -> str:  # dims from the k-th resized one: a weighed sum of two reads each
            if k == len(corners):
                return converted(self.value(x, at, mask), torch.float32)
            d = resized[k]
            return " + ".join(f"{w} * ({weighed(k + 1, at[:d] + (i,) + at[d + 1:])})" for i, w in corners[k])

        return self.emit(weighed(0, idx), torch.float32)

    def _pooled(self, layer: L.PoolingLayer, idx: Index, mask: str) -> Value:
        """A max or average pool at `idx`, as ATen's kernels compute it in float32: the window's taps read in
        row-major order where they fall inside the input; the largest (a NaN wins and stays), or the sum divided by
        the override, by the window's positions inside the input and its padding (`count_include_pad`, clipped
        at the padding's end as ceil mode's last window is), or by those inside the input."""
        x = layer.inputs[0]
        dims = window_dims(layer)
        lead = x.rank - len(dims)
        starts = [self.index(_affine(i, -pad, stride)) for i, (_, stride, pad, _) in zip(idx[lead:], dims)]
        average = layer.type == L.PoolingType.AVERAGE
        acc = None if average else "(-INF)"
        for tap in itertools.product(*(range(window) for window, *_ in dims)):
            at, checks = [], []
            for start, t, n, (_, _, _, dilation) in zip(starts, tap, x.shape[lead:], dims):
                at.append(self.index(_affine(start, t * dilation, 1)))
                if _LITERAL.fullmatch(at[-1]) is None:
                    checks.append(f"({at[-1]} >= 0) & ({at[-1]} < {n})")
                elif not 0 <= int(at[-1]) < n:
                    break
            else:
                inside = self.index(" & ".join([mask, *checks])) if checks else mask
                v = converted(self.value(x, idx[:lead] + tuple(at), inside), torch.float32)
                if average:
                    term = f"tl.where({inside}, {v}, 0.0)"
                    acc = self.emit(term if acc is None else f"{acc} + {term}", torch.float32)[0]
                else:
                    acc = self.emit(f"tl.where({inside} & (({v} > {acc}) | ({v} != {v})), {v}, {acc})",
                                    torch.float32)[0]
        if not average:
            return acc, torch.float32
        if layer.divisor_override is not None:
            return self.emit(f"{acc} / {literal(float(layer.divisor_override))}", torch.float32)
        counts = []
        for start, n, (window, _, pad, _) in zip(starts, x.shape[lead:], dims):
            if _LITERAL.fullmatch(start):
                first, end = int(start), min(int(start) + window, n + pad)
                counts.append(str(end - first if layer.count_include_pad else min(end, n) - max(first, 0)))
                continue
            end = self.index(f"tl.minimum({start} + {window}, {n + pad})")
            counts.append(f"({end} - {start})" if layer.count_include_pad else
                          f"(tl.minimum({end}, {n}) - tl.maximum({start}, 0))")
        if all(_LITERAL.fullmatch(c) for c in counts):
            return self.emit(f"{acc} / {literal(float(math.prod(int(c) for c in counts)))}", torch.float32)
        return self.emit(f"{acc} / ({' * '.join(counts)}).to(tl.float32)", torch.float32)

    def _product(self, layer: L.MatrixMultiplyLayer, idx: Index, mask: str) -> Value:
        """A small matrix multiply at `idx` (`small_product_refusal`): the row of op0(a) and the column of op1(b)
        at each position of the reduced dim, their products summed in float32 in order, then the bias."""
        a, b = layer.inputs
        out = layer.outputs[0]
        lead, (row, col) = idx[:-2], idx[-2:]
        transposed = (layer.op0 == L.MatrixOperation.TRANSPOSE, layer.op1 == L.MatrixOperation.TRANSPOSE)
        acc = None
        for p in range(_terms(layer)):
            at_a = _broadcast(lead, out.shape[:-2], a.shape[:-2]) + ((str(p), row) if transposed[0] else (row, str(p)))
            at_b = _broadcast(lead, out.shape[:-2], b.shape[:-2]) + ((col, str(p)) if transposed[1] else (str(p), col))
            at_a = tuple("0" if n == 1 else i for i, n in zip(at_a, a.shape))
            at_b = tuple("0" if n == 1 else i for i, n in zip(at_b, b.shape))
            term = f"{converted(self.value(a, at_a, mask), torch.float32)} * " \
                   f"{converted(self.value(b, at_b, mask), torch.float32)}"
            acc = self.emit(term if acc is None else f"{acc} + {term}", torch.float32)[0]
        bias = layer.weights.get("bias")
        if bias is not None:
            self.at = (idx, mask, tuple(out.shape))
            acc = self.emit(f"{acc} + {converted(self.load_weight(bias), torch.float32)}", torch.float32)[0]
        return acc, torch.float32

    def _padding(self, layer: L.PaddingLayer, idx: Index, mask: str) -> Value:
        x, out = layer.inputs[0], layer.outputs[0]
        rank = x.rank
        lead = [0] * rank
        for k in range(len(layer.pad) // 2):  # pairs from the last dim
            lead[rank - 1 - k] = layer.pad[2 * k]
        shifted = tuple(self.index(f"{i} - {b}") if b else i for i, b in zip(idx, lead))
        checks = [f"({i} >= 0) & ({i} < {n})" for i, n, b, e in zip(shifted, x.shape, lead, out.shape)
                  if b > 0 or e - b > n]
        inside = self.index(" & ".join(checks)) if checks else None
        value = self.value(x, shifted, self.index(f"{mask} & {inside}") if inside else mask)
        if inside is None:
            return value
        fill = torch.tensor(layer.value, dtype=torch.float64).to(out.dtype)
        fill = ("True" if fill.item() else "False") if out.dtype == torch.bool else \
            scalar_literal(fill) if out.dtype in INTEGERS else literal(float(fill))
        return self.emit(f"tl.where({inside}, {converted(value, out.dtype)}, {fill})", held(out.dtype))


_INTERPOLATED = {"linear": 1, "bilinear": 2}  # interpolating modes the generator computes: the dims they resize


def _source_scale(size: int, out: int, align_corners: bool, factor: float | None) -> float:
    """The float32 factor ATen maps an output index to a source coordinate by: (size - 1) / (out - 1) with aligned
    corners (0 for one output), else 1 / the given scale factor, else size / out."""
    if align_corners:
        return float(np.float32(size - 1) / np.float32(out - 1)) if out > 1 else 0.0
    return float(np.float32(1.0 / factor)) if factor else float(np.float32(size) / np.float32(out))


_LITERAL = re.compile(r"-?\d+")


def _affine(i: str, start: int, step: int) -> str:
    """start + i * step: a literal where index `i` is one."""
    if _LITERAL.fullmatch(i):
        return str(start + int(i) * step)
    term = i if step == 1 else f"{i} * {step}"
    return term if start == 0 else f"{start} + {term}"


def _broadcast(idx: Index, shape: Sequence[int], operand: Sequence[int]) -> Index:
    """The index into `operand` (right-aligned to `shape`, broadcast along its size-1 dims) of the element `idx`."""
    lead = len(shape) - len(operand)
    return tuple("0" if n == 1 else idx[lead + d] for d, n in enumerate(operand))


def generate(layers: Sequence[L.Layer], inputs: Sequence[Tensor], outputs: Sequence[Tensor],
             walk: Sequence[int] | None = None) -> IndexedKernel:
    """The kernel computing `outputs` (one static shape) from `inputs` through `layers`, walking the output's dims in
    `walk`'s order (outermost first; default: row-major). Raises NetworkError naming a layer it cannot compute, or a
    group that is not closed."""
    if not layers or not outputs or len(layers) > MAX_LAYERS:
        raise NetworkError(f"an indexed group needs 1 to {MAX_LAYERS} layers and an output")
    shape = tuple(outputs[0].shape)
    if any(tuple(t.shape) != shape for t in outputs) or not all(isinstance(d, int) for d in shape):
        raise NetworkError(f"indexed group outputs of different or dynamic shapes: {[list(t.shape) for t in outputs]}")
    for layer in layers:
        reason = indexed_fusable(layer)
        if reason is not None and not isinstance(layer, L.ConstantLayer):
            raise NetworkError(f"{layer.KIND} layer {layer.name!r} cannot be fused: {reason}")
    b = _Emitter(layers, inputs)
    idx = tuple(f"i{d}" for d in range(len(shape)))
    for t in outputs:
        if id(t) not in b.made or id(t) in b.given:
            raise NetworkError(f"group output {t.name!r} is not computed by the group's layers")
    stores = []
    for k, t in enumerate(outputs):
        offset = " + ".join(f"i{d} * out{k}_t{d}" for d in range(len(shape)) if shape[d] != 1) or "offs * 0"
        stores.append(f"tl.store(out{k} + {offset}, {stored(b.value(t, idx, 'mask'), t.dtype)}, mask=mask)")
    walk = tuple(range(len(shape))) if walk is None else tuple(walk)
    if sorted(walk) != list(range(len(shape))):
        raise NetworkError(f"walk {list(walk)} is no order of the {len(shape)} dims")
    return IndexedKernel(_source(b, shape, walk, len(outputs), stores), tuple(inputs), tuple(b.weights),
                         tuple(outputs), shape)


def _source(b: _Emitter, shape: tuple[int, ...], walk: tuple[int, ...], num_outputs: int, stores: list[str]) -> str:
    pointers = [*(f"in{i}" for i in range(len(b.inputs))), *(f"w{k}" for k in range(len(b.weights)))]
    outs = [f"out{k}" for k in range(num_outputs)]
    strides = [f"{p}_t{d}" for p in pointers for d in range(b.ranks[p])]
    strides += [f"{p}_t{d}" for p in outs for d in range(len(shape))]
    params = [*pointers, *outs, "numel", *strides, "INT64: tl.constexpr", "BLOCK: tl.constexpr", PDL_PARAM]
    body = [*WAIT_LINES, "if INT64:", "    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)", "else:",
            "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)", "mask = offs < numel", "rem = offs"]
    for k, d in enumerate(reversed(walk)):  # innermost first
        body += [f"i{d} = rem % {shape[d]}", f"rem = rem // {shape[d]}"] if k < len(walk) - 1 else [f"i{d} = rem"]
    body += b.lines + stores
    signature = ",\n        ".join(params)
    return (f"# Generated by {__name__} from the engine's layers; do not edit.\n{HEADER}\n\n"
            f"@triton.jit\ndef {KERNEL_NAME}(\n        {signature},\n):\n" + "".join(f"    {line}\n" for line in body))


CHANNELS_LAST_WALK = (0, 2, 3, 1)  # N, H, W, C: a channels-last tensor's memory order


class IndexedLauncher:
    """Runs a generated indexed kernel on CUDA tensors (or on CPU tensors under Triton's interpreter). The kernel
    walks its output in the output's memory order: channels-last where the planner asks (its readers are
    channels-last convolutions) or where the 4-D inputs are all channels-last (as ATen's concatenation keeps them;
    those of the output's shape, where there are such: a residual read as is, not a permuted operand); else
    row-major. Inputs of another shape count only where no layer of the kernel reshapes or permutes: a concatenation,
    padding, resize or pool keeps the meaning of N, C, H and W, a permute or reshape does not (a channels-last
    [B, C, H, W] partitioned into [B, windows, tokens, C] windows is row-major, so the layer norm and the linear
    layer after it read rows of C, not every windows-th value). Each order's kernel is generated when first
    needed."""

    def __init__(self, layers: Sequence[L.Layer], inputs: Sequence[Tensor], outputs: Sequence[Tensor],
                 channels_last: bool = False) -> None:
        self.kernel = generate(layers, inputs, outputs)
        self._group = (list(layers), list(inputs), list(outputs))
        self.channels_last = channels_last and len(self.kernel.shape) == 4
        self._keeps_axes = not any(isinstance(layer, L.ShuffleLayer) for layer in layers)
        self._fns: dict[bool, object] = {}
        self._weights: dict[torch.device, list[torch.Tensor]] = {}

    def _fn(self, channels_last: bool):
        from torchkiln.runtime.backends.cuda.codegen.compile import load_source

        fn = self._fns.get(channels_last)
        if fn is None:
            kernel = generate(*self._group, CHANNELS_LAST_WALK) if channels_last else self.kernel
            fn = self._fns[channels_last] = getattr(load_source(kernel.source), KERNEL_NAME)
        return fn

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        kernel = self.kernel
        if len(inputs) != len(kernel.inputs):
            raise EngineInputError(f"the indexed kernel takes {len(kernel.inputs)} inputs, got {len(inputs)}")
        for x, t in zip(inputs, kernel.inputs):
            if x.dtype != t.dtype or tuple(x.shape) != tuple(t.shape):
                raise EngineInputError(f"input {t.name!r}: expected {t.dtype} {list(t.shape)}, got {x.dtype} "
                                       f"{list(x.shape)}")
        device = inputs[0].device if inputs else torch.device("cuda")
        weights = self._weights.get(device)
        if weights is None:
            weights = self._weights[device] = [w.to(device) for w in kernel.weights]
        four = [x for x in inputs if x.dim() == 4 and x.numel() > 0]
        # those read as the output is, else (where no layer moves the axes) any
        four = [x for x in four if tuple(x.shape) == tuple(kernel.shape)] or (four if self._keeps_axes else [])
        last = len(kernel.shape) == 4 and (self.channels_last or bool(four) and all(
            x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous() for x in four))
        layout = torch.channels_last if last else torch.contiguous_format
        outputs = [torch.empty(kernel.shape, dtype=t.dtype, device=device, memory_format=layout)
                   for t in kernel.outputs]
        numel = math.prod(kernel.shape)
        if numel == 0:
            return outputs
        strides = [s for x in (*inputs, *weights, *outputs) for s in x.stride()]
        grid = ((numel + BLOCK - 1) // BLOCK,)
        launch(self._fn(last), grid, *inputs, *weights, *outputs, numel, *strides,
               INT64=needs_int64(*inputs, *outputs), BLOCK=BLOCK, **chain_options())
        return outputs


def compile_group(layers: Sequence[L.Layer], inputs: Sequence[Tensor], outputs: Sequence[Tensor],
                  channels_last: bool = False) -> IndexedLauncher:
    """Generate, load and wrap the kernel of an indexed group (4-D outputs channels-last if asked)."""
    return IndexedLauncher(layers, inputs, outputs, channels_last)
