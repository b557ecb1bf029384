"""torch.ops.torchkiln.execute_engine: how a stitched TorchScript module calls an engine.

The engine travels as a uint8 tensor attribute of the module (so torch.jit.save/load carry it). It is
deserialized on first call and cached on that tensor object, keyed by the tensor's storage and version
counter, so writing other bytes into it (in place or by setattr) loads the new engine.

The call also carries the engine signature the module was compiled against (its inputs' and outputs'
dtypes and shapes, as text); an engine that does not match it is refused, and meta and fake tensors get
their outputs from it without running anything.
"""
from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Sequence

import torch

from torchkiln.errors import EngineFormatError, EngineIndexError, EngineInputError, TorchkilnError
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.serialization import dtype_name, parse_dtype

_lib = torch.library.Library("torchkiln", "DEF")
_lib.define("execute_engine(Tensor[] inputs, Tensor engine, str signature='') -> Tensor[]")
_load_lock = threading.Lock()
# The errors the op raises on purpose; TorchScript's interpreter turns them into RuntimeErrors whose text
# names them, and `reraise_engine_error` turns them back.
ENGINE_ERRORS: tuple[type[TorchkilnError], ...] = (EngineIndexError, EngineInputError, EngineFormatError)


def engine_blob(data: bytes) -> torch.Tensor:
    """Engine bytes as the uint8 tensor a module holds (a normal tensor even under inference_mode, so its
    version counter counts in-place writes)."""
    with torch.inference_mode(False):
        return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _spec(dtype: torch.dtype, shape: Sequence[int]) -> str:
    return f"{dtype_name(dtype)}[{','.join(str(d) for d in shape)}]"


def engine_signature(engine: Engine) -> str:
    """What a module expects of an engine: `inputs: float32[2,64]; outputs: float32[2,10]` (an input with a
    shape range lists each dim as min..max)."""
    ins = []
    for b in engine.bindings:
        dims = [str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in zip(b.min_shape, b.max_shape)]
        ins.append(f"{dtype_name(b.dtype)}[{','.join(dims)}]")
    outs = [_spec(t.dtype, t.shape) for t in engine.network.outputs]
    return f"inputs: {', '.join(ins)}; outputs: {', '.join(outs)}"


_OUTPUT = re.compile(r"(\w+)\[([\d,]*)\]")


def signature_outputs(signature: str) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """The outputs' dtypes and shapes an engine signature names."""
    _, sep, outs = signature.partition("; outputs: ")
    found = _OUTPUT.findall(outs) if sep else []
    if not sep or (outs and len(found) != outs.count("[")):
        raise EngineFormatError(f"malformed engine signature {signature!r}")
    return [(parse_dtype(d, "engine signature"), tuple(int(n) for n in dims.split(",") if n)) for d, dims in found]


@dataclasses.dataclass(frozen=True)
class _Loaded:
    key: tuple[int, int, int]
    engine: Engine
    signature: str


def _blob_key(blob: torch.Tensor) -> tuple[int, int, int]:
    """Changes whenever the bytes may have: another storage, or an in-place write (the version counter)."""
    version = -1 if blob.is_inference() else blob._version  # inference tensors cannot be written outside it
    return blob.data_ptr(), version, blob.numel()


def engine_from_blob(blob: torch.Tensor, expected: str = "") -> Engine:
    """The Engine a module's blob holds, deserialized when the bytes are new; refused (EngineFormatError)
    if `expected` names another engine signature."""
    key = _blob_key(blob)
    loaded = getattr(blob, "_torchkiln_engine", None)
    if loaded is None or loaded.key != key:
        with _load_lock:
            loaded = getattr(blob, "_torchkiln_engine", None)
            if loaded is None or loaded.key != key:
                engine = Engine.deserialize(blob.detach().cpu().contiguous().numpy().tobytes())
                loaded = _Loaded(key, engine, engine_signature(engine))
                blob._torchkiln_engine = loaded
    if expected and loaded.signature != expected:
        raise EngineFormatError(f"engine {loaded.engine.name!r} does not fit this module: the module expects "
                                f"{expected!r}, the engine has {loaded.signature!r}")
    return loaded.engine


def _execute_engine(inputs: list[torch.Tensor], engine: torch.Tensor,
                    signature: str = "") -> list[torch.Tensor]:
    return engine_from_blob(engine, signature).execute(inputs)


def _below_autograd(inputs: list[torch.Tensor], engine: torch.Tensor,
                    signature: str = "") -> list[torch.Tensor]:
    """Engines are inference-only: under autograd the engine runs as is and its outputs do not require grad."""
    with torch._C._AutoDispatchBelowADInplaceOrView():
        return torch.ops.torchkiln.execute_engine.default(inputs, engine, signature)


def _fake_execute_engine(inputs: list[torch.Tensor], engine: torch.Tensor,
                         signature: str = "") -> list[torch.Tensor]:
    """Meta and fake tensors: empty outputs of the engine's dtypes and shapes, on the inputs' device."""
    from torch._subclasses.fake_tensor import is_fake

    if not signature:  # a module saved before signatures were recorded: read the engine itself
        if engine.device.type == "meta" or is_fake(engine):
            raise EngineFormatError("this module records no engine signature, so its engine's output shapes "
                                    "are unknown without the engine's bytes (a real tensor attribute)")
        signature = engine_signature(engine_from_blob(engine))
    device = inputs[0].device if inputs else engine.device
    return [torch.empty(shape, dtype=dtype, device=device) for dtype, shape in signature_outputs(signature)]


for _key in ("CPU", "CUDA"):
    _lib.impl("execute_engine", _execute_engine, _key)
_lib.impl("execute_engine", _below_autograd, "Autograd")
torch.library.register_fake("torchkiln::execute_engine", _fake_execute_engine, lib=_lib)


_FROM_INTERPRETER = re.compile(r"^(?:\w+\.)*(" + "|".join(e.__name__ for e in ENGINE_ERRORS) + r"): (.*?)"
                               r"(?:\n\nAt:\n.*)?\Z", re.DOTALL | re.MULTILINE)
# After the TorchScript traceback: the original type and text ("builtins.RuntimeError" where a graph's own
# prim::RaiseException raised it, as the guard of a compiled module's static argument does).
_AFTER_TRACEBACK = re.compile(r"\n(?:builtins\.)?RuntimeError: ")


def reraise_engine_error(error: Exception) -> None:
    """If `error` is TorchScript's RuntimeError for an error the engine op raised, raise that torchkiln error
    type (from it) instead; otherwise return."""
    if isinstance(error, ENGINE_ERRORS):
        return
    text = str(error)
    marker = _AFTER_TRACEBACK.search(text)
    found = _FROM_INTERPRETER.match(text[marker.end():]) if marker is not None else None
    if found is None:
        return
    kind = next(e for e in ENGINE_ERRORS if e.__name__ == found.group(1))
    raise kind(found.group(2).rstrip()) from error
