"""Engine bytes: round trip, and every kind of damage is a clear EngineFormatError (never a crash)."""
import hashlib
import json
import pathlib
import re
import struct
import tracemalloc
from collections.abc import Callable

import pytest
import torch
from harness import assert_matches_eager

import torchkiln
from torchkiln.errors import EngineFormatError, NetworkError
from torchkiln.examples import SmallResNet
from torchkiln.runtime import limits, serialization as S
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.runtime.executor import ReferenceExecutor


@pytest.fixture(scope="module")
def engine_bytes():
    return torchkiln.convert_method_to_engine(SmallResNet().eval(), "forward", [torchkiln.Input((1, 3, 32, 32))])


def _split(data: bytes):
    """(version, the metadata with the network under "network", weights); plans are dropped."""
    sections = dict(S.split_sections(data))
    graph = json.loads(sections["meta"])
    graph["network"] = json.loads(sections["graph"])
    return S.FORMAT_VERSION, graph, sections.get("weights", b"")


def _pack(graph, weights: bytes, version: int = S.FORMAT_VERSION) -> bytes:
    graph = dict(graph)
    network = graph.pop("network")
    data = _pack_text(json.dumps(graph).encode(), json.dumps(network).encode(), weights)
    return data if version == S.FORMAT_VERSION else _with_version(data, version)


def _pack_text(meta: bytes, network: bytes, weights: bytes) -> bytes:
    """Format-2 bytes with a correct table and checksum, as an attacker can make them."""
    return S.join_sections([("meta", meta), ("graph", network)] + ([("weights", weights)] if weights else []))


def _with_version(data: bytes, version: int) -> bytes:
    body = bytearray(data[:-32])
    struct.pack_into("<I", body, 8, version)
    return bytes(body) + hashlib.sha256(bytes(body)).digest()


def _pack_v1(graph, weights: bytes) -> bytes:
    g = json.dumps(graph).encode()
    body = S._PREFIX.pack(S.MAGIC, 1, 0, len(g), len(weights)) + g + weights
    return body + hashlib.sha256(body).digest()


def test_round_trip_runs_identically(engine_bytes):
    engine = Engine.deserialize(engine_bytes)
    again = Engine.deserialize(engine.serialize())
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(engine.execute([x])[0], again.execute([x])[0])
    assert b"pickle" not in engine_bytes and b"\x80\x04" not in engine_bytes[:64]


VECTORS = pathlib.Path(__file__).resolve().parent / "engine_vectors"
_MANIFEST = json.loads((VECTORS / "manifest.json").read_text())


@pytest.mark.parametrize("name", sorted(_MANIFEST["vectors"]))
def test_shared_engine_vectors(name):
    """The format's test vectors (scripts/make_engine_vectors.py), which tests/test_cpp_runtime.py loads with the C++
    loader: each loads, or is refused with its recorded message."""
    try:
        Engine.deserialize((VECTORS / name).read_bytes(), max_memory=_MANIFEST["max_memory"],
                           max_flops=_MANIFEST["max_flops"])
        got = "loaded"
    except EngineFormatError as e:
        got = f"EngineFormatError: {e}"
    assert got == _MANIFEST["vectors"][name]


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
    with pytest.raises(torchkiln.EngineFormatError, match="version 3 is newer"):
        Engine.deserialize(_pack(graph, weights, version=3))


def test_format_1_engines_still_load_and_are_planned_on_load(engine_bytes):
    """Engines saved before plans existed: the same graph and weights in the old layout."""
    _, graph, weights = _split(engine_bytes)
    old = Engine.deserialize(_pack_v1(graph, weights))
    assert old.plans == []
    x = torch.randn(1, 3, 32, 32)
    assert torch.equal(old.execute([x])[0], Engine.deserialize(engine_bytes).execute([x])[0])
    assert len(old.plans) == 1 and len(Engine.deserialize(old.serialize()).plans) == 1


@pytest.mark.parametrize("name", ["code", "plan.x", "meta"])
def test_unknown_or_repeated_sections_are_refused(engine_bytes, name):
    sections = S.split_sections(engine_bytes) + [(name, b"{}")]
    with pytest.raises(torchkiln.EngineFormatError, match="section .* is (unknown|repeated)"):
        Engine.deserialize(S.join_sections(sections))


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


def test_a_parameter_added_since_an_engine_was_written_reads_as_its_default(engine_bytes):
    """An engine written before a layer kind gained a parameter with a default (a convolution's groups here, as
    attention's enable_gqa was added) loads, with the default; one without a parameter that has none is refused."""
    _, graph, weights = _split(engine_bytes)
    conv = next(entry for entry in graph["network"]["layers"] if entry["kind"] == "convolution")
    assert "groups" in S.param_defaults(L.ConvolutionLayer)
    del conv["params"]["groups"]
    engine = Engine.deserialize(_pack(graph, weights))
    assert next(x for x in engine.network.layers if isinstance(x, L.ConvolutionLayer)).groups == 1
    required = next(f.name for f in L.ConvolutionLayer.param_fields() if f.name not in S.param_defaults(
        L.ConvolutionLayer))
    del conv["params"][required]
    with pytest.raises(torchkiln.EngineFormatError, match=f"missing parameter '{required}'"):
        Engine.deserialize(_pack(graph, weights))


def test_undefined_input_reference(engine_bytes):
    _, graph, weights = _split(engine_bytes)
    graph["network"]["layers"][0]["inputs"] = ["../../etc/passwd"]
    with pytest.raises(torchkiln.EngineFormatError, match="is not defined before this layer"):
        Engine.deserialize(_pack(graph, weights))


def test_graph_is_not_json(engine_bytes):
    with pytest.raises(torchkiln.EngineFormatError, match="not valid JSON"):
        Engine.deserialize(_pack_text(b"{}", b"{nope", b""))
    body = S._PREFIX.pack(S.MAGIC, 1, 0, 5, 0) + b"{nope"  # format 1
    with pytest.raises(torchkiln.EngineFormatError, match="not valid JSON"):
        Engine.deserialize(body + hashlib.sha256(body).digest())


def test_huge_declared_lengths(engine_bytes):
    body = struct.pack("<8sIIQQ", S.MAGIC, 1, 0, 1 << 60, 1 << 60)
    with pytest.raises(torchkiln.EngineFormatError, match="truncated"):
        Engine.deserialize(body + b"\0" * 32)
    body = struct.pack("<8sII16sQ16sQ", S.MAGIC, 2, 2, b"meta", 1 << 60, b"graph", 1 << 60)
    with pytest.raises(torchkiln.EngineFormatError, match="truncated"):
        Engine.deserialize(body + b"\0" * 32)
    with pytest.raises(torchkiln.EngineFormatError, match="sections"):
        Engine.deserialize(struct.pack("<8sII", S.MAGIC, 2, 1 << 31) + b"\0" * 64)


def test_corrupt_engine_inside_a_saved_module_raises_on_call(tmp_path):
    model = SmallResNet().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input((1, 3, 32, 32))])
    blob = compiled._torchkiln_engine_0
    blob[100] ^= 0xFF  # damage the engine bytes the module carries
    torch.jit.save(compiled, tmp_path / "damaged.ts")
    loaded = torch.jit.load(tmp_path / "damaged.ts")
    with pytest.raises(RuntimeError, match="EngineFormatError: engine data is corrupted: checksum mismatch"):
        loaded(torch.randn(1, 3, 32, 32))


# ---- hostile engines: each repro names the problem and costs bounded time and memory ------------------

def _engine_of(build, inputs=()) -> bytes:
    """Bytes of a small engine whose network `build(network, *inputs)` makes; inputs are (name, dtype, shape)."""
    network = Network("h")
    xs = [network.add_input(name, dtype, shape) for name, dtype, shape in inputs]
    for out in build(network, *xs):
        network.mark_output(out)
    bindings = [InputBinding(t.name, t.dtype, t.shape, t.shape, t.shape) for t in network.inputs]
    return Engine(network, bindings, "cpu", torch.float32, "h").serialize()


def _fill_engine() -> bytes:
    return _engine_of(lambda n: [n.add_fill(4, 0.0, 1.0, torch.float32).get_output()])


def test_deeply_nested_json_is_a_format_error(engine_bytes):
    _, graph, weights = _split(engine_bytes)
    network = graph.pop("network")
    deep = ("[" * 200_000 + "]" * 200_000).encode()
    for meta, net in ((json.dumps(graph).encode(), deep), (deep, json.dumps(network).encode())):
        with pytest.raises(torchkiln.EngineFormatError, match="nested too deeply"):
            Engine.deserialize(_pack_text(meta, net, weights))


def test_deep_value_in_a_parameter_is_a_format_error():
    _, graph, weights = _split(_fill_engine())
    graph["network"]["layers"][0]["params"]["length"] = "@@@"
    network = graph.pop("network")
    g = json.dumps(network).replace('"@@@"', "[" * 950 + "]" * 950).encode()  # deep, yet within JSON's own limit
    with pytest.raises(torchkiln.EngineFormatError, match="parameter 'length'|nested too deeply") as e:
        Engine.deserialize(_pack_text(json.dumps(graph).encode(), g, weights))
    assert len(str(e.value)) < 300


def test_five_thousand_digit_integer_is_a_format_error():
    _, graph, weights = _split(_fill_engine())
    network = graph.pop("network")
    g = json.dumps(network).replace('"length": 4', '"length": ' + "7" * 5000).encode()
    with pytest.raises(torchkiln.EngineFormatError, match="integer of 5000 digits"):
        Engine.deserialize(_pack_text(json.dumps(graph).encode(), g, weights))


@pytest.mark.parametrize("length", [3 << 28, 1 << 62])
def test_tiny_engine_with_a_huge_fill_is_refused_at_load(length):
    _, graph, weights = _split(_fill_engine())
    graph["network"]["layers"][0]["params"]["length"] = length
    graph["network"]["layers"][0]["outputs"][0]["shape"] = [length]
    data = _pack(graph, weights)
    assert len(data) < 1024  # a few hundred bytes
    tracemalloc.start()
    try:
        with pytest.raises(torchkiln.EngineFormatError, match="plans .* bytes .* limit|size calculation overflowed"):
            Engine.deserialize(data, max_memory=1 << 30)
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


def test_tiny_engine_with_a_huge_expand_is_refused_at_load():
    data = _engine_of(lambda n, x: [n.add_expand(x, (4,)).get_output()], [("x", torch.float32, (1,))])
    _, graph, weights = _split(data)
    expand = graph["network"]["layers"][0]
    expand["name"], expand["outputs"][0]["name"], graph["network"]["outputs"] = "e", "y", ["y"]
    expand["params"]["shape"] = expand["outputs"][0]["shape"] = [1 << 20, 1 << 20]
    data = _pack(graph, weights)
    assert len(data) < 1024  # a few hundred bytes
    with pytest.raises(torchkiln.EngineFormatError, match="plans .* bytes .* limit"):
        Engine.deserialize(data)


def test_memory_limit_from_the_environment(monkeypatch):
    data = _fill_engine()  # 16 bytes of output, computed through 3 float64 vectors of 4
    monkeypatch.setenv("TORCHKILN_MAX_ENGINE_MEMORY", "8")
    with pytest.raises(torchkiln.EngineFormatError, match="plans 112 bytes .* workspace 96.* 8-byte limit"):
        Engine.deserialize(data)
    assert Engine.deserialize(data, max_memory=112).execute([])[0].tolist() == [0.0, 1.0, 2.0, 3.0]
    monkeypatch.setenv("TORCHKILN_MAX_ENGINE_MEMORY", "lots")
    with pytest.raises(ValueError, match="TORCHKILN_MAX_ENGINE_MEMORY='lots' is not a number of bytes"):
        Engine.deserialize(data)


def _chain(n: int, width: int) -> bytes:
    """x -> n negations in a row: n outputs of `width` floats, two of them live at any time."""
    def build(net, x):
        for _ in range(n):
            x = net.add_unary(x, L.UnaryOperation.NEG).get_output()
        return [x]

    return _engine_of(build, [("x", torch.float32, (width,))])


def test_memory_ceiling_counts_the_live_tensors_not_every_output():
    data = _chain(64, 1 << 16)  # 64 outputs of 256 KiB: 16 MiB in all, 512 KiB live at once
    engine = Engine.deserialize(data, max_memory=1 << 20)
    x = torch.randn(1 << 16)
    assert torch.equal(engine.execute([x])[0], x)
    with pytest.raises(torchkiln.EngineFormatError, match=r"layer 0 \(unary .*plans 262144 bytes .* live tensors "
                                                          r"262144.* 200000-byte limit"):
        Engine.deserialize(data, max_memory=200_000)


def test_gpt2_at_a_batch_whose_outputs_sum_over_the_ceiling_compiles_and_runs(monkeypatch):
    """GPT-2 base at batch 32 x 128 planned 10.8 GiB of layer outputs against a 4 GiB ceiling (refused at its
    first call) while its live tensors peak at 0.2 GiB; here a small GPT-2 at 8 x 128 (40 MB of outputs, 7 MB
    of weights and live tensors, 10 MB of attention scores on the math path) under a 24 MB ceiling."""
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=128,
                                     use_cache=False)
    model = transformers.GPT2Model(config).eval()
    ids = torch.randint(0, 1000, (8, 128))
    monkeypatch.setenv("TORCHKILN_MAX_ENGINE_MEMORY", str(24 << 20))
    compiled = torchkiln.compile(model, [ids])
    with torch.no_grad():
        out, ref = compiled(ids), model(ids).last_hidden_state
    out = out["last_hidden_state"] if isinstance(out, dict) else out[0]
    assert_matches_eager(out, ref)


@pytest.mark.parametrize("setting, value, match", [
    ("TORCHKILN_MAX_ENGINE_MEMORY", "100000", r"layer \d+ \(\w+ .*plans \d+ bytes .* 100000-byte limit"),
    ("TORCHKILN_MAX_ENGINE_FLOPS", "1e6", r"layer \d+ \(\w+ .*plans .* FLOPs per call by this layer, over the "
                                          r"limit of 1e\+06 .*TORCHKILN_MAX_ENGINE_FLOPS"),
])
def test_compile_refuses_an_engine_its_loader_would_refuse(monkeypatch, setting, value, match):
    """The error comes at compile time, naming the layer, not at the compiled module's first call."""
    monkeypatch.setenv(setting, value)
    with pytest.raises(torchkiln.EngineFormatError, match=match):
        torchkiln.compile(SmallResNet().eval(), [torchkiln.Input((1, 3, 32, 32))])


def _expanded(net, x, shape):
    return net.add_expand(x, shape).get_output()


# Each allocates gigabytes inside one layer while its outputs are small; measured on the reference backend.
_HOSTILE = {
    # 150 MB of bools computed through three float64 vectors: +3.4 GiB
    "fill": (lambda n: [n.add_fill(150_000_000, 0.0, 1.0, torch.bool).get_output()], [], "fill"),
    # a stride-0 last dim forces SDPA's math path: 25000^2 scores, +5.2 GiB
    "attention": (lambda n, x: [n.add_attention(*[_expanded(n, x, (1, 1, 25_000, 2))] * 3).get_output()],
                  [("x", torch.float32, (1, 1, 1, 1))], "attention"),
    # 0.5 GB of uint8 pixels resampled through float32 buffers: 2.6 GiB
    "upsample": (lambda n, x: [n.add_resize(x, "bilinear", size=(23_000, 23_000)).get_output()],
                 [("x", torch.uint8, (1, 1, 2, 2))], "resize"),
    # step -1 is an index_select that copies the whole 1.25 GiB view
    "slice": (lambda n, x: [n.add_slice(_expanded(n, x, (2, 5 << 27)), (1, 0), (2, 1), (-1, 1)).get_output()],
              [("x", torch.uint8, (1, 1))], "slice"),
    # float64 convolutions unfold the whole batch: 9 taps of a 0.5 GiB image
    "im2col": (lambda n, x: [n.add_convolution_nd(_expanded(n, x, (1, 1, 8192, 8192)), torch.ones(1, 1, 3, 3,
                                                  dtype=torch.float64), stride=(1, 1), padding=(1, 1),
                                                  dilation=(1, 1)).get_output()],
               [("x", torch.float64, (1, 1, 1, 1))], "convolution"),
}


@pytest.mark.parametrize("case", sorted(_HOSTILE))
def test_what_a_layer_allocates_inside_counts_against_the_ceiling(case):
    build, inputs, kind = _HOSTILE[case]
    data = _engine_of(build, inputs)
    assert len(data) < 1200
    tracemalloc.start()
    try:
        with pytest.raises(torchkiln.EngineFormatError, match=rf"layer \d+ \({kind} .*plans \d+ bytes at this layer "
                                                              rf"\(.* the layer's workspace \d+\), over the "
                                                              rf"2147483648-byte limit"):
            Engine.deserialize(data, max_memory=2 << 30)
        assert tracemalloc.get_traced_memory()[1] < 16 << 20
    finally:
        tracemalloc.stop()


def _matmul_chain(count: int) -> bytes:
    """`count` products of 4096 x 4096 matrices in a row, from a fill: no weights, a few KB."""
    def build(n):
        row = n.add_shuffle(n.add_fill(4096, 0.0, 1e-4, torch.float32).get_output(), reshape_dims=(1, 4096))
        m = _expanded(n, row.get_output(), (4096, 4096))
        y = m
        for _ in range(count):
            y = n.add_matrix_multiply(y, L.MatrixOperation.NONE, m, L.MatrixOperation.NONE).get_output()
        return [n.add_reduce(y, L.ReduceOperation.SUM, (0, 1), False).get_output()]

    return _engine_of(build)


def test_compute_ceiling_refuses_a_small_engine_of_many_big_products(monkeypatch):
    data = _matmul_chain(60)  # 8.2e12 FLOPs: over a minute on two cores
    assert len(data) < 16_000
    with pytest.raises(torchkiln.EngineFormatError, match=r"layer 10 \(matrix_multiply .*plans 1.1e\+12 FLOPs per "
                                                          r"call by this layer, over the limit of 1e\+12"):
        Engine.deserialize(data, max_flops=10 ** 12)
    monkeypatch.setenv("TORCHKILN_MAX_ENGINE_FLOPS", "1e12")
    with pytest.raises(torchkiln.EngineFormatError, match="over the limit of 1e\\+12"):
        Engine.deserialize(data)
    assert len(Engine.deserialize(data, max_flops=10 ** 13).network.layers) == 64


def test_default_ceilings_scale_with_the_device():
    assert limits.max_engine_memory() == limits.CPU_MEMORY_SHARE * limits.cpu_memory() // 1
    assert limits.max_engine_flops() == limits.COMPUTE_SECONDS * limits.CPU_CORE_FLOPS * limits.cpu_cores()
    assert limits.max_engine_memory(5) == 5 and limits.max_engine_flops(7, "cuda") == 7


def test_too_many_layers_is_refused_before_inference(monkeypatch):
    _, graph, weights = _split(_fill_engine())
    graph["network"]["layers"] *= 3
    monkeypatch.setattr(S, "MAX_LAYERS", 2)
    with pytest.raises(torchkiln.EngineFormatError, match="'layers' holds 3 entries, over the limit of 2"):
        Engine.deserialize(_pack(graph, weights))


def _fill_network_engine() -> Engine:
    network = Network("h")
    network.mark_output(network.add_fill(4, 0.0, 1.0, torch.float32).get_output())
    return Engine(network, [], "cpu", torch.float32, "h")


@pytest.mark.parametrize("limit, match", [
    ("MAX_GRAPH_BYTES", r"graph of \d+ bytes(,| exceeds) .*100-byte limit"),
    ("MAX_META_BYTES", r"metadata and plans of \d+ bytes(,| exceed) .*100-byte limit"),
])
def test_json_sections_are_bounded_before_they_are_parsed_and_when_written(monkeypatch, limit, match):
    engine = _fill_network_engine()
    data = engine.serialize()
    monkeypatch.setattr(S, limit, 100)
    monkeypatch.setattr(S, "_parse_graph", None)  # refused before any JSON is read
    with pytest.raises(torchkiln.EngineFormatError, match=match):
        Engine.deserialize(data)
    with pytest.raises(torchkiln.EngineFormatError, match=match):
        engine.serialize()


def test_long_parameter_list_is_refused(engine_bytes):
    _, graph, weights = _split(engine_bytes)
    conv = next(entry for entry in graph["network"]["layers"] if entry["kind"] == "convolution")
    conv["params"]["stride"] = [1] * 100_000
    with pytest.raises(torchkiln.EngineFormatError, match="parameter 'stride'.* list of 100000"):
        Engine.deserialize(_pack(graph, weights))


@pytest.mark.parametrize("shapes, match", [
    (((1, 3, 32, 32), (1, 3, 32, 32), (2, 3, 32, 32)), "fixed dim 0 of 1"),
    (((1, 3, 32, 32), (1, 3, 32, 32), (1, 3, 32, 64)), "fixed dim 3 of 32"),
    (((1, 3, 16, 16), (1, 3, 16, 16), (1, 3, 16, 16)), "fixed dim 2 of 32"),
    (((1, 3, 32, 32), (1, 3, 32), (1, 3, 32, 32)), "ranks"),
])
def test_bindings_must_match_the_network_inputs(engine_bytes, shapes, match):
    _, graph, weights = _split(engine_bytes)
    for key, shape in zip(("min_shape", "opt_shape", "max_shape"), shapes):
        graph["bindings"][0][key] = list(shape)
    with pytest.raises(torchkiln.EngineFormatError, match=match):
        Engine.deserialize(_pack(graph, weights))


def test_binding_range_must_be_ordered():
    data = _engine_of(lambda n, x: [n.add_identity(x).get_output()], [("x", torch.float32, (4, 4))])
    _, graph, weights = _split(data)
    b = graph["bindings"][0]
    b["min_shape"], b["opt_shape"], b["max_shape"] = [4, 4], [2, 4], [8, 4]
    with pytest.raises(torchkiln.EngineFormatError, match="min <= opt <= max"):
        Engine.deserialize(_pack(graph, weights))


def test_unread_intermediate_is_freed_at_once():
    network = Network("unread")
    x = network.add_input("x", torch.float32, (4,))
    network.add_unary(x, L.UnaryOperation.EXP)  # nothing reads it
    network.mark_output(network.add_unary(x, L.UnaryOperation.NEG).get_output())
    ex = ReferenceExecutor(network, torch.device("cpu"))
    assert ex.steps[0][-1] == [1]


def test_the_most_layers_an_engine_may_hold_load_in_seconds():
    import time

    n = limits.MAX_LAYERS
    layer = ('{{"kind":"{kind}","name":"l{i}","inputs":["t{i}"],"outputs":[{{"name":"t{j}","dtype":"float32",'
             '"shape":[2,3]}}],"weights":{{}},"params":{params}}}')
    layers = ",".join(layer.format(kind="identity" if i % 2 else "unary", i=i, j=i + 1,
                                   params="{}" if i % 2 else '{"op":"neg"}') for i in range(n))
    shape = '"dtype":"float32","min_shape":[2,3],"opt_shape":[2,3],"max_shape":[2,3]'
    meta = f'{{"name":"chain","device_type":"cpu","precision":"float32","bindings":[{{"name":"t0",{shape}}}]}}'
    text = (f'{{"name":"chain","inputs":[{{"name":"t0","dtype":"float32","shape":[2,3]}}],'
            f'"outputs":["t{n}"],"layers":[{layers}]}}').encode()
    data = _pack_text(meta.encode(), text, b"")
    assert len(data) > 18_000_000
    start = time.process_time()  # CPU time: a busy shared machine stretches wall time, not this
    engine = Engine.deserialize(data)
    assert time.process_time() - start < 60  # about 5 s of CPU on a 2-core CI machine
    assert len(engine.network.layers) == n
    x = torch.randn(2, 3)
    assert torch.equal(engine.execute([x])[0], x)


# ---- load-time validation: each kind's validate() turns what ATen would reject later into a clear error ----

def _conv(n, x):
    return [n.add_convolution_nd(x, torch.randn(4, 3, 3, 3), torch.randn(4), stride=(1, 1), padding=(1, 1),
                                 dilation=(1, 1)).get_output()]


def _gather(n, x):
    return [n.add_gather(x, n.add_constant(torch.tensor([0, 3])).get_output(), 1).get_output()]


def _scatter(n, x):
    return [n.add_scatter(x, n.add_constant(torch.tensor([[1, 0]])).get_output(),
                          n.add_constant(torch.ones(1, 2)).get_output(), 1).get_output()]


_IMAGE = [("x", torch.float32, (1, 3, 8, 8))]
_MATRIX = [("x", torch.float32, (4, 6))]


@pytest.mark.parametrize("build, inputs, kind, edit, match", [
    (_conv, _IMAGE, "convolution", {"stride": [0, 1]}, r"stride\[0\] = 0 is outside \[1, "),
    (_conv, _IMAGE, "convolution", {"stride": [1, 1 << 30]}, r"stride\[1\] = 1073741824 is outside"),
    (_conv, _IMAGE, "convolution", {"padding": [-1, 1]}, r"padding\[0\] = -1 is outside \[0, "),
    (_conv, _IMAGE, "convolution", {"dilation": [1, 0]}, r"dilation\[1\] = 0"),
    (_conv, _IMAGE, "convolution", {"stride": [1, 1, 1]}, r"stride \(1, 1, 1\) needs 2 entries"),
    (_conv, _IMAGE, "convolution", {"groups": 3}, "groups 3 does not divide the 4 kernels"),
    (lambda n, x: [n.add_pooling_nd(x, L.PoolingType.MAX, (2, 2), stride=(2, 2), padding=(0, 0)).get_output()],
     _IMAGE, "pooling", {"window": [0, 2]}, r"window\[0\] = 0"),
    (lambda n, x: [n.add_softmax(x, 1).get_output()], _MATRIX, "softmax", {"axis": 2},
     "axis 2 is out of range for a tensor of rank 2"),
    (lambda n, x: [n.add_reduce(x, L.ReduceOperation.SUM, (0,), False).get_output()], _MATRIX, "reduce",
     {"axes": [1, -1]}, r"axes \(1, -1\) repeat an axis"),
    (lambda n, x: [n.add_concatenation([x, x], 0).get_output()], _MATRIX, "concatenation", {"axis": -3},
     "axis -3 is out of range"),
    (lambda n, x: [n.add_topk(x, L.TopKOperation.MAX, 2, 1).get_output()], _MATRIX, "topk", {"k": 7},
     r"k 7 is outside \[0, 6\]"),
    (lambda n, x: [n.add_cumulative(x, L.CumulativeOperation.SUM, 0).get_output()], _MATRIX, "cumulative",
     {"axis": 9}, "axis 9 is out of range"),
    (_gather, _MATRIX, "gather", {"axis": 2}, "axis 2 is out of range"),
    (lambda n, x: [n.add_expand(x, (4, 6)).get_output()], _MATRIX, "expand", {"shape": [1] * 15 + [4, 6]},
     "more than 16"),
    (lambda n, x: [n.add_shuffle(x, reshape_dims=(4, 6)).get_output()], _MATRIX, "shuffle",
     {"reshape_dims": [1] * 15 + [4, 6]}, "output 0 has rank 17, over the limit of 16"),
    (lambda n, x: [n.add_padding(x, (1, 1), L.PaddingMode.CONSTANT).get_output()], _MATRIX, "padding",
     {"pad": [1, 1, 1]}, r"pad \(1, 1, 1\) needs a \(begin, end\) pair"),
    (lambda n, x: [n.add_resize(x, "nearest", size=(16, 16)).get_output()], _IMAGE, "resize",
     {"mode": "lanczos"}, "unknown mode 'lanczos'"),
    (lambda n, x: [n.add_normalization(x, L.NormalizationKind.GROUP, 1e-5, num_groups=1).get_output()], _IMAGE,
     "normalization", {"num_groups": 2}, "num_groups 2 does not divide the 3 channels"),
])
def test_load_time_validation(build, inputs, kind, edit, match):
    _, graph, weights = _split(_engine_of(build, inputs))
    layer = next(entry for entry in graph["network"]["layers"] if entry["kind"] == kind)
    layer["params"].update(edit)
    with pytest.raises(torchkiln.EngineFormatError, match=match):
        Engine.deserialize(_pack(graph, weights))


@pytest.mark.parametrize("build, values, match", [
    (_gather, [0, 7], r"indices hold values in \[0, 7\], outside \[0, 6\)"),
    (_gather, [-1, 0], r"indices hold values in \[-1, 0\], outside \[0, 6\)"),  # a gather never wraps
    (_scatter, [-1, 0], r"indices hold values in \[-1, 0\], outside \[0, 6\)"),
])
def test_constant_indices_are_checked_at_load(build, values, match):
    data = _engine_of(build, _MATRIX)
    _, graph, _ = _split(data)
    engine = Engine.deserialize(data)
    const = next(layer for layer in engine.network.layers if layer.KIND == "constant")
    const.weights["value"] = torch.tensor([values] if build is _scatter else values)
    _, graph, weights = _split(engine.serialize())
    with pytest.raises(torchkiln.EngineFormatError, match=match):
        Engine.deserialize(_pack(graph, weights))


def test_bias_length_and_weight_dtype_are_checked():
    network = Network("h")
    x = network.add_input("x", torch.float32, (1, 3, 8, 8))
    with pytest.raises(NetworkError, match=r"bias of shape \[3\] for 4 output channels"):
        network.add_convolution_nd(x, torch.randn(4, 3, 3, 3), torch.randn(3), stride=(1, 1), padding=(0, 0),
                                   dilation=(1, 1))
    with pytest.raises(NetworkError, match="weight 'kernel' has dtype torch.int64"):
        network.add_convolution_nd(x, torch.ones(4, 3, 3, 3, dtype=torch.int64), stride=(1, 1), padding=(0, 0),
                                   dilation=(1, 1))
    # The same checks hold for engine bytes whose weights were swapped.
    _, graph, weights = _split(_engine_of(_conv, _IMAGE))
    conv = graph["network"]["layers"][0]
    conv["weights"]["bias"] = conv["weights"]["kernel"]
    with pytest.raises(torchkiln.EngineFormatError, match=r"bias of shape \[4, 3, 3, 3\] for 4 output channels"):
        Engine.deserialize(_pack(graph, weights))


def test_cached_shape_inference_agrees_with_the_meta_path():
    from torchkiln.ir.shape_inference import infer_on_meta, infer_outputs
    from test_engine_fuzz import seed_engines

    layers = [layer for data in seed_engines() for layer in Engine.deserialize(data).network.layers
              if not layer.SUBNETWORKS]  # control flow gives what its sub-networks give: no meta path
    assert len({type(layer) for layer in layers}) >= 20
    for layer in layers:
        assert infer_outputs(layer) == list(infer_on_meta(layer)), layer.KIND
    # Layers alike but for a parameter or an input dtype are told apart.
    network = Network("h")
    ints = network.add_input("i", torch.int64, (2, 3))
    floats = network.add_input("f", torch.float64, (2, 3))
    assert network.add_unary(ints, L.UnaryOperation.EXP).get_output().dtype == torch.float32
    assert network.add_unary(ints, L.UnaryOperation.NOT).get_output().dtype == torch.bool
    assert network.add_unary(floats, L.UnaryOperation.EXP).get_output().dtype == torch.float64
    assert network.add_cast(floats, torch.int8).get_output().dtype == torch.int8


def test_backend_round_trips_and_an_engine_without_one_runs_on_the_reference():
    data = _engine_of(lambda n, x: [n.add_activation(x, L.ActivationType.RELU).get_output()],
                      [("x", torch.float32, (2,))])
    _, graph, weights = _split(data)
    graph["backend"], graph["ort_threads"] = "onnxruntime", 3
    engine = Engine.deserialize(Engine.deserialize(_pack(graph, weights)).serialize())
    assert (engine.backend, engine.backend_options.ort_threads) == ("onnxruntime", 3)
    del graph["backend"], graph["ort_threads"]  # an engine saved before backends were recorded
    assert Engine.deserialize(_pack(graph, weights)).backend == "reference"


@pytest.mark.parametrize("field, value, message", [
    ("backend", "tensorrt", "backend 'tensorrt'"), ("backend", ["onnxruntime"], "backend"),
    ("ort_threads", -1, "ort_threads"), ("ort_threads", 1 << 40, "ort_threads"), ("ort_threads", "2", "ort_threads"),
])
def test_bad_backend_metadata_is_refused(field, value, message):
    data = _engine_of(lambda n, x: [n.add_activation(x, L.ActivationType.RELU).get_output()],
                      [("x", torch.float32, (2,))])
    _, graph, weights = _split(data)
    graph[field] = value
    with pytest.raises(torchkiln.EngineFormatError, match=message):
        Engine.deserialize(_pack(graph, weights))


def test_onnxruntime_backend_on_cuda_is_refused():
    data = _engine_of(lambda n, x: [n.add_activation(x, L.ActivationType.RELU).get_output()],
                      [("x", torch.float32, (2,))])
    _, graph, weights = _split(data)
    graph["backend"], graph["device_type"] = "onnxruntime", "cuda"
    with pytest.raises(torchkiln.EngineFormatError, match="does not run on cuda|not one that runs on cuda"):
        Engine.deserialize(_pack(graph, weights))


# ---- writing: the weights section is safetensors' own bytes, copied once into the engine ----

def _weights_of_every_dtype():
    """Tensors of every weight dtype (names sharing a dtype, 0-d, empty, a view into a larger storage)."""
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for i, dtype in enumerate(L.TENSOR_DTYPES):
        values = (torch.rand(3, 5, generator=gen) * 100 - 50).to(dtype)
        tensors[f"w{i}"] = values
        tensors[f"v{i}"] = values[1:]  # shares the storage, at an offset
        tensors[f"s{i}"] = values[0, 0].clone()  # 0-d
        tensors[f"e{i}"] = values[:0]  # empty
    return tensors


def test_weights_section_is_what_safetensors_writes():
    import safetensors.torch

    tensors = _weights_of_every_dtype()
    expected = safetensors.torch.save({k: t.clone() for k, t in tensors.items()})
    assert b"".join(S.safetensors_chunks(tensors)) == expected
    loaded = safetensors.torch.load(expected)
    assert all(torch.equal(loaded[k], t) for k, t in tensors.items())


def test_weights_are_read_as_safetensors_reads_them_from_where_they_lie():
    """`read_safetensors` copies each tensor once out of the bytes (bytes, or a view into a larger buffer) and gives
    what safetensors gives: dtypes, shapes, values, and tensors that own their memory."""
    import safetensors.torch

    tensors = _weights_of_every_dtype()
    data = safetensors.torch.save({k: t.clone() for k, t in tensors.items()})
    wanted = safetensors.torch.load(data)
    assert S._plain_safetensors(memoryview(data)) is not None  # read here, not handed to safetensors
    padded = bytearray(b"x" * 13 + data + b"y" * 7)
    for given in (data, memoryview(padded)[13:13 + len(data)]):
        got = S.read_safetensors(given)
        assert got.keys() == wanted.keys()
        for k, t in wanted.items():
            assert got[k].dtype == t.dtype and got[k].shape == t.shape and torch.equal(got[k], t), k
    got = S.read_safetensors(memoryview(padded)[13:13 + len(data)])
    padded[13 + len(data) - 1] ^= 0xFF  # the last byte of the data: a copy is not changed with it
    assert all(torch.equal(got[k], t) for k, t in wanted.items())


@pytest.mark.parametrize("change", ["metadata", "complex", "gap", "short header", "bad json", "overlap"])
def test_weights_this_reader_does_not_take_go_to_safetensors_which_decides(change):
    """Headers outside what `safetensors_chunks` writes (metadata, another dtype) load through safetensors itself;
    broken ones raise there, so nothing safetensors refuses is accepted."""
    import json
    import struct

    import safetensors.torch

    tensors = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.arange(4, dtype=torch.int32)}
    if change == "metadata":
        data = safetensors.torch.save(tensors, metadata={"made by": "a test"})
    elif change == "complex":
        data = safetensors.torch.save({**tensors, "c": torch.ones(2, dtype=torch.complex64)})
    else:
        data = safetensors.torch.save(tensors)
        size = struct.unpack_from("<Q", data)[0]
        header = json.loads(data[8:8 + size])
        if change == "gap":
            header["b"]["data_offsets"] = [header["b"]["data_offsets"][0] + 4, header["b"]["data_offsets"][1] + 4]
        elif change == "overlap":
            header["b"]["data_offsets"] = [20, 36]
        text = json.dumps(header).encode()
        if change == "bad json":
            text = text[:-1]
        body = data[8 + size:]
        data = struct.pack("<Q", len(text) + (100 if change == "short header" else 0)) + text + body
    try:
        wanted = safetensors.torch.load(data)
    except Exception as e:  # noqa: BLE001 - whatever safetensors raises, the reader raises too
        with pytest.raises(type(e)):
            S.read_safetensors(data)
        return
    got = S.read_safetensors(data)
    assert got.keys() == wanted.keys() and all(torch.equal(got[k], wanted[k]) for k in wanted)


def test_weights_of_a_dtype_outside_the_table_are_written_by_safetensors():
    import safetensors.torch

    tensors = {"a": torch.ones(2, dtype=torch.complex64), "b": torch.arange(3.0)}
    assert b"".join(S.safetensors_chunks(tensors)) == safetensors.torch.save(tensors)


def test_join_sections_of_pieces_is_join_of_their_bytes():
    sections = [("meta", b"{}"), ("graph", [b"[", memoryview(b"12345"), b"]"]), ("plan.0", bytearray(b"{}"))]
    flat = [(name, b"".join(bytes(p) for p in data) if isinstance(data, list) else bytes(data))
            for name, data in sections]
    assert S.join_sections(sections) == S.join_sections(flat)
    body = S.join_sections(flat)[:-32]
    assert S.join_sections(flat)[-32:] == hashlib.sha256(body).digest()


def test_engine_bytes_are_the_format_as_written_before(engine_bytes):
    """Writing without intermediate copies changed no byte: the same sections, safetensors' weights, sha256."""
    import safetensors.torch

    engine = Engine.deserialize(engine_bytes)
    data = engine.serialize()
    sections = S.split_sections(data)
    weights = safetensors.torch.load(dict(sections)["weights"])
    sections = [(n, safetensors.torch.save(weights) if n == "weights" else d) for n, d in sections]
    body = S._HEADER.pack(S.MAGIC, S.FORMAT_VERSION, len(sections)) + b"".join(
        S._SECTION.pack(n.encode(), len(d)) for n, d in sections) + b"".join(d for _, d in sections)
    assert data == body + hashlib.sha256(body).digest()


def test_weights_sharing_storage_round_trip():
    """Two layers whose weights are views of one tensor (and one a slice of a larger storage) save and load."""
    base = torch.randn(2, 4, 3, 3, 3)
    n = Network("shared")
    x = n.add_input("x", torch.float32, (1, 3, 8, 8))
    a = n.add_convolution_nd(x, base[0], torch.zeros(4), stride=(1, 1), padding=(1, 1), dilation=(1, 1))
    b = n.add_convolution_nd(x, base[1], base[0, :, 0, 0, 0], stride=(1, 1), padding=(1, 1), dilation=(1, 1))
    n.mark_output(a.get_output())
    n.mark_output(b.get_output())
    engine = Engine(n, [InputBinding("x", torch.float32, (1, 3, 8, 8), (1, 3, 8, 8), (1, 3, 8, 8))], "cpu",
                    torch.float32)
    again = Engine.deserialize(engine.serialize())
    xs = torch.randn(1, 3, 8, 8)
    for got, expected in zip(again.execute([xs]), engine.execute([xs])):
        assert torch.equal(got, expected)


def _define_twice(layers: list) -> None:
    layers.append(dict(layers[0], name="again", outputs=[dict(o, name="again:0") for o in layers[0]["outputs"]]))


def _use_before(layers: list) -> None:
    layers.insert(0, {"kind": "dim_value", "name": "early", "inputs": [], "weights": {},
                      "params": {"value": {"op": "sym", "name": "u0"}, "dtype": "int64"},
                      "outputs": [{"name": "early:0", "dtype": "int64", "shape": []}]})


# A nonzero engine whose size symbol u0 is defined twice, or used before its layer: (edit, the error's words)
DATA_DEPENDENT_HOSTILE = {
    "defined-twice": (_define_twice, "symbol u0 is defined twice"),
    "used-before": (_use_before, "uses symbols ['u0'] that no input dim or earlier layer defines"),
}


def data_dependent_hostile(name: str) -> bytes:
    """The bytes of DATA_DEPENDENT_HOSTILE[name] (tests/test_cpp_runtime.py loads them in C++)."""
    data = _engine_of(lambda n, x: [n.add_non_zero(x).get_output()], [("x", torch.int64, (3, 4))])
    _, graph, weights = _split(data)
    DATA_DEPENDENT_HOSTILE[name][0](graph["network"]["layers"])
    return _pack(graph, weights)


@pytest.mark.parametrize("name", sorted(DATA_DEPENDENT_HOSTILE))
def test_a_data_dependent_size_is_defined_once_before_use(name):
    with pytest.raises(torchkiln.EngineFormatError, match=re.escape(DATA_DEPENDENT_HOSTILE[name][1])):
        Engine.deserialize(data_dependent_hostile(name))


# ---- control flow: sub-networks nested in a layer's entry ----------------------------------------------------

def _conditional_engine(depth: int) -> bytes:
    """A conditional whose then-branch holds another conditional, `depth` deep; every branch passes x through."""
    def level(k: int) -> Network:
        net = Network(f"level{k}")
        p, x = net.add_input("p", torch.bool, ()), net.add_input("x", torch.float32, (2,))
        inner = level(k - 1) if k > 1 else None
        then = net.add_conditional(p, [p, x], inner, inner).get_output() if inner else net.add_unary(
            x, L.UnaryOperation.EXP).get_output()
        net.mark_output(then)
        return net

    top = level(depth)
    return _engine_of(lambda n, p, x: n.add_conditional(p, [p, x], top, top).outputs,
                      [("p", torch.bool, ()), ("x", torch.float32, (2,))])


def test_sub_networks_round_trip_and_run():
    engine = Engine.deserialize(_conditional_engine(3))
    x = torch.randn(2)
    assert torch.equal(engine.execute([torch.tensor(True), x])[0], x.exp())


def _damaged_conditional(damage: Callable[[dict], object]) -> bytes:
    """A one-level conditional engine whose layer entry `damage` edits."""
    _, graph, weights = _split(_conditional_engine(1))
    damage(graph["network"]["layers"][0])
    return _pack(graph, weights)


def _sub_networks_on_a_unary() -> bytes:
    _, graph, weights = _split(_engine_of(lambda n, x: [n.add_unary(x, L.UnaryOperation.EXP).get_output()],
                                          [("x", torch.float32, (2,))]))
    graph["network"]["layers"][0]["subnetworks"] = {}
    return _pack(graph, weights)


def _costly_loop() -> bytes:
    """A loop of 2^20 iterations of a (256, 1024) by (1024, 1024) product: 5.6e14 FLOPs, over the default compute
    ceiling of a machine of 128 cores (3.8e14), in 6 MiB."""
    body = Network("body")
    i, x = body.add_input("i", torch.int64, ()), body.add_input("x", torch.float32, (256, 1024))
    w = body.add_constant(torch.zeros(1024, 1024)).get_output()
    y = body.add_matrix_multiply(x, L.MatrixOperation.NONE, w, L.MatrixOperation.NONE).get_output()
    body.mark_output(body.add_constant(torch.tensor(True)).get_output())
    body.mark_output(y)
    trips = lambda n, v: n.add_constant(torch.tensor(v)).get_output()  # noqa: E731
    return _engine_of(lambda n, x: n.add_loop(trips(n, 1 << 20), trips(n, True), [x], [], body, 1 << 20).outputs,
                      [("x", torch.float32, (256, 1024))])


# Hostile sub-networks: name -> (the engine's bytes, the error's words) (tests/test_cpp_runtime.py loads them in C++)
SUB_NETWORK_HOSTILE: dict[str, tuple[Callable[[], bytes], str]] = {
    "nested-too-deep": (lambda: _conditional_engine(S.MAX_NESTING + 1),
                        f"sub-networks nested more than {S.MAX_NESTING} deep"),
    "none": (lambda: _damaged_conditional(lambda entry: entry.pop("subnetworks")), "expected the sub-networks"),
    "no-else": (lambda: _damaged_conditional(lambda entry: entry["subnetworks"].pop("else_branch")),
                "expected the sub-networks"),
    "unknown-kind-inside": (lambda: _damaged_conditional(
        lambda entry: entry["subnetworks"]["then_branch"]["layers"][0].update(kind="nope")), "unknown layer kind"),
    "branch-inputs": (lambda: _damaged_conditional(lambda entry: entry["subnetworks"]["then_branch"]["inputs"].pop(0)),
                      "level1 input: 1 tensors for 2"),
    "on-another-kind": (_sub_networks_on_a_unary, "a unary layer holds no sub-networks"),
    "costly-loop": (_costly_loop, "FLOPs per call by this layer, over the limit of"),
}


@pytest.mark.parametrize("name", sorted(SUB_NETWORK_HOSTILE))
def test_hostile_sub_networks_are_format_errors(name):
    make, words = SUB_NETWORK_HOSTILE[name]
    with pytest.raises(EngineFormatError, match=re.escape(words)):
        Engine.deserialize(make())
