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

The backends a user can name, with their devices and docs, are `settings_table.ENGINE_BACKENDS` (the command
line reads them before torch is imported); this registry implements exactly those. What backends share (their
options, the runner protocol, BackendUnavailable) is in `base.py`, which they import instead of this module.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.backends.base import BackendOptions, BackendUnavailable, Runner, SessionModels
from torchkiln.runtime.executor import ReferenceExecutor
from torchkiln.runtime.plan import Kernel, Plan, Target, one_step_per_layer, target_here
from torchkiln.settings_table import ENGINE_BACKENDS

logger = logging.getLogger(__name__)

_warned: set[str] = set()


@dataclasses.dataclass(frozen=True)
class Backend:
    """A registry row: the device kinds a backend runs on, how it lowers a network to its plan for a device
    (at build time, or on load where no stored plan fits this machine), how it runs a plan, and which layers it
    runs quantized."""

    devices: frozenset[str]
    target: Callable[[torch.device], Target]  # what a plan made here is for; a stored plan fits if equal
    plan: Callable[[Network, torch.device, BackendOptions], Plan]
    runner: Callable[[Network, Plan, torch.device, BackendOptions, SessionModels | None], Runner]  # see make_runner
    # why the backend runs a convolution or matrix multiply that post-training quantization could quantize in float
    # (it has no quantized kernel of that layer's form); None where it runs it quantized. The reference runs every
    # quantized layer's meaning, for checking: its speed is not the point.
    quantized: Callable[[L.Layer], str | None]
    # whether quantized linear layers of one input run faster merged into one wide product read through column slices
    # (builder/passes/merge_quantized_linears.py): where the plan reads a slice as a view, not as a copy
    merges_linears: bool = False


def _quantizes_all(layer: L.Layer) -> str | None:
    return None


def _reference_target(device: torch.device) -> Target:
    return target_here("reference", device)


def _reference_plan(network: Network, device: torch.device, options: BackendOptions) -> Plan:
    kernels, steps = one_step_per_layer(network, lambda layer: Kernel("aten", layer.KIND))
    return Plan(_reference_target(device), kernels, steps)


def _reference_runner(network: Network, plan: Plan, device: torch.device, options: BackendOptions,
                      models: SessionModels | None = None) -> Runner:
    return ReferenceExecutor(network, device)


def _onnxruntime_target(device: torch.device) -> Target:
    from torchkiln.runtime.backends.onnxruntime import target

    return target(device)


def _onnxruntime_plan(network: Network, device: torch.device, options: BackendOptions) -> Plan:
    from torchkiln.runtime.backends.onnxruntime import make_plan

    return make_plan(network, device, options)


def _onnxruntime_runner(network: Network, plan: Plan, device: torch.device, options: BackendOptions,
                        models: SessionModels | None = None) -> Runner:
    from torchkiln.runtime.backends.onnxruntime import OrtRunner

    return OrtRunner(network, plan, device, options, models=models)


def _cuda_target(device: torch.device) -> Target:
    from torchkiln.runtime.backends.cuda.planner import target

    return target(device)


def _cuda_plan(network: Network, device: torch.device, options: BackendOptions) -> Plan:
    from torchkiln.runtime.backends.cuda.fusion_report import log_unfused
    from torchkiln.runtime.backends.cuda.planner import make_plan as plan

    made = plan(network, device, options)
    log_unfused(network, made)  # at debug level: each pair of steps left apart, and why
    return made


def _cuda_quantized(layer: L.Layer) -> str | None:
    from torchkiln.runtime.backends.cuda.codegen.quantized_conv import worth_quantizing

    return worth_quantizing(layer) if isinstance(layer, L.ConvolutionLayer) else None


def _cuda_runner(network: Network, plan: Plan, device: torch.device, options: BackendOptions,
                 models: SessionModels | None = None) -> Runner:
    from torchkiln.runtime.backends.cuda.runner import CudaRunner

    return CudaRunner(network, plan, device, options)


_IMPLEMENTATIONS = {
    "reference": (_reference_target, _reference_plan, _reference_runner, _quantizes_all),
    "onnxruntime": (_onnxruntime_target, _onnxruntime_plan, _onnxruntime_runner, _quantizes_all),
    "cuda": (_cuda_target, _cuda_plan, _cuda_runner, _cuda_quantized),
}
if set(_IMPLEMENTATIONS) != set(ENGINE_BACKENDS):  # a backend a user can name is one the registry has, and back
    raise ImportError(f"backends implemented {sorted(_IMPLEMENTATIONS)} differ from settings_table.ENGINE_BACKENDS "
                      f"{sorted(ENGINE_BACKENDS)}")
BACKENDS: dict[str, Backend] = {name: Backend(frozenset(row.devices), *_IMPLEMENTATIONS[name],
                                               merges_linears=name == "cuda")
                                for name, row in ENGINE_BACKENDS.items()}


def runs_on(backend: str, device_type: str) -> bool:
    return backend in BACKENDS and device_type in BACKENDS[backend].devices


def target_of(backend: str, device: torch.device) -> Target:
    """The target a plan of `backend` made on `device` now would have; BackendUnavailable if it cannot run."""
    return BACKENDS[backend].target(device)


def make_plan(backend: str, network: Network, device: torch.device, options: BackendOptions) -> Plan:
    """`backend`'s plan of `network` for `device`; BackendUnavailable where that backend cannot run here."""
    return BACKENDS[backend].plan(network, device, options)


def make_runner(backend: str, network: Network, plan: Plan | None, device: torch.device, options: BackendOptions,
                engine: str = "engine", models: SessionModels | None = None) -> Runner:
    """The runner of `plan` (None: the backend could not plan here), or (with a warning naming `engine` and the
    cause) the reference one where that backend cannot run here. `models`: the ONNX models an onnxruntime
    engine's sessions were made from (`SessionModels`)."""
    if backend != "reference" and plan is not None:
        try:
            return BACKENDS[backend].runner(network, plan, device, options, models)
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
