"""Ceilings on what an engine may plan: the memory it holds at once and the FLOPs of one call.

Both are counted on shapes alone, at the largest shape of every dynamic dim, layer by layer in run order, so a
hostile engine is refused at the layer that goes over, before anything is allocated or computed:

- memory: the weights (each tensor once), plus at each layer the intermediate tensors live there (made, and
  read by this layer or a later one, or returned) and the layer's own workspace (`ir/cost.py`). Network inputs
  are the caller's and are not counted; a constant layer's output is a weight.
- compute: the sum of every layer's FLOPs (`ir/cost.py`).

The ceilings are the arguments of `Engine.deserialize`, else the environment (TORCHKILN_MAX_ENGINE_MEMORY in
bytes, TORCHKILN_MAX_ENGINE_FLOPS), else scaled to the device the engine runs on (see `default_max_memory` and
`default_max_flops`). The builder checks the same ceilings (`check_network`), so compiling an engine its own
loader would refuse fails at compile time, naming the layer.
"""
from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from torchkiln.errors import EngineFormatError
from torchkiln.ir import cost
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network

MEMORY_ENV = "TORCHKILN_MAX_ENGINE_MEMORY"
FLOPS_ENV = "TORCHKILN_MAX_ENGINE_FLOPS"
MAX_LAYERS = 1 << 17  # loading checks each layer in ~20-40 us: the largest engine loads in a few seconds
CPU_MEMORY_SHARE = 0.5  # of the RAM the process may use: the engine's bytes and the caller's copies need the rest
GPU_MEMORY_SHARE = 0.9  # of the GPU's memory: the CUDA context and library workspaces need the rest
CPU_CORE_FLOPS = 5e10  # FLOP/s of one x86 core in float32 GEMMs (AVX2 FMA at ~3 GHz, most of its peak)
GPU_SM_FLOPS = 5e12  # FLOP/s of one streaming multiprocessor of a current data-center GPU (tensor cores)
COMPUTE_SECONDS = 60  # the default compute ceiling: about a minute of the device's peak per call


@functools.cache
def cpu_memory() -> int:
    """Bytes of RAM this process may use: the machine's, or its cgroup's limit where lower (8 GiB where the
    platform does not say, which makes the default ceiling the 4 GiB it was before it scaled)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        total = 8 << 30
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _gpu() -> Any:
    """The current GPU's properties, or None without CUDA."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()) if torch.cuda.is_available() else None


def default_max_memory(device_type: str) -> int:
    """Half the RAM the process may use; for a CUDA engine, 90% of the current GPU's memory (the CPU's rule
    where there is no GPU: nothing runs there then)."""
    gpu = _gpu() if device_type == "cuda" else None
    if gpu is not None:
        return int(GPU_MEMORY_SHARE * gpu.total_memory)
    return int(CPU_MEMORY_SHARE * cpu_memory())


def default_max_flops(device_type: str) -> int:
    """COMPUTE_SECONDS of the device's rough peak: CPU_CORE_FLOPS per core the process may use, or for a CUDA
    engine GPU_SM_FLOPS per multiprocessor of the current GPU."""
    gpu = _gpu() if device_type == "cuda" else None
    rate = GPU_SM_FLOPS * gpu.multi_processor_count if gpu is not None else CPU_CORE_FLOPS * cpu_cores()
    return int(COMPUTE_SECONDS * rate)


def _ceiling(value: int | None, env: str, what: str, default: Callable[[], int]) -> int:
    """The argument, else the environment variable (an int, or a float such as 1e13), else the default."""
    if value is None:
        raw = os.environ.get(env)
        if raw is None:
            return default()
        try:
            value = int(raw)
        except ValueError:
            try:
                number = float(raw)
            except ValueError:
                number = math.nan
            if not (math.isfinite(number) and number >= 0):
                raise ValueError(f"{env}={raw!r} is not a number of {what}") from None
            value = int(number)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"the ceiling on {what} must be a non-negative int, got {value!r}")
    return value


def max_engine_memory(max_memory: int | None = None, device_type: str = "cpu") -> int:
    """The ceiling on the bytes an engine may plan: the argument, else TORCHKILN_MAX_ENGINE_MEMORY, else
    `default_max_memory(device_type)`."""
    return _ceiling(max_memory, MEMORY_ENV, "bytes", lambda: default_max_memory(device_type))


def max_engine_flops(max_flops: int | None = None, device_type: str = "cpu") -> int:
    """The ceiling on one call's FLOPs: the argument, else TORCHKILN_MAX_ENGINE_FLOPS, else
    `default_max_flops(device_type)`."""
    return _ceiling(max_flops, FLOPS_ENV, "FLOPs", lambda: default_max_flops(device_type))


def last_readers(layer_inputs: Iterable[Iterable[str]]) -> dict[str, int]:
    """Tensor name -> index of the last layer that reads it, from each layer's input names in run order."""
    last: dict[str, int] = {}
    for i, names in enumerate(layer_inputs):
        for name in names:
            last[name] = i
    return last


class Budget:
    """An engine's planned memory and FLOPs, its layers added in run order; `add` raises EngineFormatError
    naming the layer where either goes over its ceiling."""

    def __init__(self, max_memory: int, max_flops: int, last_reader: Mapping[str, int], kept: Iterable[str]):
        self.max_memory, self.max_flops = max_memory, max_flops
        self.frees: dict[int, list[str]] = {}
        for name, i in last_reader.items():
            self.frees.setdefault(i, []).append(name)
        self.reads = last_reader
        self.kept = set(kept)
        self.live: dict[str, float] = {}
        self.live_bytes = 0.0
        self.weights: set[int] = set()
        self.weight_bytes = 0.0
        self.flops = 0.0
        self.peak = 0.0

    def add(self, index: int, layer: L.Layer, where: str) -> None:
        for w in layer.weights.values():
            if id(w) not in self.weights:
                self.weights.add(id(w))
                self.weight_bytes += w.numel() * w.element_size()
        made = [] if isinstance(layer, L.ConstantLayer) else [(t.name, cost.nbytes(t)) for t in layer.outputs]
        for name, n in made:
            self.live[name] = n
            self.live_bytes += n
        workspace = cost.workspace_bytes(layer)
        need = self.weight_bytes + self.live_bytes + workspace
        self.peak = max(self.peak, need)
        if not need <= self.max_memory:  # NaN or inf is over too
            raise EngineFormatError(
                f"{where}: the engine plans {_count(need)} bytes at this layer (weights {_count(self.weight_bytes)}, "
                f"live tensors {_count(self.live_bytes)}, the layer's workspace {_count(workspace)}), over the "
                f"{self.max_memory}-byte limit (raise it with Engine.deserialize(max_memory=...) or {MEMORY_ENV})")
        self.flops += cost.flops(layer)
        if not self.flops <= self.max_flops:
            raise EngineFormatError(
                f"{where}: the engine plans {self.flops:.3g} FLOPs per call by this layer, over the limit of "
                f"{self.max_flops:.3g} (raise it with Engine.deserialize(max_flops=...) or {FLOPS_ENV})")
        done = self.frees.pop(index, []) + [name for name, _ in made if name not in self.reads]
        for name in done:
            if name not in self.kept and name in self.live:
                self.live_bytes -= self.live.pop(name)


def _count(n: float) -> str:
    return str(int(n)) if math.isfinite(n) else str(n)


def check_network(network: Network, device_type: str, max_memory: int | None = None,
                  max_flops: int | None = None) -> Budget:
    """Raise EngineFormatError where loading an engine of `network` would refuse it (too many layers, or over
    the memory or FLOPs ceiling of its device here); else return its budget (peak bytes, FLOPs)."""
    if len(network.layers) > MAX_LAYERS:
        raise EngineFormatError(f"network {network.name!r} has {len(network.layers)} layers; an engine holds at "
                                f"most {MAX_LAYERS}")
    budget = Budget(max_engine_memory(max_memory, device_type), max_engine_flops(max_flops, device_type),
                    last_readers([t.name for t in layer.inputs] for layer in network.layers),
                    [t.name for t in network.outputs])
    for i, layer in enumerate(network.layers):
        budget.add(i, layer, f"network {network.name!r} layer {i} ({layer.KIND} {layer.name[:60]!r})")
    return budget
