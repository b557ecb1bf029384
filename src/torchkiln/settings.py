"""Public settings: engine input specifications and the validated compile settings."""
from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

import torch

SUPPORTED_INPUT_DTYPES = (
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool,
)
ENGINE_PRECISIONS = (torch.float32, torch.float16, torch.bfloat16)
_PRECISION_ALIASES = {
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}
_FORMATS = (torch.contiguous_format, torch.channels_last)
_OP_NAME = re.compile(r"\w+::\w+(\.\w+)?")
BACKENDS = ("auto", "reference", "onnxruntime")
MAX_ORT_THREADS = 1024


def _shape_tuple(name: str, shape: Any) -> tuple[int, ...]:
    if isinstance(shape, torch.Size):
        shape = tuple(shape)
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise ValueError(f"Input {name} must be a tuple of ints, got {shape!r}")
    bad = [d for d in shape if d <= 0]
    if bad:
        raise ValueError(f"Input {name} {tuple(shape)} has a non-positive dimension {bad[0]}; every dim must be >= 1")
    return tuple(shape)


@dataclasses.dataclass(frozen=True, init=False)
class Input:
    """Shape range, dtype and memory format of one engine input (mirrors torch_tensorrt.Input)."""

    min_shape: tuple[int, ...]
    opt_shape: tuple[int, ...]
    max_shape: tuple[int, ...]
    dtype: torch.dtype
    format: torch.memory_format
    name: str | None
    example_data: torch.Tensor | None = dataclasses.field(default=None, compare=False, repr=False)

    def __init__(
        self,
        shape: Sequence[int] | None = None,
        *,
        min_shape: Sequence[int] | None = None,
        opt_shape: Sequence[int] | None = None,
        max_shape: Sequence[int] | None = None,
        dtype: torch.dtype = torch.float32,
        format: torch.memory_format = torch.contiguous_format,
        name: str | None = None,
    ) -> None:
        ranged = (min_shape, opt_shape, max_shape)
        if shape is not None:
            if any(s is not None for s in ranged):
                raise ValueError("Input takes either shape or min_shape/opt_shape/max_shape, not both")
            fixed = _shape_tuple("shape", shape)
            mins = opts = maxs = fixed
        else:
            if any(s is None for s in ranged):
                raise ValueError("Input needs shape, or all three of min_shape, opt_shape and max_shape")
            mins = _shape_tuple("min_shape", min_shape)
            opts = _shape_tuple("opt_shape", opt_shape)
            maxs = _shape_tuple("max_shape", max_shape)
            if not len(mins) == len(opts) == len(maxs):
                raise ValueError(f"Input min_shape {mins}, opt_shape {opts} and max_shape {maxs} differ in rank")
            for i, (lo, mid, hi) in enumerate(zip(mins, opts, maxs)):
                if not lo <= mid <= hi:
                    raise ValueError(
                        f"Input dim {i} must satisfy min <= opt <= max, got min_shape {mins}, "
                        f"opt_shape {opts}, max_shape {maxs}"
                    )
        if dtype not in SUPPORTED_INPUT_DTYPES:
            raise ValueError(f"Input dtype {dtype} is not supported; use one of {list(SUPPORTED_INPUT_DTYPES)}")
        if format not in _FORMATS:
            raise ValueError(f"Input format {format} is not supported; use torch.contiguous_format or torch.channels_last")
        if format == torch.channels_last and len(opts) != 4:
            raise ValueError(f"Input format torch.channels_last needs a 4-d shape, got {opts}")
        for key, value in (("min_shape", mins), ("opt_shape", opts), ("max_shape", maxs), ("dtype", dtype),
                           ("format", format), ("name", name), ("example_data", None)):
            object.__setattr__(self, key, value)

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, name: str | None = None) -> Input:
        """An Input of exactly this tensor's shape, dtype and memory format; shape analysis runs on its data."""
        fmt = torch.channels_last if tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last) \
            and not tensor.is_contiguous() else torch.contiguous_format
        spec = cls(tuple(tensor.shape), dtype=tensor.dtype, format=fmt, name=name)
        object.__setattr__(spec, "example_data", tensor.detach())
        return spec

    @property
    def is_dynamic(self) -> bool:
        return self.min_shape != self.max_shape

    def example(self, device: torch.device, which: str = "opt") -> torch.Tensor:
        """A tensor of this spec at its min, opt or max shape, for shape analysis: the tensor this Input was
        made from where its shape fits, else random floats, random bools, or ones for integers (safe as
        divisors and as indices into any embedding)."""
        shape = {"min": self.min_shape, "opt": self.opt_shape, "max": self.max_shape}[which]
        if self.example_data is not None and tuple(self.example_data.shape) == shape:
            return self.example_data.to(device)
        if self.dtype.is_floating_point:
            t = torch.randn(shape, device=device).to(self.dtype)
        elif self.dtype == torch.bool:
            t = torch.rand(shape, device=device) > 0.5
        else:
            t = torch.ones(shape, device=device, dtype=self.dtype)
        return t.contiguous(memory_format=self.format)

    def __repr__(self) -> str:
        shape = f"shape={self.opt_shape}" if not self.is_dynamic else \
            f"min={self.min_shape}, opt={self.opt_shape}, max={self.max_shape}"
        return f"Input({shape}, dtype={self.dtype})"


def as_input(spec: Input | torch.Tensor | Sequence[int]) -> Input:
    """Accept an Input, an example tensor or a plain shape."""
    if isinstance(spec, Input):
        return spec
    if isinstance(spec, torch.Tensor):
        return Input.from_tensor(spec)
    if isinstance(spec, (tuple, list, torch.Size)):
        return Input(tuple(spec))
    raise ValueError(f"inputs entries must be torchkiln.Input, torch.Tensor or a shape tuple, got {type(spec).__name__}")


def _is_shape(spec: Any) -> bool:
    return isinstance(spec, torch.Size) or (
        isinstance(spec, (tuple, list)) and bool(spec)
        and all(isinstance(d, int) and not isinstance(d, bool) for d in spec))


def as_signature(spec: Any, path: str = "inputs") -> Any:
    """One method argument's spec: an Input, or a tuple/list/dict of specs (nested), mirroring the argument.

    A tuple or list of ints is a shape; any other tuple or list is a collection of arguments' parts.
    """
    if isinstance(spec, (Input, torch.Tensor)) or _is_shape(spec):
        return as_input(spec)
    if isinstance(spec, (tuple, list)):
        if not spec:
            raise ValueError(f"{path} is an empty {type(spec).__name__}; give an Input for each tensor in it")
        return type(spec)(as_signature(s, f"{path}[{i}]") for i, s in enumerate(spec))
    if isinstance(spec, dict):
        if not spec:
            raise ValueError(f"{path} is an empty dict; give an Input for each tensor in it")
        for key in spec:
            if not isinstance(key, (str, int)):
                raise ValueError(f"{path}: dict keys must be str or int, got {type(key).__name__}")
        return {k: as_signature(s, f"{path}[{k!r}]") for k, s in spec.items()}
    raise ValueError(f"{path} must be a torchkiln.Input, a torch.Tensor, a shape, or a tuple/list/dict of them; "
                     f"got {type(spec).__name__}")


def flatten_signature(signature: Any) -> list[Input]:
    """The Inputs of a (nested) signature in argument order; dicts in their insertion order."""
    if isinstance(signature, Input):
        return [signature]
    items = signature.values() if isinstance(signature, dict) else signature
    return [leaf for item in items for leaf in flatten_signature(item)]


def _precision(p: Any) -> torch.dtype:
    if isinstance(p, str) and p.lower() in _PRECISION_ALIASES:
        return _PRECISION_ALIASES[p.lower()]
    if isinstance(p, torch.dtype) and p in ENGINE_PRECISIONS:
        return p
    raise ValueError(
        f"enabled_precisions: unknown precision {p!r}; use torch.float32, torch.float16 or torch.bfloat16"
    )


def _device(device: Any) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: {device!r} is not a device ({e})") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device: {dev} is not supported; use 'cpu' or 'cuda'")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {dev} was asked for but CUDA is not available here")
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _device_memory(device: torch.device) -> int | None:
    """Bytes of memory on `device` (physical memory for the CPU), or None where unknown."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _leaves(signature: Any, path: str) -> list[tuple[str, Input]]:
    """Every Input of a (nested) signature with its path, e.g. `inputs[1]['mask']`."""
    if isinstance(signature, Input):
        return [(path, signature)]
    items = signature.items() if isinstance(signature, dict) else enumerate(signature)
    return [leaf for k, item in items for leaf in _leaves(item, f"{path}[{k!r}]")]


def _check_sizes(signature: tuple[Any, ...], device: torch.device) -> None:
    """Raise ValueError, before anything is allocated, for an input larger than the device's memory."""
    memory = _device_memory(device)
    if memory is None:
        return
    for path, spec in _leaves(signature, "inputs"):
        size = math.prod(spec.max_shape) * torch.empty((), dtype=spec.dtype).element_size()
        if size > memory:
            raise ValueError(f"{path}: {spec} needs {size} bytes ({size / 2**30:.1f} GiB) at its largest shape, "
                             f"more than the {memory / 2**30:.1f} GiB of memory on {device}")


def _names(setting: str, names: Iterable[str]) -> frozenset[str]:
    try:
        items = tuple(names) if not isinstance(names, str) else None
    except TypeError:
        items = None
    if items is None or not all(isinstance(n, str) for n in items):
        raise ValueError(f"{setting} must be a collection of strings, got {names!r}")
    return frozenset(items)


@dataclasses.dataclass(frozen=True)
class CompileSettings:
    """Every choice one compile makes; built and validated by `CompileSettings.create`.

    `input_signature` holds one entry per method argument: an Input, or a tuple/list/dict of them
    (nested) for an argument that is a collection of tensors. `inputs` is every Input of it, flattened.
    """

    inputs: tuple[Input, ...]
    input_signature: tuple[Any, ...] = ()
    enabled_precisions: frozenset[torch.dtype] = frozenset({torch.float32})
    device: torch.device = torch.device("cpu")
    min_block_size: int = 3
    torch_executed_ops: frozenset[str] = frozenset()
    torch_executed_modules: frozenset[str] = frozenset()
    require_full_compilation: bool = False
    truncate_long_and_double: bool = False
    debug: bool = False
    # What runs the engines: "reference" (ATen, layer by layer), "onnxruntime" (CPU only: ONNX Runtime sessions,
    # with the layers ONNX cannot express on the reference meanings), or "auto": onnxruntime on the CPU,
    # reference elsewhere.
    backend: str = "auto"
    ort_threads: int = 0  # ONNX Runtime's intra-op threads; 0: torch.get_num_threads() where the engine runs
    # From a dict `inputs` (frontend/arguments.py): the arguments the tensor specs are for, in order (empty: the
    # leading arguments), and the non-tensor arguments fixed to a value by name. Others take their defaults.
    input_names: tuple[str, ...] = ()
    static_arguments: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not self.input_signature:  # built directly from flat Inputs: one tensor per argument
            object.__setattr__(self, "input_signature", tuple(self.inputs))

    @classmethod
    def create(
        cls,
        inputs: Sequence[Any] | None,
        enabled_precisions: Iterable[Any] | None = None,
        device: Any = None,
        min_block_size: int = 3,
        torch_executed_ops: Iterable[str] = (),
        torch_executed_modules: Iterable[str] = (),
        require_full_compilation: bool = False,
        truncate_long_and_double: bool = False,
        debug: bool = False,
        backend: str = "auto",
        ort_threads: int = 0,
        default_device: torch.device | None = None,
        input_names: Sequence[str] = (),
        static_arguments: Sequence[tuple[str, Any]] = (),
    ) -> CompileSettings:
        """Validate user arguments; every problem is a ValueError naming the argument."""
        if inputs is None or isinstance(inputs, (Input, torch.Tensor, dict)):
            raise ValueError("inputs (or input_signature) must be a non-empty list of torchkiln.Input (or example "
                             "tensors), one per argument of the method")
        signature = tuple(as_signature(spec, f"inputs[{i}]") for i, spec in enumerate(inputs))
        if not signature:
            raise ValueError("inputs (or input_signature) must be a non-empty list of torchkiln.Input (or example "
                             "tensors), one per argument of the method")
        if enabled_precisions is None:
            enabled_precisions = {torch.float32}
        if isinstance(enabled_precisions, (torch.dtype, str)):
            enabled_precisions = {enabled_precisions}
        if not isinstance(enabled_precisions, Iterable):
            raise ValueError(f"enabled_precisions must be a set of precisions such as {{torch.float32}}, got "
                             f"{enabled_precisions!r}")
        precisions = frozenset(_precision(p) for p in enabled_precisions)
        if not precisions:
            raise ValueError("enabled_precisions must name at least one precision")
        if not isinstance(min_block_size, int) or isinstance(min_block_size, bool) or min_block_size < 1:
            raise ValueError(f"min_block_size must be an int >= 1, got {min_block_size!r}")
        torch_executed_ops = _names("torch_executed_ops", torch_executed_ops)
        torch_executed_modules = _names("torch_executed_modules", torch_executed_modules)
        for op in sorted(torch_executed_ops):
            if not _OP_NAME.fullmatch(op):
                raise ValueError(f"torch_executed_ops: {op!r} is not an op name; use 'namespace::op' for every "
                                 f"overload (e.g. 'aten::add') or 'namespace::op.overload' (e.g. 'aten::add.Tensor')")
        dev = _device(device if device is not None else (default_device or "cpu"))
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
        if backend == "onnxruntime" and dev.type != "cpu":
            raise ValueError(f"backend: 'onnxruntime' runs on the CPU, not on {dev}; use 'auto' or 'reference'")
        if isinstance(ort_threads, bool) or not isinstance(ort_threads, int) \
                or not 0 <= ort_threads <= MAX_ORT_THREADS:
            raise ValueError(f"ort_threads must be an int in [0, {MAX_ORT_THREADS}] (0: torch.get_num_threads()), "
                             f"got {ort_threads!r}")
        _check_sizes(signature, dev)
        return cls(
            inputs=tuple(flatten_signature(signature)),
            input_signature=signature,
            enabled_precisions=precisions,
            device=dev,
            min_block_size=min_block_size,
            torch_executed_ops=torch_executed_ops,
            torch_executed_modules=torch_executed_modules,
            require_full_compilation=bool(require_full_compilation),
            truncate_long_and_double=bool(truncate_long_and_double),
            debug=bool(debug),
            backend=backend,
            ort_threads=ort_threads,
            input_names=tuple(input_names),
            static_arguments=tuple(static_arguments),
        )

    @property
    def engine_backend(self) -> str:
        """The backend engines run on: `backend`, with "auto" resolved by the device."""
        if self.backend != "auto":
            return self.backend
        return "onnxruntime" if self.device.type == "cpu" else "reference"

    @property
    def compute_dtype(self) -> torch.dtype:
        """The float precision engine layers run in: the lowest enabled one."""
        for p in (torch.float16, torch.bfloat16):
            if p in self.enabled_precisions:
                return p
        return torch.float32
