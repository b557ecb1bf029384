"""Command-line values of the bench modes: device and precision by name."""
from __future__ import annotations

import torch

from torchkiln.input_spec import DTYPE_NAMES
from torchkiln.settings import ENGINE_PRECISIONS


def bench_device(name: str | None) -> torch.device:
    """The device named (cuda where available when None); ValueError for one that cannot be used here."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"unknown device {name!r}; use cpu or cuda") from None
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device {name!r} is not supported; use cpu or cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but CUDA is not available here")
    return device


def bench_precision(name: str | None, device: torch.device) -> torch.dtype:
    """The precision named (fp16 on cuda, fp32 on cpu when None); ValueError for one engines do not have."""
    if name is None:
        return torch.float16 if device.type == "cuda" else torch.float32
    dtype = DTYPE_NAMES.get(name.lower())
    if dtype not in ENGINE_PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; use fp32, fp16 or bf16")
    return dtype
