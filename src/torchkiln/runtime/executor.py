"""The reference executor: runs a network's layers in order with ATen, on any device.

The plan is made once per device: weights moved there, every tensor given a slot, and each
intermediate freed right after its last reader.
"""
from __future__ import annotations

import threading

import torch

from torchkiln.network import layers as L
from torchkiln.network.network import Network
from torchkiln.runtime.reference import MEANINGS
from torchkiln.runtime.symbols import SymbolBinder

# Layers whose output may share memory with their input (views and no-op casts).
_MAY_ALIAS = (L.IdentityLayer, L.ShuffleLayer, L.SliceLayer, L.ExpandLayer, L.CastLayer, L.ConstantLayer)


class ReferenceExecutor:
    """A network bound to one device, ready to run."""

    def __init__(self, network: Network, device: torch.device) -> None:
        self.device = device
        slot: dict[int, int] = {id(t): i for i, t in enumerate(network.inputs)}
        for layer in network.layers:
            for t in layer.outputs:
                slot[id(t)] = len(slot)
        self.num_slots = len(slot)
        self.num_inputs = len(network.inputs)
        last_reader: dict[int, int] = {}
        for step, layer in enumerate(network.layers):
            for t in layer.inputs:
                last_reader[slot[id(t)]] = step
        kept = {slot[id(t)] for t in network.outputs}
        frees: list[list[int]] = [[] for _ in network.layers]
        for s, step in last_reader.items():
            if s not in kept:
                frees[step].append(s)
        self.steps = []
        for step, layer in enumerate(network.layers):
            weights = {k: w.to(device) for k, w in layer.weights.items()}
            self.steps.append((MEANINGS[type(layer)], layer, weights,
                               [slot[id(t)] for t in layer.inputs], [slot[id(t)] for t in layer.outputs],
                               frees[step]))
        self.output_slots = [slot[id(t)] for t in network.outputs]
        self.clone_output = [_may_alias_storage(t) for t in network.outputs]
        self.binder = SymbolBinder.for_network(network)  # dynamic shapes: binds symbols per input signature

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if self.device.type == "cuda":
            with CUDNN_WITHOUT_TF32:
                return self._run(inputs)
        return self._run(inputs)

    def _run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        values: list[torch.Tensor | None] = [None] * self.num_slots
        values[: self.num_inputs] = inputs
        device = self.device
        steps = self.steps if self.binder is None else self.binder.steps_for(inputs, self.steps)
        for fn, layer, weights, ins, outs, frees in steps:
            result = fn(layer, [values[i] for i in ins], weights, device)
            if isinstance(result, torch.Tensor):
                values[outs[0]] = result
            else:
                for i, r in zip(outs, result):
                    values[i] = r
            for i in frees:
                values[i] = None
        return [values[s].clone() if clone else values[s]
                for s, clone in zip(self.output_slots, self.clone_output)]


class _CudnnWithoutTF32:
    """fp32 layers compute in true fp32: cuDNN would otherwise use TF32 for convolutions. The flag is global,
    so it is cleared when the first engine run starts and the user's value comes back when the last one ends
    (engines may run in several threads at once)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._saved = False

    def __enter__(self) -> None:
        with self._lock:
            if self._running == 0:
                self._saved = torch.backends.cudnn.allow_tf32
                torch.backends.cudnn.allow_tf32 = False
            self._running += 1

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                torch.backends.cudnn.allow_tf32 = self._saved


CUDNN_WITHOUT_TF32 = _CudnnWithoutTF32()


def _may_alias_storage(tensor) -> bool:
    """Whether an output may share memory with an engine input or a weight (then it is copied)."""
    while tensor.producer is not None:
        if not isinstance(tensor.producer, _MAY_ALIAS):
            return False
        if isinstance(tensor.producer, L.ConstantLayer):
            return True
        tensor = tensor.producer.inputs[0]
    return True
