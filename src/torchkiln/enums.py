"""Torch-TensorRT's enum names: `dtype`, `memory_format`, `DeviceType`, `EngineCapability` (ported scripts keep
their spelling)."""
from __future__ import annotations

import enum
from typing import Any

import torch

_TORCH_DTYPES = {
    "u8": torch.uint8, "i8": torch.int8, "i32": torch.int32, "i64": torch.int64, "f16": torch.float16,
    "f32": torch.float32, "f64": torch.float64, "b": torch.bool, "bf16": torch.bfloat16,
}


class dtype(enum.Enum):  # noqa: N801  (Torch-TensorRT's name)
    """Tensor element types by Torch-TensorRT's names; `.to(torch.dtype)` gives the torch dtype.

    `unknown` is an Input's dtype left for compile to choose (Torch-TensorRT's name): the model's floating-point
    parameter dtype, else float32.

    Aliases as in Torch-TensorRT: uint8; int8; int32, int; int64, long; f16, half, fp16, float16; f32, float,
    fp32, float32; f64, double, fp64, float64; b, bool; bf16, bfloat16.
    """

    unknown = "unknown"
    u8 = "u8"
    i8 = "i8"
    i32 = "i32"
    i64 = "i64"
    f16 = "f16"
    f32 = "f32"
    f64 = "f64"
    b = "b"
    bf16 = "bf16"
    uint8 = "u8"
    int8 = "i8"
    int32 = "i32"
    int = "i32"
    int64 = "i64"
    long = "i64"
    half = "f16"
    fp16 = "f16"
    float16 = "f16"
    float = "f32"
    fp32 = "f32"
    float32 = "f32"
    double = "f64"
    fp64 = "f64"
    float64 = "f64"
    bool = "b"
    bfloat16 = "bf16"

    def to(self, target: Any = torch.dtype) -> torch.dtype:
        """This type as `target`; only `torch.dtype` is a target here (there is no TensorRT type)."""
        if target is not torch.dtype:
            raise ValueError(f"dtype.to: only torch.dtype is a target in torchkiln, got {target!r}")
        if self is dtype.unknown:
            raise ValueError("dtype.unknown has no torch dtype: it leaves the choice to compile")
        return _TORCH_DTYPES[self.value]

    @classmethod
    def _from(cls, value: Any) -> dtype:
        """The member for a torch dtype, a member, or a name (Torch-TensorRT's `dtype._from`)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, torch.dtype):
            for key, t in _TORCH_DTYPES.items():
                if t == value:
                    return cls(key)
        if isinstance(value, str) and value in cls.__members__:
            return cls.__members__[value]
        raise ValueError(f"dtype: {value!r} is not a type torchkiln knows; use one of {sorted(cls.__members__)}")


def to_torch_dtype(value: Any) -> Any:
    """A torchkiln.dtype member as its torch dtype (dtype.unknown: None); anything else unchanged."""
    if value is dtype.unknown:
        return None
    return value.to(torch.dtype) if isinstance(value, dtype) else value


class memory_format(enum.Enum):  # noqa: N801  (Torch-TensorRT's name)
    """Tensor layouts by Torch-TensorRT's names; torchkiln's engines take the two torch has for 4-d tensors:
    `contiguous` (alias `linear`) and `channels_last` (alias `hwc`). `.to(torch.memory_format)` gives torch's."""

    contiguous = "contiguous"
    channels_last = "channels_last"
    linear = "contiguous"
    hwc = "channels_last"

    def to(self, target: Any = torch.memory_format) -> torch.memory_format:
        """This layout as `target`; only `torch.memory_format` is a target here."""
        if target is not torch.memory_format:
            raise ValueError(f"memory_format.to: only torch.memory_format is a target in torchkiln, got {target!r}")
        return torch.contiguous_format if self is memory_format.contiguous else torch.channels_last

    @classmethod
    def _from(cls, value: Any) -> memory_format:
        """The member for a torch memory format, a member, or a name."""
        if isinstance(value, cls):
            return value
        if value == torch.contiguous_format:
            return cls.contiguous
        if value == torch.channels_last:
            return cls.channels_last
        if isinstance(value, str) and value in cls.__members__:
            return cls.__members__[value]
        raise ValueError(f"memory_format: {value!r} is not a layout torchkiln's engines take; use "
                         f"torch.contiguous_format or torch.channels_last")


def to_torch_format(value: Any) -> Any:
    """A torchkiln.memory_format member as its torch memory format; anything else unchanged."""
    return value.to(torch.memory_format) if isinstance(value, memory_format) else value


class DeviceType(enum.Enum):
    """Where an engine runs: Torch-TensorRT's GPU and DLA, plus the CPU (torchkiln's own)."""

    UNKNOWN = "unknown"
    GPU = "gpu"
    DLA = "dla"
    CPU = "cpu"


class EngineCapability(enum.Enum):
    """Torch-TensorRT's engine capability; only STANDARD (alias `default`) means something for torchkiln's
    engines."""

    STANDARD = "standard"
    SAFETY = "safety"
    DLA_STANDALONE = "dla_standalone"
    default = "standard"


class CalibrationAlgo(enum.Enum):
    """How post-training quantization picks an activation's range from its calibration values (Torch-TensorRT's
    `ptq.CalibrationAlgo` names, and the two it lacked)."""

    MAX = "max"  # the largest |value| seen
    PERCENTILE = "percentile"  # the 99.99th percentile of |value|
    ENTROPY = "entropy"  # the range whose quantized histogram is nearest in KL divergence (TensorRT's entropy)
    MSE = "mse"  # the range of least mean squared quantization error
    ENTROPY_CALIBRATION = "entropy"  # Torch-TensorRT's names
    ENTROPY_CALIBRATION_2 = "entropy"
    MINMAX_CALIBRATION = "max"
    LEGACY_CALIBRATION = "percentile"
