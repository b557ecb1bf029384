"""Evaluators of TorchScript's prim ops: constants and collections.

Collection evaluators also run on engine tensors (a list of network tensors is a valid list).
"""
from __future__ import annotations

from typing import Any

import torch

from torchkiln.analysis.registry import evaluator
from torchkiln.analysis.resolve import Args, NotStatic


def _unpack(args: Args, items: Any) -> Any:
    items = tuple(items)
    if len(items) != args.node.outputsSize():
        raise ValueError(f"cannot unpack {len(items)} values into {args.node.outputsSize()}")
    return items if len(items) != 1 else items[0]


@evaluator("prim::Constant")
def constant(args: Args) -> Any:
    return args.node.output().toIValue()


@evaluator("prim::ListConstruct")
def list_construct(args: Args) -> list:
    return list(args)


@evaluator("prim::TupleConstruct")
def tuple_construct(args: Args) -> tuple:
    return tuple(args)


@evaluator("prim::ListUnpack", "prim::TupleUnpack")
def unpack(args: Args) -> Any:
    return _unpack(args, args[0])


@evaluator("prim::TupleIndex")
def tuple_index(args: Args) -> Any:
    return args[0][args[1]]


@evaluator("prim::RaiseException")
def raise_exception(args: Args) -> None:
    """Known to the registry so that guards are understood; raising is left to run time."""
    raise NotStatic("prim::RaiseException raises at run time")


class _Uninitialized:
    """prim::Uninitialized: the placeholder TorchScript puts on paths that raise; never read."""

    def __repr__(self) -> str:
        return "<uninitialized>"


UNINITIALIZED = _Uninitialized()


@evaluator("prim::Uninitialized")
def uninitialized(args: Args) -> _Uninitialized:
    return UNINITIALIZED


@evaluator("prim::unchecked_cast")
def unchecked_cast(args: Args) -> Any:
    """A type refinement (Optional[T] -> T): the value itself."""
    return args[0]


_PYTHON_TYPES = {"IntType": int, "FloatType": float, "BoolType": bool, "StringType": str, "NoneType": type(None),
                 "DeviceObjType": torch.device}


def _is_instance(value: Any, jit_type: Any) -> bool:
    """Whether a build-time value is of a TorchScript type; NotStatic where the value does not say."""
    kind = jit_type.kind()
    if kind in _PYTHON_TYPES:
        wanted = _PYTHON_TYPES[kind]
        return isinstance(value, wanted) and (wanted is not int or not isinstance(value, bool))
    if kind == "ListType" and isinstance(value, list) and value:
        return all(_is_instance(v, jit_type.getElementType()) for v in value)
    if kind == "TupleType" and isinstance(value, tuple):
        elements = jit_type.elements()
        return len(elements) == len(value) and all(_is_instance(v, t) for v, t in zip(value, elements))
    if kind in ("ListType", "TupleType") and not isinstance(value, (list, tuple)):
        return False
    raise NotStatic(f"isinstance of a {type(value).__name__} and {jit_type} is left to run time")


@evaluator("prim::isinstance")
def isinstance_(args: Args) -> bool:
    """`isinstance(self.size, int)` on a Union or Optional value known at build time."""
    return any(_is_instance(args[0], t) for t in args.node.tys("types"))
