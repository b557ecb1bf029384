"""Conditional and loop layers on the CUDA backend: the layer's meaning (`ir/reference.py`), with each branch or
body run by its own CUDA plan (made for the sub-network at its first call on a device, its steps bound per input
shape), not layer by layer.

A conditional layer whose predicate the input shapes alone decide (`ir/shape_only.py`: `if x.size(1) > 64:` on a
dynamic dim) has its branch picked when the runner binds the input shapes (`decided_conditionals`,
`decided_step`): its step then runs that branch's plan and reads nothing on the host, so a CUDA graph holds it, one
graph per input shape and hence per branch. A predicate computed from data, and a loop's condition, are read on the
host when the layer runs, so an engine holding one runs its steps one by one, uncaptured
(`runner.captures_graphs`)."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import conditional, loop
from torchkiln.ir.shape_only import shape_only_conditionals
from torchkiln.runtime.backends.base import BackendOptions
from torchkiln.runtime.backends.cuda import kernels
from torchkiln.runtime.plan import Step


class SubnetworkPlans:
    """Sub-networks run by their CUDA plans: one plan per (sub-network, device), steps bound per input shapes."""

    def __init__(self, allow_tf32: bool) -> None:
        self.allow_tf32 = allow_tf32
        self.plans: dict[tuple[int, torch.device], tuple] = {}
        self.bound: dict[tuple, object] = {}

    def run(self, network: Network, inputs: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
        from torchkiln.runtime.backends.cuda.planner import make_plan
        from torchkiln.runtime.backends.cuda.runner import bind_steps, place_weights
        from torchkiln.runtime.symbols import SymbolBinder

        planned = self.plans.get((id(network), device))
        if planned is None:
            plan = make_plan(network, device, BackendOptions(timing_iterations=0))
            planned = self.plans[id(network), device] = (plan, place_weights(network, plan, device),
                                                         SymbolBinder.for_network(network))
        shapes = tuple(tuple(x.shape) for x in inputs)
        key = (id(network), device, shapes)
        bound = self.bound.get(key)
        if bound is None:
            plan, weights, binder = planned
            bound = self.bound[key] = bind_steps(network, plan, weights, binder, shapes, device, self.allow_tf32)
        return bound.run_eagerly(inputs)


def _control_flow(layer: L.Layer, allow_tf32: bool, taken: bool | None = None,
                  device: torch.device | None = None) -> Callable[[list[torch.Tensor]], object]:
    """The layer's meaning with its sub-networks run by their plans on `device` (None: the first input's); a
    conditional's branch is `taken` where given (its predicate is then never read)."""
    plans = SubnetworkPlans(allow_tf32)

    def run(xs: list[torch.Tensor]) -> object:
        where = device or xs[0].device
        run_sub = lambda network, inputs: plans.run(network, inputs, where)  # noqa: E731
        return conditional(layer, xs, run_sub, taken) if isinstance(layer, L.ConditionalLayer) else \
            loop(layer, xs, run_sub, where)

    return run


def decided_conditionals(network: Network, steps: Sequence[Step]) -> dict[int, L.ConditionalLayer]:
    """The steps (by index) that are one conditional layer with a shape-only predicate: the runner picks their
    branch when it binds the input shapes (the planner gives every control-flow layer a step of its own)."""
    decidable = shape_only_conditionals(network)
    return {k: network.layers[step.layers[0]] for k, step in enumerate(steps)
            if len(step.layers) == 1 and step.layers[0] in decidable}


def decided_step(step: kernels.StepLayers, taken: bool, allow_tf32: bool) -> kernels.StepFn:
    """The callable of a step of one conditional layer whose branch is known (`taken`): it runs that branch by
    its plan on the operands and reads no predicate, so nothing waits for the host."""
    [layer] = step.layers
    run = _control_flow(layer, allow_tf32, taken, step.device)
    position = {tid: i for i, tid in enumerate(step.inputs)}
    reads = [position[id(t)] for t in layer.inputs]
    made = {id(t): i for i, t in enumerate(layer.outputs)}
    picks = [made[tid] for tid in step.outputs]

    def fn(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        result = run([xs[i] for i in reads])
        results = [result] if isinstance(result, torch.Tensor) else result
        return [results[i] for i in picks]

    return fn


def decided_only(network: Network) -> bool:
    """Whether every control-flow layer of `network`, and of its branches in turn, is a conditional with a
    shape-only predicate: what the runner can decide before it runs (and capture)."""
    decidable = shape_only_conditionals(network)
    return all(j in decidable and decided_only(layer.then_branch) and decided_only(layer.else_branch)
               for j, layer in enumerate(network.layers) if layer.SUBNETWORKS)


kernels.LAYER_KERNELS.update({kind: lambda layer, ws, allow_tf32: _control_flow(layer, allow_tf32)
                              for kind in (L.ConditionalLayer, L.LoopLayer)})
