"""The generated-product tactic: whether a convolution or matrix product and the pointwise layers after it run as one
generated Triton kernel (a GEMM, codegen/gemm.py; a depthwise convolution, codegen/depthwise.py), and in which tile
configuration.

The library path (cuBLAS or cuDNN for the product, in the layout the planner chose, then the generated pointwise
kernel) and each candidate tile configuration run as the runner would run them (the kernel makers of `kernels.py`,
replayed from a CUDA graph) at the opt shapes; the fastest wins, and the choice is kept in the timing cache under
the product's shapes and the epilogue's generated source. A depthwise convolution's input is sampled channels-last
(as the convolution stack around it makes it), so a library step planned NCHW pays its input conversion, and its
output's where a convolution reads it. Without timing (or off a GPU) the library path is kept.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime.backends.base import BackendOptions
from torchkiln.runtime.backends.cuda import quant_kernels, timing
from torchkiln.runtime.backends.cuda.codegen import depthwise, gemm, multiprocessors, quantized_conv
from torchkiln.runtime.backends.cuda.kernels import StepLayers, epilogue_inputs, make_step
from torchkiln.runtime.backends.cuda.runner import placed_weight
from torchkiln.runtime.plan import Kernel

logger = logging.getLogger(__name__)

Group = tuple[Kernel, list[int]]
GENERATORS = {"gemm": gemm, "depthwise": depthwise}  # Request.kind -> its codegen module


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


@dataclasses.dataclass(frozen=True)
class Request:
    """A product (layer index), the pointwise layers of its epilogue, the library steps that compute the same, the
    generated kernel's kind ("gemm", "depthwise", "quantized_gemm" or "quantized_conv", a row of the kernel table),
    and the layers before the product that the generated step takes in (a quantized product's dequantize layers and
    weight)."""

    product: int
    epilogue: tuple[int, ...]
    library: tuple[Group, ...]
    kind: str = "gemm"
    prologue: tuple[int, ...] = ()

    @property
    def members(self) -> list[int]:
        """The generated step's layers, in the network's order."""
        return [*sorted((*self.prologue, self.product)), *self.epilogue]


def choose(network: Network, requests: Sequence[Request], readers: dict[int, list[L.Layer]], returned: set[int],
           device: torch.device, options: BackendOptions, cache: timing.TimingCache) -> list[str | None]:
    """For each request, the tile configuration (`Config.text()`) of the fastest generated kernel, or None where the
    library steps are as fast (or nothing is timed). Every candidate kernel is compiled first, several at once
    (`timing.first_calls`), then each is timed alone; requests of one key (a block repeated at one shape) are timed
    once."""
    if options.timing_iterations == 0 or device.type != "cuda":
        return [None] * len(requests)
    results: list[str | None] = [None] * len(requests)
    pending = []
    same: dict[str, list[int]] = {}  # key -> the later requests of that key
    for i, request in enumerate(requests):
        key, inputs, configs = _describe(network, request, readers, returned, device)
        found = cache.get(key)
        if found is not None:
            results[i] = found or None
            continue
        if key in same:
            same[key].append(i)
            continue
        same[key] = []
        values = {id(t): _sample(t, timing.opt_shape(t.shape), device, _channels_last_sample(network, request, t))
                  for t in inputs}
        runs = {"library": _steps(network, request.library, values, readers, returned, device, options,
                                  _converts_output(network, request, readers))}
        for config in configs:
            kernel = Kernel("generated", request.kind, (("config", config.text()),))
            runs[config.text()] = _steps(network, [(kernel, request.members)], values, readers, returned, device,
                                         options)
        pending.append((i, key, runs))
    calls = [run for _, _, runs in pending for run in runs.values()]
    failed = {id(run): error for run, error in zip(calls, timing.first_calls(calls)) if error}
    for i, key, runs in pending:
        layer = network.layers[requests[i].product]
        times = {}
        for name, run in runs.items():
            if id(run) in failed:  # a configuration Triton cannot build here (its shared memory, say)
                logger.debug("%s tactic %s refused for %s: %s", requests[i].kind, name, layer.name, failed[id(run)])
                continue
            with torch.no_grad():
                times[name] = timing.time_graphed_ms(run, options.timing_iterations)
        choice = min(times, key=times.get) if times else "library"
        logger.debug("tactic for %s (%s + %d epilogue layers): %s -> %s", layer.name, requests[i].kind,
                     len(requests[i].epilogue), {c: round(t * 1e3, 1) for c, t in times.items()}, choice)
        cache.put(key, "" if choice == "library" else choice)
        for k in (i, *same[key]):
            results[k] = None if choice == "library" else choice
    return results


def _describe(network: Network, request: Request, readers: dict[int, list[L.Layer]], returned: set[int],
              device: torch.device) -> tuple[str, list[Tensor], list[gemm.Config | depthwise.Config]]:
    """The request's timing-cache key, the merged step's inputs, and the configurations to time. The key holds the
    generated source (a depthwise convolution's holds its window, stride, padding and dilation; a quantized one's
    are added), the library steps' kernel rows (their layout) and the candidates."""
    inputs, outputs = group_io(network, request.members, readers, returned)
    layer = network.layers[request.product]
    rest = [network.layers[j] for j in request.epilogue]
    if request.kind in (quant_kernels.GENERATED_OP, quant_kernels.GENERATED_CONV_OP):
        generated = quant_kernels.generated_kernel([network.layers[j] for j in request.members],
                                                   [id(t) for t in inputs], outputs)[0]
        source = generated.source + (generated.described_source or "")
    else:
        source = GENERATORS[request.kind].generate(layer, rest, epilogue_inputs(layer, rest, [id(t) for t in inputs]),
                                                   outputs).source
    weight = layer.weights.get("kernel")
    key = [torch.cuda.get_device_name(device), torch.__version__, _triton_version(), request.kind,
           hashlib.sha256(source.encode()).hexdigest()[:24], [list(timing.opt_shape(t.shape)) for t in inputs],
           [str(t.dtype) for t in inputs], None if weight is None else list(weight.shape)]
    out, x = timing.opt_shape(layer.outputs[0].shape), timing.opt_shape(layer.inputs[0].shape)
    if request.kind == "depthwise":
        key.append([[k.op, [list(o) for o in k.tactic]] for k, _ in request.library])
        configs = depthwise.candidates(*out)
    elif request.kind == quant_kernels.GENERATED_CONV_OP:
        kernel = layer.weights["kernel"]
        key.append([list(layer.stride), list(layer.padding), list(layer.dilation)])  # (launch constants, not source)
        configs = quantized_conv.candidates(out[0] * out[2] * out[3], out[1], math.prod(kernel.shape[1:]),
                                            kernel.shape[1], multiprocessors(device),
                                            pointwise=gemm.pointwise_conv(layer) is None)
    else:
        conv = isinstance(layer, L.ConvolutionLayer)
        n = out[1] if conv else out[-1]
        m, k = math.prod(out) // max(n, 1), x[1] if conv else x[-1]
        configs = gemm.quantized_candidates(m, n, k) if request.kind == quant_kernels.GENERATED_OP else \
            gemm.candidates(m, n, k, multiprocessors(device))
    key.append([c.text() for c in configs])  # a choice made among other candidates is made again
    return json.dumps(key), inputs, configs


def _triton_version() -> str:
    import triton

    return triton.__version__


def _channels_last_sample(network: Network, request: Request, t: Tensor) -> bool:
    """Whether `t` is sampled channels-last for timing, as the convolution stack around the request makes it: a
    depthwise convolution's input, and every 4-D input of a quantized convolution's step (its input, a residual its
    epilogue adds: sampled NCHW, the residual's strided reads timed a 1x1 convolution of [32,64,56,56] with its add
    at 199 us, channels-last at 70, H200)."""
    layer = network.layers[request.product]
    if request.kind == "depthwise":
        return t is layer.inputs[0]
    return request.kind == quant_kernels.GENERATED_CONV_OP and t.rank == 4


def _sample(t: Tensor, shape: tuple[int, ...], device: torch.device, channels_last: bool = False) -> torch.Tensor:
    """A value of `t`'s dtype at `shape` for timing (channels-last if asked)."""
    if not t.dtype.is_floating_point:
        value = torch.ones(shape, device=device, dtype=t.dtype)
    else:
        value = torch.randn(shape, device=device).to(t.dtype)
    return value.contiguous(memory_format=torch.channels_last) if channels_last and value.dim() == 4 else value


def _converts_output(network: Network, request: Request, readers: dict[int, list[L.Layer]]) -> bool:
    """Whether the library steps of a depthwise request run NCHW and a convolution reads what they make: then a
    channels-last copy of it follows them (the reading convolution's, timed here as the planner's layout choice
    counts it), where the generated kernel writes channels-last."""
    if request.kind != "depthwise" or any(k.option("channels_last") is not False for k, _ in request.library):
        return False
    made = [t for j in (request.product, *request.epilogue) for t in network.layers[j].outputs]
    return any(isinstance(r, L.ConvolutionLayer) for t in made for r in readers.get(id(t), []))


def _steps(network: Network, steps: Sequence[Group], values: dict[int, torch.Tensor],
           readers: dict[int, list[L.Layer]], returned: set[int], device: torch.device,
           options: BackendOptions, channels_last_out: bool = False) -> Callable[[], None]:
    """The steps, run in order on `values` (tensor id -> value), as one callable; with `channels_last_out`, each
    step's 4-D outputs are copied channels-last after it."""
    fns: list[tuple[Callable, list[int], list[int]]] = []
    for kernel, members in steps:
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
            made = fn([env[i] for i in ins])
            if channels_last_out:
                made = [o.contiguous(memory_format=torch.channels_last) if o.dim() == 4 else o for o in made]
            env.update(zip(outs, made))

    return run
