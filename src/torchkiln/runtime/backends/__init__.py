"""The backend registry: a backend turns (network, device, options) into a Runner that computes the network.

- `reference` — the reference executor (ATen, any device): every layer's meaning, layer by layer.
- `cuda` — CUDA only: fused library calls (cuDNN, cuBLAS, SDPA through ATen), generated pointwise kernels,
  channels-last convolutions, and one CUDA graph per input shape (runtime/backends/cuda/).
- `onnxruntime` — CPU only: maximal runs of layers that ONNX expresses become ONNX Runtime sessions; the
  layers it cannot express run on the reference meanings inside the same call, in order.

A backend lowers a network to a plan for a device (runtime/plan.py) and runs plans. An engine records the
name of its backend, its options and its plans in its bytes; `make_runner` builds the runner of a plan when the
engine first runs on a device. A backend that cannot run here (onnxruntime not installed, a session
ONNX Runtime refuses) logs one warning and the engine runs on the reference backend.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Protocol

import torch

from torchkiln.ir.network import Network
from torchkiln.runtime.executor import ReferenceExecutor
from torchkiln.runtime.plan import Kernel, Plan, Target, one_step_per_layer, target_here

logger = logging.getLogger(__name__)

MAX_THREADS = 1024
MAX_TIMING_ITERATIONS = 10_000
_warned: set[str] = set()


class BackendUnavailable(Exception):
    """A backend cannot run a network here (its library is missing, or it refused the network)."""


class Runner(Protocol):
    """A network bound to one device and backend, ready to run."""

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The network's outputs for `inputs` (checked by the engine); never aliasing an input or a weight
        unless the reference executor's would."""


@dataclasses.dataclass(frozen=True)
class BackendOptions:
    """What a backend may be tuned with; stored in the engine's bytes."""

    ort_threads: int = 0  # ONNX Runtime's intra-op threads; 0: torch.get_num_threads() where the engine runs
    allow_tf32: bool = False  # cuda: fp32 convolutions and matrix multiplies may use TF32 (10-bit mantissa)
    timing_iterations: int = 10  # cuda: runs averaged per tactic when the build times them; 0: no timing
    cuda_graphs: bool = True  # cuda: replay each input shape's launches as one CUDA graph

    def __post_init__(self) -> None:
        if isinstance(self.ort_threads, bool) or not isinstance(self.ort_threads, int) \
                or not 0 <= self.ort_threads <= MAX_THREADS:
            raise ValueError(f"ort_threads must be an int in [0, {MAX_THREADS}] (0: torch.get_num_threads()), "
                             f"got {self.ort_threads!r}")
        if isinstance(self.timing_iterations, bool) or not isinstance(self.timing_iterations, int) \
                or not 0 <= self.timing_iterations <= MAX_TIMING_ITERATIONS:
            raise ValueError(f"timing_iterations must be an int in [0, {MAX_TIMING_ITERATIONS}], got "
                             f"{self.timing_iterations!r}")
        for name in ("allow_tf32", "cuda_graphs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> BackendOptions:
        """Options read from engine metadata (absent keys take their defaults); ValueError if one is bad."""
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})


@dataclasses.dataclass(frozen=True)
class Backend:
    """A registry row: the device kinds a backend runs on, how it lowers a network to its plan for a device
    (at build time, or on load where no stored plan fits this machine), and how it runs a plan."""

    devices: frozenset[str]
    target: Callable[[torch.device], Target]  # what a plan made here is for; a stored plan fits if equal
    plan: Callable[[Network, torch.device, BackendOptions], Plan]
    runner: Callable[[Network, Plan, torch.device, BackendOptions], Runner]


def _reference_target(device: torch.device) -> Target:
    return target_here("reference", device)


def _reference_plan(network: Network, device: torch.device, options: BackendOptions) -> Plan:
    kernels, steps = one_step_per_layer(network, lambda layer: Kernel("aten", layer.KIND))
    return Plan(_reference_target(device), kernels, steps)


def _reference_runner(network: Network, plan: Plan, device: torch.device, options: BackendOptions) -> Runner:
    return ReferenceExecutor(network, device)


def _onnxruntime_target(device: torch.device) -> Target:
    from torchkiln.runtime.backends.onnxruntime import target

    return target(device)


def _onnxruntime_plan(network: Network, device: torch.device, options: BackendOptions) -> Plan:
    from torchkiln.runtime.backends.onnxruntime import make_plan

    return make_plan(network, device)


def _onnxruntime_runner(network: Network, plan: Plan, device: torch.device, options: BackendOptions) -> Runner:
    from torchkiln.runtime.backends.onnxruntime import OrtRunner

    return OrtRunner(network, plan, device, options)


def _cuda_target(device: torch.device) -> Target:
    from torchkiln.runtime.backends.cuda.planner import target

    return target(device)


def _cuda_plan(network: Network, device: torch.device, options: BackendOptions) -> Plan:
    from torchkiln.runtime.backends.cuda.planner import make_plan as plan

    return plan(network, device, options)


def _cuda_runner(network: Network, plan: Plan, device: torch.device, options: BackendOptions) -> Runner:
    from torchkiln.runtime.backends.cuda.runner import CudaRunner

    return CudaRunner(network, plan, device, options)


BACKENDS: dict[str, Backend] = {
    "reference": Backend(frozenset({"cpu", "cuda"}), _reference_target, _reference_plan, _reference_runner),
    "onnxruntime": Backend(frozenset({"cpu"}), _onnxruntime_target, _onnxruntime_plan, _onnxruntime_runner),
    "cuda": Backend(frozenset({"cuda"}), _cuda_target, _cuda_plan, _cuda_runner),
}


def runs_on(backend: str, device_type: str) -> bool:
    return backend in BACKENDS and device_type in BACKENDS[backend].devices


def target_of(backend: str, device: torch.device) -> Target:
    """The target a plan of `backend` made on `device` now would have; BackendUnavailable if it cannot run."""
    return BACKENDS[backend].target(device)


def make_plan(backend: str, network: Network, device: torch.device, options: BackendOptions) -> Plan:
    """`backend`'s plan of `network` for `device`; BackendUnavailable where that backend cannot run here."""
    return BACKENDS[backend].plan(network, device, options)


def make_runner(backend: str, network: Network, plan: Plan | None, device: torch.device, options: BackendOptions,
                engine: str = "engine") -> Runner:
    """The runner of `plan` (None: the backend could not plan here), or (with a warning naming `engine` and the
    cause) the reference one where that backend cannot run here."""
    if backend != "reference" and plan is not None:
        try:
            return BACKENDS[backend].runner(network, plan, device, options)
        except BackendUnavailable as e:
            warn_unavailable(backend, engine, e)
    return _reference_runner(network, _reference_plan(network, device, options), device, options)


def warn_unavailable(backend: str, engine: str, error: Exception) -> None:
    """Log once per cause (a missing library is one warning, not one per engine) that an engine runs on the
    reference backend instead of `backend`."""
    if str(error) not in _warned:
        _warned.add(str(error))
        logger.warning("the %s backend cannot run here, so engine %r (and any other engine it cannot run for this "
                       "reason) runs on the reference backend: %s", backend, engine, error)
