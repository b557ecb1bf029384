"""The method's input signature: tensors, and tuples, lists and dicts of them (nested).

`inputs` mirrors the method's arguments. These helpers check it against the graph's argument types and give
engines the tensors of list arguments (shape analysis builds example inputs of the same structure:
analysis/shape_analysis.py). Engines themselves only ever take and return flat tensors: the nodes that unpack
collection arguments and pack returned collections stay in TorchScript around them.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from torchkiln.analysis.registry import find_converter
from torchkiln.settings import Input
from torchkiln.torchscript import Graph, Node, Value

logger = logging.getLogger("torchkiln.partitioning")


def _describe(spec: Any) -> str:
    if isinstance(spec, Input):
        return repr(spec)
    return f"a {type(spec).__name__} of {len(spec)}"


def _check(t: torch._C.JitType, spec: Any, path: str, where: str) -> None:
    def fail(expected: str) -> None:
        raise ValueError(f"{path}: {where} expects {expected} here, but inputs gives {_describe(spec)}")

    if isinstance(t, torch._C.TensorType):
        if not isinstance(spec, Input):
            fail("a Tensor (give a torchkiln.Input)")
    elif isinstance(t, torch._C.TupleType):
        elements = t.elements()
        if not isinstance(spec, tuple) or len(spec) != len(elements):
            fail(f"a tuple of {len(elements)} ({t})")
        for i, (et, es) in enumerate(zip(elements, spec)):
            _check(et, es, f"{path}[{i}]", where)
    elif isinstance(t, torch._C.ListType):
        if not isinstance(spec, list):
            fail(f"a list ({t})")
        for i, es in enumerate(spec):
            _check(t.getElementType(), es, f"{path}[{i}]", where)
    elif isinstance(t, torch._C.DictType):
        if not isinstance(spec, dict):
            fail(f"a dict ({t})")
        key_kind = {torch._C.StringType: str, torch._C.IntType: int}.get(type(t.getKeyType()))
        for key, es in spec.items():
            if key_kind is None or not isinstance(key, key_kind) or isinstance(key, bool):
                raise ValueError(f"{path}: {where} takes {t}; the key {key!r} does not fit it")
            _check(t.getValueType(), es, f"{path}[{key!r}]", where)
    else:
        raise ValueError(f"{path}: {where} has type {t} here; torchkiln compiles methods whose arguments are "
                         f"tensors, or tuples, lists and dicts of tensors")


def check_signature(graph: Graph, signature: tuple[Any, ...], method: str) -> None:
    """A ValueError naming the argument where `inputs` does not match the method's argument types."""
    params = list(graph.inputs())[1:]
    if len(params) != len(signature):
        raise ValueError(f"inputs: {method}() takes {len(params)} inputs but {len(signature)} were given")
    for i, (param, spec) in enumerate(zip(params, signature)):
        _check(param.type(), spec, f"inputs[{i}]", f"{method}() argument {param.debugName().split('.')[0]!r}")


def _constant(v: Value) -> Any:
    return v.toIValue() if v.node().kind() == "prim::Constant" else None


def _reads_only(node: Node, offset: int) -> bool:
    """Whether `node` only reads its input at `offset` (no alias annotation: not written, kept or returned)."""
    try:
        schema = torch._C.parse_schema(node.schema())
    except RuntimeError:
        return False
    args = schema.arguments
    return offset < len(args) and args[offset].alias_info is None


def _unpack_list(graph: Graph, value: Value, length: int) -> bool:
    uses = [u for u in value.uses() if find_converter(u.user) is not None and _reads_only(u.user, u.offset)]
    if not uses:
        return False
    producer = value.node()
    unpack = graph.create("prim::ListUnpack", [value], length)
    for out in unpack.outputs():
        out.setType(torch._C.TensorType.get())
    pack = graph.create("prim::ListConstruct", list(unpack.outputs()))
    pack.output().setType(torch._C.ListType.ofTensors())
    if producer.kind() == "prim::Param":
        unpack.insertBefore(next(iter(graph.nodes()), graph.return_node()))
    else:
        unpack.insertAfter(producer)
    pack.insertAfter(unpack)
    for use in uses:
        use.user.replaceInput(use.offset, pack.output())
    logger.debug("list argument %%%s unpacked into %d tensors for %s", value.debugName(), length,
                 ", ".join(sorted({u.user.kind() for u in uses})))
    return True


def _unpack_lists_in(graph: Graph, value: Value, spec: Any) -> bool:
    if isinstance(spec, list):
        return _unpack_list(graph, value, len(spec))
    if isinstance(spec, Input):
        return False
    changed = False
    for use in list(value.uses()):
        user = use.user
        if isinstance(spec, tuple) and user.kind() == "prim::TupleUnpack":
            for out, part in zip(user.outputs(), spec):
                changed |= _unpack_lists_in(graph, out, part)
            continue
        index = _constant(user.inputsAt(1)) if user.inputsSize() == 2 and use.offset == 0 else None
        if user.kind() in ("prim::TupleIndex", "aten::__getitem__") and index is not None:
            try:
                part = spec[index]
            except (IndexError, KeyError, TypeError):
                continue
            changed |= _unpack_lists_in(graph, user.output(), part)
    return changed


def unpack_list_inputs(graph: Graph, signature: tuple[Any, ...]) -> bool:
    """Where a list argument of known length feeds a convertible op (e.g. `torch.cat(xs)`), unpack it.

    The op then reads `prim::ListConstruct(ListUnpack(xs))`, which an engine can take as separate tensors.
    Only reads are redirected; ops that may write or keep the list still see the caller's list.
    """
    changed = False
    for param, spec in zip(list(graph.inputs())[1:], signature):
        changed |= _unpack_lists_in(graph, param, spec)
    return changed
