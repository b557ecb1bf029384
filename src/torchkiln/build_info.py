"""`dump_build_info` and `set_device`: what this torchkiln was built with, and the default CUDA device."""
from __future__ import annotations

import importlib.metadata
import platform
import sys
from typing import IO

import torch

from torchkiln._version import __version__


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def build_info() -> dict[str, object]:
    """Versions (torchkiln, Python, torch, CUDA, ONNX Runtime, onnx, Triton), the engine format version, the
    engine backends and the devices each runs on, and whether CUDA is available here."""
    from torchkiln.runtime.backends import BACKENDS
    from torchkiln.runtime.serialization import FORMAT_VERSION

    ort = _version("onnxruntime")
    return {
        "torchkiln": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda (torch built with)": torch.version.cuda,
        "cuda available": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "onnxruntime": ort,
        "onnx": _version("onnx"),
        "triton": _version("triton"),
        "engine format version": FORMAT_VERSION,
        "backends": {name: sorted(row.devices) for name, row in BACKENDS.items()
                     if name != "onnxruntime" or ort is not None},
    }


def dump_build_info(file: IO[str] | None = None) -> str:
    """Write `build_info()` as "key: value" lines to `file` (default stdout), as Torch-TensorRT's
    dump_build_info prints its build; returns the text."""
    text = "".join(f"{key}: {value}\n" for key, value in build_info().items())
    (file or sys.stdout).write(text)
    return text


def set_device(gpu_id: int) -> None:
    """Make CUDA device `gpu_id` the current one (`torch.cuda.set_device`), the one `device="cuda"` (no index)
    means; ValueError where it does not exist."""
    if isinstance(gpu_id, bool) or not isinstance(gpu_id, int):
        raise ValueError(f"set_device: gpu_id must be an int, got {gpu_id!r}")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not 0 <= gpu_id < count:
        raise ValueError(f"set_device: there is no CUDA device {gpu_id} here ({count} CUDA devices)")
    torch.cuda.set_device(gpu_id)
