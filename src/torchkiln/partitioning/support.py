"""Which nodes can run in an engine: asked of the converter and evaluator registries and the settings."""
from __future__ import annotations

import dataclasses
import enum

from torchkiln.conversion.registry import find_converter, find_evaluator
from torchkiln.conversion.resolve import NotStatic, Resolver, is_dynamic
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Node, node_key

FALLBACK_ATTR = "torchkiln_fallback"  # set on nodes that module fallback forces to PyTorch


class Target(enum.Enum):
    ENGINE = "engine"  # converted to layers (or a collection of engine tensors)
    STATIC = "static"  # a value known at build time; runs nowhere, becomes a constant where needed
    TORCH = "torch"  # stays a TorchScript node


class Fallback(enum.Enum):
    """Why a node stays in PyTorch."""

    NO_CONVERTER = "no converter or evaluator"
    FORCED_OP = "forced by torch_executed_ops"
    FORCED_MODULE = "forced by torch_executed_modules"
    CONTROL_FLOW = "dynamic control flow"
    NOT_STATIC = "an argument is only known at run time"
    CAPABILITY = "the converter does not support these arguments"
    BOUNDARY = "a non-tensor value would cross an engine boundary"
    MIN_BLOCK_SIZE = "engine block below min_block_size"


@dataclasses.dataclass(frozen=True)
class Decision:
    target: Target
    reason: Fallback | None = None
    detail: str = ""

    @classmethod
    def torch(cls, reason: Fallback, detail: str = "") -> Decision:
        return cls(Target.TORCH, reason, detail)


def _forced(node: Node, settings: CompileSettings) -> bool:
    return node.kind() in settings.torch_executed_ops or node_key(node) in settings.torch_executed_ops


def classify(node: Node, resolver: Resolver, settings: CompileSettings) -> Decision:
    """Decide where one top-level node runs."""
    if node.hasAttribute(FALLBACK_ATTR):
        return Decision.torch(Fallback.FORCED_MODULE, node.s(FALLBACK_ATTR))
    if _forced(node, settings):
        return Decision.torch(Fallback.FORCED_OP, node.kind())
    if list(node.blocks()):
        return Decision.torch(Fallback.CONTROL_FLOW, node.kind())
    converter = find_converter(node)
    if converter is not None:
        try:
            args = resolver.args(node)
        except NotStatic as e:
            return Decision.torch(Fallback.NOT_STATIC, str(e))
        reason = converter.capability(args) if converter.capability else None
        if reason:
            return Decision.torch(Fallback.CAPABILITY, reason)
        return Decision(Target.ENGINE)
    if find_evaluator(node) is not None:
        try:
            if node.outputsSize() == 0:
                args = resolver.args(node)
                if is_dynamic(list(args)):
                    raise NotStatic("its arguments are run-time tensors")
                return Decision(Target.STATIC)
            values = [resolver.resolve(o) for o in node.outputs()]
        except NotStatic as e:
            return Decision.torch(Fallback.NOT_STATIC, str(e))
        return Decision(Target.ENGINE if is_dynamic(values) else Target.STATIC)
    return Decision.torch(Fallback.NO_CONVERTER, node_key(node))


_PACK = ("prim::TupleConstruct", "prim::ListConstruct", "prim::DictConstruct")
_UNPACK = ("prim::TupleUnpack", "prim::ListUnpack", "prim::TupleIndex", "aten::__getitem__")


def is_io_plumbing(node: Node) -> bool:
    """Packing of the method's returned collections or unpacking of its collection inputs.

    Such nodes stay in TorchScript around the engines and are not counted as fallback.
    """
    if node.kind() in _PACK:
        return all(u.user.kind() == "prim::Return" or is_io_plumbing(u.user) for o in node.outputs() for u in o.uses())
    if node.kind() in _UNPACK:
        source = node.inputsAt(0).node()
        return source.kind() == "prim::Param" or is_io_plumbing(source)
    return False
