"""Write tests/engine_vectors/: engine files, good and hostile, each with the outcome every loader of the format
must give (manifest.json: "loaded", or the EngineFormatError's text). tests/test_engine_format.py loads them with
the Python loader and tests/test_cpp_runtime.py with the C++ one.

    PYTHONPATH=src python scripts/make_engine_vectors.py
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import struct
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

import torch  # noqa: E402

from test_engine_fuzz import _engine, pack, seed_engines, split  # noqa: E402
from torchkiln.errors import EngineFormatError  # noqa: E402
from torchkiln.ir import layers as L  # noqa: E402
from torchkiln.ir.network import Network  # noqa: E402
from torchkiln.ir.symbolic import DimSymbol  # noqa: E402
from torchkiln.runtime import serialization as S  # noqa: E402
from torchkiln.runtime import tape_format  # noqa: E402
from torchkiln.runtime.engine import Engine, InputBinding  # noqa: E402
from torchkiln.runtime.tape import record_tape  # noqa: E402

OUT = ROOT / "tests" / "engine_vectors"
# Vectors whose message ends in the words of the library that read the bytes (Python's json, the safetensors
# package, RapidJSON...): every loader gives this beginning.
LIBRARY_WORDS = {"graph_not_json.engine": "EngineFormatError: engine graph is not valid JSON: ",
                 "weights_not_safetensors.engine": "EngineFormatError: engine weights are not valid safetensors: "}
MAX_MEMORY, MAX_FLOPS = 16 << 20, 10 ** 9  # the ceilings the vectors are loaded under


def _dynamic() -> bytes:
    s = DimSymbol("s0", 1, 8)
    n = Network("dynamic")
    x = n.add_input("x", torch.float32, (s, 4))
    y = n.add_activation(x, L.ActivationType.CLIP, alpha=float("-inf"), beta=0.5).get_output()  # JSON -Infinity
    n.mark_output(n.add_reduce(y, L.ReduceOperation.SUM, (1,), keep_dims=True).get_output())
    binding = InputBinding("x", torch.float32, (1, 4), (4, 4), (8, 4))
    return Engine(n, [binding], "cpu", torch.float32, "dynamic").serialize()


def _edit(data: bytes, change) -> bytes:
    graph, weights = split(data)
    change(graph)
    return pack(graph, weights)


def _with_checksum(body: bytes) -> bytes:
    return body + hashlib.sha256(body).digest()


def _format_1(data: bytes) -> bytes:
    """The same engine in format 1 (saved before plans): one JSON of the metadata and the network, the weights."""
    graph, weights = split(data)
    graph.pop("plans")
    text = json.dumps(graph).encode()
    return _with_checksum(struct.pack("<8sIIQQ", S.MAGIC, 1, 0, len(text), len(weights)) + text + weights)


def _layer(graph: dict, kind: str) -> dict:
    return next(layer for layer in graph["network"]["layers"] if layer["kind"] == kind)


def _tapes(cnn: bytes) -> dict[str, bytes]:
    """The CNN with a CPU tape of its run (docs/tape_format.md), with that tape damaged, and with launches of a kernel
    of no params added, chained (`pdl`) and not, or with a `pdl` that is no bool."""
    tape = record_tape(Engine.deserialize(cnn), torch.device("cpu"))
    doc, blob = tape_format.decode(tape, "tape")
    launches = json.loads(json.dumps(doc))
    launches["kernels"].append({"name": "k", "cubin": [0, 0], "num_warps": 1, "shared": 0, "params": []})
    launches["body"] += [{"launch": 0, "grid": [1, 1, 1], "args": [], **pdl} for pdl in ({"pdl": True}, {"pdl": False},
                                                                                        {}, {"pdl": 1})]
    next(i for i in doc["prologue"] if "op" in i)["args"][0] = {"t": doc["outputs"][0]}
    damaged = {"good_tape": tape, "tape_read_before_written": tape_format.encode(doc, blob),
               "tape_bad_magic": b"TKTAPX" + tape[6:],
               "good_tape_pdl": tape_format.encode({**launches, "body": launches["body"][:-1]}, blob),
               "tape_pdl_not_bool": tape_format.encode(launches, blob)}
    return {name: S.join_sections([*S.split_sections(cnn), ("tape.0", t)]) for name, t in damaged.items()}


def vectors() -> dict[str, bytes]:
    cnn = seed_engines()[0]
    found = {f"good_{name}": data for name, data in zip(("cnn", "indexing", "attention", "workspace"),
                                                       seed_engines())}
    found["good_dynamic_clip_infinity"] = _dynamic()
    found["good_format_1"] = _format_1(cnn)
    found.update(_tapes(cnn))
    found["bad_magic"] = b"XKLNENG\0" + cnn[8:]
    found["truncated"] = cnn[:40]
    found["padded"] = cnn + b"\0"
    found["checksum"] = cnn[:-40] + bytes([cnn[-40] ^ 1]) + cnn[-39:]
    found["newer_version"] = _with_checksum(cnn[:8] + struct.pack("<I", 3) + cnn[12:-32])
    found["unknown_section"] = S.join_sections([*S.split_sections(cnn), ("extra", b"{}")])
    found["repeated_section"] = S.join_sections([*S.split_sections(cnn), ("meta", b"{}")])
    found["no_meta_section"] = S.join_sections([s for s in S.split_sections(cnn) if s[0] != "meta"])
    sections = dict(S.split_sections(cnn))
    for name, graph in (("graph_not_json", b'{"name": '), ("graph_not_object", b"[1, 2]"),
                        ("nested_too_deeply", b"[" * 5000 + b"]" * 5000),
                        ("integer_too_long", b'{"n": 1' + b"0" * 40 + b"}")):
        found[name] = S.join_sections([("meta", sections["meta"]), ("graph", graph)])
    found["weights_not_safetensors"] = S.join_sections([*((k, v) for k, v in S.split_sections(cnn) if k != "weights"),
                                                        ("weights", b"\x08\0\0\0\0\0\0\0garbage!")])
    found["unknown_layer_kind"] = _edit(cnn, lambda g: g["network"]["layers"][0].update(kind="teleport"))
    found["bad_parameter_type"] = _edit(cnn, lambda g: _layer(g, "convolution")["params"].update(groups="one"))
    found["unknown_parameter"] = _edit(cnn, lambda g: _layer(g, "convolution")["params"].update(colour=1))
    found["undefined_input"] = _edit(cnn, lambda g: _layer(g, "convolution").update(inputs=["nowhere"]))
    found["declared_output_differs"] = _edit(cnn, lambda g: _layer(g, "convolution")["outputs"][0].update(
        dtype="float64"))
    found["bad_backend_option"] = _edit(cnn, lambda g: g.update(ort_threads=-1))
    found["binding_dtype_differs"] = _edit(cnn, lambda g: g["bindings"][0].update(dtype="int32"))
    found["over_memory_ceiling"] = _engine("fill", lambda n: [n.add_fill(1 << 30, 0.0, 1.0, torch.float64)
                                                              .get_output()])
    found["over_compute_ceiling"] = _engine("products", lambda n: [
        n.add_matrix_multiply(n.add_input("x", torch.float32, (1024, 1024)), L.MatrixOperation.NONE,
                              n.add_input("y", torch.float32, (1024, 1024)), L.MatrixOperation.NONE).get_output()])
    return found


def outcome(data: bytes) -> str:
    try:
        Engine.deserialize(data, max_memory=MAX_MEMORY, max_flops=MAX_FLOPS)
    except EngineFormatError as e:
        return f"EngineFormatError: {e}"
    return "loaded"


if __name__ == "__main__":
    OUT.mkdir(exist_ok=True)
    manifest = {"max_memory": MAX_MEMORY, "max_flops": MAX_FLOPS, "library_words": LIBRARY_WORDS, "vectors": {}}
    for name, data in vectors().items():
        (OUT / f"{name}.engine").write_bytes(data)
        manifest["vectors"][f"{name}.engine"] = outcome(data)
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
