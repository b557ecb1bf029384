"""Give a compiled method back the arguments lowering folded as constants, each guarded.

The compiled module keeps the method's signature, defaults included (`compiled(x)` works as `model(x)` did),
and a call with another value than the one compiled raises EngineInputError naming the argument, instead of
silently computing with the compiled value. The guard runs in TorchScript, before any engine.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from torchkiln.torchscript import Graph, StaticArgument, Value


def _remedy(a: StaticArgument) -> str:
    if a.value is None and isinstance(a.type, torch._C.OptionalType) \
            and isinstance(a.type.getElementType(), torch._C.TensorType):
        return f"compile with an Input for {a.name!r} (inputs={{..., {a.name!r}: torchkiln.Input(...)}}) to pass one"
    return f"compile with inputs={{..., {a.name!r}: <value>}} for another value"


def _raise_if(graph: Graph, condition: Value, message: str) -> None:
    """`if condition: raise EngineInputError(message)`, at the graph's insert point."""
    node = graph.create("prim::If", [condition], 0)
    graph.insertNode(node)
    then, _ = node.addBlock(), node.addBlock()
    with graph.insert_point_guard(then):
        graph.insertNode(graph.create("prim::RaiseException", [graph.insertConstant(f"EngineInputError: {message}"),
                                                               graph.insertConstant("builtins.RuntimeError")], 0))


def _guard(graph: Graph, value: Value, a: StaticArgument, method: str) -> None:
    """`if value != a.value: raise EngineInputError(...)`, at the graph's insert point."""
    if a.value is None:
        differs = graph.insert("aten::__isnot__", [value, graph.insertConstant(None)])
    else:
        differs = graph.insert("aten::ne", [value, graph.insertConstant(a.value)])
    why = "its default" if a.is_default else "the value inputs gave"
    _raise_if(graph, differs, f"{method}() argument {a.name!r} must be {a.value!r}: the module was compiled with it "
                              f"fixed to that value ({why}); {_remedy(a)}")


def _require_tensor(graph: Graph, value: Value, method: str) -> None:
    """An Optional[Tensor] argument compiled with an Input: typed Optional again, None refused."""
    uses = [(u.user, u.offset) for u in value.uses()]
    value.setType(torch._C.OptionalType(torch._C.TensorType.get()))
    name = value.debugName().split(".")[0]
    _raise_if(graph, graph.insert("aten::__is__", [value, graph.insertConstant(None)]),
              f"{method}() argument {name!r} must be a tensor: the module was compiled with an Input for it")
    cast = graph.create("prim::unchecked_cast", [value])
    cast.output().setType(torch._C.TensorType.get())
    graph.insertNode(cast)
    for user, offset in uses:
        user.replaceInput(offset, cast.output())


def restore_static_arguments(graph: Graph, arguments: Sequence[StaticArgument], optional_tensors: Sequence[int] = (),
                             method: str = "forward") -> None:
    """Add each static argument back to the graph's inputs at its place, guarded against any other value; the
    `optional_tensors` (argument indices, self not counted) are typed Optional[Tensor] again, None refused."""
    if not arguments and not optional_tensors:
        return
    kept = len(list(graph.inputs()))  # self and the tensor arguments, in order
    added = [graph.addInput(a.name) for a in arguments]
    for value, a in zip(added, arguments):
        value.setType(a.type)
    static_at = {a.index + 1: kept + k for k, a in enumerate(arguments)}
    order, next_kept = [], 0
    for position in range(kept + len(arguments)):
        if position in static_at:
            order.append(static_at[position])
        else:
            order.append(next_kept)
            next_kept += 1
    graph.permuteInputs(order)
    with graph.insert_point_guard(next(iter(graph.nodes()), graph.return_node())):
        for value, a in zip(added, arguments):
            _guard(graph, value, a, method)
        params = list(graph.inputs())[1:]
        for index in optional_tensors:
            _require_tensor(graph, params[index], method)
    graph.lint()
