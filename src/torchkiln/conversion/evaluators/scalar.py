"""Evaluators of int/float/bool arithmetic and conversions (TorchScript's scalar ops)."""
from __future__ import annotations

import operator

import torch

from torchkiln.conversion.registry import evaluator
from torchkiln.conversion.resolve import Args, NotStatic


def _number(x):
    if isinstance(x, torch.Tensor):
        if x.numel() != 1:
            raise NotStatic("a tensor of more than one element is not a number")
        return x.item()
    if not isinstance(x, (bool, int, float)):
        raise NotStatic(f"{type(x).__name__} is not known before run time")
    return x


@evaluator("aten::Int", "aten::Int.Tensor")
def to_int(args: Args) -> int:
    return int(_number(args[0]))


@evaluator("aten::Float", "aten::Float.Tensor")
def to_float(args: Args) -> float:
    return float(_number(args[0]))


@evaluator("aten::Bool", "aten::Bool.Tensor")
def to_bool(args: Args) -> bool:
    return bool(_number(args[0]))


def _binary(fn):
    return lambda args: fn(args[0], args[1])


for _name, _fn in {
    "aten::add": operator.add, "aten::sub": operator.sub, "aten::mul": operator.mul,
    "aten::div": operator.truediv, "aten::floordiv": operator.floordiv,
    "aten::remainder": operator.mod,
    "aten::pow": operator.pow,
    "aten::eq": operator.eq, "aten::ne": operator.ne, "aten::lt": operator.lt, "aten::gt": operator.gt,
    "aten::le": operator.le, "aten::ge": operator.ge,
}.items():
    evaluator(_name)(_binary(_fn))


@evaluator("aten::len")
def length(args: Args) -> int:
    return len(args[0])


# Not the bare "aten::neg": that key is the tensor overload, which has a converter.
@evaluator("aten::neg.int", "aten::neg.float", "aten::neg.Scalar")
def neg(args: Args):
    return -args[0]
