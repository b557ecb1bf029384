"""Symbolic shape inference: a layer's reference meaning run on fake tensors whose dims are symbols.

The meaning runs under torch's FakeTensorMode with a ShapeEnv in which each of our symbols is an
unbacked SymInt bounded by its range. Unbacked symbols have no example value, so nothing in the meaning
can silently specialize on one: a shape decision the ranges do not settle raises, and the layer is
reported as needing static shapes. The output SymInts' expressions are mapped back to our symbols.

This module is the only user of torch's ShapeEnv / FakeTensorMode internals.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence

import torch

from torchkiln.errors import NetworkError
from torchkiln.ir.layers import (AttentionLayer, Layer, MatrixMultiplyLayer, MatrixOperation, NonZeroLayer,
                                 PaddingLayer, PaddingMode, ResizeLayer, SliceLayer, UniqueLayer)
from torchkiln.ir.symbolic import DimSymbol, SymbolicError, as_dim, as_shape, has_symbols, symbols_of, to_tree

Outputs = list[tuple[tuple, torch.dtype]]
Meaning = Callable[..., list[torch.Tensor]]  # a layer's reference meaning: (layer, inputs, weights, device)


def symbolic_params(layer: Layer) -> dict[str, object]:
    """The layer's parameters that hold symbolic dims."""
    return {k: v for k, v in layer.params().items() if has_symbols(v)}


class _Env:
    """A ShapeEnv and FakeTensorMode in which each of a set of our symbols is a bounded unbacked SymInt."""

    def __init__(self, symbols: frozenset[DimSymbol]) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.symbolic_shapes import ShapeEnv

        self.env = ShapeEnv()
        self.to_env: dict[DimSymbol, object] = {}
        self.from_env: dict[object, DimSymbol] = {}
        for s in sorted(symbols, key=lambda s: s.name):
            node = self.env.create_unbacked_symint()
            self.env.constrain_symbol_range(node.node.expr, s.lo, s.hi)
            self.to_env[s] = node.node.expr
            self.from_env[node.node.expr] = s
        self.mode = FakeTensorMode(shape_env=self.env, allow_non_fake_inputs=True)
        self.state = self._state()

    def _state(self) -> tuple:
        """What a meaning could have assumed: replacements, runtime asserts, narrowed ranges."""
        return (len(self.env.replacements), sum(len(v) for v in self.env.deferred_runtime_asserts.values()),
                tuple(str(self.env.var_to_range[e]) for e in self.from_env))

    def clean(self) -> bool:
        return self._state() == self.state

    def sym_int(self, d: object) -> object:
        if isinstance(d, int):
            return d
        return self.env.create_symintnode(d.xreplace(self.to_env), hint=None)


_ENVS: dict[frozenset[DimSymbol], _Env] = {}
_ENVS_LOCK = threading.Lock()
_MAX_ENVS = 16


def infer_symbolic(layer: Layer, run: Meaning) -> Outputs:
    """Output shapes (ints and symbolic dims) and dtypes of `layer`, by running `run` (the reference
    meaning) on fake tensors; a NetworkError says that the layer needs static shapes."""
    if isinstance(layer, SliceLayer) and len(layer.shape) == layer.inputs[0].rank:
        # By definition a slice holds `shape` elements; torch's rule would give min(shape, bound) instead, an
        # expression later shape rules could not match. Conversion checked the bounds; the run-time meaning
        # checks them again on ints.
        return [(as_shape(layer.shape), layer.inputs[0].dtype)]
    rule = _DIRECT_RULES.get(type(layer))
    direct = rule(layer, run) if rule is not None else None
    if direct is not None:
        return direct
    params = symbolic_params(layer)
    symbols: set[DimSymbol] = set()
    for t in layer.inputs:
        symbols |= symbols_of(t.shape)
    symbols |= symbols_of(list(params.values()))
    key = frozenset(symbols)
    with _ENVS_LOCK:  # one env per symbol set, reused while no meaning has added an assumption to it
        found = _ENVS.pop(key, None)
    return _infer(found or _Env(key), layer, params, run)


def _matmul_shape(layer: MatrixMultiplyLayer, run: Meaning) -> Outputs | None:
    """op0(a) @ op1(b) (+ bias) of operands of rank 2 or more: [..., M, K] x [..., K, N] -> [..., M, N], the leading
    dims broadcast (equal, or one of them 1), read off the shapes (torch 2.11's fake matmul and linear ask for int
    sizes: numel(), a reshape to 3-D). None where the rule does not plainly apply (a fake run decides)."""
    a, b = layer.inputs
    bias = layer.weights.get("bias")
    if a.rank < 2 or b.rank < 2 or a.dtype != b.dtype or MatrixOperation.VECTOR in (layer.op0, layer.op1):
        return None
    rows, cols = list(a.shape), list(b.shape)
    for shape, op in ((rows, layer.op0), (cols, layer.op1)):
        if op == MatrixOperation.TRANSPOSE:
            shape[-1], shape[-2] = shape[-2], shape[-1]
    if rows[-1] != cols[-2] or (bias is not None and (bias.dim() > 1 or bias.numel() not in (1, cols[-1]))):
        return None
    lead_a, lead_b = rows[:-2], cols[:-2]
    width = max(len(lead_a), len(lead_b))
    lead_a, lead_b = [1] * (width - len(lead_a)) + lead_a, [1] * (width - len(lead_b)) + lead_b
    lead = []
    for x, y in zip(lead_a, lead_b):
        if x != y and 1 not in (x, y):
            return None
        lead.append(y if x == 1 else x)
    return [(tuple(lead) + (rows[-2], cols[-1]), a.dtype)]


def _padding_shape(layer: PaddingLayer, run: Meaning) -> Outputs | None:
    """Each padded dim grown by its pads, read off the shape where every dim a pad changes is static (a window
    padding of a map with a dynamic batch: torch 2.11's fake constant_pad_nd asks for every size as an int). None
    otherwise, or where a pad would leave a dim empty or reflect past its size (the fake run says what is wrong)."""
    x = layer.inputs[0]
    shape = list(x.shape)
    for k in range(len(layer.pad) // 2):
        before, after = layer.pad[2 * k], layer.pad[2 * k + 1]
        if not (before or after):
            continue
        dim = x.rank - 1 - k
        size = shape[dim]
        if not isinstance(size, int) or not isinstance(before, int) or not isinstance(after, int):
            return None
        grown = size + before + after
        if grown < 0 or (layer.mode != PaddingMode.CONSTANT and max(before, after) >= size):
            return None
        shape[dim] = grown
    return [(tuple(shape), x.dtype)]


def _attention_shape(layer: AttentionLayer, run: Meaning) -> Outputs | None:
    """SDPA of q [..., L, E], k [..., S, E], v [..., S, Ev] with the same leading dims (k and v: the same or, with
    `enable_gqa`, a divisor of q's heads at dim -3): [..., L, Ev] (torch 2.11's fake SDPA cannot run on symbolic
    sizes). The mask only has to broadcast, which the run-time meaning checks."""
    q, k, v = layer.inputs[:3]
    if not (q.rank == k.rank == v.rank >= 2 and k.shape[:-2] == v.shape[:-2] and q.shape[-1] == k.shape[-1]
            and k.shape[-2] == v.shape[-2] and q.dtype == k.dtype == v.dtype):
        return None
    if q.shape[:-2] != k.shape[:-2] and not (
            layer.enable_gqa and q.rank >= 3 and q.shape[:-3] == k.shape[:-3]
            and isinstance(q.shape[-3], int) and isinstance(k.shape[-3], int) and q.shape[-3] % k.shape[-3] == 0):
        return None
    return [(tuple(q.shape[:-1]) + (v.shape[-1],), q.dtype)]


def _non_zero_shape(layer: NonZeroLayer, run: Meaning) -> Outputs:
    """[count, rank] indices: count is the symbol the layer defines (its value is known once it has run)."""
    return [((layer.count, layer.inputs[0].rank), torch.int64)]


def _unique_shape(layer: UniqueLayer, run: Meaning) -> Outputs:
    x = layer.inputs[0]
    return [((layer.count,), x.dtype), (tuple(x.shape), torch.int64), ((layer.count,), torch.int64)]


def _resize_shape(layer: ResizeLayer, run: Meaning) -> Outputs | None:
    """The leading (batch, channel) dims kept and the spatial ones the layer's `size` (static or not: a map resized
    to the input's dynamic size), or else from a run of the meaning on a meta map of the same spatial size where
    those are static (torch 2.11's fake upsampling asks for every size as an int)."""
    x = layer.inputs[0]
    spatial = x.shape[2:]
    if x.rank < 3:
        return None
    if layer.size is not None:
        return [(tuple(x.shape[:2]) + tuple(as_dim(d) for d in layer.size), x.dtype)] \
            if len(layer.size) == len(spatial) else None
    if any(not isinstance(d, int) for d in spatial):
        return None
    meta = torch.device("meta")
    try:
        out = run(layer, [torch.empty((1, 1, *spatial), dtype=x.dtype, device=meta)], {}, meta)[0]
    except Exception:  # (the fake run says what is wrong)
        return None
    return [(tuple(x.shape[:2]) + tuple(out.shape[2:]), out.dtype)]


# layers whose output shapes are read off their input shapes instead of a fake run of their meaning
_DIRECT_RULES: dict[type, Callable[[Layer, Meaning], Outputs | None]] = {
    MatrixMultiplyLayer: _matmul_shape,
    PaddingLayer: _padding_shape,
    ResizeLayer: _resize_shape,
    AttentionLayer: _attention_shape,
    NonZeroLayer: _non_zero_shape,
    UniqueLayer: _unique_shape,
}


def _infer(state: _Env, layer: Layer, params: dict[str, object], run: Meaning) -> Outputs:
    key = frozenset(state.to_env)
    sym_int = state.sym_int

    def convert(value: object) -> object:
        if isinstance(value, tuple):
            return tuple(convert(v) for v in value)
        return sym_int(value) if has_symbols(value) else value

    mode, from_env = state.mode, state.from_env
    fake_layer = dataclasses.replace(layer, **{k: convert(v) for k, v in params.items()})
    try:
        with mode:
            # on the meta device: its shape rules are the generic ones (torch 2.11's CPU linear in half precision
            # asks for numel() and cannot run on symbolic sizes)
            meta = torch.device("meta")
            inputs = [torch.empty([sym_int(d) for d in t.shape], dtype=t.dtype, device=meta) for t in layer.inputs]
            weights = {k: torch.empty_strided(w.shape, w.stride(), dtype=w.dtype, device=meta)
                       for k, w in layer.weights.items()}
            outs = run(fake_layer, inputs, weights, meta)
    except NetworkError:
        raise
    except Exception as e:  # a shape decision the ranges do not settle, or an op without symbolic support
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise NetworkError(f"{layer.KIND} layer {layer.name!r} needs static shapes: {first}") from None
    if not state.clean():  # the env is dropped: the next layer gets a fresh one
        raise NetworkError(f"{layer.KIND} layer {layer.name!r} needs static shapes: its shape rule assumes a "
                           f"relation between dims that their ranges do not imply")
    with _ENVS_LOCK:
        _ENVS[key] = state
        while len(_ENVS) > _MAX_ENVS:
            _ENVS.pop(next(iter(_ENVS)))
    result: Outputs = []
    for o in outs:
        shape = []
        for d in o.shape:
            if isinstance(d, torch.SymInt):
                expr = d.node.expr
                unknown = [s for s in expr.free_symbols if s not in from_env]
                if unknown:
                    raise NetworkError(f"{layer.KIND} layer {layer.name!r}: output dim {expr} depends on data")
                try:
                    dim = as_dim(expr.xreplace(from_env))
                    to_tree(dim)  # an engine must be able to store it (s0**9 it cannot)
                    shape.append(dim)
                except SymbolicError as e:
                    raise NetworkError(f"{layer.KIND} layer {layer.name!r}: {e}") from None
            else:
                shape.append(int(d))
        result.append((tuple(shape), o.dtype))
    return result


def any_symbolic(layer: Layer, inputs: Sequence) -> bool:
    """Whether shape inference of `layer` on `inputs` (network tensors) needs symbols."""
    return any(has_symbols(t.shape) for t in inputs) or bool(symbolic_params(layer))
