"""Replace Python Ops: a custom torch.autograd.Function call (prim::PythonOp) becomes the inference-time
equivalent registered for its class with `torchkiln.register_python_op`, or else its own forward, scripted without
its autograd bookkeeping (lowering/function_forward.py says when that computes what `apply` does).

A PythonOp runs Python: it cannot run in an engine, and a module that holds one cannot be saved with
torch.jit.save. The replacement is a TorchScript function taking the arguments `apply` takes, in order; its graph
is inlined where the call was, so the rest of lowering and the converters see plain ops. A call left in place
carries why in its `NOT_INLINED_ATTR` attribute, for the compile's warning.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from torchkiln.lowering.function_forward import NotInlinable, script_forward
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph, Node, source_location

logger = logging.getLogger("torchkiln.lowering")

# class name (qualified "package.module.Class", or the bare "Class") -> the replacement
PYTHON_OPS: dict[str, torch.jit.ScriptFunction] = {}
NOT_INLINED_ATTR = "torchkiln_not_inlined"  # a PythonOp left in place: why its forward could not replace it


def python_op_names(node: Node) -> tuple[str, ...]:
    """The names a prim::PythonOp's Function class is registered under: qualified first, then bare."""
    owner = getattr(node.pyobj(), "__self__", None)
    bare = node.pyname()
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}", bare
    return (bare,)


def register_python_op(name: str | type, fn: Callable[..., Any]) -> None:
    """Replace every call of the custom autograd Function `name` (its class, its qualified name
    'package.module.Class', or its bare class name) by `fn`: a TorchScript-able function (or a
    torch.jit.ScriptFunction) taking the arguments the Function's `apply` takes, in order."""
    if isinstance(name, type):
        name = f"{name.__module__}.{name.__qualname__}"
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a torch.autograd.Function class or its name, got {name!r}")
    if isinstance(fn, torch.jit.ScriptFunction):
        scripted = fn
    else:
        try:
            scripted = torch.jit.script(fn)
        except Exception as e:  # TorchScript's compiler raises many kinds of errors
            raise ValueError(f"fn: the replacement for {name} must be TorchScript-able; scripting "
                             f"{getattr(fn, '__name__', fn)!r} failed: {str(e).strip().splitlines()[0]}") from e
    PYTHON_OPS[name] = scripted


def _replacement(node: Node) -> tuple[str, torch.jit.ScriptFunction] | None:
    return next(((n, PYTHON_OPS[n]) for n in python_op_names(node) if n in PYTHON_OPS), None)


def _arguments(graph: Graph, node: Node) -> list[torch._C.Value]:
    """The call's arguments in order: tensors (and traced scalars) are inputs, 'c' arguments are constants;
    NotInlinable (no constant left behind) where one is a Python object TorchScript has no constant of (a dict of
    settings, say)."""
    inputs, scalars = iter(node.inputs()), iter(node.scalar_args())
    arguments: list[torch._C.Value] = []
    for k, kind in enumerate(node.cconv()):
        if kind == "d":
            arguments.append(next(inputs))
            continue
        scalar = next(scalars)
        try:
            arguments.append(graph.insertConstant(scalar))
        except (TypeError, RuntimeError):  # pybind11: a type it cannot convert; TorchScript: one it cannot hold
            _drop_unused_constants(arguments)
            raise NotInlinable(f"its argument {k} is a Python {type(scalar).__name__}, which TorchScript cannot hold "
                               f"as a constant") from None
    return arguments


def _drop_unused_constants(arguments: list[torch._C.Value]) -> None:
    """Destroy the constants made for a call's scalars that nothing uses."""
    for value in arguments:
        if value.node().kind() == "prim::Constant" and not value.uses():
            value.node().destroy()


def _shape_of_return(types: list[torch._C.JitType]) -> tuple[str, int]:
    """('tuple', n) for a tuple or n > 1 values; ('one', kind) else."""
    if len(types) > 1:
        return "tuple", len(types)
    t = types[0]
    return ("tuple", len(t.elements())) if isinstance(t, torch._C.TupleType) else ("one", t.kind())


def _own_forward(node: Node, arguments: list[torch._C.Value]) -> torch.jit.ScriptFunction:
    """The PythonOp's Function's forward scripted for this call; NotInlinable saying why not."""
    function = getattr(node.pyobj(), "__self__", None)
    if not (isinstance(function, type) and issubclass(function, torch.autograd.Function)):
        raise NotInlinable("it is not a torch.autograd.Function's apply")
    fn = script_forward(function, arguments)
    for value, argument in zip(arguments, fn.schema.arguments):
        if not value.type().isSubtypeOf(argument.type):
            raise NotInlinable(f"its forward takes {argument.name}: {argument.type}; the call passes {value.type()}")
    returned = fn.graph.return_node().inputsAt(0).type()
    if _shape_of_return([returned]) != _shape_of_return([o.type() for o in node.outputs()]):
        raise NotInlinable(f"its forward returns {returned}; the call returns "
                           f"{', '.join(str(o.type()) for o in node.outputs())}")
    return fn


def _inline(graph: Graph, node: Node, fn: torch.jit.ScriptFunction, arguments: list[torch._C.Value]
            ) -> list[torch._C.Value]:
    with graph.insert_point_guard(node):
        outputs = graph.insertGraph(fn.inlined_graph, arguments)
        if len(outputs) == 1 and node.outputsSize() > 1:
            elements = outputs[0].type().elements()
            unpack = graph.create("prim::TupleUnpack", [outputs[0]], len(elements))
            for out, t in zip(unpack.outputs(), elements):
                out.setType(t)
            graph.insertNode(unpack)
            outputs = list(unpack.outputs())
    return outputs


def _not_inlined(node: Node, name: str, why: NotInlinable) -> None:
    """Leave the call in place, saying why (`NOT_INLINED_ATTR`, for the compile's warning)."""
    node.s_(NOT_INLINED_ATTR, str(why))
    logger.debug("custom autograd Function %s is not inlined: %s", name, why)


@lowering_pass(replaces=("prim::PythonOp",))
def replace_python_ops(graph: Graph, ctx: LoweringContext) -> bool:
    """Inline the registered replacement, or else the scripted forward, of each custom autograd Function call."""
    changed = False
    for node in [n for n in all_nodes(graph.block()) if n.kind() == "prim::PythonOp"]:
        found = _replacement(node)
        name = found[0] if found else python_op_names(node)[0]
        try:
            with graph.insert_point_guard(node):
                arguments = _arguments(graph, node)
        except NotInlinable as e:
            if found:
                raise ValueError(f"the replacement registered for {name} cannot take the arguments its apply was "
                                 f"called with ({source_location(node)}): {e}") from None
            _not_inlined(node, name, e)
            continue
        if found:
            fn = found[1]
        else:
            try:
                fn = _own_forward(node, arguments)
            except NotInlinable as e:
                _drop_unused_constants(arguments)
                _not_inlined(node, name, e)
                continue
        try:
            outputs = _inline(graph, node, fn, arguments)
        except RuntimeError as e:
            raise ValueError(f"the replacement registered for {name} does not take the arguments its apply "
                             f"was called with ({source_location(node)}): {str(e).strip().splitlines()[0]}") from e
        if len(outputs) != node.outputsSize():
            raise ValueError(f"the replacement registered for {name} returns {len(outputs)} values; its apply "
                             f"returns {node.outputsSize()}")
        for old, new in zip(node.outputs(), outputs):
            old.replaceAllUsesWith(new)
        node.destroy()
        logger.debug("replaced custom autograd Function %s by %s", name,
                     "its registered equivalent" if found else "its scripted forward")
        changed = True
    return changed
