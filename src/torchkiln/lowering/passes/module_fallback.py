"""Module Fallback: the nodes of modules listed in `torch_executed_modules` stay in PyTorch.

Torch-TensorRT's NotateModuleForFallback puts delimiter nodes around calls to those modules before
freezing, and MarkNodesForFallback marks what lies between them after. Here the delimiters are the
call stacks freezing's inliner records on every node it inlines (`Node.getModuleHierarchy()`:
'layer1(Sequential).0(BasicBlock).conv1(Conv2d)'), so the user's module is never edited, and a node
cannot drift out of its region: rewrites keep the call stack of the node they replace. A call of another
method of the same module (torchvision's ResNet: forward -> self._forward_impl) adds a 'SELF(ClassName)'
segment, which names no submodule and is skipped.

An entry that matches no submodule, or whose submodules contribute no op to the graph, is warned about
(logging and warnings.warn), with the module types present.

An entry names a class as `module.ClassName` (its `__module__` and `__name__`, e.g.
'torchvision.models.resnet.BasicBlock'), or as a bare 'ClassName', which matches every class of that name.
"""
from __future__ import annotations

import logging
import re

import torch

from torchkiln.analysis.registry import FALLBACK_ATTR
from torchkiln.log import warn
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph

logger = logging.getLogger("torchkiln.lowering")

_MANGLE = re.compile(r"___torch_mangle_\d+\.")
_SEGMENT = re.compile(r"([^.()]+)\([^()]*\)")
_SAME_MODULE = "SELF"  # the instance name of a call to another method of the same module


def class_name(module: torch.jit.ScriptModule) -> str:
    """The Python name TorchScript recorded for a scripted or traced module's class."""
    return _MANGLE.sub("", module._c._type().qualified_name()).removeprefix("__torch__.")


def _matches(entry: str, name: str) -> bool:
    entry = entry.removeprefix("__main__.").removeprefix("__torch__.")
    return entry == name if "." in entry else entry == name.rsplit(".", 1)[-1]


@lowering_pass(stage="module")
def notate_module_for_fallback(module: torch.jit.ScriptModule, ctx: LoweringContext) -> bool:
    """Record the instance paths of submodules whose class is listed in torch_executed_modules."""
    entries = ctx.settings.torch_executed_modules
    for path, sub in module.named_modules(remove_duplicate=False):
        name = class_name(sub)
        if any(_matches(e, name) for e in entries):
            ctx.fallback_modules[path] = name
    for entry in sorted(entries):
        if not any(_matches(entry, name) for name in ctx.fallback_modules.values()):
            warn(logger, f"torch_executed_modules: no submodule of {class_name(module)} has class {entry!r}, so "
                         f"it has no effect; the module types present are {_module_types(module)}")
    return bool(ctx.fallback_modules)


def _module_types(module: torch.jit.ScriptModule) -> list[str]:
    return sorted({class_name(sub) for _, sub in module.named_modules()})


def _instance_path(node: torch._C.Node) -> list[str]:
    return [s for s in _SEGMENT.findall(node.getModuleHierarchy()) if s != _SAME_MODULE]


@lowering_pass()
def mark_nodes_for_fallback(graph: Graph, ctx: LoweringContext) -> bool:
    """Mark every node inlined from a listed module with the torchkiln_fallback attribute ('path (class)').

    Runs last, on the nodes conversion will see. Constants are values, not ops, and stay unmarked.
    """
    forced = ctx.fallback_modules
    marked: set[str] = set()
    for node in all_nodes(graph.block()):
        if not forced or node.kind() == "prim::Constant":
            continue
        path = _instance_path(node)
        owner = next((".".join(path[:k]) for k in range(len(path) + 1) if ".".join(path[:k]) in forced), None)
        if owner is not None:
            node.s_(FALLBACK_ATTR, f"{owner or '<top module>'} ({forced[owner]})")
            marked.add(owner)
    for name in sorted(set(forced.values()) - {forced[owner] for owner in marked}):
        paths = [p or "<top module>" for p, n in forced.items() if n == name]
        warn(logger, f"torch_executed_modules: the submodules {paths} of class {name!r} contribute no op to "
                     f"the graph, so nothing is kept in PyTorch for them")
    return bool(marked)
