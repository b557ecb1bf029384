"""What every backend shares: the options it is tuned with (stored in the engine's bytes), the runner protocol,
and the error a backend raises where it cannot run here. Backends import these from here, never from the
registry (`runtime/backends/__init__.py`) above them."""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

from torchkiln.settings_table import Setting, backend_fields, boolean, with_fields

if TYPE_CHECKING:
    import torch


class BackendUnavailable(Exception):
    """A backend cannot run a network here (its library is missing, or it refused the network)."""


class Runner(Protocol):
    """A network bound to one device and backend, ready to run."""

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """The network's outputs for `inputs` (checked by the engine); never aliasing an input or a weight
        unless the reference executor's would."""


# The options no compile setting feeds; the others are the fields of the settings table's backend mappings.
_BACKEND_ONLY = (
    Setting("cuda_graphs", "bool", True, "cuda: replay each input shape's launches as one CUDA graph", boolean),
)
OPTIONS: tuple[Setting, ...] = (*backend_fields(), *_BACKEND_ONLY)


@dataclasses.dataclass(frozen=True)
class SessionModels:
    """The ONNX model bytes an onnxruntime engine's sessions were made from (the module cache stores them), for
    the engine whose bytes end with the SHA-256 `engine_digest`, exported for ONNX Runtime `ort_version`."""

    engine_digest: bytes
    ort_version: str
    models: tuple[bytes | memoryview, ...]


@dataclasses.dataclass(frozen=True)
@with_fields(OPTIONS)
class BackendOptions:
    """What a backend may be tuned with; stored in the engine's bytes. One field per row of OPTIONS, each
    checked as its compile setting is (docs/settings.md)."""

    def __post_init__(self) -> None:
        for option in OPTIONS:
            option.check(option.name, getattr(self, option.name), {})

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> BackendOptions:
        """Options read from engine metadata (absent keys take their defaults); ValueError if one is bad."""
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})
