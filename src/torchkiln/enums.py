"""Torch-TensorRT's enum names: `dtype`, `DeviceType`, `EngineCapability` (ported scripts keep their spelling)."""
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

    Aliases as in Torch-TensorRT: uint8; int8; int32, int; int64, long; f16, half, fp16, float16; f32, float,
    fp32, float32; f64, double, fp64, float64; b, bool; bf16, bfloat16.
    """

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
    """A torchkiln.dtype member as its torch dtype; anything else unchanged."""
    return value.to(torch.dtype) if isinstance(value, dtype) else value


class DeviceType(enum.Enum):
    """Where an engine runs: Torch-TensorRT's GPU and DLA, plus the CPU (torchkiln's own)."""

    UNKNOWN = "unknown"
    GPU = "gpu"
    DLA = "dla"
    CPU = "cpu"


class EngineCapability(enum.Enum):
    """Torch-TensorRT's engine capability; only STANDARD means something for torchkiln's engines."""

    STANDARD = "standard"
    SAFETY = "safety"
    DLA_STANDALONE = "dla_standalone"
