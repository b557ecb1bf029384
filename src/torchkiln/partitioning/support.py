"""Which nodes can run in an engine: asked of the converter and evaluator registries and the settings."""
from __future__ import annotations

import dataclasses
import enum

from torchkiln.analysis.registry import FALLBACK_ATTR, find_converter, find_evaluator
from torchkiln.analysis.resolve import NotStatic, Resolver, is_dynamic
from torchkiln.analysis.shape_conditions import is_shape_condition
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import (Node, TensorMeta, is_tensor_type, node_blocks, node_key, node_schema, value_key,
                                   writes_to_arguments)



class Target(enum.Enum):
    ENGINE = "engine"  # converted to layers (or a collection of engine tensors)
    STATIC = "static"  # a value known at build time; runs nowhere, becomes a constant where needed
    TORCH = "torch"  # stays a TorchScript node


class Fallback(str, enum.Enum):
    """Why a node stays in PyTorch. Members compare equal to their text."""

    NO_CONVERTER = "no converter or evaluator"
    FORCED_OP = "forced by torch_executed_ops"
    FORCED_MODULE = "forced by torch_executed_modules"
    CONTROL_FLOW = "dynamic control flow"
    NOT_STATIC = "an argument is only known at run time"
    CAPABILITY = "the converter does not support these arguments"
    BOUNDARY = "a non-tensor value would cross an engine boundary"
    MIN_BLOCK_SIZE = "engine block below min_block_size"
    CONVERSION_FAILED = "conversion failed"
    WRITTEN_VIEW = "shares memory with a tensor written in place"  # views, their base and the writers stay together
    IO_PLUMBING = "packs or unpacks the method's collection inputs or outputs"  # not a fallback: engines take tensors

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass(frozen=True)
class Decision:
    target: Target
    reason: Fallback | None = None
    detail: str = ""

    @classmethod
    def torch(cls, reason: Fallback, detail: str = "") -> Decision:
        return cls(Target.TORCH, reason, detail)

    @property
    def is_fallback(self) -> bool:
        """Whether the node runs in PyTorch although it could have been engine work."""
        return self.target == Target.TORCH and self.reason != Fallback.IO_PLUMBING


def _forced_by(node: Node, settings: CompileSettings) -> str | None:
    """The torch_executed_ops entry naming this node's op ('aten::add' for all overloads, or 'aten::add.Tensor')."""
    for name in (node_key(node), node.kind()):
        if name in settings.torch_executed_ops:
            return name
    return None


def _not_static(node: Node, resolver: Resolver, error: NotStatic) -> Decision:
    """NOT_STATIC naming the first input only known at run time, or the tensor whose data is needed."""
    tensors = []
    for v in node.inputs():
        try:
            value = resolver.resolve(v)
        except NotStatic:
            return Decision.torch(Fallback.NOT_STATIC,
                                  f"%{v.debugName()} ({v.type()}) is computed at run time by {v.node().kind()}")
        if isinstance(value, TensorMeta):
            tensors.append(v)
    if tensors:
        return Decision.torch(Fallback.NOT_STATIC, f"needs the data of tensor %{tensors[0].debugName()}")
    return Decision.torch(Fallback.NOT_STATIC, str(error))


CONDITION_USES = {"prim::If": 0, "prim::Loop": 1}  # where a control-flow node reads its condition


def reads_as_condition(node: Node, resolver: Resolver) -> bool:
    """Whether every use of the node's output is a condition: of an If, a Loop's first trip, or a Loop's next (or,
    for a shape condition, the operand of a `not` that is itself such a predicate)."""
    uses = node.output().uses()
    for use in uses:
        user = use.user
        owner = user.owningBlock().owningNode() if user.kind() == "prim::Return" else None
        if not (CONDITION_USES.get(user.kind()) == use.offset
                or owner is not None and owner.kind() == "prim::Loop" and use.offset == 0
                or user.kind() == "aten::__not__" and is_predicate(user, resolver)):
            return False
    return bool(uses)


def is_predicate(node: Node, resolver: Resolver) -> bool:
    """A condition an engine computes as a 0-d bool tensor (see conversion/control_flow.py), read only as a
    condition: `bool(tensor)`, or a condition on dynamic dims their ranges do not decide (`x.size(1) > 64`:
    analysis/shape_conditions.py)."""
    if node.kind() == "aten::Bool":
        return is_tensor_type(node.inputsAt(0).type()) and reads_as_condition(node, resolver)
    return is_shape_condition(node, resolver.resolve) and reads_as_condition(node, resolver)


def _inner_refusal(inner: Node, settings: CompileSettings) -> str | None:
    """Why a node inside an If or Loop block cannot run in an engine's sub-network, else None."""
    if node_blocks(inner):
        return None if inner.kind() in CONDITION_USES else f"{inner.kind()} holds blocks"
    if find_converter(inner) is None and find_evaluator(inner) is None:
        return f"{node_key(inner)} has no converter or evaluator"
    schema = node_schema(inner)
    if inner.outputsSize() == 0:  # a raise, a warning, a print: it must happen when (and each time) it runs
        return f"{node_key(inner)} is a side effect"
    if inner.isNondeterministic() or (schema is not None and writes_to_arguments(schema)):
        return f"{node_key(inner)} is random or writes in place"
    if inner.hasAttribute(FALLBACK_ATTR) or _forced_by(inner, settings):
        return f"{node_key(inner)} is forced to run in PyTorch"
    return None


def _control_flow(node: Node, resolver: Resolver, settings: CompileSettings) -> Decision:
    """An If or Loop whose blocks an engine can hold as sub-networks (a conditional or loop layer): tensors out,
    a condition computed by a predicate (or known), a loop carrying tensors, every node inside convertible. Whether
    each node converts is known only when it does: a failure moves the node to PyTorch (CONVERSION_FAILED)."""
    if node.kind() not in CONDITION_USES:
        return Decision.torch(Fallback.CONTROL_FLOW, f"{node.kind()} has no layer")
    carried = list(node.outputs()) + (list(node.inputs())[2:] if node.kind() == "prim::Loop" else [])
    for v in carried:
        if not is_tensor_type(v.type()):
            return Decision.torch(Fallback.CONTROL_FLOW, f"%{v.debugName()} is a {v.type()}; an engine carries tensors")
    conditions = [node.inputsAt(CONDITION_USES[node.kind()])]
    if node.kind() == "prim::Loop":
        conditions.append(list(next(node.blocks()).outputs())[0])
        try:
            resolver.resolve(node.inputsAt(0))
        except NotStatic:
            return Decision.torch(Fallback.CONTROL_FLOW, "its trip count is only known at run time")
    for v in conditions:
        if v.node().kind() != "prim::Constant" and not is_predicate(v.node(), resolver):
            return Decision.torch(Fallback.CONTROL_FLOW, f"its condition comes from {v.node().kind()}")
    pending = [inner for block in node.blocks() for inner in block.nodes()]
    while pending:
        inner = pending.pop()
        reason = _inner_refusal(inner, settings)
        if reason:
            return Decision.torch(Fallback.CONTROL_FLOW, f"{reason} in its blocks")
        pending += [n for block in node_blocks(inner) for n in block.nodes()]
    return Decision(Target.ENGINE)


def _classify(node: Node, resolver: Resolver, settings: CompileSettings) -> Decision:
    if node_blocks(node):  # an If giving a shape condition (`a and b`) is a predicate, not control flow
        return Decision(Target.ENGINE) if is_predicate(node, resolver) else _control_flow(node, resolver, settings)
    converter = find_converter(node)
    if converter is not None:
        try:
            args = resolver.args(node)
        except NotStatic as e:
            return _not_static(node, resolver, e)
        if resolver.foldable(node) and resolver.fold(node) is not None:
            return Decision(Target.STATIC)  # build-time values in and out: it runs at build time
        try:
            reason = converter.capability(args) if converter.capability else None
        except NotStatic as e:
            return _not_static(node, resolver, e)
        except Exception as e:  # noqa: BLE001 - a check that cannot decide declines the op instead of the compile
            return Decision.torch(Fallback.CAPABILITY, f"its capability check raised {type(e).__name__}: {e}")
        if reason:
            return Decision.torch(Fallback.CAPABILITY, reason)
        unknown = [o for o in node.outputs()
                   if is_tensor_type(o.type()) and o.uses() and value_key(o) not in resolver.metas]
        if unknown:  # dynamic shapes: shape analysis saw this output change rank across the input ranges
            return Decision.torch(Fallback.CAPABILITY, f"needs static shapes: the rank of %{unknown[0].debugName()} "
                                                       f"changes across the input ranges")
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
            return Decision(Target.ENGINE) if is_predicate(node, resolver) else _not_static(node, resolver, e)
        return Decision(Target.ENGINE if is_dynamic(values) else Target.STATIC)
    return Decision.torch(Fallback.NO_CONVERTER, node_key(node))


def classify(node: Node, resolver: Resolver, settings: CompileSettings) -> Decision:
    """Decide where one top-level node runs.

    A tensor sharing memory with views that something writes in place runs in PyTorch, with its base, every
    view and every writer: an engine would return a copy of a view, and the write would miss it (or the base).
    Forcing (torch_executed_ops, module fallback) applies to work an engine would run; a static value
    (a constant, shape arithmetic) is known at build time wherever its node would run, so it stays static.
    """
    if is_io_plumbing(node):
        return Decision.torch(Fallback.IO_PLUMBING)
    decision = _classify(node, resolver, settings)
    if decision.target == Target.TORCH:
        return decision
    for out in node.outputs():
        reason = is_tensor_type(out.type()) and resolver.shared_memory(out).split_write()
        if reason:
            return Decision.torch(Fallback.WRITTEN_VIEW, reason)
    if decision.target == Target.STATIC:
        return decision
    if node.hasAttribute(FALLBACK_ATTR):
        return Decision.torch(Fallback.FORCED_MODULE, node.s(FALLBACK_ATTR))
    forced = _forced_by(node, settings)
    if forced is not None:
        return Decision.torch(Fallback.FORCED_OP, f"{forced!r} is in torch_executed_ops")
    return decision


_PACK = ("prim::TupleConstruct", "prim::ListConstruct", "prim::DictConstruct")
_UNPACK = ("prim::TupleUnpack", "prim::ListUnpack", "prim::TupleIndex", "aten::__getitem__")


def is_io_plumbing(node: Node) -> bool:
    """Packing of the method's returned collections or unpacking of its collection inputs.

    Such nodes stay in TorchScript around the engines and are not counted as fallback. A pack qualifies when
    every reader of its result is the return or another such pack; an unpack when what it unpacks is a method
    input or another such unpack. (Each walk goes one way only, so a list that is built and then indexed,
    `[a, b][i]`, is neither, and the walk ends.)
    """
    if node.kind() in _PACK:
        pending = [node]
        while pending:
            for o in pending.pop().outputs():
                for use in o.uses():
                    if use.user.kind() in _PACK:
                        pending.append(use.user)
                    elif use.user.kind() != "prim::Return":
                        return False
        return True
    while node.kind() in _UNPACK:
        node = node.inputsAt(0).node()
    return node.kind() == "prim::Param"
