"""Engine bytes: round trip, and every kind of damage is a clear EngineFormatError (never a crash)."""
import hashlib
import json
import struct

import pytest
import torch

import torchkiln
from torchkiln.examples import SmallResNet
from torchkiln.runtime import serialization as S
from torchkiln.runtime.engine import Engine


@pytest.fixture(scope="module")
def engine_bytes():
    return torchkiln.convert_method_to_engine(SmallResNet().eval(), "forward", [torchkiln.Input((1, 3, 32, 32))])


def _split(data: bytes):
    _, version, _, glen, wlen = S._PREFIX.unpack_from(data)
    start = S._PREFIX.size
    return version, json.loads(data[start:start + glen]), data[start + glen:start + glen + wlen]


def _pack(graph, weights: bytes, version: int = S.FORMAT_VERSION) -> bytes:
    g = json.dumps(graph).encode()
    body = S._PREFIX.pack(S.MAGIC, version, 0, len(g), len(weights)) + g + weights
    return body + hashlib.sha256(body).digest()


def test_round_trip_runs_identically(engine_bytes):
    engine = Engine.deserialize(engine_bytes)
    again = Engine.deserialize(engine.serialize())
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(engine.execute([x])[0], again.execute([x])[0])
    assert b"pickle" not in engine_bytes and b"\x80\x04" not in engine_bytes[:64]


@pytest.mark.parametrize("cut", [0, 10, 31, 40, 1000, -1, -33])
def test_truncated(engine_bytes, cut):
    with pytest.raises(torchkiln.EngineFormatError, match="truncated"):
        Engine.deserialize(engine_bytes[:cut])


@pytest.mark.parametrize("where", [50, 400, 5000, -10])
def test_bit_flip(engine_bytes, where):
    damaged = bytearray(engine_bytes)
    damaged[where] ^= 0x10
    with pytest.raises(torchkiln.EngineFormatError, match="checksum mismatch"):
        Engine.deserialize(bytes(damaged))


def test_bad_magic(engine_bytes):
    with pytest.raises(torchkiln.EngineFormatError, match="bad magic"):
        Engine.deserialize(b"NOTKILN!" + engine_bytes[8:])


def test_newer_version_is_refused(engine_bytes):
    _, graph, weights = _split(engine_bytes)
    with pytest.raises(torchkiln.EngineFormatError, match="version 2 is newer"):
        Engine.deserialize(_pack(graph, weights, version=2))


def test_unknown_layer_kind(engine_bytes):
    _, graph, weights = _split(engine_bytes)
    graph["network"]["layers"][0]["kind"] = "os_system"
    with pytest.raises(torchkiln.EngineFormatError, match="unknown layer kind 'os_system'"):
        Engine.deserialize(_pack(graph, weights))


def test_missing_weight(engine_bytes):
    _, graph, weights = _split(engine_bytes)
    layer = next(entry for entry in graph["network"]["layers"] if entry["weights"])
    layer["weights"] = {k: "w99999" for k in layer["weights"]}
    with pytest.raises(torchkiln.EngineFormatError, match="is unknown or missing"):
        Engine.deserialize(_pack(graph, weights))


def test_weights_of_the_wrong_size(engine_bytes):
    _, graph, weights = _split(engine_bytes)
    conv = next(entry for entry in graph["network"]["layers"] if entry["kind"] == "convolution")
    other = next(entry for entry in graph["network"]["layers"]
                 if entry["kind"] == "convolution" and entry["weights"]["kernel"] != conv["weights"]["kernel"]
                 and entry is not conv)
    conv["weights"]["kernel"] = other["weights"]["kernel"]
    with pytest.raises(torchkiln.EngineFormatError, match="rejects inputs|declared"):
        Engine.deserialize(_pack(graph, weights))


def test_bad_parameter_type(engine_bytes):
    _, graph, weights = _split(engine_bytes)
    conv = next(entry for entry in graph["network"]["layers"] if entry["kind"] == "convolution")
    conv["params"]["groups"] = "__import__('os')"
    with pytest.raises(torchkiln.EngineFormatError, match="parameter 'groups'"):
        Engine.deserialize(_pack(graph, weights))


def test_undefined_input_reference(engine_bytes):
    _, graph, weights = _split(engine_bytes)
    graph["network"]["layers"][0]["inputs"] = ["../../etc/passwd"]
    with pytest.raises(torchkiln.EngineFormatError, match="is not defined before this layer"):
        Engine.deserialize(_pack(graph, weights))


def test_graph_is_not_json(engine_bytes):
    body = S._PREFIX.pack(S.MAGIC, 1, 0, 5, 0) + b"{nope"
    with pytest.raises(torchkiln.EngineFormatError, match="not valid JSON"):
        Engine.deserialize(body + hashlib.sha256(body).digest())


def test_huge_declared_lengths(engine_bytes):
    body = struct.pack("<8sIIQQ", S.MAGIC, 1, 0, 1 << 60, 1 << 60)
    with pytest.raises(torchkiln.EngineFormatError, match="truncated"):
        Engine.deserialize(body + b"\0" * 32)


def test_corrupt_engine_inside_a_saved_module_raises_on_call(tmp_path):
    model = SmallResNet().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input((1, 3, 32, 32))])
    blob = compiled._torchkiln_engine_0
    blob[100] ^= 0xFF  # damage the engine bytes the module carries
    torch.jit.save(compiled, tmp_path / "damaged.ts")
    loaded = torch.jit.load(tmp_path / "damaged.ts")
    with pytest.raises(RuntimeError, match="EngineFormatError: engine data is corrupted: checksum mismatch"):
        loaded(torch.randn(1, 3, 32, 32))
