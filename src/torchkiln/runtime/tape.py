"""Recording a tape (docs/tape_format.md): one call of an engine's planned run, as the ATen calls and generated-kernel
launches it made, for the C++ runtime to replay with no Python.

A fresh runner of the engine's plan is made and called twice under a dispatch mode that writes down every ATen call
with its arguments, while Triton's launcher writes down every kernel launch with the kernel's cubin. The runner's
making and its first call (weights placed, kernels compiled, lazy work) are the prologue; the second call is the
body. The runner runs without CUDA graphs so that its launches are seen; the C++ runtime captures the body itself, so
the runner chains generated steps as it does in its own graphs (`codegen.captured_later`), and a chained launch is
written down as a programmatic dependent one (`"pdl": true`).

A run that a tape could not replay for other input values is refused, with the reason logged: a body that reads a
value on the host, an output shape that depends on values, a launch needing what tapes do not carry.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import weakref
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchkiln.ir.symbolic import DimSymbol
from torchkiln.runtime import tape_format
from torchkiln.runtime.backends import make_runner
from torchkiln.runtime.backends.cuda.codegen import captured_later, is_compiling_ahead
from torchkiln.runtime.serialization import DTYPES, dtype_name

if TYPE_CHECKING:
    from torchkiln.runtime.engine import Engine

logger = logging.getLogger(__name__)

MAX_CONSTANT_BYTES = 256 << 20  # tensors a run read that no recorded call made, stored in the tape
# operators whose output shape depends on their input values: later calls' shapes would differ from the recording's
_VALUE_SHAPED = frozenset({"nonzero", "masked_select", "unique_dim", "unique_consecutive", "_unique", "_unique2",
                           "unique_dim_consecutive", "bincount", "repeat_interleave"})


class TapeRefused(Exception):
    """A run that a tape cannot replay faithfully; the message says why."""


class _Recorder(TorchDispatchMode):
    """Writes down the ATen calls made under it (and, through `launch`, Triton's launches) as tape instructions."""

    def __init__(self, weights: dict[int, tuple[int, str]], device: torch.device) -> None:
        super().__init__()
        self.weights = weights  # id of an engine weight tensor -> (layer, name)
        self.device = device
        # id of a tensor given a value id -> (that id, a weak reference telling whether the tensor is still the one)
        self.ids: dict[int, tuple[int, weakref.ref]] = {}
        self.num_values = 0
        self.instructions: list[dict[str, Any]] = []
        self.in_body = False
        self.constants: list[dict[str, Any]] = []
        self.blob = bytearray()
        self.constant_bytes = 0
        self.kernels: list[dict[str, Any]] = []
        self.kernel_index: dict[int, int] = {}  # id of a compiled kernel -> its row
        self.compiled: list[Any] = []  # the compiled kernels, alive while recording
        self.pending: list[tuple[int, tuple[int, int, int], tuple[Any, ...]]] = []  # launches awaiting their kernel

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """False: torch wraps a mode's `__torch_dispatch__` in dynamo's disable unless its class says not to, and
        that wrap imports torch._dynamo at the mode's first call (about 2 s of a build on an H200 host). Nothing a
        recording runs is compiled by dynamo."""
        return False

    # ---- values --------------------------------------------------------------------------------------------------
    def define(self, t: torch.Tensor | None) -> int | None:
        """A new value id for a tensor a recorded call returned."""
        if t is None:
            return None
        value = self.num_values
        self.num_values += 1
        self.ids[id(t)] = (value, weakref.ref(t))
        return value

    def known(self, t: torch.Tensor) -> int | None:
        """The value id of a tensor a recorded call made (or an input), else None."""
        found = self.ids.get(id(t))
        return found[0] if found is not None and found[1]() is t else None

    def value(self, t: torch.Tensor) -> int:
        """The value id of a tensor the run reads: recorded, an engine weight, or else a constant stored now."""
        found = self.known(t)
        if found is not None:
            return found
        ref = self.weights.get(id(t))
        if ref is not None:
            self.instructions.append({"weight": list(ref), "out": self.num_values})
            return self.define(t)
        if t.is_meta:
            raise TapeRefused("the run passes a meta tensor (a shape worked out on the host) to a device operator")
        if t.layout != torch.strided or t.is_quantized or t.is_nested or dtype_name(t.dtype) not in DTYPES:
            raise TapeRefused(f"the run reads a tensor a tape cannot store ({t.dtype}, {t.layout})")
        data = t.detach().contiguous().cpu()
        nbytes = data.numel() * data.element_size()
        self.constant_bytes += nbytes
        if self.constant_bytes > MAX_CONSTANT_BYTES:
            raise TapeRefused(f"the run reads over {MAX_CONSTANT_BYTES >> 20} MiB of tensors that no recorded call "
                              f"made and no engine weight is")
        offset = len(self.blob)
        self.blob += data.reshape(-1).view(torch.uint8).numpy().tobytes() if nbytes else b""
        self.constants.append({"data": [offset, nbytes], "dtype": dtype_name(t.dtype), "shape": list(t.shape),
                               "strides": list(t.stride()), "device": "cpu" if t.device.type == "cpu" else "engine"})
        self.instructions.append({"constant": len(self.constants) - 1, "out": self.num_values})
        return self.define(t)

    def encode(self, x: Any) -> Any:
        """An argument as tape JSON (docs/tape_format.md)."""
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return x
        if isinstance(x, float):
            return x if math.isfinite(x) else {"float": "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")}
        if isinstance(x, torch.Tensor):
            return {"t": self.value(x)}
        if isinstance(x, (list, tuple)):
            return [self.encode(v) for v in x]
        if isinstance(x, torch.dtype):
            return {"dtype": dtype_name(x)}
        if isinstance(x, torch.device):
            if x.type == "cpu" and self.device.type != "cpu":
                return {"device": "cpu"}
            if x.type != self.device.type or (x.index is not None and x.index != self.device.index):
                raise TapeRefused(f"the run names device {x}, not the engine's {self.device}")
            return {"device": "engine"}
        if isinstance(x, torch.layout):
            if x != torch.strided:
                raise TapeRefused(f"the run asks for layout {x}")
            return {"layout": "strided"}
        if isinstance(x, torch.memory_format):
            return {"memory_format": str(x).removeprefix("torch.")}
        raise TapeRefused(f"the run passes a {type(x).__name__} to an operator, which a tape cannot hold")

    # ---- ATen calls ----------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if _on_meta(args, kwargs) or is_compiling_ahead():
            # shapes worked out on the host (meta tensors hold no values), or the runner's dry run that compiles its
            # kernels (`_Bound.compile_ahead`): no work to replay
            return func(*args, **kwargs)
        schema = func._schema
        base = schema.name.split("::")[-1]
        if self.in_body and base in _VALUE_SHAPED:
            raise TapeRefused(f"{schema.name} makes an output whose shape depends on its input values")
        if self.in_body and base == "index" and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                                    for i in (args[1] if len(args) > 1 else ())):
            raise TapeRefused("a boolean-mask index makes an output whose shape depends on the mask")
        record = {"op": schema.name, "overload": schema.overload_name, "args": self.encode(list(args)),
                  "kwargs": {k: self.encode(v) for k, v in kwargs.items()}}
        out = func(*args, **kwargs)
        returns = schema.returns
        results = out if len(returns) > 1 else (out,)
        written: list[int | None] = []
        for ret, result in zip(returns, results):
            kind = ret.type.kind()
            if kind == "TensorType" or (kind == "OptionalType" and ret.type.getElementType().kind() == "TensorType"):
                written.append(self.define(result))
            elif kind == "ListType" and ret.type.getElementType().kind() == "TensorType":
                written += [self.define(t) for t in result]
            elif self.in_body and kind not in ("IntType", "SymIntType"):
                # a value read to the host (`_local_scalar_dense`'s number, `equal`'s bool); an int return is a
                # shape's (SDPA's sequence lengths)
                raise TapeRefused(f"{schema.name} returns a {ret.type} to the host, so a later call could take "
                                  f"another course")
        record["out"] = written
        self.instructions.append(record)
        return out

    # ---- Triton launches -----------------------------------------------------------------------------------------
    def launch(self, grid: tuple[int, int, int], function: int, args: tuple[Any, ...]) -> None:
        """Triton's launcher is launching `function`: write it down once its compiled kernel is known."""
        self.instructions.append({"launch": None})  # its place, filled by `launched`
        self.pending.append((len(self.instructions) - 1, grid, args))

    def launched(self, kernel: Any) -> None:
        """The kernel of the launches pending (a JIT function's run returned it)."""
        pending, self.pending = self.pending, []
        for at, grid, args in pending:
            if at != len(self.instructions) - 1:
                raise TapeRefused("a launch was not the last thing its JIT call did")
            self.instructions.pop()
            row = self.kernel_row(kernel)
            types = list(kernel.src.signature.values())  # every parameter's, constexprs too, as the launcher gets them
            if len(args) != len(types):
                raise TapeRefused(f"kernel {kernel.name}: {len(args)} launch arguments for {len(types)} parameters")
            encoded = [{"t": self.value(a)} if ty.startswith("*") else _scalar(a, ty, kernel.name)
                       for a, ty in zip(args, types) if ty != "constexpr"]
            # Triton's launcher launches a kernel compiled with launch_pdl (a chained one) programmatically dependent
            chained = {"pdl": True} if getattr(kernel.metadata, "launch_pdl", False) else {}
            self.instructions.append({"launch": row, "grid": list(grid), "args": encoded, **chained})

    def kernel_row(self, kernel: Any) -> int:
        row = self.kernel_index.get(id(kernel))
        if row is not None:
            return row
        meta = kernel.metadata
        why = [what for what, bad in (
            ("scratch memory", getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0)),
            ("thread-block clusters", getattr(meta, "num_ctas", 1) != 1),
            ("a cooperative launch", getattr(meta, "launch_cooperative_grid", False))) if bad]
        params = [ty for ty in kernel.src.signature.values() if ty != "constexpr"]
        if any(not (ty in tape_format.SCALAR_PARAMS or (ty[:1] == "*" and ty[1:] in tape_format.SCALAR_PARAMS))
               for ty in params):
            why.append(f"parameter types {params}")
        if why:
            raise TapeRefused(f"kernel {kernel.name} needs {', '.join(why)}")
        cubin = kernel.asm["cubin"]
        offset = len(self.blob)
        self.blob += cubin
        self.kernels.append({"name": kernel.name, "cubin": [offset, len(cubin)], "num_warps": meta.num_warps,
                             "shared": meta.shared, "params": params})
        self.compiled.append(kernel)
        row = self.kernel_index[id(kernel)] = len(self.kernels) - 1
        return row


def _on_meta(args: tuple, kwargs: dict) -> bool:
    """Whether an operator call works on the meta device: a meta tensor among its arguments, or a meta device asked."""
    def meta(x: Any) -> bool:
        if isinstance(x, torch.Tensor):
            return x.is_meta
        if isinstance(x, torch.device):
            return x.type == "meta"
        return isinstance(x, (list, tuple)) and any(meta(v) for v in x)

    return meta(args) or meta(tuple(kwargs.values()))


def _scalar(value: Any, ty: str, kernel: str) -> int | float:
    if isinstance(value, bool):
        return int(value)
    if ty.startswith(("i", "u")) and isinstance(value, int):
        return value
    if ty.startswith(("fp", "bf")) and isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    raise TapeRefused(f"kernel {kernel}: a {ty} parameter given {type(value).__name__} {value!r}")


@contextlib.contextmanager
def _triton_launches(recorder: _Recorder) -> Iterator[None]:
    """Triton's launches written down by `recorder` while inside."""
    from triton.backends.nvidia.driver import CudaLauncher
    from triton.runtime.jit import JITFunction

    call, run = CudaLauncher.__call__, JITFunction.run

    def recorded_call(self: Any, gx: int, gy: int, gz: int, stream: Any, function: Any, *args: Any) -> Any:
        # args: Triton's packed metadata, launch metadata and two hooks, then the kernel's arguments
        recorder.launch((gx, gy, gz), function, args[4:])
        return call(self, gx, gy, gz, stream, function, *args)

    def recorded_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        kernel = run(self, *args, **kwargs)
        if recorder.pending:
            recorder.launched(kernel)
        return kernel

    CudaLauncher.__call__, JITFunction.run = recorded_call, recorded_run
    try:
        yield
    finally:
        CudaLauncher.__call__, JITFunction.run = call, run


def _sample(dtype: torch.dtype, shape: Sequence[int], device: torch.device) -> torch.Tensor:
    """An input to record with: random floats; zeros for integers and booleans (always a valid index)."""
    if dtype.is_floating_point:
        return torch.randn(shape, device=device).to(dtype)
    return torch.zeros(shape, dtype=dtype, device=device)


def record_tape(engine: Engine, device: torch.device, shapes: Sequence[tuple[int, ...]] | None = None) -> bytes:
    """A tape section of `engine`'s planned run on `device` with inputs of `shapes` (its optimization shapes where
    None); TapeRefused (saying why) where a tape could not replay that run faithfully."""
    shapes = [tuple(b.opt_shape) for b in engine.bindings] if shapes is None else [tuple(s) for s in shapes]
    plan = engine.plan_for(device)
    options = dataclasses.replace(engine.run_options, cuda_graphs=False)
    weights = {id(w): (j, name) for j, layer in enumerate(engine.network.layers) for name, w in layer.weights.items()}
    recorder = _Recorder(weights, device)
    inputs = [_sample(b.dtype, shape, device) for b, shape in zip(engine.bindings, shapes)]
    for x in inputs:
        recorder.define(x)
    launches = _triton_launches(recorder) if device.type == "cuda" else contextlib.nullcontext()
    with torch.inference_mode(False), torch.no_grad(), launches, captured_later(), recorder:
        runner = make_runner(engine.backend, engine.network, plan, device, options, engine.name)
        runner.run(list(inputs))
        prologue, recorder.instructions = recorder.instructions, []
        recorder.in_body = True
        outputs = runner.run(list(inputs))
        body = recorder.instructions
    if recorder.pending:
        raise TapeRefused("a kernel launch's compiled kernel was never known")
    if any(recorder.known(x) is None for x in outputs):
        raise TapeRefused("an output is a tensor no recorded call made")
    target = {"device_type": device.type, "device_name": "", "capability": "", "torch": _release(torch.__version__),
              "triton": ""}
    if device.type == "cuda":
        import triton

        target.update(device_name=torch.cuda.get_device_name(device),
                      capability="{}.{}".format(*torch.cuda.get_device_capability(device)),
                      triton=triton.__version__)
    doc = {"target": target,
           "inputs": [{"dtype": dtype_name(b.dtype), "shape": list(s)} for b, s in zip(engine.bindings, shapes)],
           "num_values": recorder.num_values, "kernels": recorder.kernels, "constants": recorder.constants,
           "prologue": prologue, "body": body, "outputs": [recorder.known(x) for x in outputs]}
    logger.info("engine %s: recorded a tape for %s at %s: %d prologue and %d body instructions, %d kernels, "
                "%.3g MiB of constants", engine.name, device, shapes, len(prologue), len(body),
                len(recorder.kernels), recorder.constant_bytes / 2 ** 20)
    return tape_format.encode(doc, bytes(recorder.blob))


def _release(version: str) -> str:
    """A torch version without its local part: '2.11.0+cu130' -> '2.11.0'."""
    return version.split("+")[0]


def tape_shapes(engine: Engine, extra: int = 0) -> list[list[tuple[int, ...]]]:
    """The input shapes a build records tapes at: the engine's optimization shapes, then its smallest and its largest
    where they differ (an engine of dynamic shapes), then up to `extra` more (`extra_shapes`), each once."""
    found: list[list[tuple[int, ...]]] = []
    candidates = [[tuple(getattr(b, key)) for b in engine.bindings] for key in ("opt_shape", "min_shape", "max_shape")]
    for shapes in [*candidates, *extra_shapes(engine, extra)]:
        if shapes not in found and (not found or all(math.prod(s) for s in shapes)):  # (no tape of empty inputs)
            found.append(shapes)
    return found


def extra_shapes(engine: Engine, most: int) -> list[list[tuple[int, ...]]]:
    """Input shapes of a dynamic engine for tapes beyond its optimization, smallest and largest: every shape its
    symbols' ranges allow where there are at most `most`, else every combination of the powers of two in each range
    where there are at most `most` of those (a server that pads its batches and sequences to powers of two then always
    runs a tape), else none."""
    inputs = engine.network.inputs
    symbols = list(dict.fromkeys(d for t in inputs for d in t.shape if isinstance(d, DimSymbol)))
    if not symbols or most <= 0:
        return []
    for values in ([range(s.lo, s.hi + 1) for s in symbols],
                   [[1 << k for k in range(s.hi.bit_length()) if s.lo <= 1 << k <= s.hi] for s in symbols]):
        if math.prod(len(v) for v in values) <= most:
            return [[tuple(dict(zip(symbols, combo)).get(d, d) for d in t.shape) for t in inputs]
                    for combo in itertools.product(*values)]
    return []


def add_tape(engine: Engine, device: torch.device, extra: int = 0) -> None:
    """Record tapes of `engine` on `device` at `tape_shapes` and keep them with the engine; none (the reason logged)
    where refused: the C++ runtime runs the layers' ATen meanings at a call no tape fits."""
    for shapes in tape_shapes(engine, extra):
        try:
            engine.tapes.append(record_tape(engine, device, shapes))
        except TapeRefused as e:
            logger.info("engine %s: no tape at inputs %s for the C++ runtime (it runs the layers' ATen meanings "
                        "there): %s", engine.name, shapes, e)
            return  # (a refusal is the plan's, whatever the shapes)
        except Exception as e:  # a tape is an addition to the engine: failing to record one must not fail the build
            logger.warning("engine %s: recording a tape at inputs %s for the C++ runtime failed, so it has none there "
                           "(the C++ runtime runs its layers' ATen meanings): %s: %s", engine.name, shapes,
                           type(e).__name__, e)
