"""The Python face of a compiled module: engine errors come out as torchkiln's documented types.

TorchScript's interpreter turns any exception raised inside an op into a RuntimeError whose text holds the
original type's name; no Python class survives it. A module compiled by torchkiln (or loaded with
`torchkiln.load`) is a ScriptModule of a subclass whose `__call__` turns such a RuntimeError back into the
torchkiln error the engine raised (EngineInputError, EngineIndexError, EngineFormatError). torch.jit.save
writes it like any ScriptModule; torch.jit.load gives TorchScript's own class, whose errors stay RuntimeErrors.

Where a module's forward is one engine call and nothing else (the common case: the whole model became one
engine), that class runs the engine straight from Python on plain tensors: the same op implementation, without
the TorchScript interpreter and the dispatcher around it (tens of microseconds a call that small models feel).
Anything else (keyword arguments, hooks, meta or fake tensors, other graphs) takes the interpreter's path.
"""
from __future__ import annotations

import dataclasses
import os
from typing import IO, Any

import torch
from torch.autograd import profiler as torch_profiler
from torch.nn.modules import module as nn_module

from torchkiln.runtime.execute_op import HOSTED, execute_engine, plain_tensors, reraise_engine_error


_EXECUTE_OP = torch.ops.torchkiln.execute_engine.default  # (looked up once: `EngineCall.run` is per inference)


@dataclasses.dataclass(frozen=True)
class EngineCall:
    """A forward that is one engine call: the engine's attribute, which arguments it takes (by position), the
    signature the module expects, and the result: one engine output (an index) or a tuple of them."""

    attr: str
    num_args: int
    args: tuple[int, ...]
    signature: str
    result: int | tuple[int, ...]

    def run(self, blob: torch.Tensor, args: tuple[torch.Tensor, ...]) -> Any:
        inputs = [args[i] for i in self.args]
        # through the dispatcher where the C++ runtime library's kernel runs fitting calls (HOSTED), and so that a
        # profile shows the op as it is
        if HOSTED or torch_profiler._is_profiler_enabled:
            outputs = _EXECUTE_OP(inputs, blob, self.signature)
        else:
            outputs = execute_engine(inputs, blob, self.signature)
        return outputs[self.result] if isinstance(self.result, int) else tuple(outputs[i] for i in self.result)


def one_engine_call(graph: torch._C.Graph) -> EngineCall | None:
    """The EngineCall a forward graph is, or None if it does anything else."""
    params = list(graph.inputs())[1:]
    if any(p.type().kind() != "TensorType" for p in params):
        return None
    nodes = {n.kind(): n for n in graph.nodes()}
    expected = {"prim::GetAttr", "prim::ListConstruct", "prim::Constant", "torchkiln::execute_engine",
                "prim::ListUnpack"}
    if len(list(graph.nodes())) != len(nodes) or not expected <= set(nodes) <= expected | {"prim::TupleConstruct"}:
        return None
    get, pack, call, unpack = (nodes[k] for k in ("prim::GetAttr", "prim::ListConstruct", "torchkiln::execute_engine",
                                                  "prim::ListUnpack"))
    engine_list, blob, signature = call.inputs()
    if (engine_list.node() != pack or blob.node() != get or signature.node() != nodes["prim::Constant"]
            or next(unpack.inputs()) != call.output() or any(v not in params for v in pack.inputs())):
        return None
    unpacked = list(unpack.outputs())
    result = next(graph.outputs())
    if result in unpacked:
        where: int | tuple[int, ...] = unpacked.index(result)
    elif "prim::TupleConstruct" in nodes and result.node() == nodes["prim::TupleConstruct"] \
            and all(v in unpacked for v in result.node().inputs()):
        where = tuple(unpacked.index(v) for v in result.node().inputs())
    else:
        return None
    return EngineCall(get.s("name"), len(params), tuple(params.index(v) for v in pack.inputs()),
                      signature.node().s("value"), where)


class RaisesEngineErrors:
    """Mixin for a ScriptModule: an engine's error raised inside it reaches the caller as its torchkiln type."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        call = self.__dict__.get("_torchkiln_engine_call", False)
        if call is False:
            call = self._engine_call()
        if call is not None and not kwargs and len(args) == call.num_args and not (
                self._forward_hooks or self._forward_pre_hooks or nn_module._global_forward_hooks
                or nn_module._global_forward_pre_hooks):
            blob = self._c.getattr(call.attr)
            if plain_tensors([blob, *args]):
                return call.run(blob, args)
        try:
            return super().__call__(*args, **kwargs)
        except (RuntimeError, torch.jit.Error) as e:  # jit.Error: the graph's own prim::RaiseException
            reraise_engine_error(e)
            raise

    def _engine_call(self) -> EngineCall | None:
        """The forward as one engine call, or None; read from the graph once."""
        if "_torchkiln_engine_call" not in self.__dict__:
            self.__dict__["_torchkiln_engine_call"] = one_engine_call(self.graph) if self._c._has_method(
                "forward") else None
        return self.__dict__["_torchkiln_engine_call"]



class CompiledModule(RaisesEngineErrors, torch.jit.RecursiveScriptModule):
    """A RecursiveScriptModule that raises engine errors as torchkiln's types (and so do its copies)."""

    def __copy__(self) -> torch.jit.ScriptModule:
        return self._keep_record(as_compiled_module(super().__copy__()))

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.jit.ScriptModule:
        return self._keep_record(as_compiled_module(super().__deepcopy__(memo)))

    def _keep_record(self, copy: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
        """The copy keeps what compile recorded for refit_module_weights (in memory, never saved)."""
        if hasattr(self, "_torchkiln_compile"):
            copy._torchkiln_compile = self._torchkiln_compile
        return copy


def as_compiled_module(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """`module` itself, now of a class that raises engine errors as torchkiln's types, and with the concrete type of
    its TorchScript type as it is now (engines added): what scripting a module that holds it reads, where it would
    otherwise infer a type from the Python class."""
    if type(module) is torch.jit.RecursiveScriptModule:
        module.__class__ = CompiledModule
    module._concrete_type = torch._C.ConcreteModuleType.from_jit_type(module._c._type())
    return module


def load(f: str | os.PathLike | IO[bytes], map_location: Any = None) -> torch.jit.ScriptModule:
    """torch.jit.load, returning a module whose engine errors are torchkiln's types (as `compile` returns)."""
    return as_compiled_module(torch.jit.load(f, map_location=map_location))
