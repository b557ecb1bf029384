"""Engine bytes: a versioned header, a table of sections, a SHA-256.

Format 2 (written; little-endian):
    magic b"TKLNENG\\0" | u32 format version (2) | u32 number of sections
    | per section: 16-byte name (ASCII, NUL-padded) | u64 length
    | the sections, in table order | SHA-256 of everything before it
Sections: "meta" (JSON: name, device kind, precision, backend and its options, input bindings), "graph"
(JSON: the portable layer graph), "weights" (safetensors; absent without weights), and one "plan.K" (JSON,
`runtime.plan.Plan.to_json`) per target the engine was planned for, and one "tape.K" per tape the build recorded
(`runtime/tape_format.py`, docs/tape_format.md). Unknown sections are refused.
Format 1 (still read: engines saved before plans existed): magic | u32 1 | u32 0 | u64 graph length | u64
weights length | graph JSON holding the metadata and the network | weights | SHA-256. It has no plans, so
its backend plans it on load.

Reading never runs code: JSON and safetensors are data formats, every field is checked against the
layer kind's declared parameter types, every layer passes its kind's `validate` and the graph is
re-inferred layer by layer. Reading is bounded: JSON nesting, integer digits, the number of layers and
the length of every list are limited, and what running the engine would hold in memory and compute per call
must stay under ceilings (`runtime/limits.py`), checked on shapes alone, layer by layer, before anything is
allocated: the `max_memory` and `max_flops` arguments of `decode_engine` / `Engine.deserialize`, else
TORCHKILN_MAX_ENGINE_MEMORY (bytes) and TORCHKILN_MAX_ENGINE_FLOPS, else defaults scaled to the device the
engine runs on.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import gc
import hashlib
import json
import math
import reprlib
import struct
import sys
import types
import typing
from collections.abc import Sequence
from typing import Any

import safetensors.torch
import sympy
import torch

from torchkiln.errors import EngineFormatError, NetworkError
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import DimSymbol, SymbolicError, as_dim, from_tree, symbols_of, to_tree
from torchkiln.runtime import tape_format
from torchkiln.runtime.limits import MAX_LAYERS, Budget, last_readers, max_engine_flops, max_engine_memory

MAGIC = b"TKLNENG\0"
FORMAT_VERSION = 2
_PREFIX = struct.Struct("<8sIIQQ")  # format 1
_HEADER = struct.Struct("<8sII")  # format 2: magic, version, number of sections
_SECTION = struct.Struct("<16sQ")
MAX_SECTIONS = 64  # meta, graph, weights and the plans of up to 61 targets
_DIGEST = 32
MAX_GRAPH_BYTES = 64 << 20  # ~500 bytes for each of MAX_LAYERS layers; parsing it takes a few seconds
MAX_META_BYTES = 16 << 20  # the metadata and the plans together (a plan takes ~10 bytes a layer)
MAX_LIST = 64  # entries of a parameter list (strides, shapes, pads, axes...)
MAX_TENSORS = 1 << 12  # network inputs, network outputs, bindings, inputs of one layer
MAX_INT_DIGITS = 20  # a JSON integer beyond int64 is no shape, index or parameter
MAX_STRING = 1 << 12
MAX_SYMBOLS = 64
MAX_NESTING = 8  # control-flow layers inside control-flow layers' sub-networks

DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in L.TENSOR_DTYPES}
_show = reprlib.Repr()
_show.maxlevel, _show.maxlist, _show.maxdict, _show.maxstring, _show.maxother = 2, 6, 6, 60, 60


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _encode(value: Any) -> Any:
    if isinstance(value, sympy.Basic):  # a symbolic dim: an expression tree (ir/symbolic.py)
        return to_tree(as_dim(value))
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, torch.dtype):
        return dtype_name(value)
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def _decode(hint: Any, raw: Any, where: str, symbols: dict[str, DimSymbol] | None = None) -> Any:
    """Check `raw` against a parameter's type hint and convert it; an int may be a symbolic dim's tree."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if raw is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _decode(inner, raw, where, symbols)
    if origin is tuple:
        if not isinstance(raw, list):
            raise EngineFormatError(f"{where}: expected a list, got {type(raw).__name__}")
        if len(raw) > MAX_LIST:
            raise EngineFormatError(f"{where}: a list of {len(raw)} entries exceeds the limit of {MAX_LIST}")
        return tuple(_decode(args[0], v, where, symbols) for v in raw)
    if hint is bool:
        if isinstance(raw, bool):
            return raw
    elif hint is int:
        if isinstance(raw, int) and not isinstance(raw, bool):
            return raw
        if isinstance(raw, dict) and symbols:
            return _symbolic_dim(raw, symbols, where)
    elif hint is float:
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return float(raw)
    elif hint is str:
        if isinstance(raw, str) and len(raw) <= MAX_STRING:
            return raw
    elif hint is torch.dtype:
        if isinstance(raw, str) and raw in DTYPES:
            return DTYPES[raw]
    elif isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(raw)
        except ValueError:
            pass
    raise EngineFormatError(f"{where}: {_show.repr(raw)} is not a valid {getattr(hint, '__name__', hint)}")


def parse_shape(raw: Any, where: str) -> tuple[int, ...]:
    if not isinstance(raw, list) or len(raw) > L.MAX_RANK or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in raw):  # dynamic dims are symbols
        raise EngineFormatError(f"{where}: {_show.repr(raw)} is not a shape")
    return tuple(raw)


def _symbolic_dim(raw: Any, symbols: dict[str, DimSymbol], where: str) -> Any:
    try:
        return from_tree(raw, symbols)
    except SymbolicError as e:
        raise EngineFormatError(f"{where}: {e}") from None


def _parse_dims(raw: Any, where: str, symbols: dict[str, DimSymbol]) -> tuple[Any, ...]:
    """A shape whose dims are ints or symbolic dim trees."""
    if not isinstance(raw, list) or len(raw) > L.MAX_RANK:
        raise EngineFormatError(f"{where}: {raw!r:.80} is not a shape")
    return tuple(_symbolic_dim(d, symbols, where) if isinstance(d, dict) else parse_shape([d], where)[0]
                 for d in raw)


def _parse_symbols(raw: Any) -> dict[str, DimSymbol]:
    """The network's dim symbols: [{"name": "s0", "min": 1, "max": 8}, ...]."""
    if not isinstance(raw, list) or len(raw) > MAX_SYMBOLS:
        raise EngineFormatError(f"network symbols: expected a list of at most {MAX_SYMBOLS}")
    symbols: dict[str, DimSymbol] = {}
    for i, entry in enumerate(raw):
        where = f"network symbol {i}"
        name = _field(entry, "name", str, where)
        lo, hi = _field(entry, "min", int, where), _field(entry, "max", int, where)
        if name in symbols or not name.isidentifier() or len(name) > 64 or set(entry) != {"name", "min", "max"} \
                or isinstance(lo, bool) or isinstance(hi, bool) or not 0 <= lo <= hi < 1 << 40:
            raise EngineFormatError(f"{where}: malformed {entry!r:.80}")
        symbols[name] = DimSymbol(name, lo, hi)
    return symbols


def parse_dtype(raw: Any, where: str) -> torch.dtype:
    if not isinstance(raw, str) or raw not in DTYPES:
        raise EngineFormatError(f"{where}: {_show.repr(raw)} is not a dtype")
    return DTYPES[raw]


def _field(obj: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(obj, dict) or key not in obj or not isinstance(obj[key], kind):
        raise EngineFormatError(f"{where}: missing or malformed field {_show.repr(key)}")
    return obj[key]


def _list(obj: Any, key: str, where: str, limit: int = MAX_TENSORS) -> list[Any]:
    """A list field of at most `limit` entries."""
    value = _field(obj, key, list, where)
    if len(value) > limit:
        raise EngineFormatError(f"{where}: {key!r} holds {len(value)} entries, over the limit of {limit}")
    return value


def _parse_int(text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise EngineFormatError(f"engine graph holds an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_graph(raw: bytes) -> Any:
    """JSON with bounded integers; nesting beyond the interpreter's recursion limit is refused, not a crash."""
    try:
        return json.loads(raw.decode("utf-8"), parse_int=_parse_int)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise EngineFormatError(f"engine graph is not valid JSON: {e}") from None
    except RecursionError:
        raise EngineFormatError("engine graph is nested too deeply to be an engine") from None


@functools.cache
def _param_hints(kind: type[L.Layer]) -> tuple[tuple[str, Any], ...]:
    hints = typing.get_type_hints(kind)
    return tuple((f.name, hints[f.name]) for f in kind.param_fields())


@functools.cache
def param_defaults(kind: type[L.Layer]) -> dict[str, Any]:
    """The encoded defaults of `kind`'s parameters that have one: such a parameter may be absent from an engine (one
    written before the parameter existed), and reads as its default."""
    return {f.name: _encode(f.default) for f in kind.param_fields() if f.default is not dataclasses.MISSING}


def _encode_network(network: Network, weights: dict[str, torch.Tensor], keys: dict[int, str]) -> dict[str, Any]:
    """A network's JSON (a control-flow layer's sub-networks nested in its entry); weights go to `weights`."""
    layers = []
    for layer in network.layers:
        refs = {}
        for wname, w in layer.weights.items():
            if id(w) not in keys:
                key = f"w{len(keys)}"
                keys[id(w)] = key
                weights[key] = w.detach().cpu().contiguous()
            refs[wname] = keys[id(w)]
        entry = {
            "kind": layer.KIND,
            "name": layer.name,
            "inputs": [t.name for t in layer.inputs],
            "outputs": [{"name": t.name, "dtype": dtype_name(t.dtype), "shape": _encode(t.shape)} for t in layer.outputs],
            "weights": refs,
            "params": {k: _encode(v) for k, v in layer.params().items()},
        }
        if layer.SUBNETWORKS:
            entry["subnetworks"] = {f: _encode_network(getattr(layer, f), weights, keys) for f in layer.SUBNETWORKS}
        layers.append(entry)
    return {
        "name": network.name,
        "inputs": [{"name": t.name, "dtype": dtype_name(t.dtype), "shape": _encode(t.shape)} for t in network.inputs],
        "outputs": [t.name for t in network.outputs],
        "layers": layers,
    }


def engine_pieces(meta: dict[str, Any], network: Network, plans: Sequence[dict[str, Any]] = (),
                  tapes: Sequence[bytes] = ()) -> list[bytes | memoryview]:
    """Engine metadata, its network, its plans (JSON objects) and its tapes (sections' bytes,
    `runtime/tape_format.py`) in format 2, as pieces to join in order: the weights
    are views of the network's tensors, so that whoever joins them copies a large engine's bytes once, into where
    they are kept (`Engine.serialize`, `execute_op.engine_blob`)."""
    weights: dict[str, torch.Tensor] = {}
    graph = {"network": _encode_network(network, weights, {})}
    symbols = network.symbols()
    if symbols:  # dynamic shapes only, so engines of static shapes keep their bytes
        if len({s.name for s in symbols}) != len(symbols):
            raise EngineFormatError(f"network {network.name!r}: two dim symbols share a name")
        graph["network"]["symbols"] = [{"name": s.name, "min": s.lo, "max": s.hi} for s in symbols]
    text, others = _json_bytes(graph["network"]), [_json_bytes(meta), *(_json_bytes(plan) for plan in plans)]
    for what, n, limit in (("graph", len(text), MAX_GRAPH_BYTES),
                           ("metadata and plans", sum(map(len, others)), MAX_META_BYTES)):
        if n > limit:  # writing refuses what reading would
            raise EngineFormatError(f"network {network.name!r}: {what} of {n} bytes, over the {limit}-byte limit "
                                    f"of engines")
    sections: list[tuple[str, Chunks]] = [("meta", others[0]), ("graph", text)]
    if weights:
        sections.append(("weights", safetensors_chunks(weights)))
    sections += [(f"plan.{k}", data) for k, data in enumerate(others[1:])]
    sections += [(f"tape.{k}", data) for k, data in enumerate(tapes)]
    return section_pieces(sections)


# safetensors' dtype names, in the order its writer lays tensors out (then by name): larger alignment first.
_SAFETENSORS_DTYPES = {torch.int64: "I64", torch.float64: "F64", torch.float32: "F32", torch.int32: "I32",
                       torch.bfloat16: "BF16", torch.float16: "F16", torch.int16: "I16",
                       torch.float8_e4m3fn: "F8_E4M3", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
_SAFETENSORS_ORDER = {d: k for k, d in enumerate(_SAFETENSORS_DTYPES)}


def safetensors_chunks(tensors: dict[str, torch.Tensor]) -> list[bytes | memoryview]:
    """The bytes `safetensors.torch.save(tensors)` returns, in pieces: its header, then a view of each contiguous
    CPU tensor's own bytes, so that the weights are copied once (into the engine's bytes) instead of three times.
    safetensors itself writes them for a dtype outside the table or on a big-endian machine (on copies: it refuses
    tensors that share storage)."""
    if sys.byteorder != "little" or any(t.dtype not in _SAFETENSORS_DTYPES for t in tensors.values()):
        return [safetensors.torch.save({k: t.clone() for k, t in tensors.items()})]
    header: dict[str, Any] = {}
    chunks: list[bytes | memoryview] = []
    offset = 0
    for key in sorted(tensors, key=lambda k: (_SAFETENSORS_ORDER[tensors[k].dtype], k)):
        t = tensors[key]
        size = t.numel() * t.element_size()
        header[key] = {"dtype": _SAFETENSORS_DTYPES[t.dtype], "shape": list(t.shape),
                       "data_offsets": [offset, offset + size]}
        offset += size
        if size:
            chunks.append(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    text = _json_bytes(header)
    text += b" " * (-len(text) % 8)  # safetensors pads its header with spaces to a multiple of 8 bytes
    return [struct.pack("<Q", len(text)) + text, *chunks]


_SAFETENSORS_NAMES = {name: dtype for dtype, name in _SAFETENSORS_DTYPES.items()}
MAX_SAFETENSORS_HEADER = 100_000_000  # bytes: safetensors' own limit


def read_safetensors(data: bytes | memoryview) -> dict[str, torch.Tensor]:
    """The tensors of safetensors bytes, each copied once out of `data` where it lies. `safetensors.torch.load` takes
    only `bytes`, so an engine's weights were copied twice: into a `bytes` of the section, then into the tensors (2.5
    GB each for a 1B-parameter model, most of it the first touch of fresh pages). Bytes as `safetensors_chunks` writes
    them are read here; anything else (another dtype, a big-endian machine, a header this reader does not take) goes
    to safetensors itself, which decides, so this accepts nothing that safetensors would refuse."""
    view = memoryview(data).cast("B")
    entries = _plain_safetensors(view) if sys.byteorder == "little" else None
    if entries is None:
        return safetensors.torch.load(data if isinstance(data, bytes) else view.tobytes())
    start = 8 + struct.unpack_from("<Q", view)[0]
    tensors = {}
    for name, (dtype, shape, (begin, end)) in entries.items():
        flat = torch.empty(end - begin, dtype=torch.uint8)
        if end > begin:
            flat.numpy()[:] = view[start + begin:start + end]
        tensors[name] = flat.view(dtype).reshape(shape)
    return tensors


def _plain_safetensors(view: memoryview) -> dict[str, tuple[torch.dtype, list[int], tuple[int, int]]] | None:
    """The entries of a safetensors header that lays out tensors of the dtype table end to end, exactly covering the
    data after it, with no metadata but strings; None for anything else."""
    if len(view) < 8:
        return None
    size = struct.unpack_from("<Q", view)[0]
    if size > min(MAX_SAFETENSORS_HEADER, len(view) - 8) or view[8:9] != b"{":
        return None
    try:
        header = json.loads(view[8:8 + size].tobytes())
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(header, dict):
        return None
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        return None
    entries = {}
    for name, entry in header.items():
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            return None
        dtype, shape, offsets = _SAFETENSORS_NAMES.get(entry["dtype"]), entry["shape"], entry["data_offsets"]
        if dtype is None or not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2 or \
                not all(type(d) is int and d >= 0 for d in (*shape, *offsets)):
            return None
        begin, end = offsets
        if end - begin != math.prod(shape) * dtype.itemsize:
            return None
        entries[name] = (dtype, shape, (begin, end))
    reached = 0
    for _, _, (begin, end) in sorted(entries.values(), key=lambda e: e[2]):
        if begin != reached:
            return None
        reached = end
    return entries if reached == len(view) - 8 - size else None


Chunks = bytes | Sequence[bytes | memoryview]  # a section's data: its bytes, or pieces to join in order


def join_sections(sections: Sequence[tuple[str, Chunks]]) -> bytes:
    """Format-2 engine bytes of these (name, data) sections, checksum included. The data is hashed where it lies
    and copied once, into the result."""
    return b"".join(section_pieces(sections))


def section_pieces(sections: Sequence[tuple[str, Chunks]]) -> list[bytes | memoryview]:
    """`join_sections`'s bytes as pieces to join in order (the data where it lies, hashed there)."""
    pieces = [[data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data) for _, data in sections]
    lengths = [sum(memoryview(p).nbytes for p in section) for section in pieces]
    body = [_HEADER.pack(MAGIC, FORMAT_VERSION, len(sections)),
            *(_SECTION.pack(name.encode("ascii"), n) for (name, _), n in zip(sections, lengths)),
            *(p for section in pieces for p in section)]
    digest = hashlib.sha256()
    for piece in body:
        digest.update(piece)
    return [*body, digest.digest()]


def split_sections(data: bytes) -> list[tuple[str, bytes]]:
    """The (name, data) sections of format-2 engine bytes, in order (the checksum is not checked)."""
    _magic, _version, count = _HEADER.unpack_from(data)
    start = _HEADER.size + count * _SECTION.size
    out = []
    for k in range(count):
        raw_name, n = _SECTION.unpack_from(data, _HEADER.size + k * _SECTION.size)
        out.append((raw_name.rstrip(b"\0").decode("ascii"), data[start:start + n]))
        start += n
    return out


def _json_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode("utf-8")


def decode_engine(data: bytes | memoryview, max_memory: int | None = None, max_flops: int | None = None
                  ) -> tuple[dict[str, Any], Network, list[Any], list[bytes]]:
    """Check and parse engine bytes into (metadata, network, raw plans, tape sections); any problem is an
    EngineFormatError. The bytes are read in place (what is kept is copied out of them).

    `max_memory` and `max_flops` bound what the engine may plan (see `runtime/limits.py`; None: the environment's
    or the default ceiling of the engine's device kind). A bad ceiling is a ValueError."""
    # Loading makes many small objects; the cycle collector would rescan the growing heap again and again.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _decode_engine(data, max_memory, max_flops)
    finally:
        if collecting:
            gc.enable()


def _decode_engine(data: bytes | memoryview, max_memory: int | None, max_flops: int | None
                   ) -> tuple[dict[str, Any], Network, list[Any], list[bytes]]:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise EngineFormatError(f"engine data must be bytes, got {type(data).__name__}")
    if not isinstance(data, bytes):  # read where it lies: each section is copied out as bytes
        data = memoryview(data).cast("B")
    if len(data) < _PREFIX.size + _DIGEST:
        raise EngineFormatError(f"engine data is truncated: {len(data)} bytes is shorter than any engine")
    magic, version, _count = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise EngineFormatError("not a torchkiln engine (bad magic bytes)")
    if version > FORMAT_VERSION:
        raise EngineFormatError(f"engine format version {version} is newer than this torchkiln reads "
                                f"(up to {FORMAT_VERSION}); upgrade torchkiln to load it")
    if version < 1:
        raise EngineFormatError(f"engine format version {version} is unknown")
    sections = _sections_v1(data) if version == 1 else _sections(data)
    if len(sections["graph"]) > MAX_GRAPH_BYTES:
        raise EngineFormatError(f"engine graph of {len(sections['graph'])} bytes exceeds the {MAX_GRAPH_BYTES}-byte "
                                f"limit")
    meta_bytes = sum(len(v) for k, v in sections.items() if k not in ("graph", "weights") and not k.startswith("tape."))
    if meta_bytes > MAX_META_BYTES:
        raise EngineFormatError(f"engine metadata and plans of {meta_bytes} bytes exceed the {MAX_META_BYTES}-byte "
                                f"limit")
    graph = _parse_graph(sections["graph"])
    raw_weights = sections.get("weights", b"")
    try:
        weights = read_safetensors(raw_weights) if len(raw_weights) else {}
    except Exception as e:
        raise EngineFormatError(f"engine weights are not valid safetensors: {e}") from None
    if not isinstance(graph, dict):
        raise EngineFormatError("engine graph must be a JSON object")
    if version == 1:
        meta, raw_network = graph, _field(graph, "network", dict, "engine")
    else:
        meta, raw_network = _parse_graph(sections["meta"]), graph
        if not isinstance(meta, dict):
            raise EngineFormatError("engine metadata must be a JSON object")
    plans = [_parse_graph(sections[k]) for k in _numbered(sections, "plan.")]
    device_type = "cuda" if meta.get("device_type") == "cuda" else "cpu"  # another kind is refused after this
    ceilings = max_engine_memory(max_memory, device_type), max_engine_flops(max_flops, device_type)
    network = _decode_network(raw_network, weights, *ceilings)
    tapes = [sections[k] for k in _numbered(sections, "tape.")]
    for k, tape in enumerate(tapes):
        tape_format.check(tape, f"engine tape {k}", [layer.weights for layer in network.layers], len(network.inputs),
                          len(network.outputs), DTYPES)
    return meta, network, plans, tapes


def _numbered(sections: dict[str, bytes], prefix: str) -> list[str]:
    """The names of the sections `prefix`K, by K."""
    return sorted((k for k in sections if k.startswith(prefix)), key=lambda k: int(k[len(prefix):]))


def engine_digest(data: bytes | memoryview) -> bytes:
    """The SHA-256 that engine bytes end with, of the bytes before it (`decode_engine` checks it)."""
    return bytes(memoryview(data)[-_DIGEST:])


def _check_digest(data: bytes | memoryview) -> None:
    if hashlib.sha256(memoryview(data)[:-_DIGEST]).digest() != bytes(data[-_DIGEST:]):  # a view: not copied
        raise EngineFormatError("engine data is corrupted: checksum mismatch")


def _sections_v1(data: bytes | memoryview) -> dict[str, bytes | memoryview]:
    _magic, _version, _reserved, graph_len, weights_len = _PREFIX.unpack_from(data)
    expected = _PREFIX.size + graph_len + weights_len + _DIGEST
    if expected != len(data):
        raise EngineFormatError(f"engine data is truncated or padded: header declares {expected} bytes, got {len(data)}")
    _check_digest(data)
    start = _PREFIX.size
    return {"graph": bytes(data[start:start + graph_len]),
            "weights": memoryview(data)[start + graph_len:start + graph_len + weights_len]}  # read where it lies


def _sections(data: bytes | memoryview) -> dict[str, bytes | memoryview]:
    """Format 2's sections by name, checked against the table: known names, no repeats, lengths that add up."""
    _magic, _version, count = _HEADER.unpack_from(data)
    if count > MAX_SECTIONS:
        raise EngineFormatError(f"engine declares {count} sections (at most {MAX_SECTIONS})")
    start = _HEADER.size + count * _SECTION.size
    if start + _DIGEST > len(data):
        raise EngineFormatError("engine data is truncated: its section table runs past the end")
    table = [_SECTION.unpack_from(data, _HEADER.size + k * _SECTION.size) for k in range(count)]
    expected = start + sum(n for _, n in table) + _DIGEST
    if expected != len(data):
        raise EngineFormatError(f"engine data is truncated or padded: its sections declare {expected} bytes, "
                                f"got {len(data)}")
    _check_digest(data)
    sections: dict[str, bytes | memoryview] = {}
    for raw_name, n in table:
        name = raw_name.rstrip(b"\0").decode("ascii", "replace")
        known = name in ("meta", "graph", "weights") or any(
            name.startswith(prefix) and name[5:].isdigit() and len(name) <= 8 for prefix in ("plan.", "tape."))
        if not known or name in sections:
            raise EngineFormatError(f"engine section {name!r} is {'repeated' if known else 'unknown'}")
        # (the weights are read where they lie: `read_safetensors` copies each tensor out once)
        sections[name] = memoryview(data)[start:start + n] if name == "weights" else bytes(data[start:start + n])
        start += n
    for name in ("meta", "graph"):
        if name not in sections:
            raise EngineFormatError(f"engine has no {name!r} section")
    return sections


def _input_names(entry: Any) -> list[str]:
    """The input names a raw layer entry lists (what is malformed there is refused when the layer is read)."""
    names = entry.get("inputs") if isinstance(entry, dict) else None
    return [n for n in names if isinstance(n, str)] if isinstance(names, list) else []


def _check_defined(layer: L.Layer, known: set[DimSymbol], where: str) -> None:
    """Every symbol a layer uses is an input dim or the size an earlier data-dependent layer defines (nonzero's
    count, bound when it runs); a layer defines its own once. `known` grows by the layer's."""
    own = L.data_dependent_symbol(layer)
    if own is not None:
        if own in known:
            raise EngineFormatError(f"{where}: symbol {own.name} is defined twice (by an input dim or a layer)")
        known.add(own)
    unknown = symbols_of(list(layer.params().values()) + [t.shape for t in layer.outputs]) - known
    if unknown:
        raise EngineFormatError(f"{where}: uses symbols {sorted(s.name for s in unknown)} that no input dim or "
                                f"earlier layer defines")


def _decode_subnetworks(kind: type[L.Layer], entry: dict[str, Any], where: str, weights: dict[str, torch.Tensor],
                        max_memory: int, max_flops: int, symbols: dict[str, DimSymbol], depth: int,
                        count: list[int]) -> dict[str, Network]:
    """A control-flow layer's sub-networks (each read as a network is, with the outer network's symbols)."""
    raw = entry.get("subnetworks")
    if not kind.SUBNETWORKS:
        if raw is not None:
            raise EngineFormatError(f"{where}: a {kind.KIND} layer holds no sub-networks")
        return {}
    if depth >= MAX_NESTING:
        raise EngineFormatError(f"{where}: sub-networks nested more than {MAX_NESTING} deep")
    if not isinstance(raw, dict) or set(raw) != set(kind.SUBNETWORKS) or not all(isinstance(v, dict)
                                                                                for v in raw.values()):
        raise EngineFormatError(f"{where}: expected the sub-networks {list(kind.SUBNETWORKS)}")
    return {f: _decode_network(raw[f], weights, max_memory, max_flops, symbols, depth + 1, count)
            for f in kind.SUBNETWORKS}


def _decode_network(raw: dict[str, Any], weights: dict[str, torch.Tensor], max_memory: int,
                    max_flops: int, outer_symbols: dict[str, DimSymbol] | None = None, depth: int = 0,
                    count: list[int] | None = None) -> Network:
    """A network (depth 0) or a control-flow layer's sub-network; `count` holds the layers read so far at any depth,
    bounded by MAX_LAYERS together."""
    network = Network(str(_field(raw, "name", str, "network")))
    symbols = _parse_symbols(raw.get("symbols", [])) if outer_symbols is None else outer_symbols
    count = [0] if count is None else count
    tensors: dict[str, Any] = {}

    def define(name: Any, where: str) -> str:
        if not isinstance(name, str) or not name or len(name) > MAX_STRING:
            raise EngineFormatError(f"{where}: bad tensor name {_show.repr(name)}")
        if name in tensors:
            raise EngineFormatError(f"{where}: tensor {_show.repr(name)} defined twice")
        return name

    for i, entry in enumerate(_list(raw, "inputs", "network")):
        where = f"network input {i}"
        name = define(_field(entry, "name", str, where), where)
        t = network.add_input(name, parse_dtype(entry.get("dtype"), where), _parse_dims(entry.get("shape"), where, symbols))
        tensors[name] = t
    known = symbols_of([t.shape for t in network.inputs])
    raw_layers = _list(raw, "layers", "network", MAX_LAYERS)
    raw_outputs = _list(raw, "outputs", "network")
    budget = Budget(max_memory, max_flops, last_readers(_input_names(entry) for entry in raw_layers),
                    [name for name in raw_outputs if isinstance(name, str)])
    for i, entry in enumerate(raw_layers):
        where = f"layer {i}" if depth == 0 else f"{network.name[:60]!r} layer {i}"
        count[0] += 1
        if count[0] > MAX_LAYERS:
            raise EngineFormatError(f"{where}: the engine holds more than {MAX_LAYERS} layers with its sub-networks")
        kind_name = _field(entry, "kind", str, where)
        kind = L.LAYER_KINDS.get(kind_name)
        if kind is None:
            raise EngineFormatError(f"{where}: unknown layer kind {_show.repr(kind_name)}")
        name = _field(entry, "name", str, where)
        where = f"{where} ({kind_name} {name[:60]!r})"
        if not name or len(name) > MAX_STRING:
            raise EngineFormatError(f"{where}: bad layer name")
        inputs = []
        for tname in _list(entry, "inputs", where):
            if not isinstance(tname, str) or tname not in tensors:
                raise EngineFormatError(f"{where}: input {_show.repr(tname)} is not defined before this layer")
            inputs.append(tensors[tname])
        refs = _field(entry, "weights", dict, where)
        layer_weights = {}
        for wname, key in refs.items():
            if wname not in kind.WEIGHTS or not isinstance(key, str) or key not in weights:
                raise EngineFormatError(f"{where}: weight {_show.repr(wname)} -> {_show.repr(key)} is unknown or "
                                        f"missing")
            layer_weights[wname] = weights[key]
        raw_params = _field(entry, "params", dict, where)
        params = {}
        defaults = param_defaults(kind)
        for pname, hint in _param_hints(kind):
            if pname not in raw_params and pname not in defaults:
                raise EngineFormatError(f"{where}: missing parameter {pname!r}")
            raw = raw_params.get(pname, defaults.get(pname))
            params[pname] = _decode(hint, raw, f"{where} parameter {pname!r}", symbols)
        if not set(raw_params) <= set(params):
            extra = sorted(set(raw_params) - set(params))
            raise EngineFormatError(f"{where}: unknown parameters {_show.repr(extra)}")
        if name in network._names:
            raise EngineFormatError(f"{where}: layer name used twice")
        params.update(_decode_subnetworks(kind, entry, where, weights, max_memory, max_flops, symbols, depth, count))
        try:
            layer = network.add_layer(kind, inputs, weights=layer_weights, name=name, **params)
        except NetworkError as e:
            raise EngineFormatError(f"{where}: {e}") from None
        _check_defined(layer, known, where)
        declared = _list(entry, "outputs", where)
        if len(declared) != len(layer.outputs):
            raise EngineFormatError(f"{where}: declares {len(declared)} outputs, the layer has {len(layer.outputs)}")
        for out, spec in zip(layer.outputs, declared):
            oname = define(_field(spec, "name", str, where), where)
            if spec.get("shape") != _encode(out.shape) or parse_dtype(spec.get("dtype"), where) != out.dtype:
                raise EngineFormatError(f"{where}: output {_show.repr(oname)} declared {_show.repr(spec.get('dtype'))}"
                                        f"{_show.repr(spec.get('shape'))} but the layer computes "
                                        f"{dtype_name(out.dtype)}{list(out.shape)}")
            out.name = oname
            tensors[oname] = out
        budget.add(i, layer, where)
    marked: set[str] = set()
    for tname in raw_outputs:
        if not isinstance(tname, str) or tname not in tensors or tname in marked:
            raise EngineFormatError(f"network output {_show.repr(tname)} is not defined or listed twice")
        marked.add(tname)
        network.mark_output(tensors[tname])
    return network
