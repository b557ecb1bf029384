"""The key of a whole compiled module: a SHA-256 of everything compile makes it from, taken before scripting or
tracing it.

That is the module: for a ScriptModule, the code of its methods with every call inlined and every attribute of
every submodule; for a Python module, each submodule's class (its methods' code objects, its class attributes)
and every attribute of each submodule (what Python code could read: training flags, plain values, config objects
followed through their attributes, functions by their code), with the content of every parameter, buffer and
other tensor. Then torch's global flags that change what a trace records, the compile settings (input specs
and backend included), the device and the software (`key.software`: library versions, torchkiln's source). The
Python source itself, and the files of every library the compile loaded, are checked on reuse (`sources`).
Anything the description cannot tell apart exactly raises `Unkeyable`: the module is compiled, and its engine
blocks still use the engine cache.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import logging
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules import module as nn_module

from torchkiln.cache.key import settings_in_key, software
from torchkiln.cache.weights import Unkeyable, tensor_digests

FORMAT = "torchkiln module cache 1"
MAX_DEPTH = 12  # attribute chains followed from a submodule (a config object's nested configs are a few)
MAX_VALUES = 1_000_000  # values described; more is a module whose attributes are not a model's
# Module attributes that are not what its code reads: hooks are checked (a module with forward hooks is not keyed),
# the state dict's own hooks do not change what compile makes.
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
          "_forward_hooks_always_called", "_backward_hooks", "_backward_pre_hooks")
_NOT_READ = frozenset(_HOOKS) | {"_state_dict_hooks", "_state_dict_pre_hooks", "_load_state_dict_pre_hooks",
                                 "_load_state_dict_post_hooks", "_is_full_backward_hook", "_compiled_call_impl"}
# What scripting a module adds to its class and to it, empty (accessing a class's __annotations__ makes one).
_MADE_BY_SCRIPTING = frozenset({"__annotations__", "__overloads__"})
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.memory_format,
          torch.layout, torch.Size, range, slice, type(Ellipsis))
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python, not a C type
_STATELESS_BASES = (object, types.SimpleNamespace)  # C types whose instances hold no state but their __dict__
_ANNOTATIONS = (types.UnionType, types.GenericAlias)  # and typing's: described by what they print


class _Describer:
    """Writes a module and what hangs off it as text that names no memory address."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.lines: list[str] = []
        self.paths = {id(m): path for path, m in module.named_modules(remove_duplicate=True)}
        self.tensors: list[torch.Tensor] = []  # hashed together at the end (on several threads)
        self.tensor_index: dict[int, int] = {}
        self.on_path: set[int] = set()
        self.count = 0
        self.described: dict[type, str] = {}  # class -> `classes` of it

    def tensor(self, t: torch.Tensor) -> str:
        index = self.tensor_index.setdefault(id(t), len(self.tensors))
        if index == len(self.tensors):
            self.tensors.append(t)
        return f"{type(t).__module__}.{type(t).__qualname__} #{index} requires_grad={t.requires_grad}"

    def code(self, fn: Callable[..., Any]) -> str:
        """A Python function by where its code is (the file's content is checked on reuse, `sources`; code made
        from a string, by its bytecode and constants), its defaults and its closure."""
        code = fn.__code__
        where = f"{code.co_filename}:{code.co_firstlineno}"
        if code.co_filename.startswith("<"):
            where += f" {hashlib.sha256(_code_bytes(code)).hexdigest()}"
        closure = []
        for cell in fn.__closure__ or ():
            try:
                closure.append(cell.cell_contents if cell.cell_contents is not fn else "<itself>")
            except ValueError:  # a cell not filled yet
                closure.append("<empty cell>")
        return (f"function {fn.__module__}.{fn.__qualname__} at {where} defaults {self.value(fn.__defaults__)} "
                f"{self.value(fn.__kwdefaults__)} closure {self.value(closure)}")

    def value(self, obj: Any, depth: int = 0) -> str:
        self.count += 1
        if self.count > MAX_VALUES or depth > MAX_DEPTH:
            raise Unkeyable("module attributes nested deeper or larger than a model's")
        if isinstance(obj, _PLAIN + _ANNOTATIONS) or type(obj).__module__ == "typing":
            return f"{type(obj).__name__} {obj!r}"
        if isinstance(obj, logging.Logger):
            return f"logger {obj.name}"
        if isinstance(obj, enum.Enum):
            return f"{type(obj).__qualname__}.{obj.name} {self.value(obj.value, depth + 1)}"
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj)
        if isinstance(obj, torch.nn.Module):
            if id(obj) not in self.paths:
                raise Unkeyable(f"an attribute holding a {type(obj).__name__} outside the module")
            return f"submodule {self.paths[id(obj)]!r}"
        if isinstance(obj, type):
            return f"class {obj.__module__}.{obj.__qualname__}"
        if isinstance(obj, types.ModuleType):
            return f"module {obj.__name__}"
        if isinstance(obj, (types.BuiltinFunctionType, types.WrapperDescriptorType, types.MethodDescriptorType)):
            return f"builtin {getattr(obj, '__module__', None)}.{obj.__qualname__}"
        if id(obj) in self.on_path:
            raise Unkeyable(f"a {type(obj).__name__} attribute that contains itself")
        self.on_path.add(id(obj))
        try:
            return self._container(obj, depth)
        finally:
            self.on_path.discard(id(obj))

    def _container(self, obj: Any, depth: int) -> str:
        if isinstance(obj, types.FunctionType):
            return self.code(obj)
        if isinstance(obj, types.MethodType):
            return f"method of {self.value(obj.__self__, depth + 1)}: {self.value(obj.__func__, depth + 1)}"
        if isinstance(obj, functools.partial):
            return (f"partial {self.value(obj.func, depth + 1)} {self.value(obj.args, depth + 1)} "
                    f"{self.value(obj.keywords, depth + 1)}")
        if isinstance(obj, (list, tuple)):
            return f"{type(obj).__name__}[{', '.join(self.value(o, depth + 1) for o in obj)}]"
        if isinstance(obj, (set, frozenset)):
            return f"set[{', '.join(sorted(self.value(o, depth + 1) for o in obj))}]"
        if isinstance(obj, dict):
            items = (f"{self.value(k, depth + 1)}: {self.value(v, depth + 1)}" for k, v in obj.items())
            return f"{type(obj).__name__}[{', '.join(items)}]"
        if dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__"):
            return self.instance(obj, depth)
        raise Unkeyable(f"a {type(obj).__qualname__} attribute")

    def instance(self, obj: Any, depth: int) -> str:
        """An object by its class and the attributes its code could read; Unkeyable for an object of a class built
        on a C type (a deque, an array) whose state its attributes do not hold."""
        cls = type(obj)
        if any(not klass.__flags__ & _HEAP_TYPE and klass not in _STATELESS_BASES for klass in cls.__mro__):
            raise Unkeyable(f"a {cls.__qualname__} attribute (its class is built on a C type)")
        state = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
        for klass in cls.__mro__:
            for slot in getattr(klass, "__slots__", ()):
                if slot not in ("__dict__", "__weakref__") and hasattr(obj, slot):
                    state[slot] = getattr(obj, slot)
        fields = ", ".join(f"{k}={self.value(v, depth + 1)}" for k, v in sorted(state.items()))
        return f"{self.classes(cls, depth)}({fields})"

    def classes(self, cls: type, depth: int) -> str:
        """A class by its name and those of its bases, with each one's own attributes (its methods' code)."""
        if cls not in self.described:
            self.described[cls] = self._classes(cls, depth)
        return self.described[cls]

    def _classes(self, cls: type, depth: int) -> str:
        parts = []
        for klass in cls.__mro__:
            if klass.__module__ == "builtins" or klass is torch.nn.Module:
                continue
            own = []
            for name, attr in sorted(vars(klass).items()):
                if name in _MADE_BY_SCRIPTING and not attr:
                    continue
                if name in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__", "__firstlineno__",
                            "__static_attributes__", "__slots__", "__parameters__", "__orig_bases__", "_abc_impl"):
                    continue
                own.append(f"{name}={self.attribute(attr, depth + 1)}")
            parts.append(f"{klass.__module__}.{klass.__qualname__}{{{', '.join(own)}}}")
        return " < ".join(parts) or f"{cls.__module__}.{cls.__qualname__}"

    def attribute(self, attr: Any, depth: int) -> str:
        """A class attribute: a method or property by its code, a value as any value; another object (which the
        class's source makes) by its type."""
        if isinstance(attr, (staticmethod, classmethod)):
            return f"{type(attr).__name__} {self.value(attr.__func__, depth)}"
        if isinstance(attr, property):
            return f"property {self.value(attr.fget, depth)} {self.value(attr.fset, depth)}"
        if isinstance(attr, (types.GetSetDescriptorType, types.MemberDescriptorType)):
            return f"descriptor {attr.__qualname__}"
        count = self.count
        try:
            return self.value(attr, depth)
        except Unkeyable:
            self.count = count
            return f"a {type(attr).__module__}.{type(attr).__qualname__}"

    def python_module(self, module: torch.nn.Module) -> None:
        if nn_module._global_forward_hooks or nn_module._global_forward_pre_hooks:
            raise Unkeyable("global forward hooks")
        for path, m in module.named_modules(remove_duplicate=False):
            if isinstance(m, torch.jit.ScriptModule):
                raise Unkeyable(f"a ScriptModule ({path}) inside a Python module")
            if any(getattr(m, hooks, None) for hooks in _HOOKS):
                raise Unkeyable(f"hooks on submodule {path or '<top>'!r}")
            state = {k: v for k, v in vars(m).items()
                     if k not in _NOT_READ and not (k in _MADE_BY_SCRIPTING and not v)}
            try:
                self.lines.append(f"submodule {path!r}: {self.classes(type(m), 0)}")
                for k, v in sorted(state.items()):
                    self.lines.append(f"  {k} = {self.value(v, 1)}")
            except Unkeyable as e:
                raise Unkeyable(f"submodule {path or '<top>'!r} ({type(m).__name__}): {e}") from None

    def script_module(self, module: torch.jit.ScriptModule) -> None:
        for name in sorted(module._c._method_names()):
            graph = str(module._c._get_method(name).inlined_graph)
            if "prim::PythonOp" in graph:
                raise Unkeyable(f"method {name} calls Python code (prim::PythonOp)")
            self.lines.append(f"method {name}:\n{graph}")
        modules = {path: m for path, m in torch._C._jit_debug_module_iterators(module._c)["named_modules"]}
        for path, sub in modules.items():
            self.lines.append(f"submodule {path!r}: {sub._type().qualified_name()}")
        for path, value in torch._C._jit_debug_module_iterators(module._c)["named_attributes_r"]:
            if isinstance(value, torch._C.ScriptObject):
                if path not in modules:
                    raise Unkeyable(f"attribute {path} of TorchScript class {value._type().qualified_name()}")
                continue
            self.lines.append(f"attribute {path} = {self.value(value, 1)}")


def _code_bytes(code: types.CodeType) -> bytes:
    """What a code object does: its bytecode, names and constants (nested code objects too)."""
    consts = [_code_bytes(c) if isinstance(c, types.CodeType) else repr(c).encode() for c in code.co_consts]
    return b"\0".join([code.co_code, repr((code.co_names, code.co_varnames, code.co_freevars, code.co_cellvars,
                                            code.co_argcount, code.co_kwonlyargcount, code.co_flags)).encode(),
                       *consts])


def torch_flags() -> str:
    """torch's global settings that change what scripting or tracing records."""
    return (f"default dtype {torch.get_default_dtype()} deterministic {torch.are_deterministic_algorithms_enabled()} "
            f"mha fastpath {torch.backends.mha.get_fastpath_enabled()} grad {torch.is_grad_enabled()}")


def device_identity(device: torch.device) -> str:
    """The device compile builds for: its type and index, and a GPU's name and compute capability.

    With the backend (a setting), `key.software()` and the files of the libraries a compile loaded (`sources`),
    this is the engines' target, known without importing the backend's library (ONNX Runtime: 20 ms)."""
    if device.type != "cuda":
        return f"device {device}"
    return (f"device {device} {torch.cuda.get_device_name(device)} "
            f"{'{}.{}'.format(*torch.cuda.get_device_capability(device))}")


def module_key(module: torch.nn.Module, settings: Any) -> str:
    """The key of compiling `module` with `settings` (64 hex digits); Unkeyable if it cannot be made exactly."""
    d = _Describer(module)
    if isinstance(module, torch.jit.ScriptModule):
        d.script_module(module)
    else:
        d.python_module(module)
    d.lines += [FORMAT, torch_flags(), f"settings {d.value(settings_in_key(settings, frozenset()))}",
                device_identity(settings.device), software()]
    d.lines += [f"{i} {digest}" for i, digest in enumerate(tensor_digests(d.tensors))]
    return hashlib.sha256("\n".join(d.lines).encode()).hexdigest()
