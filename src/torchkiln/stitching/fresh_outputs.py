"""A compiled module's outputs never share memory with its constants.

Lowering freezes the module, so a buffer it returns, or a value computed from its weights alone, becomes a
constant of the graph: one tensor, which every call would return. Eager computes such an output anew each call
(or returns a buffer of the module, which the compiled module no longer has), so a caller writing into an output
must not change what the next call returns. Each constant that an output may be, view or hold (through views,
tuples, lists, dicts and control flow; alias analysis decides) is copied once per call, at the top of the graph,
and its uses read the copy (`torchkiln::fresh_copy`, which TorchScript does not fold back into a constant as it
would aten::clone). Constants that share memory (a buffer and a view of it, both returned) are copied as one
span and taken as views of it again, so outputs that alias one another still do, as in eager. An output that is
an input stays that input, as in eager; engine outputs are new tensors already (the runners copy what could
alias a weight).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from torchkiln.analysis.resolve import alias_sources
from torchkiln.torchscript import Graph, Node, Value, holds_tensor_type, value_key


def constants_reaching_outputs(graph: Graph) -> list[Node]:
    """The prim::Constant nodes holding tensors that a graph output may be, view or hold."""
    found: dict[int, Node] = {}
    seen: set[int] = set()
    stack = list(graph.return_node().inputs())
    while stack:
        v = stack.pop()
        if value_key(v) in seen:
            continue
        seen.add(value_key(v))
        if v.node().kind() == "prim::Constant":
            if holds_tensor_type(v.type()):
                found[value_key(v)] = v.node()
            continue
        stack.extend(alias_sources(v))
    return list(found.values())


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _view_key(t: torch.Tensor) -> tuple:
    return t.device, t.untyped_storage().data_ptr(), t.dtype, t.storage_offset(), tuple(t.shape), t.stride()


def _fresh_tensors(graph: Graph, tensors: list[torch.Tensor]) -> dict[tuple, Value]:
    """Per distinct view of `tensors`: a value copied per call. Views of one storage (of one dtype, each with
    elements) are views of one copied span of it."""
    views = {_view_key(t): t for t in tensors}
    groups: dict[tuple, list[torch.Tensor]] = {}
    for key, t in views.items():
        groups.setdefault(key[:3] if t.numel() else key, []).append(t)
    fresh: dict[tuple, Value] = {}
    for members in groups.values():
        if len(members) == 1:
            fresh[_view_key(members[0])] = graph.insert("torchkiln::fresh_copy", [graph.insertConstant(members[0])])
            continue
        start = min(t.storage_offset() for t in members)
        end = max(t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1 for t in members)
        span = torch.empty(0, dtype=members[0].dtype, device=members[0].device).set_(
            members[0].untyped_storage(), start, (end - start,), (1,))
        copy = graph.insert("torchkiln::fresh_copy", [graph.insertConstant(span)])
        for t in members:
            geometry = [list(t.shape), list(t.stride()), t.storage_offset() - start]
            fresh[_view_key(t)] = graph.insert("aten::as_strided", [copy] + [graph.insertConstant(g) for g in geometry])
    return fresh


def _rebuild(graph: Graph, value: Any, jit_type: torch._C.JitType, fresh: dict[tuple, Value]) -> Value:
    """Nodes at the insert point that build constant `value` with its tensors taken from `fresh`."""
    if isinstance(jit_type, torch._C.OptionalType) and value is not None:
        jit_type = jit_type.getElementType()
    if isinstance(value, torch.Tensor):
        return fresh[_view_key(value)]
    if value is None or not holds_tensor_type(jit_type):
        return graph.insertConstant(value)
    if isinstance(jit_type, torch._C.TupleType):
        node = graph.create("prim::TupleConstruct", [_rebuild(graph, v, t, fresh)
                                                     for v, t in zip(value, jit_type.elements())])
    elif isinstance(jit_type, torch._C.ListType):
        node = graph.create("prim::ListConstruct", [_rebuild(graph, v, jit_type.getElementType(), fresh)
                                                    for v in value])
    elif isinstance(jit_type, torch._C.DictType):
        node = graph.create("prim::DictConstruct", [x for k, v in value.items() for x in (
            _rebuild(graph, k, jit_type.getKeyType(), fresh), _rebuild(graph, v, jit_type.getValueType(), fresh))])
    else:
        raise TypeError(f"a constant of type {jit_type} holding tensors cannot be rebuilt")
    node.output().setType(jit_type)
    graph.insertNode(node)
    return node.output()


def copy_constant_outputs(graph: Graph) -> int:
    """Make each constant an output may alias a new copy per call (see the module docstring); return how many."""
    constants = constants_reaching_outputs(graph)
    if not constants:
        return 0
    values = [n.output().toIValue() for n in constants]
    with graph.insert_point_guard(next(iter(graph.nodes()))):
        fresh = _fresh_tensors(graph, [t for v in values for t in _tensors(v)])
        copies = [_rebuild(graph, v, n.output().type(), fresh) for n, v in zip(constants, values)]
    for node, copy in zip(constants, copies):
        node.output().replaceAllUsesWith(copy)
        node.destroy()
    return len(constants)
