"""Conditional and loop layers on the CUDA backend: the layer's meaning (`ir/reference.py`), with each branch or
body run by its own CUDA plan (made for the sub-network at its first call on a device, its steps bound per input
shape), not layer by layer. The predicate and the loop's condition are read on the host, so an engine holding
control flow runs its steps one by one: no CUDA graph is captured for it (`runner.captures_graphs`)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import conditional, loop
from torchkiln.runtime.backends.base import BackendOptions
from torchkiln.runtime.backends.cuda import kernels


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


def _control_flow(layer: L.Layer, ws: kernels.Weights, allow_tf32: bool) -> Callable[[list[torch.Tensor]], object]:
    plans = SubnetworkPlans(allow_tf32)

    def run(xs: list[torch.Tensor]) -> object:
        device = xs[0].device
        run_sub = lambda network, inputs: plans.run(network, inputs, device)  # noqa: E731
        return conditional(layer, xs, run_sub) if isinstance(layer, L.ConditionalLayer) else \
            loop(layer, xs, run_sub, device)

    return run


kernels.LAYER_KERNELS.update({L.ConditionalLayer: _control_flow, L.LoopLayer: _control_flow})
