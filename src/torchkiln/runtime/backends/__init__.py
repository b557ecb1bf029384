"""The backend registry: a backend turns (network, device, options) into a Runner that computes the network.

- `reference` — the reference executor (ATen, any device): every layer's meaning, layer by layer.
- `onnxruntime` — CPU only: maximal runs of layers that ONNX expresses become ONNX Runtime sessions; the
  layers it cannot express run on the reference meanings inside the same call, in order.

An engine records the name of its backend (and its options) in its bytes; `make_runner` builds the runner
when the engine first runs on a device. A backend that cannot run here (onnxruntime not installed, a session
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

logger = logging.getLogger(__name__)

MAX_THREADS = 1024
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

    def __post_init__(self) -> None:
        if isinstance(self.ort_threads, bool) or not isinstance(self.ort_threads, int) \
                or not 0 <= self.ort_threads <= MAX_THREADS:
            raise ValueError(f"ort_threads must be an int in [0, {MAX_THREADS}] (0: torch.get_num_threads()), "
                             f"got {self.ort_threads!r}")


def _reference(network: Network, device: torch.device, options: BackendOptions) -> Runner:
    return ReferenceExecutor(network, device)


def _onnxruntime(network: Network, device: torch.device, options: BackendOptions) -> Runner:
    from torchkiln.runtime.backends.onnxruntime import OrtRunner

    return OrtRunner(network, device, options)


Backend = Callable[[Network, torch.device, BackendOptions], Runner]
BACKENDS: dict[str, Backend] = {"reference": _reference, "onnxruntime": _onnxruntime}
# The device kinds each backend runs on.
DEVICES: dict[str, frozenset[str]] = {"reference": frozenset({"cpu", "cuda"}), "onnxruntime": frozenset({"cpu"})}


def make_runner(backend: str, network: Network, device: torch.device, options: BackendOptions,
                engine: str = "engine") -> Runner:
    """The runner of `backend`, or (with a warning naming `engine` and the cause) the reference one where
    that backend cannot run here."""
    if backend != "reference":
        try:
            return BACKENDS[backend](network, device, options)
        except BackendUnavailable as e:
            if str(e) not in _warned:  # once per cause: a missing library is one warning, not one per engine
                _warned.add(str(e))
                logger.warning("the %s backend cannot run here, so engine %r (and any other engine it cannot run "
                               "for this reason) runs on the reference backend: %s", backend, engine, e)
    return _reference(network, device, options)
