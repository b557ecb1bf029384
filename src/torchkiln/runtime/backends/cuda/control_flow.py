"""Conditional and loop layers on the CUDA backend: the layer's meaning (`ir/reference.py`), with each branch or
body run by its own CUDA plan (made for the sub-network at its first call on a device, its steps bound per input
shape and the outer network's bindings), not layer by layer: the runner makes every step of one such layer here
(`layer_step`).

Where the input shapes alone decide a layer's course (`ir/shape_only.py`: a conditional on `x.size(1) > 64`, a
for loop over `range(x.size(0))` or a constant count), the runner decides it when it binds the input shapes
(`decisions`, `layer_step`): the step runs the taken branch, or the body that many times on iteration tensors
made then, and reads nothing on the host, so a CUDA graph holds it: one graph per input shape, hence per branch
and trip count (a loop of more than `MAX_CAPTURED_TRIPS` iterations runs by its meaning, uncaptured, at that
shape). A predicate or loop condition computed from data is read on the host when the layer runs, so an engine
holding one runs its steps one by one, uncaptured (`runner.captures_graphs`)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import conditional, loop
from torchkiln.ir.shape_only import decided_by_shapes
from torchkiln.ir.symbolic import DimSymbol
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.base import BackendOptions
from torchkiln.runtime.backends.cuda import kernels
from torchkiln.runtime.plan import Step


class SubnetworkPlans:
    """Sub-networks run by their CUDA plans: one plan per (sub-network, device), steps bound per input shapes and
    the outer network's bindings (a sub-network's input dims are expressions of the outer network's symbols, which
    only the outer network binds: `x.flatten()` gives a branch an input of s0*s1 elements)."""

    def __init__(self, allow_tf32: bool) -> None:
        self.allow_tf32 = allow_tf32
        self.plans: dict[tuple[int, torch.device], tuple] = {}
        self.bound: dict[tuple, object] = {}

    def run(self, network: Network, inputs: list[torch.Tensor], device: torch.device,
            bindings: Mapping[DimSymbol, int]) -> list[torch.Tensor]:
        from torchkiln.runtime.backends.cuda.planner import make_plan
        from torchkiln.runtime.backends.cuda.runner import bind_steps, place_weights

        planned = self.plans.get((id(network), device))
        if planned is None:
            plan = make_plan(network, device, BackendOptions(timing_iterations=0))
            planned = self.plans[id(network), device] = (plan, place_weights(network, plan, device))
        shapes = tuple(tuple(x.shape) for x in inputs)
        key = (id(network), device, shapes, tuple(sorted(bindings.items(), key=lambda kv: kv[0].name)))
        bound = self.bound.get(key)
        if bound is None:
            plan, weights = planned
            bound = self.bound[key] = bind_steps(network, plan, weights, None, shapes, device, self.allow_tf32,
                                                 bindings)
        return bound.run_eagerly(inputs)


MAX_CAPTURED_TRIPS = 1024  # a loop of more iterations runs by its meaning, uncaptured: a graph would hold each one

Decision = bool | int  # a conditional's branch (True: then) or a loop's iteration count


def layer_step(step: kernels.StepLayers, decision: Decision | None, bindings: Mapping[DimSymbol, int],
               allow_tf32: bool) -> kernels.StepFn:
    """The callable of a step of one conditional or loop layer: its meaning with each branch or body run by its
    plan. Where `decision` gives its course (a branch, an iteration count: `decisions`), it runs that course and
    reads nothing on the host; else it reads its predicate, trip count and conditions there."""
    [layer] = step.layers
    plans = SubnetworkPlans(allow_tf32)
    device = step.device
    run_sub = lambda network, inputs: plans.run(network, inputs, device, bindings)  # noqa: E731
    iterations = None
    if isinstance(layer, L.LoopLayer) and decision is not None:  # made now: a captured graph cannot copy them in
        iterations = [torch.full((), i, dtype=torch.int64, device=device)
                      for i in range(min(decision, layer.max_trips + 1))]
    position = {tid: i for i, tid in enumerate(step.inputs)}
    reads = [position[id(t)] for t in layer.inputs]
    made = {id(t): i for i, t in enumerate(layer.outputs)}
    picks = [made[tid] for tid in step.outputs]

    def fn(xs: list[torch.Tensor]) -> list[torch.Tensor]:
        ins = [xs[i] for i in reads]
        result = conditional(layer, ins, run_sub, decision) if isinstance(layer, L.ConditionalLayer) else \
            loop(layer, ins, run_sub, device, iterations)
        results = [result] if isinstance(result, torch.Tensor) else result
        return [results[i] for i in picks]

    return fn


def decided_layers(network: Network, steps: Sequence[Step]) -> dict[int, L.Layer]:
    """The steps (by index) that are one control-flow layer whose course the input shapes decide: the runner
    decides them when it binds the input shapes (the planner gives every control-flow layer a step of its own)."""
    decidable = decided_by_shapes(network)
    return {k: network.layers[step.layers[0]] for k, step in enumerate(steps)
            if len(step.layers) == 1 and step.layers[0] in decidable}


def decisions(network: Network, steps: Sequence[Step],
              values: Callable[[list[Tensor]], dict[int, torch.Tensor]]) -> dict[int, Decision]:
    """Each decided step's course at the bound shapes, from `values` (the shape-only tensors' values by id)."""
    found: dict[int, Decision] = {}
    for k, layer in decided_layers(network, steps).items():
        known = values(layer.inputs[:1] if isinstance(layer, L.ConditionalLayer) else layer.inputs[:2])
        if isinstance(layer, L.ConditionalLayer):
            found[k] = bool(known[id(layer.inputs[0])])
            continue
        trips, go = int(known[id(layer.inputs[0])]), bool(known[id(layer.inputs[1])])
        again = bool(layer.body.outputs[0].producer.weights["value"])
        found[k] = 0 if not go or trips <= 0 else trips if again else 1
    return found


def capturable(decision: Decision) -> bool:
    """Whether a step so decided may run decided and be captured: a loop's iterations are each held by the graph
    (and their tensors made at binding), so one of more than MAX_CAPTURED_TRIPS runs by its meaning, uncaptured."""
    return isinstance(decision, bool) or decision <= MAX_CAPTURED_TRIPS


def decided_only(network: Network) -> bool:
    """Whether the input shapes decide the course of every control-flow layer of `network`, and of its branches and
    bodies in turn: what the runner can decide before it runs (and capture)."""
    decidable = decided_by_shapes(network)
    return all(j in decidable and all(decided_only(getattr(layer, field)) for field in layer.SUBNETWORKS)
               for j, layer in enumerate(network.layers) if layer.SUBNETWORKS)
