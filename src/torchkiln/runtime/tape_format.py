"""A tape section's bytes (docs/tape_format.md): written from a recorded run, and checked on load.

The Python runtime never runs a tape (it has the plan, and Triton); it checks one as the C++ loader does, so that
both loaders give the same outcome on the same bytes, and keeps its bytes to write them again.
"""
from __future__ import annotations

import json
import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from torchkiln.errors import EngineFormatError

MAGIC = b"TKTAPE\0\0"
VERSION = 1
_HEADER = struct.Struct("<8sIQ")
MAX_JSON = 64 << 20
MAX_VALUES = 1 << 20
MAX_INSTRUCTIONS = 1 << 20
MAX_GRID = (2 ** 31 - 1, 2 ** 16 - 1, 2 ** 16 - 1)
SCALAR_PARAMS = ("i1", "i8", "i16", "i32", "i64", "u1", "u8", "u16", "u32", "u64", "fp16", "bf16", "fp32", "fp64")
INSTRUCTIONS = ("weight", "constant", "op", "launch")
MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")


def encode(doc: Mapping[str, Any], blob: bytes) -> bytes:
    """A tape section's bytes: the header, the JSON `doc` and the blob its offsets point into."""
    text = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(text) > MAX_JSON:
        raise EngineFormatError(f"a tape's JSON of {len(text)} bytes is over the {MAX_JSON}-byte limit")
    return _HEADER.pack(MAGIC, VERSION, len(text)) + text + blob


def decode(data: bytes, where: str) -> tuple[dict[str, Any], bytes]:
    """The (JSON object, blob) of a tape section, its header checked."""
    if len(data) < _HEADER.size:
        raise EngineFormatError(f"{where}: truncated ({len(data)} bytes)")
    magic, version, n = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EngineFormatError(f"{where}: not a tape (bad magic bytes)")
    if version != VERSION:
        raise EngineFormatError(f"{where}: tape version {version} is not {VERSION}")
    if n > MAX_JSON or _HEADER.size + n > len(data):
        raise EngineFormatError(f"{where}: its JSON of {n} bytes runs past the section or the {MAX_JSON}-byte limit")
    try:
        doc = json.loads(data[_HEADER.size:_HEADER.size + n], parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise EngineFormatError(f"{where}: its JSON does not parse: {e}") from None
    if not isinstance(doc, dict):
        raise EngineFormatError(f"{where}: its JSON is not an object")
    return doc, data[_HEADER.size + n:]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check(data: bytes, where: str, weights: Sequence[Mapping[str, Any]], num_inputs: int, num_outputs: int,
          dtypes: Mapping[str, Any]) -> None:
    """EngineFormatError unless `data` is a well-formed tape of an engine whose layers hold `weights` (per layer:
    name -> tensor), with `num_inputs` inputs and `num_outputs` outputs; `dtypes` are the format's dtype names."""
    doc, blob = decode(data, where)
    _Checker(doc, blob, where, weights, num_inputs, num_outputs, dtypes).run()


class _Checker:
    def __init__(self, doc: dict[str, Any], blob: bytes, where: str, weights: Sequence[Mapping[str, Any]],
                 num_inputs: int, num_outputs: int, dtypes: Mapping[str, Any]) -> None:
        self.doc, self.blob, self.where = doc, blob, where
        self.weights, self.num_inputs, self.num_outputs, self.dtypes = weights, num_inputs, num_outputs, dtypes
        self.written: set[int] = set()

    def fail(self, message: str) -> None:
        raise EngineFormatError(f"{self.where}: {message}")

    def field(self, obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
        value = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(value, kind):
            self.fail(f"{where}: {key!r} is missing or not a {getattr(kind, '__name__', kind)}")
        return value

    def integer(self, value: Any, lo: int, hi: int, what: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
            self.fail(f"{what} must be an integer in [{lo}, {hi}], got {str(value)[:40]}")
        return value

    def blob_range(self, raw: Any, what: str) -> None:
        if not isinstance(raw, list) or len(raw) != 2:
            self.fail(f"{what}: a blob range is [offset, length]")
        offset = self.integer(raw[0], 0, len(self.blob), f"{what} offset")
        self.integer(raw[1], 0, len(self.blob) - offset, f"{what} length")

    def run(self) -> None:
        doc = self.doc
        target = self.field(doc, "target", dict, "tape")
        for key in ("device_type", "device_name", "capability", "torch", "triton"):
            if len(self.field(target, key, str, "target")) > 256:
                self.fail(f"target {key} is too long")
        if target["device_type"] not in ("cpu", "cuda"):
            self.fail(f"target device_type {target['device_type'][:20]!r} is not cpu or cuda")
        inputs = self.field(doc, "inputs", list, "tape")
        if len(inputs) != self.num_inputs:
            self.fail(f"{len(inputs)} inputs for an engine of {self.num_inputs}")
        for k, raw in enumerate(inputs):
            if self.field(raw, "dtype", str, f"input {k}") not in self.dtypes:
                self.fail(f"input {k}: unknown dtype")
            self.shape(self.field(raw, "shape", list, f"input {k}"), f"input {k}")
        self.num_values = self.integer(doc.get("num_values"), self.num_inputs, MAX_VALUES, "num_values")
        self.written = set(range(self.num_inputs))
        self.kernels = self.field(doc, "kernels", list, "tape")
        for k, raw in enumerate(self.kernels):
            self.kernel(raw, f"kernel {k}")
        self.constants = self.field(doc, "constants", list, "tape")
        for k, raw in enumerate(self.constants):
            self.constant(raw, f"constant {k}")
        prologue, body = self.field(doc, "prologue", list, "tape"), self.field(doc, "body", list, "tape")
        if len(prologue) + len(body) > MAX_INSTRUCTIONS:
            self.fail(f"{len(prologue) + len(body)} instructions (at most {MAX_INSTRUCTIONS})")
        for part, instructions in (("prologue", prologue), ("body", body)):
            for k, raw in enumerate(instructions):
                self.instruction(raw, f"{part} instruction {k}")
        outputs = self.field(doc, "outputs", list, "tape")
        if len(outputs) != self.num_outputs:
            self.fail(f"{len(outputs)} outputs for an engine of {self.num_outputs}")
        for value in outputs:
            self.read(value, "outputs")

    def shape(self, raw: list[Any], what: str) -> list[int]:
        if len(raw) > 64:
            self.fail(f"{what}: rank {len(raw)} is over 64")
        return [self.integer(d, 0, 2 ** 62, f"{what} dim") for d in raw]

    def kernel(self, raw: Any, what: str) -> None:
        if len(self.field(raw, "name", str, what)) > 1024:
            self.fail(f"{what}: name too long")
        self.blob_range(raw.get("cubin"), f"{what} cubin")
        warps = self.integer(raw.get("num_warps"), 1, 32, f"{what} num_warps")
        if warps & (warps - 1):
            self.fail(f"{what}: num_warps {warps} is not a power of two")
        self.integer(raw.get("shared"), 0, 1 << 30, f"{what} shared")
        params = self.field(raw, "params", list, what)
        if len(params) > 1024 or not all(isinstance(p, str) and (p in SCALAR_PARAMS or (
                p.startswith("*") and p[1:] in SCALAR_PARAMS)) for p in params):
            self.fail(f"{what}: params must be at most 1024 of {', '.join(SCALAR_PARAMS)} or pointers to them")

    def constant(self, raw: Any, what: str) -> None:
        dtype = self.dtypes.get(self.field(raw, "dtype", str, what))
        if dtype is None:
            self.fail(f"{what}: unknown dtype")
        shape = self.shape(self.field(raw, "shape", list, what), what)
        strides = self.field(raw, "strides", list, what)
        if len(strides) != len(shape):
            self.fail(f"{what}: {len(strides)} strides for rank {len(shape)}")
        numel = math.prod(shape)
        extent = 1 + sum((d - 1) * self.integer(s, 0, 2 ** 62, f"{what} stride") for d, s in zip(shape, strides)) \
            if numel else 0
        if extent > numel:
            self.fail(f"{what}: its strides reach {extent} elements, past its {numel}")
        self.blob_range(raw.get("data"), f"{what} data")
        if raw["data"][1] != numel * dtype.itemsize:
            self.fail(f"{what}: {raw['data'][1]} bytes for {numel} elements of {dtype}")
        if raw.get("device") not in ("engine", "cpu"):
            self.fail(f"{what}: device must be 'engine' or 'cpu'")

    def read(self, value: Any, what: str) -> None:
        self.integer(value, 0, self.num_values - 1, f"{what}: value id")
        if value not in self.written:
            self.fail(f"{what}: reads value {value} before anything writes it")

    def write(self, value: Any, what: str) -> None:
        self.integer(value, 0, self.num_values - 1, f"{what}: value id")
        if value in self.written:
            self.fail(f"{what}: writes value {value} a second time")
        self.written.add(value)

    def instruction(self, raw: Any, what: str) -> None:
        kinds = [k for k in INSTRUCTIONS if k in raw] if isinstance(raw, dict) else []
        if len(kinds) != 1:
            self.fail(f"{what}: an instruction has exactly one of the keys {', '.join(INSTRUCTIONS)}")
        kind = kinds[0]
        if kind == "weight":
            ref = raw["weight"]
            if not isinstance(ref, list) or len(ref) != 2:
                self.fail(f"{what}: a weight is [layer, name]")
            layer = self.integer(ref[0], 0, len(self.weights) - 1, f"{what} layer")
            if not isinstance(ref[1], str) or ref[1] not in self.weights[layer]:
                self.fail(f"{what}: layer {layer} has no weight {str(ref[1])[:60]!r}")
            self.write(raw.get("out"), what)
        elif kind == "constant":
            self.integer(raw["constant"], 0, len(self.constants) - 1, f"{what} constant")
            self.write(raw.get("out"), what)
        elif kind == "op":
            if len(self.field(raw, "op", str, what)) > 256 or len(self.field(raw, "overload", str, what)) > 256:
                self.fail(f"{what}: operator name too long")
            self.argument(self.field(raw, "args", list, what), what, 0)
            kwargs = self.field(raw, "kwargs", dict, what)
            if len(kwargs) > 64 or any(len(k) > 256 for k in kwargs):
                self.fail(f"{what}: too many or too long kwargs")
            self.argument(list(kwargs.values()), what, 0)
            out = self.field(raw, "out", list, what)
            if len(out) > 1024:
                self.fail(f"{what}: over 1024 outputs")
            for value in out:
                if value is not None:
                    self.write(value, what)
        elif kind == "launch":
            k = self.integer(raw["launch"], 0, len(self.kernels) - 1, f"{what} kernel")
            grid = self.field(raw, "grid", list, what)
            if len(grid) != 3:
                self.fail(f"{what}: a grid is [x, y, z]")
            for d, hi in zip(grid, MAX_GRID):
                self.integer(d, 0, hi, f"{what} grid")
            args, params = self.field(raw, "args", list, what), self.kernels[k]["params"]
            if len(args) != len(params):
                self.fail(f"{what}: {len(args)} args for kernel {k}'s {len(params)} params")
            for arg, param in zip(args, params):
                if param.startswith("*"):
                    if not isinstance(arg, dict) or list(arg) != ["t"]:
                        self.fail(f"{what}: a pointer param takes a tensor value")
                    self.read(arg["t"], what)
                elif isinstance(arg, bool) or not isinstance(arg, (int, float)):
                    self.fail(f"{what}: a {param} param takes a number")
            if not isinstance(raw.get("pdl", False), bool):
                self.fail(f"{what}: 'pdl' must be true or false")

    def argument(self, values: list[Any], what: str, depth: int) -> None:
        if depth > 4 or len(values) > 4096:
            self.fail(f"{what}: arguments nested or long past the limits")
        for value in values:
            if isinstance(value, list):
                self.argument(value, what, depth + 1)
            elif isinstance(value, dict):
                self.tagged(value, what)
            elif isinstance(value, str) and len(value) > 4096:
                self.fail(f"{what}: a string argument is too long")

    def tagged(self, value: dict[str, Any], what: str) -> None:
        if len(value) != 1:
            self.fail(f"{what}: a tagged argument has one key")
        (tag, raw), = value.items()
        if tag == "t":
            self.read(raw, what)
        elif tag == "float":
            if raw not in ("inf", "-inf", "nan"):
                self.fail(f"{what}: a float is 'inf', '-inf' or 'nan'")
        elif tag == "dtype":
            if raw not in self.dtypes:
                self.fail(f"{what}: unknown dtype")
        elif tag == "device":
            if raw not in ("engine", "cpu"):
                self.fail(f"{what}: a device is 'engine' or 'cpu'")
        elif tag == "layout":
            if raw != "strided":
                self.fail(f"{what}: the only layout is 'strided'")
        elif tag == "memory_format":
            if raw not in MEMORY_FORMATS:
                self.fail(f"{what}: unknown memory format")
        else:
            self.fail(f"{what}: unknown argument tag {tag[:40]!r}")
