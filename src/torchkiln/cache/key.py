"""The key of an engine block: a SHA-256 of everything its engine is made from.

That is the block's lowered nodes and every node outside it that its static values come from (walked back to
the block's run-time inputs and the method's arguments), with the content of every constant tensor (its
weights), the shape analysis of every value named (input shapes, ranges and dtypes), the compile and build
settings, the input specs, the target (backend, device, GPU name and capability, library versions) and
torchkiln itself (the hash of its source, and the engine format's version). Anything the walk cannot describe
exactly makes the block uncacheable (`Unkeyable`): it is built, never matched by a key that might not tell it
apart.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import importlib.metadata
import os
import platform
import re
from collections.abc import Mapping, Sequence
from typing import Any

import sympy
import torch

from torchkiln.cache.source_digest import source_digest as source_files_digest
from torchkiln.cache.weights import Unkeyable, describe_tensor
from torchkiln.ir.symbolic import DimSymbol
from torchkiln.runtime.backends import BackendUnavailable, target_of
from torchkiln.runtime.serialization import FORMAT_VERSION
from torchkiln.torchscript import Node, Value, value_key

# Settings with no part in what an engine is: logging, and the cache's own switches.
_NOT_IN_KEY = frozenset({"debug", "cache_built_engines", "reuse_cached_engines"})
# Node kinds whose meaning is code outside the graph: a block reading one is not keyed.
_CALLS = frozenset({"prim::CallMethod", "prim::CallFunction", "prim::PythonOp"})
# Node attribute kinds the key describes: each is also the name of the Node method that reads it.
_ATTRIBUTE_KINDS = frozenset({"i", "f", "s", "t", "is", "fs", "ss", "ts", "ival", "ty", "tys", "c"})


class _Describer:
    """Writes values, dims and nodes as text that names no memory address or Python identity."""

    def __init__(self, metas: Mapping[int, Any], module: torch.nn.Module | None) -> None:
        self.metas = metas
        self.module = module
        self.lines: list[str] = []
        self.names: dict[int, str] = {}  # value_key -> %n
        self.objects: dict[int, Any] = {}  # value_key -> what a prim::GetAttr chain from self reads
        self.symbols: dict[int, str] = {}  # id(symbol) -> S<n>
        self.symbol_names: dict[str, int] = {}

    def describe(self, obj: Any) -> str:
        if obj is None or isinstance(obj, (bool, int, float, str, torch.dtype, torch.device, torch.memory_format,
                                           torch.layout)):
            return repr(obj)
        if isinstance(obj, enum.Enum):
            return f"{type(obj).__name__}.{obj.name}"
        if isinstance(obj, torch.Tensor):
            return describe_tensor(obj)
        if isinstance(obj, (sympy.Expr, DimSymbol)):
            return self.dim(obj)
        if isinstance(obj, (list, tuple)):
            return f"{type(obj).__name__}[{', '.join(self.describe(o) for o in obj)}]"
        if isinstance(obj, (set, frozenset)):
            return f"set[{', '.join(sorted(self.describe(o) for o in obj))}]"
        if isinstance(obj, dict):
            return f"dict[{', '.join(f'{self.describe(k)}: {self.describe(v)}' for k, v in obj.items())}]"
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            fields = ", ".join(f"{f.name}={self.describe(getattr(obj, f.name))}" for f in dataclasses.fields(obj))
            return f"{type(obj).__name__}({fields})"
        if isinstance(obj, torch._C.JitType):
            return f"type({obj.annotation_str})"
        raise Unkeyable(f"a {type(obj).__name__} value")

    def dim(self, expr: sympy.Expr) -> str:
        """A symbolic dim: its expression, with each symbol's range and samples and its identity (S<n>)."""
        parts = []
        for sym in sorted(expr.free_symbols, key=str):
            if not isinstance(sym, DimSymbol):
                raise Unkeyable(f"symbol {sym} of unknown range")
            if id(sym) not in self.symbols:
                if self.symbol_names.setdefault(sym.name, id(sym)) != id(sym):
                    raise Unkeyable(f"two symbols named {sym.name}")
                self.symbols[id(sym)] = f"S{len(self.symbols)}"
            parts.append(f"{sym.name}={self.symbols[id(sym)]}[{sym.lo}, {sym.hi}, {sym.samples}]")
        return f"dim({expr}; {', '.join(parts)})"

    def name(self, v: Value, what: str) -> str:
        ref = self.names[value_key(v)] = f"%{len(self.names)}"
        meta = self.metas.get(value_key(v))
        self.lines.append(f"{ref} = {what} : {v.type().annotation_str} {self.describe(meta)}")
        return ref

    def ref(self, v: Value) -> str:
        """The name of `v`; a method argument (or self) not named yet is named here."""
        found = self.names.get(value_key(v))
        if found is not None:
            return found
        if v.node().kind() != "prim::Param" or v.node().owningBlock().owningNode() is not None:
            raise Unkeyable(f"%{v.debugName()} is read before it is made")
        if v.offset() == 0 and self.module is not None:
            self.objects[value_key(v)] = self.module
        return self.name(v, f"argument {v.offset()}")

    def attributes(self, node: Node) -> str:
        if node.kind() == "prim::Constant":
            return self.describe(node.output().toIValue()) if node.outputsSize() == 1 else ""
        found = []
        for attr in sorted(node.attributeNames()):
            kind = node.kindOf(attr)
            if kind not in _ATTRIBUTE_KINDS:
                raise Unkeyable(f"{node.kind()} attribute {attr} of kind {kind}")
            found.append(f"{attr}={self.describe(getattr(node, kind)(attr))}")
        return ", ".join(found)

    def attribute_read(self, node: Node) -> str:
        """What a prim::GetAttr chain from self reads off the module: a submodule is followed, a value is
        described."""
        parent = self.objects.get(value_key(node.input()))
        if parent is None:
            raise Unkeyable(f"prim::GetAttr {node.s('name')!r} of an object the key cannot see")
        value = getattr(parent, node.s("name"))
        if isinstance(value, torch.nn.Module):
            self.objects[value_key(node.output())] = value
            return f"module {getattr(value, 'original_name', type(value).__name__)}"
        return self.describe(value)

    def node(self, node: Node) -> None:
        if node.kind() in _CALLS:
            raise Unkeyable(f"{node.kind()} calls code outside the graph")
        inputs = ", ".join(self.ref(i) for i in node.inputs())
        what = f"{node.kind()}({inputs}) [{self.attributes(node)}]"
        if node.kind() == "prim::GetAttr":
            what += f" reads {self.attribute_read(node)}"
        for k, block in enumerate(node.blocks()):
            self.lines.append(f"block {k} of {node.kind()} {{")
            for p in block.inputs():
                self.name(p, "block parameter")
            for inner in block.nodes():
                self.node(inner)
            self.lines.append(f"}} returns ({', '.join(self.ref(o) for o in block.outputs())})")
        for k, out in enumerate(node.outputs()):
            self.name(out, f"{what} output {k}")


def _nodes_within(nodes: Sequence[Node]) -> list[Node]:
    """`nodes` and every node nested in their blocks."""
    found, stack = [], list(reversed(nodes))
    while stack:
        node = stack.pop()
        found.append(node)
        for block in node.blocks():
            stack.extend(reversed(list(block.nodes())))
    return found


def _producers(nodes: Sequence[Node], inputs: Sequence[Value], order: Sequence[Node]) -> list[Node]:
    """The top-level nodes outside the block whose outputs the block reads (not through its run-time inputs),
    and theirs in turn, in `order` (the graph's top-level nodes in their final order)."""
    inside = _nodes_within(nodes)
    made = {value_key(o) for n in inside for o in n.outputs()} | {value_key(p) for n in inside for b in n.blocks()
                                                                    for p in b.inputs()}
    made |= {value_key(v) for v in inputs}
    position = {n: i for i, n in enumerate(order)}
    needed: set[Node] = set()
    stack = [v for n in inside for v in n.inputs()]
    while stack:
        v = stack.pop()
        producer = v.node()
        if value_key(v) in made or producer.kind() == "prim::Param" or producer in needed:
            continue
        if producer not in position:
            raise Unkeyable(f"%{v.debugName()} comes from a node outside the graph's top level")
        needed.add(producer)
        stack.extend(v for n in _nodes_within([producer]) for v in n.inputs())
    return sorted(needed, key=position.__getitem__)


@functools.lru_cache(maxsize=1)
def source_digest() -> str:
    """A SHA-256 of torchkiln's Python source: a change to any of it is a change of the code that makes engines."""
    return source_files_digest(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _version(package: str) -> str:
    """The installed package's version, from its metadata's Version line (importlib.metadata.version parses all of
    the metadata as an e-mail message: 0.3-1 ms a package)."""
    try:
        dist = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return "absent"
    found = re.search(r"^Version:[ \t]*(\S+)", dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "",
                      re.MULTILINE)
    return found.group(1) if found else str(dist.version)


def software() -> str:
    """The versions of the software that makes and runs engines, and torchkiln's source."""
    versions = {p: _version(p) for p in ("torch", "triton", "onnxruntime", "onnx", "numpy")}
    return (f"versions {sorted(versions.items())} python {platform.python_version()} torch.version.cuda "
            f"{torch.version.cuda}\ntorchkiln source {source_digest()} engine format {FORMAT_VERSION}")


def environment(backend: str, device: torch.device) -> str:
    """The target and the software that makes and runs the engine."""
    try:
        target = target_of(backend, device)
    except BackendUnavailable as e:
        raise Unkeyable(f"backend {backend} cannot run here: {e}") from None
    return f"target {target}\n{software()}"


def block_key(nodes: Sequence[Node], inputs: Sequence[Value], outputs: Sequence[Value], order: Sequence[Node],
              metas: Mapping[int, Any], module: torch.nn.Module | None, settings: Any, build: Any, name: str) -> str:
    """The cache key of the engine of one block (64 hex digits); Unkeyable if it cannot be made exactly.

    `order` is the graph's top-level nodes in their final order, `module` the lowered module (what a
    prim::GetAttr reads), `settings` the compile settings and `build` the build settings of the engine."""
    d = _Describer(metas, module)
    for i, v in enumerate(inputs):
        d.name(v, f"engine input {i}")
    for node in _producers(nodes, inputs, order):
        d.node(node)
    d.lines.append("engine block")
    for node in nodes:
        d.node(node)
    d.lines.append(f"outputs ({', '.join(d.ref(o) for o in outputs)})")
    specs = [d.describe({k: getattr(spec, k) for k in ("min_shape", "opt_shape", "max_shape", "dtype", "format",
                                                       "name", "tensor_domain")}) for spec in settings.inputs]
    d.lines += [f"name {name!r}", f"inputs {specs}", f"settings {d.describe(settings_in_key(settings))}",
                f"build {d.describe(build)}", environment(build.backend, build.device)]
    return hashlib.sha256("\n".join(d.lines).encode()).hexdigest()


def settings_in_key(settings: Any, more: frozenset[str] = frozenset({"inputs", "input_signature"})) -> dict[str, Any]:
    """Every compile setting but those with no part in what is built (and `more`): a new setting is part of the
    keys the day it is added."""
    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)
            if f.name not in _NOT_IN_KEY | more}
