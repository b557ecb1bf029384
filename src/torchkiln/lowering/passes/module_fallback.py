"""Module Fallback: the nodes of modules listed in `torch_executed_modules` stay in PyTorch.

Torch-TensorRT's NotateModuleForFallback puts delimiter nodes around calls to those modules before
freezing, and MarkNodesForFallback marks what lies between them after. Here the delimiters are the
call stacks freezing's inliner records on every node it inlines (`Node.getModuleHierarchy()`:
'layer1(Sequential).0(BasicBlock).conv1(Conv2d)'), so the user's module is never edited, and a node
cannot drift out of its region: rewrites keep the call stack of the node they replace.

An entry names a class as `module.ClassName` (its `__module__` and `__name__`, e.g.
'torchvision.models.resnet.BasicBlock'), or as a bare 'ClassName', which matches every class of that name.
"""
from __future__ import annotations

import logging
import re

import torch

from torchkiln.analysis.registry import FALLBACK_ATTR
from torchkiln.lowering.registry import LoweringContext, lowering_pass
from torchkiln.lowering.walk import all_nodes
from torchkiln.torchscript import Graph

logger = logging.getLogger("torchkiln.lowering")

_MANGLE = re.compile(r"___torch_mangle_\d+\.")
_SEGMENT = re.compile(r"([^.()]+)\([^()]*\)")


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
            logger.warning("torch_executed_modules: no submodule of %s has class %r", class_name(module), entry)
    return bool(ctx.fallback_modules)


def _instance_path(node: torch._C.Node) -> list[str]:
    return _SEGMENT.findall(node.getModuleHierarchy())


@lowering_pass()
def mark_nodes_for_fallback(graph: Graph, ctx: LoweringContext) -> bool:
    """Mark every node inlined from a listed module with the torchkiln_fallback attribute ('path (class)').

    Runs last, on the nodes conversion will see. Constants are values, not ops, and stay unmarked.
    """
    forced = ctx.fallback_modules
    changed = False
    for node in all_nodes(graph.block()):
        if not forced or node.kind() == "prim::Constant":
            continue
        path = _instance_path(node)
        owner = next((".".join(path[:k]) for k in range(len(path) + 1) if ".".join(path[:k]) in forced), None)
        if owner is not None:
            node.s_(FALLBACK_ATTR, f"{owner or '<top module>'} ({forced[owner]})")
            changed = True
    return changed
