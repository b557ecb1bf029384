"""Public settings: engine input specifications and the validated compile settings."""
from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.device import to_torch_device
from torchkiln.enums import to_torch_dtype, to_torch_format
from torchkiln.enums import dtype as DType
from torchkiln.settings_table import AUTO_BACKEND, BY_NAME, SETTINGS, with_fields

SUPPORTED_INPUT_DTYPES = (
    torch.float32, torch.float16, torch.bfloat16, torch.float64,
    torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool,
)
ENGINE_PRECISIONS = (torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.float8_e4m3fn)
QUANT_PRECISIONS = (torch.int8, torch.float8_e4m3fn)  # post-training quantization's types, the first preferred
_PRECISION_ALIASES = {
    "int8": torch.int8, "i8": torch.int8, "fp8": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16,
}
_FORMATS = (torch.contiguous_format, torch.channels_last)


def _shape_tuple(name: str, shape: Any) -> tuple[int, ...]:
    if isinstance(shape, torch.Size):
        shape = tuple(shape)
    if not isinstance(shape, (tuple, list)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        raise ValueError(f"Input {name} must be a tuple of ints, got {shape!r}")
    bad = [d for d in shape if d <= 0]
    if bad:
        raise ValueError(f"Input {name} {tuple(shape)} has a non-positive dimension {bad[0]}; every dim must be >= 1")
    return tuple(shape)


def _domain(tensor_domain: Any) -> tuple[float, float] | None:
    if tensor_domain is None:
        return None
    ok = isinstance(tensor_domain, (tuple, list)) and len(tensor_domain) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in tensor_domain)
    if not ok or not tensor_domain[0] < tensor_domain[1]:
        raise ValueError(f"Input tensor_domain must be (low, high) with finite numbers and low < high, got "
                         f"{tensor_domain!r}")
    return (float(tensor_domain[0]), float(tensor_domain[1]))


def _memory_format(tensor: torch.Tensor) -> torch.memory_format:
    channels_last = tensor.dim() == 4 and tensor.is_contiguous(memory_format=torch.channels_last)
    return torch.channels_last if channels_last and not tensor.is_contiguous() else torch.contiguous_format


@dataclasses.dataclass(init=False)
class Input:
    """Shape range, dtype and memory format of one engine input (mirrors torch_tensorrt.Input).

    `tensor_domain=(low, high)` is the range random inputs of this spec are drawn from (shape analysis,
    `torchkiln compile --check-accuracy`): floats uniform in [low, high), integers in [ceil(low), ceil(high)).
    `torch_tensor=` (or `example_tensor=`) gives the tensor shape analysis runs on; without a shape, the
    Input takes the tensor's shape, dtype and memory format.

    Without a dtype, `dtype` is `torchkiln.dtype.unknown` (as in Torch-TensorRT): compile takes the model's
    floating-point parameter dtype when it is float16 or bfloat16, else float32. Fields can be set after
    construction (`spec.dtype = torch.half`), checked as the constructor checks them; `memory_format` is another
    name for `format`.
    """

    min_shape: tuple[int, ...]
    opt_shape: tuple[int, ...]
    max_shape: tuple[int, ...]
    dtype: torch.dtype | DType  # DType.unknown: not given
    format: torch.memory_format
    name: str | None
    tensor_domain: tuple[float, float] | None = None
    example_data: torch.Tensor | None = dataclasses.field(default=None, compare=False, repr=False)
    _SETTABLE = ("shape", "min_shape", "opt_shape", "max_shape", "dtype", "format", "memory_format", "name",
                 "tensor_domain")  # not a field: no annotation

    def __init__(
        self,
        shape: Sequence[int] | None = None,
        *,
        min_shape: Sequence[int] | None = None,
        opt_shape: Sequence[int] | None = None,
        max_shape: Sequence[int] | None = None,
        dtype: Any = None,
        format: torch.memory_format | None = None,
        name: str | None = None,
        tensor_domain: tuple[float, float] | None = None,
        torch_tensor: torch.Tensor | None = None,
        example_tensor: torch.Tensor | None = None,
    ) -> None:
        if torch_tensor is not None and example_tensor is not None:
            raise ValueError("Input takes torch_tensor or example_tensor (the same thing), not both")
        tensor = torch_tensor if torch_tensor is not None else example_tensor
        if tensor is not None and not isinstance(tensor, torch.Tensor):
            raise ValueError(f"Input torch_tensor must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor is not None and tensor.is_nested:  # (it has no shape: shape analysis cannot run on it)
            raise ValueError("Input torch_tensor must be a tensor with a shape, got a nested tensor "
                             "(to_padded_tensor() makes one)")
        ranged = (min_shape, opt_shape, max_shape)
        if shape is None and tensor is not None and all(s is None for s in ranged):
            shape = tuple(tensor.shape)
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
        dtype = to_torch_dtype(dtype)
        if dtype is None:
            dtype = tensor.dtype if tensor is not None else DType.unknown
        format = to_torch_format(format)
        if format is None:
            format = _memory_format(tensor) if tensor is not None else torch.contiguous_format
        if dtype is not DType.unknown and dtype not in SUPPORTED_INPUT_DTYPES:
            raise ValueError(f"Input dtype {dtype} is not supported; use one of {list(SUPPORTED_INPUT_DTYPES)}")
        if format not in _FORMATS:
            raise ValueError(f"Input format {format} is not supported; use torch.contiguous_format or torch.channels_last")
        if format == torch.channels_last and len(opts) != 4:
            raise ValueError(f"Input format torch.channels_last needs a 4-d shape, got {opts}")
        if tensor is not None:
            if tensor.dtype != dtype:
                raise ValueError(f"Input torch_tensor has dtype {tensor.dtype} but the Input's dtype is {dtype}")
            if tensor.dim() != len(opts) or not all(lo <= d <= hi for lo, d, hi in zip(mins, tensor.shape, maxs)):
                raise ValueError(f"Input torch_tensor of shape {tuple(tensor.shape)} is outside the Input's "
                                 f"shape range min {mins}, max {maxs}")
            tensor = tensor.detach()
        for key, value in (("min_shape", mins), ("opt_shape", opts), ("max_shape", maxs), ("dtype", dtype),
                           ("format", format), ("name", name), ("tensor_domain", _domain(tensor_domain)),
                           ("example_data", tensor)):
            object.__setattr__(self, key, value)

    def __setattr__(self, key: str, value: Any) -> None:
        """Set a field, checked as the constructor checks it (ValueError naming the problem)."""
        key = "format" if key == "memory_format" else key
        if key not in self._SETTABLE:
            raise AttributeError(f"Input.{key} cannot be set; settable: {', '.join(self._SETTABLE)}")
        fields = dict(min_shape=self.min_shape, opt_shape=self.opt_shape, max_shape=self.max_shape,
                      dtype=self.dtype, format=self.format, name=self.name,
                      tensor_domain=self.tensor_domain, torch_tensor=self.example_data)
        fields.update(dict.fromkeys(("min_shape", "opt_shape", "max_shape"), value) if key == "shape" else
                      {key: value})
        self.__dict__.update(Input(**fields).__dict__)

    @property
    def explicit_dtype(self) -> bool:
        """Whether the dtype was given (or taken from torch_tensor), not left to compile."""
        return self.dtype is not DType.unknown

    def with_default_dtype(self, dtype: torch.dtype) -> Input:
        """This Input, or where its dtype was not given a copy of it with `dtype`."""
        if self.explicit_dtype:
            return self
        spec = copy.copy(self)
        spec.dtype = dtype
        return spec

    @property
    def memory_format(self) -> torch.memory_format:
        """The layout inputs of this spec come in (Torch-TensorRT's other name for `format`)."""
        return self.format

    @classmethod
    def from_tensor(cls, tensor: torch.Tensor, name: str | None = None) -> Input:
        """An Input of exactly this tensor's shape, dtype and memory format; shape analysis runs on its data."""
        return cls(torch_tensor=tensor, name=name)

    @classmethod
    def from_tensors(cls, tensors: Sequence[torch.Tensor]) -> list[Input]:
        """`from_tensor` of each tensor."""
        if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (tuple, list)):
            raise ValueError(f"Input.from_tensors takes a list or tuple of tensors, got {type(tensors).__name__}")
        return [cls.from_tensor(t) for t in tensors]

    @property
    def is_dynamic(self) -> bool:
        return self.min_shape != self.max_shape

    @property
    def shape(self) -> tuple[int, ...] | dict[str, tuple[int, ...]]:
        """The shape of a static Input; for a range, {"min_shape": ..., "opt_shape": ..., "max_shape": ...}."""
        if not self.is_dynamic:
            return self.opt_shape
        return {"min_shape": self.min_shape, "opt_shape": self.opt_shape, "max_shape": self.max_shape}

    @property
    def torch_tensor(self) -> torch.Tensor | None:
        """The tensor this Input was made from, if any."""
        return self.example_data

    def example_tensor(self, optimization_profile_field: str | None = None) -> torch.Tensor:
        """A tensor of this spec on the CPU (Torch-TensorRT's name): at "min_shape", "opt_shape" or
        "max_shape"; a static Input needs no field."""
        if optimization_profile_field is None:
            if self.is_dynamic:
                raise ValueError("Input.example_tensor: this Input is a range; give optimization_profile_field="
                                 "'min_shape', 'opt_shape' or 'max_shape'")
            optimization_profile_field = "opt_shape"
        fields = {"min_shape": "min", "opt_shape": "opt", "max_shape": "max"}
        if optimization_profile_field not in fields:
            raise ValueError(f"Input.example_tensor: optimization_profile_field must be one of {list(fields)}, "
                             f"got {optimization_profile_field!r}")
        return self.example(torch.device("cpu"), fields[optimization_profile_field])

    def example(self, device: torch.device, which: str = "opt") -> torch.Tensor:
        """A tensor of this spec at its min, opt or max shape, for shape analysis: the tensor this Input was
        made from where its shape fits; else, with a tensor_domain, random values in it; else random floats,
        random bools, or ones for integers (safe as divisors and as indices into any embedding)."""
        shape = {"min": self.min_shape, "opt": self.opt_shape, "max": self.max_shape}[which]
        if not self.explicit_dtype:
            return self.with_default_dtype(torch.float32).example(device, which)
        if self.example_data is not None and tuple(self.example_data.shape) == shape:
            return self.example_data.to(device)
        if self.dtype == torch.bool:
            t = torch.rand(shape, device=device) > 0.5
        elif self.tensor_domain is not None:
            low, high = self.tensor_domain
            if self.dtype.is_floating_point:
                t = (torch.rand(shape, device=device, dtype=torch.float64) * (high - low) + low).to(self.dtype)
            else:
                t = torch.randint(math.ceil(low), max(math.ceil(high), math.ceil(low) + 1), shape, device=device,
                                  dtype=self.dtype)
        elif self.dtype.is_floating_point:
            t = torch.randn(shape, device=device).to(self.dtype)
        else:
            t = torch.ones(shape, device=device, dtype=self.dtype)
        return t.contiguous(memory_format=self.format)

    def __repr__(self) -> str:
        shape = f"shape={self.opt_shape}" if not self.is_dynamic else \
            f"min={self.min_shape}, opt={self.opt_shape}, max={self.max_shape}"
        domain = f", tensor_domain={self.tensor_domain}" if self.tensor_domain is not None else ""
        return f"Input({shape}, dtype={self.dtype}{domain})"


def as_input(spec: Input | torch.Tensor | Sequence[int]) -> Input:
    """Accept an Input, an example tensor or a plain shape."""
    if isinstance(spec, Input):
        return spec.with_default_dtype(torch.float32)
    if isinstance(spec, torch.Tensor):
        return Input.from_tensor(spec)
    if isinstance(spec, (tuple, list, torch.Size)):
        return Input(tuple(spec), dtype=torch.float32)
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


def engine_precision(p: Any) -> torch.dtype:
    """The engine precision `p` names (a torch.dtype, torchkiln.dtype or a name such as "fp16")."""
    p = to_torch_dtype(p)
    if isinstance(p, str) and p.lower() in _PRECISION_ALIASES:
        return _PRECISION_ALIASES[p.lower()]
    if isinstance(p, torch.dtype) and p in ENGINE_PRECISIONS:
        return p
    raise ValueError(
        f"enabled_precisions: unknown precision {p!r}; use torch.float32, torch.float16, torch.bfloat16, torch.int8 "
        f"or torch.float8_e4m3fn"
    )


def as_device(device: Any) -> torch.device:
    """The torch.device a `device` setting means (a string, torch.device, torchkiln.Device or its dict form);
    ValueError naming it where it is not one torchkiln compiles for here."""
    device = to_torch_device(device)
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


def calibration_samples(samples: Sequence[Any] | None, num_args: int) -> tuple[tuple[Any, ...], ...]:
    """calibration_inputs as one tuple of method arguments per sample (a tensor alone: a one-argument sample)."""
    if samples is None:
        return ()
    if isinstance(samples, torch.Tensor) or not isinstance(samples, Sequence):
        raise ValueError("calibration_inputs must be a list of samples, each a tensor (one-argument methods) or a "
                         "tuple of the method's arguments")
    found = []
    for i, sample in enumerate(samples):
        args = (sample,) if isinstance(sample, torch.Tensor) else sample
        if not isinstance(args, (tuple, list)) or len(args) != num_args:
            raise ValueError(f"calibration_inputs[{i}]: expected a tuple of {num_args} arguments (one per Input), "
                             f"got {type(sample).__name__}")
        found.append(tuple(args))
    return tuple(found)


def load_calibration_samples(path: str, num_args: int) -> tuple[tuple[Any, ...], ...]:
    """The samples saved at `path` by torch.save: a list of samples as calibration_inputs takes them (or one
    tensor: one sample)."""
    if not os.path.isfile(path):
        raise ValueError(f"calibration_inputs: there is no file {path!r}")
    try:
        value = torch.load(path, weights_only=True)
    except Exception as e:  # torch.load's errors are many, and long
        raise ValueError(f"calibration_inputs: {path!r} is not a torch.save file of tensors (and lists or tuples of "
                         f"them): torch.load(weights_only=True) refused it ({type(e).__name__})") from None
    return calibration_samples([value] if isinstance(value, torch.Tensor) else value, num_args)


# create()'s keywords besides the settings: the device when `device` is not given, and what a dict `inputs` gives
_CREATE_KEYWORDS = {"default_device": None, "input_names": (), "static_arguments": ()}


def _create_signature() -> inspect.Signature:
    """create()'s signature as help() shows it: the inputs, every setting with its default, and the keywords the
    compiler passes."""
    keyword = inspect.Parameter.KEYWORD_ONLY
    return inspect.Signature([
        inspect.Parameter("cls", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        inspect.Parameter("inputs", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        *(inspect.Parameter(s.name, keyword, default=s.default) for s in SETTINGS),
        *(inspect.Parameter(name, keyword, default=default) for name, default in _CREATE_KEYWORDS.items()),
    ])


# The fields' defaults are the table's defaults checked, which calls as_device, engine_precision and
# calibration_samples above.
@dataclasses.dataclass(frozen=True)
@with_fields(SETTINGS, after=("inputs", "input_signature"))
class CompileSettings:
    """Every choice one compile makes; built and validated by `CompileSettings.create`. Besides these fields it
    has one per setting of `settings_table.SETTINGS` (docs/settings.md).

    `input_signature` holds one entry per method argument: an Input, or a tuple/list/dict of them
    (nested) for an argument that is a collection of tensors. `inputs` is every Input of it, flattened.
    """

    inputs: tuple[Input, ...]
    input_signature: tuple[Any, ...] = ()
    # From a dict `inputs` (frontend/arguments.py): the arguments the tensor specs are for, in order (empty: the
    # leading arguments), and the non-tensor arguments fixed to a value by name. Others take their defaults.
    input_names: tuple[str, ...] = ()
    static_arguments: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not self.input_signature:  # built directly from flat Inputs: one tensor per argument
            object.__setattr__(self, "input_signature", tuple(self.inputs))

    @classmethod
    def create(cls, inputs: Sequence[Any] | None, **settings: Any) -> CompileSettings:
        """Validate user arguments; every problem is a ValueError naming the argument. The keywords are the
        settings of `settings_table.SETTINGS`, and `default_device` (the device when `device` is not given),
        `input_names` and `static_arguments` (from a dict `inputs`)."""
        unknown = sorted(set(settings) - set(BY_NAME) - set(_CREATE_KEYWORDS))
        if unknown:
            raise ValueError(f"unknown compile settings {unknown}; known: {list(BY_NAME)}")
        if inputs is None or isinstance(inputs, (Input, torch.Tensor, dict)):
            raise ValueError("inputs (or input_signature) must be a non-empty list of torchkiln.Input (or example "
                             "tensors), one per argument of the method")
        signature = tuple(as_signature(spec, f"inputs[{i}]") for i, spec in enumerate(inputs))
        if not signature:
            raise ValueError("inputs (or input_signature) must be a non-empty list of torchkiln.Input (or example "
                             "tensors), one per argument of the method")
        checked: dict[str, Any] = {"inputs": signature, "default_device": settings.get("default_device")}
        for s in SETTINGS:
            checked[s.name] = s.check(s.name, settings.get(s.name, s.default), checked)
        _check_sizes(signature, checked["device"])
        return cls(
            inputs=tuple(flatten_signature(signature)),
            input_signature=signature,
            input_names=tuple(settings.get("input_names", ())),
            static_arguments=tuple(settings.get("static_arguments", ())),
            **{s.name: checked[s.name] for s in SETTINGS},
        )

    def settings_without_effect(self) -> list[str]:
        """The settings marked no_effect given a value other than their default, as "name=value"."""
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        return [f"{s.name}={getattr(self, s.name)!r}" for s in SETTINGS
                if s.no_effect and getattr(self, s.name) != defaults[s.name]]

    @property
    def engine_backend(self) -> str:
        """The backend engines run on: `backend`, with "auto" resolved by the device."""
        if self.backend != "auto":
            return self.backend
        return AUTO_BACKEND.get(self.device.type, "reference")

    @property
    def quant_type(self) -> torch.dtype | None:
        """The type post-training quantization quantizes to: int8 where enabled, else fp8 e4m3 where enabled."""
        return next((p for p in QUANT_PRECISIONS if p in self.enabled_precisions), None)

    @property
    def compute_dtype(self) -> torch.dtype:
        """The float precision engine layers run in: the lowest enabled one."""
        for p in (torch.float16, torch.bfloat16):
            if p in self.enabled_precisions:
                return p
        return torch.float32


CompileSettings.create.__func__.__signature__ = _create_signature()
