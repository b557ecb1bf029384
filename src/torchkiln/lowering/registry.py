"""Lowering passes by name.

A graph pass is `fn(graph, ctx) -> bool` (did it change the graph); a module pass runs before
freezing, is `fn(module, ctx) -> bool` and must leave the module as it found it (it may record
what it learned in `ctx`).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

import torch

from torchkiln.lowering.walk import all_nodes
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Graph, TensorMeta, Value


@dataclasses.dataclass
class LoweringContext:
    """What a pass may read besides its graph: the settings, and facts earlier passes recorded."""

    settings: CompileSettings
    # instance path ('' is the root, 'layer1.0' a submodule) -> class name, for torch_executed_modules
    fallback_modules: dict[str, str] = dataclasses.field(default_factory=dict)
    module: torch.jit.ScriptModule | None = None  # the frozen module, once frozen
    # what shape analysis saw of every top-level tensor, when passes run again after it (value key -> meta)
    metas: Mapping[int, TensorMeta] | None = None


@dataclasses.dataclass(frozen=True)
class LoweringPass:
    name: str
    fn: Callable[..., bool]
    stage: str  # "module" (before freezing) or "graph"
    doc: str
    replaces: tuple[str, ...]  # the ops (overloads) this pass rewrites away
    decomposition: bool  # only re-expresses `replaces` in other ops: skipped when the engine converts them whole


PASSES: dict[str, LoweringPass] = {}


def lowering_pass(stage: str = "graph", replaces: tuple[str, ...] = (), decomposition: bool = False
                  ) -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Register a pass under its function name; its docstring's first line describes it.

    `replaces` names the op overloads ('aten::gelu', 'aten::log_softmax.int') the pass rewrites into
    other ops: the pipeline skips the pass when the user forced one of them to PyTorch with
    `torch_executed_ops`, and, for a `decomposition`, when every one of them has a converter.
    """
    if stage not in ("module", "graph"):
        raise ValueError(f"stage must be 'module' or 'graph', got {stage!r}")

    def register(fn: Callable[..., bool]) -> Callable[..., bool]:
        if fn.__name__ in PASSES:
            raise ValueError(f"lowering pass {fn.__name__} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        PASSES[fn.__name__] = LoweringPass(fn.__name__, fn, stage, doc, tuple(replaces), decomposition)
        return fn

    return register


def changes(graph: Graph, mutate: Callable[[], object]) -> bool:
    """Run an in-place graph mutation; report whether the graph's text changed."""
    before = str(graph)
    mutate()
    return str(graph) != before


_DEFINED = re.compile(r"^\s*(%[\w.]+(?:\s*:\s*[^=,]+)?(?:\s*,\s*%[\w.]+(?:\s*:\s*[^=,]+)?)*)\s*=", re.MULTILINE)
_RETURNED = re.compile(r"return\s*\(\s*(%[\w.]+)")
_PATTERN_OPS = re.compile(r"=\s*(\w+::\w+)")


def _provenance_pairs(pattern: str, replacement: str) -> list[tuple[str, str]]:
    """Every value the replacement defines, paired with the value the pattern returns.

    The rewriter then gives each new node the source range and module call stack of the node it
    replaces, so error messages still name the user's source line and module fallback still
    knows which module the node belongs to.
    """
    returned = _RETURNED.search(pattern)
    if returned is None:
        return []
    target = returned.group(1)[1:]
    return [(name[1:], target) for lhs in _DEFINED.findall(replacement) for name in re.findall(r"%[\w.]+", lhs)]


_SCALARS = (torch._C.IntType, torch._C.FloatType, torch._C.BoolType, torch._C.StringType, torch._C.NoneType)


def _scalar_constants(graph: Graph) -> list[torch._C.Node]:
    """prim::Constant nodes of numbers, strings, None and lists of numbers (what patterns match on)."""
    def scalar(v: Value) -> bool:
        t = v.type()
        if isinstance(t, torch._C.OptionalType):
            return v.toIValue() is None
        listed = isinstance(t, torch._C.ListType) and isinstance(t.getElementType(), _SCALARS)
        return isinstance(t, _SCALARS) or listed
    return [n for n in all_nodes(graph.block()) if n.kind() == "prim::Constant" and scalar(n.output())]


def _unpool_constants(graph: Graph) -> None:
    """Give every use of a scalar constant its own prim::Constant node.

    The matcher requires a pattern's inner values, constants included, to have no uses outside the
    match, and freezing pools equal constants into one node that many ops read.
    """
    for node in _scalar_constants(graph):
        for use in list(node.output().uses())[1:]:
            copy = graph.createClone(node, lambda v: v)
            copy.insertAfter(node)
            use.user.replaceInput(use.offset, copy.output())


def _pool_constants(graph: Graph) -> None:
    """Merge equal scalar constants again, into one node at the top of the graph.

    (LibTorch's ConstantPooling does this too, but compares every weight tensor on the way.)
    """
    kept: dict[tuple[str, str], torch._C.Node] = {}
    for node in _scalar_constants(graph):
        key = (node.output().type().str(), repr(node.output().toIValue()))
        if key not in kept:
            kept[key] = node
            continue
        first = kept[key]
        first.moveAfter(graph.param_node())
        node.output().replaceAllUsesWith(first.output())
        node.destroy()


def rewrite(graph: Graph, pattern: str, replacement: str) -> bool:
    """Replace every match of a TorchScript IR pattern by the replacement (torch's SubgraphRewriter).

    The matcher compares op kinds and constant values, not types: a pattern must not match another
    overload of its op with the same number of inputs, or the replacement must be right for it too.
    New nodes keep the source range and module call stack of the node they replace.
    """
    needed = set(_PATTERN_OPS.findall(pattern)) - {"prim::Constant"}
    if any(graph.findNode(kind, True) is None for kind in needed):  # LibTorch's search, nested blocks included
        return False  # an op of the pattern is nowhere in the graph: nothing can match
    _unpool_constants(graph)
    changed = changes(graph, lambda: torch._C._jit_pass_custom_pattern_based_rewrite_graph(
        pattern, replacement, graph, _provenance_pairs(pattern, replacement)))
    _pool_constants(graph)
    return changed
