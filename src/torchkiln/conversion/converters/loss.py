"""Loss converters: the elementwise losses (mse, l1, huber, smooth_l1, soft_margin, hinge_embedding, margin_ranking,
kl_div, poisson_nll, triplet_margin) and nll, cross entropy and multi-margin over class indices, as ATen writes
each, then the reduction (0: none, 1: mean, 2: sum).

binary_cross_entropy_with_logits is converted; binary_cross_entropy is not: eager raises for an input outside [0, 1],
which an engine would not."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torchkiln.analysis.registry import converter
from torchkiln.analysis.resolve import Args
from torchkiln.conversion.context import ConversionCtx
from torchkiln.conversion.impl.activation import clip
from torchkiln.conversion.impl.common import one_dtype
from torchkiln.conversion.impl.elementwise import binary, select, unary
from torchkiln.conversion.impl.reduce import pairwise_distance, reduce
from torchkiln.conversion.impl.shuffle import reshape, squeeze_dims, unsqueeze
from torchkiln.ir import layers as L
from torchkiln.ir.tensor import Tensor

E, U, R = L.ElementWiseOperation, L.UnaryOperation, L.ReduceOperation
_REDUCTIONS = {0: None, 1: R.AVG, 2: R.SUM}  # at::Reduction: None, Mean, Sum


def _capability(*operands: str) -> Callable[[Args], str | None]:
    """The capability of a loss: its tensor operands of one floating dtype, a known reduction."""
    same_dtype = one_dtype(*operands, floating=True)

    def check(args: Args) -> str | None:
        return same_dtype(args) or (None if args.reduction in _REDUCTIONS else f"unknown reduction {args.reduction!r}")

    return check


def _reduced(ctx: ConversionCtx, loss: Tensor, reduction: int) -> Tensor:
    op = _REDUCTIONS[reduction]
    return loss if op is None else reduce(ctx, loss, op, None, False)


def _loss(key: str, *operands: str) -> Callable:
    """Register `fn(ctx, args, *operand tensors) -> elementwise loss` as the converter of `key`."""
    def register(fn: Callable[..., Tensor]) -> Callable:
        @converter(key, capability=_capability(*operands))
        def convert(ctx: ConversionCtx, args: Args) -> Tensor:
            return _reduced(ctx, fn(ctx, args, *(ctx.to_tensor(args[n]) for n in operands)), args.reduction)

        convert.__doc__ = fn.__doc__
        return convert

    return register


@_loss("aten::mse_loss", "self", "target")
def mse_loss(ctx: ConversionCtx, args: Args, x: Tensor, t: Tensor) -> Tensor:
    """(x - t)^2."""
    return unary(ctx, binary(ctx, x, t, E.SUB), U.SQUARE)


@_loss("aten::l1_loss", "self", "target")
def l1_loss(ctx: ConversionCtx, args: Args, x: Tensor, t: Tensor) -> Tensor:
    """|x - t|."""
    return unary(ctx, binary(ctx, x, t, E.SUB), U.ABS)


@_loss("aten::huber_loss", "self", "target")
def huber_loss(ctx: ConversionCtx, args: Args, x: Tensor, t: Tensor) -> Tensor:
    """z = |x - t|: 0.5 z^2 where z < delta, else delta (z - 0.5 delta)."""
    z, delta = unary(ctx, binary(ctx, x, t, E.SUB), U.ABS), args.delta
    quadratic = binary(ctx, binary(ctx, z, 0.5, E.PROD), z, E.PROD)
    linear = binary(ctx, binary(ctx, z, 0.5 * delta, E.SUB), delta, E.PROD)
    return select(ctx, binary(ctx, z, delta, E.LESS), quadratic, linear)


@_loss("aten::smooth_l1_loss", "self", "target")
def smooth_l1_loss(ctx: ConversionCtx, args: Args, x: Tensor, t: Tensor) -> Tensor:
    """z = |x - t|: 0.5 z^2 / beta where z < beta, else z - 0.5 beta (beta 0: z)."""
    z, beta = unary(ctx, binary(ctx, x, t, E.SUB), U.ABS), args.beta
    if beta == 0:
        return z
    quadratic = binary(ctx, binary(ctx, binary(ctx, z, 0.5, E.PROD), z, E.PROD), beta, E.DIV)
    return select(ctx, binary(ctx, z, beta, E.LESS), quadratic, binary(ctx, z, 0.5 * beta, E.SUB))


@_loss("aten::soft_margin_loss", "self", "target")
def soft_margin_loss(ctx: ConversionCtx, args: Args, x: Tensor, t: Tensor) -> Tensor:
    """log1p(exp(-x t))."""
    return unary(ctx, unary(ctx, binary(ctx, unary(ctx, x, U.NEG), t, E.PROD), U.EXP), U.LOG1P)


@_loss("aten::hinge_embedding_loss", "self", "target")
def hinge_embedding_loss(ctx: ConversionCtx, args: Args, x: Tensor, t: Tensor) -> Tensor:
    """where(t != 1, max(margin - x, 0), 0) + where(t != -1, x, 0)."""
    margin = clip(ctx, binary(ctx, args.margin, x, E.SUB), 0.0, None)
    zero = ctx.to_tensor(0.0, x.dtype)
    return binary(ctx, select(ctx, binary(ctx, t, 1.0, E.NOT_EQUAL), margin, zero),
                  select(ctx, binary(ctx, t, -1.0, E.NOT_EQUAL), x, zero), E.SUM)


@_loss("aten::margin_ranking_loss", "input1", "input2", "target")
def margin_ranking_loss(ctx: ConversionCtx, args: Args, a: Tensor, b: Tensor, t: Tensor) -> Tensor:
    """max(-t (a - b) + margin, 0)."""
    out = binary(ctx, binary(ctx, unary(ctx, t, U.NEG), binary(ctx, a, b, E.SUB), E.PROD), args.margin, E.SUM)
    return clip(ctx, out, 0.0, None)


@_loss("aten::kl_div", "self", "target")
def kl_div(ctx: ConversionCtx, args: Args, x: Tensor, t: Tensor) -> Tensor:
    """exp(t) (t - x) with log_target, else xlogy(t, t) - t x (0 where t is 0)."""
    if args.log_target:
        return binary(ctx, unary(ctx, t, U.EXP), binary(ctx, t, x, E.SUB), E.PROD)
    xlogy = select(ctx, binary(ctx, t, 0.0, E.EQUAL), 0.0, binary(ctx, t, unary(ctx, t, U.LOG), E.PROD))
    xlogy = select(ctx, unary(ctx, t, U.ISNAN), float("nan"), xlogy)
    return binary(ctx, xlogy, binary(ctx, t, x, E.PROD), E.SUB)


@_loss("aten::poisson_nll_loss", "input", "target")
def poisson_nll_loss(ctx: ConversionCtx, args: Args, x: Tensor, t: Tensor) -> Tensor:
    """exp(x) - t x (log_input), else x - t log(x + eps); with full, plus Stirling's term where t > 1."""
    if args.log_input:
        loss = binary(ctx, unary(ctx, x, U.EXP), binary(ctx, t, x, E.PROD), E.SUB)
    else:
        loss = binary(ctx, x, binary(ctx, t, unary(ctx, binary(ctx, x, args.eps, E.SUM), U.LOG), E.PROD), E.SUB)
    if not args.full:
        return loss
    stirling = binary(ctx, binary(ctx, binary(ctx, t, unary(ctx, t, U.LOG), E.PROD), t, E.SUB),
                      binary(ctx, unary(ctx, binary(ctx, t, 2 * math.pi, E.PROD), U.LOG), 0.5, E.PROD), E.SUM)
    return binary(ctx, loss, select(ctx, binary(ctx, t, 1.0, E.LESS_EQUAL), 0.0, stirling), E.SUM)


@converter("aten::triplet_margin_loss", capability=_capability("anchor", "positive", "negative"))
def triplet_margin_loss(ctx: ConversionCtx, args: Args) -> Tensor:
    """max(margin + d(anchor, positive) - d(anchor, negative), 0), d the pairwise distance (with swap, the negative
    distance is the smaller of d(anchor, negative) and d(positive, negative))."""
    a, pos, neg = (ctx.to_tensor(args[n]) for n in ("anchor", "positive", "negative"))
    p, eps = args.p, args.eps
    d_pos, d_neg = pairwise_distance(ctx, a, pos, p, eps, False), pairwise_distance(ctx, a, neg, p, eps, False)
    if args.swap:
        d_neg = binary(ctx, d_neg, pairwise_distance(ctx, pos, neg, p, eps, False), E.MIN)
    loss = clip(ctx, binary(ctx, binary(ctx, d_pos, args.margin, E.SUM), d_neg, E.SUB), 0.0, None)
    return _reduced(ctx, loss, args.reduction)


def _class_loss_ok(args: Args) -> str | None:
    x, target, weight = args.self, args.target, args.weight
    if not x.dtype.is_floating_point or (weight is not None and weight.dtype != x.dtype):
        return f"input of dtype {x.dtype} and weight of another (only one floating dtype)"
    if target.dtype.is_floating_point:
        return "class probabilities as target (only class indices are converted)"
    if args.get("label_smoothing", 0.0) != 0.0:
        return "label smoothing"
    if args.reduction not in _REDUCTIONS:
        return f"unknown reduction {args.reduction!r}"
    return None


def nll_loss(ctx: ConversionCtx, logp: Tensor, target: Tensor, weight, reduction: int, ignore_index: int) -> Tensor:
    """-weight[t] * logp[n, t] for each target t but ignore_index (0 there); mean: divided by the weights summed over
    the targets counted (NaN when none is), as ATen computes it. An index out of range stops the gather."""
    dim = 1 if logp.rank > 1 else 0
    counted = binary(ctx, target, ignore_index, E.NOT_EQUAL)
    safe = select(ctx, counted, target, ctx.to_tensor(0, target.dtype))
    index = unsqueeze(ctx, safe, dim)
    picked = squeeze_dims(ctx, ctx.network.add_gather(logp, index, dim, L.GatherMode.ELEMENT).get_output(), [dim])
    w = (ctx.network.add_gather(ctx.to_tensor(weight), safe, 0, L.GatherMode.DEFAULT).get_output()
         if weight is not None else ctx.to_tensor(1.0, logp.dtype))
    zero = ctx.to_tensor(0.0, logp.dtype)
    loss = select(ctx, counted, unary(ctx, binary(ctx, picked, w, E.PROD), U.NEG), zero)
    if reduction != 1:
        return _reduced(ctx, loss, reduction)
    total = reduce(ctx, select(ctx, counted, w, zero), R.SUM, None, False)
    return binary(ctx, reduce(ctx, loss, R.SUM, None, False), total, E.DIV)


@converter("aten::nll_loss_nd", "aten::nll_loss", "aten::nll_loss2d", capability=_class_loss_ok)
def nll_loss_converter(ctx: ConversionCtx, args: Args) -> Tensor:
    return nll_loss(ctx, ctx.to_tensor(args.self), ctx.to_tensor(args.target, torch.int64), args.weight,
                    args.reduction, args.ignore_index)


@converter("aten::cross_entropy_loss", capability=_class_loss_ok)
def cross_entropy_loss(ctx: ConversionCtx, args: Args) -> Tensor:
    """nll_loss of log_softmax over the class dim."""
    x = ctx.to_tensor(args.self)
    logp = ctx.network.add_softmax(x, 1 if x.rank > 1 else 0, log=True).get_output()
    return nll_loss(ctx, logp, ctx.to_tensor(args.target, torch.int64), args.weight, args.reduction, args.ignore_index)


@converter("aten::binary_cross_entropy_with_logits", capability=_capability("self", "target"))
def binary_cross_entropy_with_logits(ctx: ConversionCtx, args: Args) -> Tensor:
    """(1 - t) x - log_sigmoid(x) * ((pos_weight - 1) t + 1), times weight, as ATen computes it."""
    x, t = ctx.to_tensor(args.self), ctx.to_tensor(args.target)
    log_sig = ctx.network.add_activation(x, L.ActivationType.LOG_SIGMOID).get_output()
    if args.pos_weight is not None:
        log_weight = binary(ctx, binary(ctx, binary(ctx, args.pos_weight, 1.0, E.SUB), t, E.PROD), 1.0, E.SUM)
        log_sig = binary(ctx, log_sig, log_weight, E.PROD)
    loss = binary(ctx, binary(ctx, binary(ctx, 1.0, t, E.SUB), x, E.PROD), log_sig, E.SUB)
    if args.weight is not None:
        loss = binary(ctx, loss, args.weight, E.PROD)
    return _reduced(ctx, loss, args.reduction)


@converter("aten::cosine_embedding_loss", capability=_capability("input1", "input2", "target"))
def cosine_embedding_loss(ctx: ConversionCtx, args: Args) -> Tensor:
    """cos = sum(a b) / sqrt((sum(a a) + 1e-12) (sum(b b) + 1e-12)) over the last dim: 1 - cos where the target is 1,
    max(cos - margin, 0) where it is -1, else 0, as ATen computes it."""
    a, b, t = ctx.to_tensor(args.input1), ctx.to_tensor(args.input2), ctx.to_tensor(args.target)
    dim = t.rank

    def summed(x: Tensor, y: Tensor) -> Tensor:
        return reduce(ctx, binary(ctx, x, y, E.PROD), R.SUM, dim, False)

    mags = binary(ctx, binary(ctx, summed(a, a), 1e-12, E.SUM), binary(ctx, summed(b, b), 1e-12, E.SUM), E.PROD)
    cos = binary(ctx, summed(a, b), unary(ctx, mags, U.SQRT), E.DIV)
    zero = ctx.to_tensor(0.0, cos.dtype)
    positive = select(ctx, binary(ctx, t, 1.0, E.EQUAL), binary(ctx, 1.0, cos, E.SUB), zero)
    negative = select(ctx, binary(ctx, t, -1.0, E.EQUAL), clip(ctx, binary(ctx, cos, args.margin, E.SUB), 0.0, None),
                      zero)
    return _reduced(ctx, binary(ctx, positive, negative, E.SUM), args.reduction)


def _multi_margin_ok(args: Args) -> str | None:
    if args.p not in (1, 2):
        return f"p={args.p} (eager raises)"
    if len(args.self.shape) not in (1, 2):
        return f"a {len(args.self.shape)}-d input"
    if args.weight is not None and args.weight.dtype != args.self.dtype:
        return "a weight of another dtype"
    return _class_loss_ok(args)


@converter("aten::multi_margin_loss", capability=_multi_margin_ok)
def multi_margin_loss(ctx: ConversionCtx, args: Args) -> Tensor:
    """sum over classes d != y of max(margin - x[y] + x[d], 0)^p (times weight[y]) / C; a NaN term counts 0, as in
    ATen's loop (z > 0 is false for NaN)."""
    x = ctx.to_tensor(args.self)
    if x.rank == 1:
        x = reshape(ctx, x, [1, -1])
    target = reshape(ctx, ctx.to_tensor(args.target, torch.int64), [-1, 1])
    classes = x.shape[1]
    picked = ctx.network.add_gather(x, target, 1, L.GatherMode.ELEMENT).get_output()
    z = binary(ctx, binary(ctx, args.margin, picked, E.SUB), x, E.SUM)
    term = z if args.p == 1 else binary(ctx, z, z, E.PROD)
    if args.weight is not None:
        term = binary(ctx, term, ctx.network.add_gather(ctx.to_tensor(args.weight), target, 0,
                                                        L.GatherMode.DEFAULT).get_output(), E.PROD)
    other = binary(ctx, ctx.to_tensor(torch.arange(classes).reshape(1, -1)), target, E.NOT_EQUAL)
    counted = binary(ctx, other, binary(ctx, z, 0.0, E.GREATER), E.AND)
    loss = binary(ctx, reduce(ctx, select(ctx, counted, term, ctx.to_tensor(0.0, x.dtype)), R.SUM, 1, False),
                  float(classes), E.DIV)
    if args.self.shape and len(args.self.shape) == 1:
        loss = reshape(ctx, loss, [])
    return _reduced(ctx, loss, args.reduction)
