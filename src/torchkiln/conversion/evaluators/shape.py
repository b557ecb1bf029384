"""Evaluators of a tensor's metadata: size, dim, numel, dtype. They need only its shape and dtype."""
from __future__ import annotations

from torchkiln.conversion.impl.common import normalize_dim
from torchkiln.conversion.registry import evaluator
from torchkiln.conversion.resolve import Args, NotStatic


def static_shape(x) -> tuple[int, ...]:
    shape = tuple(x.shape)
    if any(d < 0 for d in shape):
        raise NotStatic(f"shape {shape} has dynamic dims")
    return shape


@evaluator("aten::size")
def size(args: Args) -> list[int]:
    return list(static_shape(args[0]))


@evaluator("aten::size.int")
def size_int(args: Args) -> int:
    shape = tuple(args[0].shape)
    d = shape[normalize_dim(args[1], len(shape))]
    if d < 0:
        raise NotStatic(f"dim {args[1]} of shape {shape} is dynamic")
    return d


@evaluator("aten::len.Tensor")
def len_tensor(args: Args) -> int:
    shape = tuple(args[0].shape)
    if not shape or shape[0] < 0:
        raise NotStatic(f"len() of a tensor of shape {shape}")
    return shape[0]


@evaluator("aten::dim")
def dim(args: Args) -> int:
    return len(args[0].shape)
