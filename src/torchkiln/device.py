"""`torchkiln.Device`: Torch-TensorRT's device description, from a string, a dict or a torch.device."""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import torch

from torchkiln.enums import DeviceType

_SPEC = re.compile(r"(cuda|gpu|dla|cpu)(?::(\d+))?")


@dataclasses.dataclass(frozen=True, init=False)
class Device:
    """Target device: `Device("cuda:0")`, `Device("dla:0", allow_gpu_fallback=True)`, `Device(gpu_id=1)`,
    `Device(device_type=DeviceType.CPU)`, `Device(torch.device("cpu"))`, or `Device._from(dict_or_anything)`."""

    device_type: DeviceType
    gpu_id: int
    dla_core: int
    allow_gpu_fallback: bool

    def __init__(self, spec: str | torch.device | None = None, *, device_type: DeviceType | None = None,
                 gpu_id: int | None = None, dla_core: int | None = None, allow_gpu_fallback: bool = False) -> None:
        kind, index = DeviceType.GPU, None
        if spec is not None:
            if device_type is not None:
                raise ValueError("Device takes a device string (or torch.device) or device_type=, not both")
            text = str(spec).strip().lower()
            match = _SPEC.fullmatch(text)
            if not match:
                raise ValueError(f"Device: {spec!r} is not a device; use 'cpu', 'cuda:N', 'gpu:N' or 'dla:N'")
            kind = {"cuda": DeviceType.GPU, "gpu": DeviceType.GPU, "dla": DeviceType.DLA,
                    "cpu": DeviceType.CPU}[match.group(1)]
            index = int(match.group(2)) if match.group(2) is not None else None
        elif device_type is not None:
            if not isinstance(device_type, DeviceType):
                raise ValueError(f"Device: device_type must be a torchkiln.DeviceType, got {device_type!r}")
            kind = device_type
        for name, value in (("gpu_id", gpu_id), ("dla_core", dla_core)):
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"Device: {name} must be an int >= 0, got {value!r}")
        if kind == DeviceType.DLA:
            dla_core = index if index is not None else (dla_core or 0)
            gpu_id = gpu_id or 0
        else:
            gpu_id = index if index is not None else (gpu_id if gpu_id is not None else _current_gpu(kind))
            dla_core = dla_core if dla_core is not None else -1
        if kind == DeviceType.CPU:
            gpu_id = -1
        for key, value in (("device_type", kind), ("gpu_id", gpu_id), ("dla_core", dla_core),
                           ("allow_gpu_fallback", bool(allow_gpu_fallback))):
            object.__setattr__(self, key, value)

    @classmethod
    def _from(cls, value: Any) -> Device:
        """A Device from a Device, a string, a torch.device or a dict of Device's keyword arguments."""
        if isinstance(value, Device):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - {"device_type", "gpu_id", "dla_core", "allow_gpu_fallback"})
            if unknown:
                raise ValueError(f"Device: unknown keys {unknown} in {value!r}")
            return cls(**value)
        if isinstance(value, (str, torch.device)):
            return cls(value)
        raise ValueError(f"device: {value!r} is not a device; give a string such as 'cuda:0', a torch.device, "
                         f"a torchkiln.Device or a dict of its fields")

    def to(self, target: Any = torch.device) -> torch.device:
        """The torch.device engines run on; a DLA device runs on its GPU when allow_gpu_fallback is set."""
        if target is not torch.device:
            raise ValueError(f"Device.to: only torch.device is a target, got {target!r}")
        if self.device_type == DeviceType.CPU:
            return torch.device("cpu")
        if self.device_type == DeviceType.DLA and not self.allow_gpu_fallback:
            raise ValueError(f"device: {self} asks for a DLA core; torchkiln has no DLA engines (give "
                             f"allow_gpu_fallback=True to run on GPU {self.gpu_id} instead)")
        if self.device_type == DeviceType.UNKNOWN:
            raise ValueError("device: DeviceType.UNKNOWN is not a device to compile for")
        return torch.device("cuda", self.gpu_id)

    def __str__(self) -> str:
        if self.device_type == DeviceType.CPU:
            return "Device(type=CPU)"
        if self.device_type == DeviceType.DLA:
            return (f"Device(type=DLA, dla_core={self.dla_core}, gpu_id={self.gpu_id}, "
                    f"allow_gpu_fallback={self.allow_gpu_fallback})")
        return f"Device(type={self.device_type.name}, gpu_id={self.gpu_id})"


def _current_gpu(kind: DeviceType) -> int:
    return torch.cuda.current_device() if kind == DeviceType.GPU and torch.cuda.is_available() else 0


def to_torch_device(value: Any) -> Any:
    """A torchkiln.Device, its dict form, or a 'gpu:N' / 'dla:N' string as the torch.device it means; anything
    else unchanged."""
    named = isinstance(value, str) and value.strip().lower().startswith(("gpu", "dla"))
    return Device._from(value).to(torch.device) if named or isinstance(value, (Device, dict)) else value
