"""The generated-GEMM tactic: whether a matrix product and the pointwise layers after it run as one generated Triton
GEMM (codegen/gemm.py), and in which tile configuration.

The library path (cuBLAS or cuDNN for the product, then the generated pointwise kernel) and each candidate tile
configuration run as the runner would run them (the kernel makers of `kernels.py`, replayed from a CUDA graph) at
the opt shapes; the fastest wins, and the choice is kept in the timing cache under the product's shapes and the
epilogue's generated source. Without timing (or off a GPU) the library path is kept.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends import BackendOptions
from torchkiln.runtime.backends.cuda import timing
from torchkiln.runtime.backends.cuda.codegen.gemm import candidates, generate
from torchkiln.runtime.backends.cuda.kernels import StepLayers, make_step
from torchkiln.runtime.backends.cuda.runner import placed_weight
from torchkiln.runtime.plan import Kernel

logger = logging.getLogger(__name__)

Group = tuple[Kernel, list[int]]


def group_io(network: Network, members: Sequence[int], readers: dict[int, list[L.Layer]],
             returned: set[int]) -> tuple[list[Tensor], list[Tensor]]:
    """The tensors a step of `members` reads from outside it (in first-read order) and those it makes that
    others read or the network returns."""
    layers = [network.layers[j] for j in members]
    own = {id(layer) for layer in layers}
    made = {id(t) for layer in layers for t in layer.outputs}
    inputs: list[Tensor] = []
    for layer in layers:
        inputs += [t for t in layer.inputs if id(t) not in made and all(t is not x for x in inputs)]
    outputs = [t for layer in layers for t in layer.outputs
               if id(t) in returned or any(id(r) not in own for r in readers.get(id(t), []))]
    return inputs, outputs


def choose(network: Network, product: int, epilogue: Sequence[int], library: Sequence[Group],
           readers: dict[int, list[L.Layer]], returned: set[int], device: torch.device, options: BackendOptions,
           cache: timing.TimingCache) -> str | None:
    """The tile configuration (`Config.text()`) of the fastest generated GEMM for `product` and its `epilogue`
    layers, or None where the `library` steps (what the planner makes otherwise) are as fast, or nothing is
    timed."""
    if options.timing_iterations == 0 or device.type != "cuda":
        return None
    members = [product, *epilogue]
    inputs, outputs = group_io(network, members, readers, returned)
    layer = network.layers[product]
    rest = [network.layers[j] for j in epilogue]
    made = {id(t) for x in rest for t in x.outputs}
    others = [t for t in inputs if any(t is i for x in rest for i in x.inputs) and id(t) not in made
              and t is not layer.outputs[0]]
    source = generate(layer, rest, others, outputs).source
    shapes = [timing.opt_shape(t.shape) for t in inputs]
    weight = layer.weights.get("kernel")
    key = json.dumps([torch.cuda.get_device_name(device), torch.__version__, _triton_version(), "gemm",
                      hashlib.sha256(source.encode()).hexdigest()[:24], [list(s) for s in shapes],
                      [str(t.dtype) for t in inputs], None if weight is None else list(weight.shape)])
    found = cache.get(key)
    if found is not None:
        return found or None
    values = {id(t): _sample(t, s, device) for t, s in zip(inputs, shapes)}
    times = {"library": _time([(network, k, m) for k, m in library], values, device, options)}
    out, x = timing.opt_shape(layer.outputs[0].shape), timing.opt_shape(layer.inputs[0].shape)
    conv = isinstance(layer, L.ConvolutionLayer)
    n = out[1] if conv else out[-1]
    m, k = math.prod(out) // max(n, 1), x[1] if conv else x[-1]
    for config in candidates(m, n, k):
        try:
            times[config.text()] = _time([(network, Kernel("generated", "gemm", (("config", config.text()),)),
                                           members)], values, device, options)
        except Exception as e:  # noqa: BLE001 - a configuration Triton cannot build here (shared memory) is skipped
            logger.debug("GEMM configuration %s refused for %s: %s", config.text(), layer.name,
                         str(e).splitlines()[0] if str(e) else type(e).__name__)
    choice = min(times, key=times.get)
    logger.debug("tactic for %s (GEMM + %d epilogue layers at %s): %s -> %s", layer.name, len(rest), shapes,
                 {c: round(t * 1e3, 1) for c, t in times.items()}, choice)
    cache.put(key, "" if choice == "library" else choice)
    return None if choice == "library" else choice


def _triton_version() -> str:
    import triton

    return triton.__version__


def _sample(t: Tensor, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """A value of `t`'s dtype at `shape` for timing: the constant itself where a constant layer makes it."""
    if isinstance(t.producer, L.ConstantLayer):
        return t.producer.weights["value"].to(device).reshape(shape)
    if t.dtype.is_floating_point:
        return torch.randn(shape, device=device).to(t.dtype)
    return torch.ones(shape, device=device, dtype=t.dtype)


def _time(steps: Sequence[tuple[Network, Kernel, Sequence[int]]], values: dict[int, torch.Tensor],
          device: torch.device, options: BackendOptions) -> float:
    """Milliseconds of the steps run in order on `values` (tensor id -> value), replayed from a CUDA graph."""
    readers: dict[int, list[L.Layer]] = {}
    fns: list[tuple[Callable, list[int], list[int]]] = []
    network = steps[0][0]
    for layer in network.layers:
        for t in layer.inputs:
            readers.setdefault(id(t), []).append(layer)
    returned = {id(t) for t in network.outputs}
    for _, kernel, members in steps:
        inputs, outputs = group_io(network, members, readers, returned)
        layers = [network.layers[j] for j in members]
        channels_last = bool(kernel.option("channels_last"))
        weights = [{k: placed_weight(w, device, channels_last and k == "kernel") for k, w in layer.weights.items()}
                   for layer in layers]
        own = StepLayers(layers, weights, [id(t) for t in inputs], [id(t) for t in outputs], device)
        fns.append((make_step(own, kernel, options.allow_tf32), [id(t) for t in inputs], [id(t) for t in outputs]))

    def run() -> None:
        env = dict(values)
        for fn, ins, outs in fns:
            env.update(zip(outs, fn([env[i] for i in ins])))

    with torch.no_grad():
        run()  # compiles generated kernels and picks cuDNN's algorithm outside the timed graph
        return timing.time_graphed_ms(run, options.timing_iterations)

