"""torch.ops.torchkiln.execute_engine: how a stitched TorchScript module calls an engine.

The engine travels as a uint8 tensor attribute of the module (so torch.jit.save/load carry it);
it is deserialized once, on first call, and kept on that tensor object.
"""
from __future__ import annotations

import threading

import torch

from torchkiln.runtime.engine import Engine

_lib = torch.library.Library("torchkiln", "DEF")
_lib.define("execute_engine(Tensor[] inputs, Tensor engine) -> Tensor[]")
_load_lock = threading.Lock()


def engine_blob(data: bytes) -> torch.Tensor:
    """Engine bytes as the uint8 tensor a module holds."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def engine_from_blob(blob: torch.Tensor) -> Engine:
    """The Engine a module's blob holds, deserialized on first use."""
    engine = getattr(blob, "_torchkiln_engine", None)
    if engine is None:
        with _load_lock:
            engine = getattr(blob, "_torchkiln_engine", None)
            if engine is None:
                engine = Engine.deserialize(blob.detach().cpu().contiguous().numpy().tobytes())
                blob._torchkiln_engine = engine
    return engine


def _execute_engine(inputs: list[torch.Tensor], engine: torch.Tensor) -> list[torch.Tensor]:
    return engine_from_blob(engine).execute(inputs)


_lib.impl("execute_engine", _execute_engine, "CompositeExplicitAutograd")
# Engines are inference-only: under autograd the engine runs as is and its outputs do not require grad.
_lib.impl("execute_engine", _execute_engine, "Autograd")
