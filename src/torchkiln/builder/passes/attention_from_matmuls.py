"""Attention written by hand becomes one attention layer: softmax(q @ k^T * scale + bias) @ v.

Written out, attention makes the score matrix ([..., L, S] per head, often in fp32) and passes over it four or five
times (the product, the scale, the bias, the softmax, the second product). As an attention layer it runs as
SDPA's fused kernels, which keep the scores on chip. The match, from each softmax over the last axis:
- before it, at most one add of a bias (any tensor that broadcasts to the scores without widening them), before
  that any multiplies or divides by a constant scalar (the scale) and at most one multiply by a tensor (of any
  values) constant along the keys (its last dim 1: a cosine attention's per-head logit scale; q is multiplied by
  it instead), and before those a matrix multiply of q by k transposed (its op1, or a shuffle swapping k's last
  two dims);
- after it, a matrix multiply of the probabilities by v (a float16/bfloat16 softmax may be widened to float32 and
  cast back around it, as `softmax(scores.float()).type_as(scores)` writes it);
- q, k and v of rank 4 (what the fused kernels take) with the same leading dims, and every value in between read
  by the next step only;
- or of rank 5, [B, G, H, L, d] (attention within groups: windows, grids), with static leading dims: q, k and v are
  regrouped to [N1, N2, L, d] by a reshape, where N2 holds the leading dims the bias varies along (the heads, at
  least), and the bias is expanded along those and reshaped to [1, N2, L, S];
- shifted windows: the scores [B * W, H, L, S] viewed as [B, W, H, L, S], a constant (a mask per window) added,
  and viewed back. q, k and v are then regrouped to [B, W * H, L, d] (a reshape: the same row-major order), so
  one constant bias [1, W * H, L, S] holds both that mask and a constant bias added before the view.

One difference is made exact. Where every bias value of a row is -inf, or one is +inf or NaN, softmax written out
gives NaN for the row, and SDPA gives zeros. For a constant bias the rows are checked here (none: nothing to add);
otherwise the layer's output is `where(row max of the bias is finite, attention, NaN)`. A row whose scores are
infinite because q or k hold infinities is not covered: written out it may be NaN where SDPA is not.
"""
from __future__ import annotations

import dataclasses
import logging
import math

import torch

from torchkiln.builder.settings import BuildSettings
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor

logger = logging.getLogger("torchkiln.builder")

E = L.ElementWiseOperation
RANK = 4
MAX_BIAS_ELEMENTS = 1 << 24  # a regrouped window bias is a constant of at most this many values


def attention_from_matmuls(network: Network, settings: BuildSettings) -> bool:
    readers = network.consumers()
    changed = False
    for softmax in [x for x in network.layers if isinstance(x, L.SoftMaxLayer)]:
        match = _match(network, softmax, readers)
        if isinstance(match, str):
            logger.debug("softmax %r is not attention: %s", softmax.name, match)
            continue
        _rewrite(network, *match)
        changed = True
    return changed


def _scalar(t: Tensor) -> float | None:
    value = L.constant_value(t)
    if value is None or value.numel() != 1 or not value.is_floating_point():
        return None
    number = float(value.reshape(()))
    return number if math.isfinite(number) and number != 0.0 else None


def _match(network: Network, softmax: L.SoftMaxLayer, readers: dict[int, list[L.Layer]]):
    """(q, k, v, bias, scale, the last matrix multiply, the regrouping of 4-D windows or 5-D heads or None, the
    multiplier of the scores' rows or None), or why `softmax` does not start attention."""
    scores = softmax.inputs[0]
    rank = scores.rank
    if softmax.log or rank not in (RANK, RANK + 1) or softmax.axis % rank != rank - 1:
        return "not a softmax over the last axis of a 4-D or 5-D tensor"
    probs = softmax.get_output()
    after = network.sole_reader(probs, readers)
    widened = _widening(scores)
    if widened is not None:  # softmax(scores.float()).type_as(scores): SDPA's softmax is in fp32 already
        if not isinstance(after, L.CastLayer) or after.to_type != widened.dtype:
            return "a softmax widened to float32 is not cast back to the scores' dtype"
        probs, scores = after.get_output(), widened
        after = network.sole_reader(probs, readers)
    if not isinstance(after, L.MatrixMultiplyLayer) or after.inputs[0] is not probs \
            or after.op0 != L.MatrixOperation.NONE or after.op1 != L.MatrixOperation.NONE or after.weights:
        return "its output is not the left operand of one plain matrix multiply"
    bias, scale, multiplier, t = None, 1.0, None, scores
    window = _window_view(network, t, readers)
    if window is not None:
        t = window.scores
    while True:
        layer = t.producer
        if network.sole_reader(t, readers) is None:
            return f"{t.name!r} has other readers"
        if isinstance(layer, L.ElementWiseLayer) and layer.op == E.SUM and bias is None and scale == 1.0 \
                and multiplier is None:
            sides = [x for x in layer.inputs if _scores_like(x)]
            if len(sides) != 1:
                return f"add {layer.name!r}: not one product side and one bias side"
            product = sides[0]
            other = layer.inputs[1] if layer.inputs[0] is product else layer.inputs[0]
            if product.shape != layer.get_output().shape or other.rank > rank or other.dtype != product.dtype:
                return f"add {layer.name!r} widens the scores"
            bias, t = other, product
        elif isinstance(layer, L.ElementWiseLayer) and layer.op in (E.PROD, E.DIV) \
                and (_scalar(layer.inputs[1]) is not None or layer.op == E.PROD and _scalar(layer.inputs[0])):
            number = _scalar(layer.inputs[1])
            if number is not None:
                scale, t = (scale * number if layer.op == E.PROD else scale / number), layer.inputs[0]
            else:
                scale, t = scale * _scalar(layer.inputs[0]), layer.inputs[1]
        elif multiplier is None and (found := _row_multiplier(layer)) is not None:
            multiplier, t = found
        else:
            break
    first = t.producer
    if not isinstance(first, L.MatrixMultiplyLayer) or first.weights or first.op0 != L.MatrixOperation.NONE:
        return "the scores are not a plain matrix multiply (scaled, plus a bias)"
    q, k_side = first.inputs
    k = L.matrix_transposed(k_side) if first.op1 == L.MatrixOperation.NONE else \
        k_side if first.op1 == L.MatrixOperation.TRANSPOSE else None
    v = after.inputs[1]
    if k is None:
        return "the right operand of the scores is not k transposed"
    if any(x.rank != rank for x in (q, k, v)) or not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]) \
            or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2] or not (q.dtype == k.dtype == v.dtype) \
            or not q.dtype.is_floating_point:
        return f"q, k and v are not {rank}-D of the same float dtype and matching dims"
    if rank == RANK + 1:
        return _grouped(q, k, v, bias, scale, after, multiplier)
    if window is None:
        return q, k, v, bias, scale, after, None, multiplier
    if bias is not None and L.constant_value(bias) is None:
        return "a bias added before the window view is not a constant"
    regrouped = window.regroup(L.constant_value(bias) if bias is not None else None, q.dtype)
    if isinstance(regrouped, str):
        return regrouped
    return q, k, v, regrouped[1], scale, after, regrouped[0], multiplier


def _grouped(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, scale: float, last: L.MatrixMultiplyLayer,
             multiplier: Tensor | None):
    """The match of 5-D attention [B, G, H, L, d], regrouped to [N1, N2, L, d] (`_Grouping`), or why not."""
    lead = tuple(q.shape[:3])
    if not all(isinstance(d, int) for d in lead):
        return "5-D attention with dynamic leading dims"
    split = 2  # N2 = the heads, at least; more where the bias varies along G or B
    if bias is not None:
        padded = (1,) * (RANK + 1 - bias.rank) + tuple(bias.shape)
        if not all(isinstance(d, int) for d in padded):
            return "5-D attention with a bias of dynamic shape"
        split = min([d for d in range(2) if padded[d] != 1], default=2)
        if math.prod(lead[split:]) * padded[3] * padded[4] > MAX_BIAS_ELEMENTS:
            return f"the regrouped bias would hold {math.prod(lead[split:]) * padded[3] * padded[4]} values"
    return q, k, v, bias, scale, last, _Grouping(lead, split), multiplier


@dataclasses.dataclass(frozen=True)
class _Grouping:
    """5-D attention's leading dims [B, G, H] regrouped to [N1, N2]: N2 = the dims from `split` on."""

    lead: tuple[int, int, int]
    split: int

    @property
    def groups(self) -> tuple[int, int]:
        return math.prod(self.lead[:self.split]), math.prod(self.lead[self.split:])

    def bias(self, network: Network, bias: Tensor) -> Tensor:
        """`bias` (broadcasting to [B, G, H, L, S]) as [1, N2, L, S]: expanded along N2's dims, then reshaped; a
        constant one as a constant (so that its rows are checked here, not at every call)."""
        padded = (1,) * (RANK + 1 - bias.rank) + tuple(bias.shape)
        full = (1,) * self.split + self.lead[self.split:] + padded[3:]
        regrouped = (1, self.groups[1], *padded[3:])
        value = L.constant_value(bias)
        if value is not None:
            return network.add_constant(value.reshape(padded).expand(full).reshape(regrouped).contiguous()).get_output()
        if bias.rank != RANK + 1:
            bias = network.add_shuffle(bias, reshape_dims=padded).get_output()
        if full != padded:
            bias = network.add_expand(bias, full).get_output()
        return network.add_shuffle(bias, reshape_dims=regrouped).get_output()


@dataclasses.dataclass(frozen=True)
class _Window:
    """Scores viewed as [B, W, H, L, S] for a constant bias added there, then viewed back (shifted windows: the
    bias is per window and head, the scores' batch dim is B * W)."""

    scores: Tensor  # the 4-D scores before the view
    view: tuple[int, ...]  # the 5-D view
    bias: torch.Tensor  # the constant added in it

    def regroup(self, bias4: torch.Tensor | None, dtype: torch.dtype) -> tuple[tuple[int, int], torch.Tensor] | str:
        """The 4-D batch dims (N1, N2) q, k and v are regrouped to, where both biases (the 5-D one, and `bias4`
        added in the 4-D frame, a constant or none) vary along N2 only, and their sum in that frame; or why not."""
        lead = self.view[:3]
        five = self.bias.reshape((1,) * (5 - self.bias.dim()) + tuple(self.bias.shape))
        if bias4 is not None:
            bias4 = bias4.reshape((1,) * (4 - bias4.dim()) + tuple(bias4.shape))
            if bias4.shape[0] != 1:
                return "a bias added before the window view varies along the batch"
            five = five.float() + bias4.float()[:, None]
        varying = [d for d in range(3) if five.shape[d] != 1]
        split = min(varying, default=3)
        if split == 0:
            return "the window view's bias varies along the batch"
        n1, n2 = math.prod(lead[:split]), math.prod(lead[split:])
        if n2 * self.view[3] * self.view[4] > MAX_BIAS_ELEMENTS:
            return f"the regrouped bias would hold {n2 * self.view[3] * self.view[4]} values"
        total = five.expand(*[1] * split, *lead[split:], *five.shape[3:])
        return (n1, n2), total.reshape(1, n2, *five.shape[3:]).to(dtype).contiguous()


def _window_view(network: Network, t: Tensor, readers: dict[int, list[L.Layer]]) -> _Window | None:
    """The window view ending at `t` (4-D scores = reshape(reshape(x, 5-D) + constant) with x of t's shape), or
    None."""
    back = t.producer
    if not _plain_reshape(back) or network.sole_reader(t, readers) is None:
        return None
    added = back.inputs[0].producer
    if not isinstance(added, L.ElementWiseLayer) or added.op != E.SUM \
            or network.sole_reader(back.inputs[0], readers) is None:
        return None
    for viewed, other in (added.inputs, reversed(added.inputs)):
        forth, bias = viewed.producer, L.constant_value(other)
        if _plain_reshape(forth) and bias is not None and bias.dim() <= 5 and viewed.shape == added.get_output().shape \
                and network.sole_reader(viewed, readers) is not None:
            x, view = forth.inputs[0], tuple(viewed.shape)
            static = all(isinstance(d, int) for d in (*view, *x.shape))
            if static and x.shape == t.shape and len(view) == 5 and view[0] * view[1] == x.shape[0] \
                    and view[2:] == tuple(x.shape[1:]):
                return _Window(x, view, bias)
    return None


def _plain_reshape(layer: L.Layer | None) -> bool:
    return isinstance(layer, L.ShuffleLayer) and layer.first_transpose is None and layer.second_transpose is None \
        and layer.reshape_dims is not None


def _widening(t: Tensor) -> Tensor | None:
    """x where `t` is x (float16 or bfloat16) cast to float32, else None."""
    cast = t.producer
    if isinstance(cast, L.CastLayer) and t.dtype == torch.float32 \
            and cast.inputs[0].dtype in (torch.float16, torch.bfloat16):
        return cast.inputs[0]
    return None


def _scores_like(t: Tensor) -> bool:
    """Whether `t` is made by a matrix multiply, by a multiply or divide by a constant scalar, or by a multiply by a
    tensor constant along the keys."""
    layer = t.producer
    if isinstance(layer, L.MatrixMultiplyLayer):
        return True
    return isinstance(layer, L.ElementWiseLayer) and layer.op in (E.PROD, E.DIV) \
        and any(_scalar(x) is not None for x in layer.inputs) or _row_multiplier(layer) is not None


def _row_multiplier(layer: L.Layer | None) -> tuple[Tensor, Tensor] | None:
    """(m, x) where `layer` multiplies x (made by a matrix multiply or a scale of one) by a tensor m that is constant
    along the keys (last dim 1) and broadcasts to x without widening it: (q @ k^T) * m == (q * m) @ k^T."""
    if not isinstance(layer, L.ElementWiseLayer) or layer.op != E.PROD:
        return None
    out = layer.outputs[0]
    for x, m in (layer.inputs, reversed(layer.inputs)):
        padded = (1,) * (out.rank - m.rank) + tuple(m.shape)
        if x.shape == out.shape and x.dtype == m.dtype and _scalar(m) is None and 0 < m.rank <= out.rank \
                and padded[-1] == 1 and all(d == 1 or d == o for d, o in zip(padded, out.shape)) \
                and isinstance(x.producer, (L.MatrixMultiplyLayer, L.ElementWiseLayer)):
            return m, x
    return None


def _rewrite(network: Network, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | torch.Tensor | None, scale: float,
             last: L.MatrixMultiplyLayer, groups: tuple[int, int] | _Grouping | None,
             multiplier: Tensor | None) -> None:
    start = len(network.layers)
    if multiplier is not None:  # each query row scaled as its scores were, before q is regrouped
        q = network.add_elementwise(q, multiplier, E.PROD).get_output()
    if isinstance(groups, _Grouping):  # 5-D: q, k, v and the bias regrouped to [N1, N2]
        if bias is not None:
            bias = groups.bias(network, bias)
        groups = groups.groups
        q, k, v = (network.add_shuffle(x, reshape_dims=(*groups, *x.shape[3:])).get_output() for x in (q, k, v))
    elif groups is not None:  # regrouped so the window view's bias broadcasts: q, k, v and the bias in [N1, N2]
        q, k, v = (network.add_shuffle(x, reshape_dims=(*groups, *x.shape[2:])).get_output() for x in (q, k, v))
        bias = network.add_constant(bias).get_output()
    out = network.add_attention(q, k, v, bias, scale=scale).get_output()
    valid = _valid_rows(network, bias) if bias is not None else None
    if valid is not None:
        nan = network.add_constant(torch.full((), float("nan"), dtype=out.dtype)).get_output()
        out = network.add_select(valid, out, nan).get_output()
    if groups is not None:
        out = network.add_shuffle(out, reshape_dims=last.get_output().shape).get_output()
    added = network.layers[start:]
    del network.layers[start:]
    at = network.layers.index(last) + 1
    network.layers[at:at] = added
    network.replace_all_uses(last.get_output(), out)
    logger.debug("attention by hand ending in %r is one attention layer (scale %g%s)", last.name, scale,
                 ", its bias's blocked rows NaN as written" if valid is not None else "")


def _valid_rows(network: Network, bias: Tensor) -> Tensor | None:
    """A bool tensor, True where the bias row's max is finite (written-out softmax is not NaN there), or None when a
    constant bias has no other row."""
    value = L.constant_value(bias)
    if value is not None:
        finite = value.float().amax(dim=-1, keepdim=True).isfinite() if value.dim() else value.isfinite()
        return None if bool(finite.all()) else network.add_constant(finite).get_output()
    last = bias.rank - 1
    top = network.add_reduce(bias, L.ReduceOperation.MAX, (last,), True).get_output() if bias.rank else bias
    inf = [network.add_constant(torch.full((), sign * float("inf"), dtype=bias.dtype)).get_output() for sign in (-1, 1)]
    above = network.add_elementwise(top, inf[0], E.GREATER).get_output()
    below = network.add_elementwise(top, inf[1], E.LESS).get_output()
    return network.add_elementwise(above, below, E.AND).get_output()
