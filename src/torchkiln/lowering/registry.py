"""Lowering passes by name. A graph pass is `fn(graph, settings) -> bool` (did it change the graph);
a module pass runs before freezing and is `fn(module, settings) -> bool`."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Graph

GraphPass = Callable[[Graph, CompileSettings], bool]
ModulePass = Callable[[torch.jit.ScriptModule, CompileSettings], bool]


@dataclasses.dataclass(frozen=True)
class LoweringPass:
    name: str
    fn: Callable[..., bool]
    stage: str  # "module" (before freezing) or "graph"
    doc: str


PASSES: dict[str, LoweringPass] = {}


def lowering_pass(stage: str = "graph") -> Callable[[Callable[..., bool]], Callable[..., bool]]:
    """Register a pass under its function name; its docstring's first line describes it."""
    def register(fn: Callable[..., bool]) -> Callable[..., bool]:
        if fn.__name__ in PASSES:
            raise ValueError(f"lowering pass {fn.__name__} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        PASSES[fn.__name__] = LoweringPass(fn.__name__, fn, stage, doc)
        return fn

    return register


def changes(graph: Graph, mutate: Callable[[], object]) -> bool:
    """Run an in-place graph mutation; report whether the graph's text changed."""
    before = str(graph)
    mutate()
    return str(graph) != before


def rewrite(graph: Graph, pattern: str, replacement: str) -> bool:
    """Replace every match of a TorchScript IR pattern by the replacement (torch's SubgraphRewriter)."""
    return changes(graph, lambda: torch._C._jit_pass_custom_pattern_based_rewrite_graph(pattern, replacement, graph))
