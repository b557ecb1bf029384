"""An Engine: an optimized network plus its input bindings, serializable to safe bytes."""
from __future__ import annotations

import dataclasses
import logging
import os
import reprlib
import threading
from collections.abc import Sequence

import torch

from torchkiln.errors import EngineFormatError, EngineInputError
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import DimSymbol, is_symbolic
from torchkiln.ir.tensor import Tensor
from torchkiln.runtime import serialization as S
from torchkiln.runtime.backends import (BACKENDS, BackendOptions, BackendUnavailable, Runner, make_plan, make_runner,
                                        runs_on, target_of, warn_unavailable)
from torchkiln.runtime.backends.base import SessionModels
from torchkiln.runtime.plan import Plan
from torchkiln.runtime.profile import active_profiler

logger = logging.getLogger(__name__)
_CPU = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class InputBinding:
    """What an engine accepts for one input: a dtype and a shape range."""

    name: str
    dtype: torch.dtype
    min_shape: tuple[int, ...]
    opt_shape: tuple[int, ...]
    max_shape: tuple[int, ...]

    def check_against(self, tensor: Tensor, engine: str) -> None:
        """Raise EngineFormatError unless this binding fits network input `tensor`: same dtype and rank,
        min <= opt <= max, and a fixed dim of the network equal to min = opt = max."""
        what = (f"engine {engine!r}: binding {self.name!r} (min {list(self.min_shape)}, opt {list(self.opt_shape)}, "
                f"max {list(self.max_shape)}, {self.dtype}) for network input {tensor!r}")
        if self.dtype != tensor.dtype:
            raise EngineFormatError(f"{what}: the dtypes differ")
        if not len(self.min_shape) == len(self.opt_shape) == len(self.max_shape) == tensor.rank:
            raise EngineFormatError(f"{what}: the ranks differ")
        for i, (lo, opt, hi, d) in enumerate(zip(self.min_shape, self.opt_shape, self.max_shape, tensor.shape)):
            if not 0 <= lo <= opt <= hi:
                raise EngineFormatError(f"{what}: dim {i} needs 0 <= min <= opt <= max")
            if isinstance(d, DimSymbol):
                if (lo, hi) != (d.lo, d.hi):
                    raise EngineFormatError(f"{what}: dim {i} is the network's symbol {d} in [{d.lo}, {d.hi}], "
                                            f"which the binding's range [{lo}, {hi}] must equal")
            elif is_symbolic(d):
                raise EngineFormatError(f"{what}: dim {i} of a network input must be an int or one symbol, got {d}")
            elif not lo == opt == hi == d:
                raise EngineFormatError(f"{what}: the network's fixed dim {i} of {d} needs min = opt = max = {d}")

    def check(self, index: int, value: object, device_type: str) -> None:
        """Raise EngineInputError naming this input if `value` does not fit."""
        what = f"engine input {index} ({self.name!r})"
        if not isinstance(value, torch.Tensor):
            raise EngineInputError(f"{what}: expected a tensor, got {type(value).__name__}")
        if value.device.type != device_type:
            raise EngineInputError(f"{what}: expected a tensor on {device_type}, got one on {value.device}")
        if value.layout != torch.strided:
            raise EngineInputError(f"{what}: expected a dense tensor, got layout {value.layout} (to_dense() makes one)")
        if value.is_nested:
            raise EngineInputError(f"{what}: expected a dense tensor, got a nested tensor (to_padded_tensor() makes "
                                   f"one)")
        if value.dtype != self.dtype:
            raise EngineInputError(f"{what}: expected dtype {self.dtype}, got {value.dtype}")
        shape = tuple(value.shape)
        if shape == self.opt_shape:
            return
        if len(shape) == len(self.opt_shape) and self.min_shape != self.max_shape:  # name the dim out of range
            for dim, (d, lo, hi) in enumerate(zip(shape, self.min_shape, self.max_shape)):
                if not lo <= d <= hi:
                    raise EngineInputError(f"{what}: dim {dim} is {d}, outside the range [{lo}, {hi}] the engine "
                                           f"was built for (shape {shape}; min {self.min_shape}, max {self.max_shape})")
        if len(shape) != len(self.opt_shape) or any(
                not lo <= d <= hi for d, lo, hi in zip(shape, self.min_shape, self.max_shape)):
            expected = str(self.opt_shape) if self.min_shape == self.max_shape else \
                f"within min {self.min_shape} and max {self.max_shape}"
            raise EngineInputError(f"{what}: expected shape {expected}, got {shape}")


def usable_cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def options_here(options: BackendOptions, backend: str, name: str) -> BackendOptions:
    """`options` as this machine runs them: an onnxruntime engine asking for more threads than there are usable
    cores (made on a larger machine, or altered) gets one per core, with a logged warning."""
    cores = usable_cores()
    if backend != "onnxruntime" or options.ort_threads <= cores:
        return options
    logger.warning("engine %r asks for %d ONNX Runtime threads; this machine has %d usable cores, so it runs with %d",
                   name, options.ort_threads, cores, cores)
    return dataclasses.replace(options, ort_threads=cores)


class Engine:
    """The built form of a network; `execute` runs it, `serialize` gives its bytes."""

    def __init__(self, network: Network, bindings: Sequence[InputBinding], device_type: str,
                 precision: torch.dtype, name: str = "engine", backend: str = "reference",
                 backend_options: BackendOptions = BackendOptions(), plans: Sequence[Plan] = (),
                 tapes: Sequence[bytes] = ()) -> None:
        if not runs_on(backend, device_type):
            raise EngineFormatError(f"engine {name!r}: backend {backend!r} does not run on {device_type}")
        if len(bindings) != len(network.inputs):
            raise EngineFormatError(f"engine {name!r}: {len(bindings)} bindings for {len(network.inputs)} inputs")
        for b, t in zip(bindings, network.inputs):
            b.check_against(t, name)
        self.network = network
        self.bindings = tuple(bindings)
        self.device_type = device_type
        self.precision = precision
        self.name = name
        self.backend = backend
        self.backend_options = backend_options  # as stored; `run_options` as this machine runs them
        self.run_options = options_here(backend_options, backend, name)
        self.plans = list(plans)  # one per target it was planned for; serialized with the engine
        self.tapes = list(tapes)  # recorded runs for the C++ runtime (runtime/tape.py), as their sections' bytes
        self.session_models: SessionModels | None = None  # stored ONNX models of its sessions (module cache)
        self._runners: dict[torch.device, Runner] = {}
        self._lock = threading.Lock()
        # An engine of static shapes: per input the (dtype, shape) a call must have, compared at once (`_fits`)
        self._static = tuple((b.dtype, torch.Size(b.opt_shape)) for b in self.bindings) if \
            all(b.min_shape == b.max_shape for b in self.bindings) else None
        self._devices: dict[int, torch.device] = {-1: _CPU}  # `get_device()`'s index -> the device

    def reference_layers(self) -> list[tuple[str, str, str]]:
        """(layer, kind, reason) of the layers an onnxruntime engine runs on the reference meanings; [] for
        other backends."""
        if self.backend != "onnxruntime":
            return []
        from torchkiln.runtime.backends.onnxruntime import reference_layers

        return reference_layers(self.network)

    def check_inputs(self, inputs: Sequence[torch.Tensor]) -> None:
        if len(inputs) != len(self.bindings):
            names = ", ".join(repr(b.name) for b in self.bindings)
            raise EngineInputError(f"engine {self.name!r} expects {len(self.bindings)} inputs ({names}), "
                                   f"got {len(inputs)}")
        for i, (binding, value) in enumerate(zip(self.bindings, inputs)):
            binding.check(i, value, self.device_type)

    def plan_for(self, device: torch.device) -> Plan | None:
        """The stored plan whose target is this machine's `device`; else a new one, kept with the engine (with a
        logged warning where the engine holds plans, none of them for this machine). None where the backend
        cannot plan here (its library is missing): the engine then runs on the reference backend."""
        try:
            here = target_of(self.backend, device)
        except BackendUnavailable as e:
            warn_unavailable(self.backend, self.name, e)
            return None
        for plan in self.plans:
            if plan.target == here:
                return plan
        try:
            plan = make_plan(self.backend, self.network, device, self.backend_options)
        except BackendUnavailable as e:
            warn_unavailable(self.backend, self.name, e)
            return None
        if self.plans:
            logger.warning("engine %r has no plan for this machine (%s; it holds plans for %s): planning it again "
                           "from its graph", self.name, plan.target.describe(),
                           "; ".join(p.target.describe() for p in self.plans))
        self.plans.append(plan)
        return plan

    def runner(self, device: torch.device) -> Runner:
        """The engine on its backend, bound to `device`: made at the first call there, then reused."""
        found = self._runners.get(device)
        if found is None:
            with self._lock:
                found = self._runners.get(device)
                if found is None:
                    found = self._runners[device] = make_runner(self.backend, self.network, self.plan_for(device),
                                                                device, self.run_options, self.name,
                                                                self.session_models)
        return found

    def _fits(self, inputs: Sequence[object]) -> torch.device | None:
        """The device of `inputs` where an engine of static shapes takes them as they are: plain tensors of exactly
        its dtypes and shapes, all on one device of its type (a comparison per input; `check_inputs` names what is
        wrong); else None."""
        static = self._static
        if static is None or not inputs or len(inputs) != len(static):
            return None
        on_cpu, index = self.device_type == "cpu", None
        for x, (dtype, shape) in zip(inputs, static):
            if type(x) is not torch.Tensor or not (x.is_cpu if on_cpu else x.is_cuda) or x.layout != torch.strided \
                    or x.is_nested or x.dtype != dtype or x.shape != shape:
                return None
            at = x.get_device()
            if index is not None and at != index:
                return None
            index = at
        device = self._devices.get(index)
        if device is None:
            device = self._devices[index] = inputs[0].device
        return device

    def execute(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Check the inputs against the bindings, then run the engine (outside autograd)."""
        device = self._fits(inputs)
        if device is None:
            self.check_inputs(inputs)
            device = inputs[0].device if inputs else torch.device(self.device_type)
            if any(x.device != device for x in inputs):
                raise EngineInputError(f"engine {self.name!r}: all inputs must be on one device, got "
                                       f"{sorted({str(x.device) for x in inputs})}")
        if not torch.is_grad_enabled():
            return self._run(device, list(inputs))
        # torch.no_grad()'s own switch: its context manager took ~20 us a call after a 2 ms ORT call (cold caches)
        torch._C._set_grad_enabled(False)
        try:
            return self._run(device, list(inputs))
        finally:
            torch._C._set_grad_enabled(True)

    def _run(self, device: torch.device, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        runner = self.runner(device)
        profiler = active_profiler()  # bench --profile: the call runs its steps one by one, each timed
        return runner.run(inputs) if profiler is None else profiler.run(self, runner, inputs)

    # ---- bytes ----------------------------------------------------------------------------
    def serialize(self) -> bytes:
        return b"".join(self.serialized_pieces())

    def serialized_pieces(self) -> list[bytes | memoryview]:
        """`serialize`'s bytes as pieces to join in order, the weights views of the network's tensors (a module's
        engine attribute is written from them directly: `execute_op.engine_blob`)."""
        meta = {
            "name": self.name,
            "device_type": self.device_type,
            "precision": S.dtype_name(self.precision),
            "backend": self.backend,
            **self.backend_options.to_json(),
            "bindings": [{"name": b.name, "dtype": S.dtype_name(b.dtype), "min_shape": list(b.min_shape),
                          "opt_shape": list(b.opt_shape), "max_shape": list(b.max_shape)} for b in self.bindings],
        }
        return S.engine_pieces(meta, self.network, [p.to_json() for p in self.plans], self.tapes)

    @classmethod
    def deserialize(cls, data: bytes | memoryview, max_memory: int | None = None, max_flops: int | None = None
                    ) -> Engine:
        """Load engine bytes; anything wrong with them raises EngineFormatError.

        `max_memory` caps the bytes the engine may hold at once (weights, live intermediates and a layer's
        workspace) and `max_flops` the FLOPs of one call, both checked on shapes before anything is allocated;
        None takes TORCHKILN_MAX_ENGINE_MEMORY / TORCHKILN_MAX_ENGINE_FLOPS, or else a default scaled to the
        engine's device (`runtime/limits.py`)."""
        meta, network, raw_plans, tapes = S.decode_engine(data, max_memory, max_flops)
        name = meta.get("name")
        device_type = meta.get("device_type")
        if not isinstance(name, str) or len(name) > S.MAX_STRING or device_type not in ("cpu", "cuda"):
            raise EngineFormatError("engine metadata: bad name or device_type")
        raw_bindings = meta.get("bindings")
        if not isinstance(raw_bindings, list) or len(raw_bindings) > S.MAX_TENSORS:
            raise EngineFormatError("engine metadata: missing bindings or too many")
        bindings = []
        for i, b in enumerate(raw_bindings):
            where = f"engine binding {i}"
            if not isinstance(b, dict) or not isinstance(b.get("name"), str) or len(b["name"]) > S.MAX_STRING:
                raise EngineFormatError(f"{where}: malformed")
            shapes = [S.parse_shape(b.get(k), where) for k in ("min_shape", "opt_shape", "max_shape")]
            bindings.append(InputBinding(b["name"], S.parse_dtype(b.get("dtype"), where), *shapes))
        backend = meta.get("backend", "reference")
        if not isinstance(backend, str) or not runs_on(backend, device_type):
            raise EngineFormatError(f"engine metadata: backend {reprlib.repr(backend)} is not one that runs on "
                                    f"{device_type} ({', '.join(b for b in BACKENDS if runs_on(b, device_type))})")
        try:
            options = BackendOptions.from_json(meta)
        except (ValueError, TypeError) as e:
            raise EngineFormatError(f"engine metadata: {e}") from None
        plans = [Plan.from_json(raw, network, f"engine plan {k}") for k, raw in enumerate(raw_plans)]
        if any(p.target.backend != backend for p in plans):
            raise EngineFormatError(f"engine metadata: a plan is for another backend than the engine's {backend!r}")
        return cls(network, bindings, device_type, S.parse_dtype(meta.get("precision"), "engine precision"), name,
                   backend, options, plans, tapes)

    def __repr__(self) -> str:
        return (f"Engine({self.name!r}, {self.device_type}, {self.backend}, {S.dtype_name(self.precision)}, "
                f"{len(self.network.layers)} layers, inputs={[b.name for b in self.bindings]})")
