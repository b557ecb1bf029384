"""The reference executor: runs a network's layers in order with ATen, on any device.

The plan is made once per device: weights moved there, every tensor given a slot, and each
intermediate freed right after its last reader.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import MEANINGS, Meaning, conditional, loop
from torchkiln.runtime.symbols import SymbolBinder

# Layers whose output may share memory with their input (views and no-op casts).
_MAY_ALIAS = (L.IdentityLayer, L.ShuffleLayer, L.SliceLayer, L.ExpandLayer, L.CastLayer, L.ConstantLayer)


def _convolution_in_true_fp32(layer: L.ConvolutionLayer, xs: list[torch.Tensor], ws: dict[str, torch.Tensor],
                               device: torch.device) -> torch.Tensor:
    """The convolution meaning, with TF32 refused for this call alone.

    cuDNN computes fp32 convolutions in TF32 (10-bit mantissa) while `torch.backends.cudnn.allow_tf32` is
    True, torch's default. That flag, and the newer `torch.backends.cudnn.conv.fp32_precision`, are
    process-wide: setting them while an engine runs would change the user's own convolutions in other
    threads, and restoring them would undo a change the user made meanwhile. aten::_convolution takes the
    permission as an argument instead, so an engine's fp32 convolutions are true fp32 and no flag is
    touched. The other cuDNN flags are read, never written, as torch.convolution reads them.
    (Measured on an H100 with torch 2.11 and the flag at its default: 1.2e-6 relative error against fp64
    this way, 2.7e-4 through torch.convolution.) Matrix multiplies have no such argument: they follow
    torch.backends.cuda.matmul's precision, true fp32 by default; a user who allows TF32 there (a
    process-wide choice) gets it in eager and engines alike.
    """
    return convolve(layer, xs[0], ws["kernel"], ws.get("bias"), allow_tf32=False)


def convolve(layer: L.ConvolutionLayer, x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor | None,
             allow_tf32: bool) -> torch.Tensor:
    """The convolution of `layer` with TF32 permission given for this call alone (see above)."""
    nd = kernel.dim() - 2
    cudnn = torch.backends.cudnn
    return torch._convolution(
        x, kernel, bias, list(layer.stride), list(layer.padding), list(layer.dilation), layer.transposed,
        list(layer.output_padding) or [0] * nd, layer.groups, cudnn.benchmark,
        cudnn.deterministic or torch.are_deterministic_algorithms_enabled(), cudnn.enabled,
        allow_tf32 and kernel.dtype == torch.float32)


# Kernels that replace a layer's reference meaning in the executor (each computes the same values).
KERNELS: dict[type[L.Layer], Meaning] = {L.ConvolutionLayer: _convolution_in_true_fp32}


def _control_flow(layer: L.Layer, device: torch.device) -> Meaning:
    """A conditional or loop layer's meaning with its sub-networks run by executors of their own (weights placed
    once, convolutions in true fp32), made at first use."""
    executors: dict[int, ReferenceExecutor] = {}  # by id of a sub-network the layer holds (alive while it is)

    def run(network: Network, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        found = executors.get(id(network))
        if found is None:
            found = executors[id(network)] = ReferenceExecutor(network, device, sub_network=True)
        return found.run(inputs)

    if isinstance(layer, L.ConditionalLayer):
        return lambda layer, xs, ws, device: conditional(layer, xs, run)
    return lambda layer, xs, ws, device: loop(layer, xs, run, device)


class ReferenceExecutor:
    """A network bound to one device, ready to run."""

    def __init__(self, network: Network, device: torch.device, sub_network: bool = False) -> None:
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
        for step, layer in enumerate(network.layers):  # an output nothing reads is freed where it is made
            for t in layer.outputs:
                last_reader.setdefault(slot[id(t)], step)
        kept = {slot[id(t)] for t in network.outputs}
        frees: list[list[int]] = [[] for _ in network.layers]
        for s, step in last_reader.items():
            if s not in kept:
                frees[step].append(s)
        self.steps = []
        for step, layer in enumerate(network.layers):
            weights = {k: w.to(device) for k, w in layer.weights.items()}
            fn = _control_flow(layer, device) if layer.SUBNETWORKS else KERNELS.get(type(layer), MEANINGS[type(layer)])
            self.steps.append((fn, layer, weights,
                               [slot[id(t)] for t in layer.inputs], [slot[id(t)] for t in layer.outputs],
                               frees[step]))
        self._weights = {id(layer): weights for _, layer, weights, *_ in self.steps}
        self.output_slots = [slot[id(t)] for t in network.outputs]
        self.clone_output = [may_alias_storage(t) for t in network.outputs]
        # dynamic shapes: binds symbols per input signature. A sub-network has none to bind (conversion refuses
        # symbolic parameters there), and its input dims may be expressions that only the outer network binds.
        self.binder = None if sub_network else SymbolBinder.for_network(network)

    def weights(self, layer: L.Layer) -> dict[str, torch.Tensor]:
        """`layer`'s weights as this executor placed them on its device."""
        return self._weights[id(layer)]

    def run(self, inputs: list[torch.Tensor],
            visit: Callable[[L.Layer, list[torch.Tensor]], None] | None = None) -> list[torch.Tensor]:
        """The network's outputs; `visit(layer, its outputs)` is called after each layer (layer-wise debugging)."""
        values = self._run(inputs, visit)
        return [values[s].clone() if clone else values[s]
                for s, clone in zip(self.output_slots, self.clone_output)]

    def _run(self, inputs: list[torch.Tensor],
             visit: Callable[[L.Layer, list[torch.Tensor]], None] | None) -> list[torch.Tensor | None]:
        values: list[torch.Tensor | None] = [None] * self.num_slots
        values[: self.num_inputs] = inputs
        device = self.device
        binder = self.binder
        steps = self.steps if binder is None else binder.steps_for(inputs, self.steps)
        bindings = binder.bind([tuple(x.shape) for x in inputs]) if binder is not None and binder.defines else None
        for fn, layer, weights, ins, outs, frees in steps:
            if bindings is not None:  # data-dependent sizes: bound as their layers run
                layer = binder.late_layer(layer, bindings)
            result = fn(layer, [values[i] for i in ins], weights, device)
            if isinstance(result, torch.Tensor):
                values[outs[0]] = result
            else:
                for i, r in zip(outs, result):
                    values[i] = r
            if bindings is not None:
                binder.bind_defined(layer, [values[i] for i in outs], bindings)
            if visit is not None:
                visit(layer, [values[i] for i in outs])
            for i in frees:
                values[i] = None
        return values


def may_alias_storage(tensor) -> bool:
    """Whether an output may share memory with an engine input or a weight (then it is copied)."""
    while tensor.producer is not None:
        if not isinstance(tensor.producer, _MAY_ALIAS):
            return False
        if isinstance(tensor.producer, L.ConstantLayer):
            return True
        tensor = tensor.producer.inputs[0]
    return True
