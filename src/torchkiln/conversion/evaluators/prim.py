"""Evaluators of TorchScript's prim ops: constants and collections.

Collection evaluators also run on engine tensors (a list of network tensors is a valid list).
"""
from __future__ import annotations

from typing import Any

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
