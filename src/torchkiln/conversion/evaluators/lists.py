"""Evaluators of list, dict and identity ops. They also run on lists of engine tensors.

Lists and dicts are mutable. The lowering pass `functionalize_list_appends` makes later readers of
an appended (or item-set) list read the append's output, so `append` and `_set_item.t` return a new
list and never change a value the resolver already holds, and it folds a new dict's leading item sets
into its construction; the resolver refuses lists and dicts that are still read after an in-place
change (see `resolve.read_after_mutation`).
"""
from __future__ import annotations

from typing import Any

import torch

from torchkiln.analysis.registry import evaluator
from torchkiln.analysis.resolve import Args, NotStatic
from torchkiln.ir.tensor import Tensor
from torchkiln.torchscript import TensorMeta


@evaluator("aten::__getitem__.t", "aten::__getitem__.str", "aten::__getitem__.Dict_str", "aten::__getitem__.Dict_int")
def getitem(args: Args) -> Any:
    return args[0][args[1]]


@evaluator("aten::len", "aten::len.t")
def length(args: Args) -> int:
    return len(args[0])


@evaluator("aten::list.t")
def list_copy(args: Args) -> list:
    return list(args[0])


@evaluator("aten::add.t")
def concatenate(args: Args) -> list:
    return list(args[0]) + list(args[1])


@evaluator("aten::append.t")
def append(args: Args) -> list:
    """A new list: the old one is still the value of every reader before the append."""
    return list(args[0]) + [args[1]]


@evaluator("aten::_set_item.t")
def set_item(args: Args) -> list:
    """A new list, as for `append`: lowering makes later readers read this output."""
    out = list(args[0])
    out[args[1]] = args[2]
    return out


@evaluator("aten::_set_item.str", "aten::_set_item.int")
def set_dict_item(args: Args) -> None:
    """A dict item set left by lowering has no reader after it (the resolver refuses the dict otherwise)."""
    args[0][args[1]] = args[2]


@evaluator("aten::slice.t", "aten::slice.str")
def slice_(args: Args) -> list | str:
    """`l[start:end:step]` (`x.shape[-2:]`)."""
    return args[0][args.start:args.end:args.step]


@evaluator("aten::copy.t", "aten::copy.Dict_str", "aten::copy.Dict_int")
def copy(args: Args) -> list | dict:
    return args[0].copy()


@evaluator("aten::dict")
def dict_(args: Args) -> dict:
    """`dict()`, `dict(other)` or `dict([(key, value), ...])`."""
    return dict(args[0]) if len(args) else {}


@evaluator("aten::extend.t")
def extend(args: Args) -> None:
    """An extend left by lowering has no reader after it (the resolver refuses the list otherwise)."""
    args[0].extend(args[1])


@evaluator("prim::DictConstruct")
def dict_construct(args: Args) -> dict:
    values = list(args)
    return dict(zip(values[::2], values[1::2]))


def _identical(a: Any, b: Any) -> bool:
    """TorchScript's `is`: identity for tensors, equality of type and value for None and scalars."""
    if a is None or b is None:
        return a is b
    if isinstance(a, (Tensor, TensorMeta, torch.Tensor)) or isinstance(b, (Tensor, TensorMeta, torch.Tensor)):
        return a is b
    if isinstance(a, (bool, int, float, str, torch.device)) and type(a) is type(b):
        return a == b
    raise NotStatic(f"identity of {type(a).__name__} and {type(b).__name__} is decided at run time")


@evaluator("aten::__is__")
def is_(args: Args) -> bool:
    return _identical(args[0], args[1])


@evaluator("aten::__isnot__")
def isnot(args: Args) -> bool:
    return not _identical(args[0], args[1])


@evaluator("aten::__contains__", "aten::__contains__.str", "aten::__contains__.int")
def contains(args: Args) -> bool:
    return args[1] in args[0]


@evaluator("aten::all.bool", "aten::all.int", "aten::all.float")
def all_(args: Args) -> bool:
    return all(args[0])


@evaluator("aten::any.bool", "aten::any.int", "aten::any.float", "aten::any.str")
def any_(args: Args) -> bool:
    return any(args[0])
