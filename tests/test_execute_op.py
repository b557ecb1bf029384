"""torch.ops.torchkiln.execute_engine: the engine cache follows the module's bytes, an engine must fit the
module it is bound to, and meta / fake tensors propagate shapes without running the engine."""
import io

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import torchkiln
from torchkiln.examples import MLP
from torchkiln.runtime.engine import Engine
from test_end_to_end import WithUnsupportedOp

SPEC = [torchkiln.Input((2, 64))]


def _compiled_pair():
    torch.manual_seed(0)
    a, b = MLP().eval(), MLP().eval()
    ca, cb = torchkiln.compile(a, SPEC), torchkiln.compile(b, SPEC)
    assert ca._torchkiln_engine_0.numel() == cb._torchkiln_engine_0.numel()
    return a, b, ca, cb


def test_engine_cache_follows_in_place_copy(tmp_path):
    a, b, ca, cb = _compiled_pair()
    x = torch.randn(2, 64)
    torch.testing.assert_close(ca(x), a(x))  # the engine is loaded and cached now
    ca._torchkiln_engine_0.copy_(cb._torchkiln_engine_0)
    torch.testing.assert_close(ca(x), b(x))
    torch.jit.save(ca, tmp_path / "m.ts")
    torch.testing.assert_close(torch.jit.load(tmp_path / "m.ts")(x), b(x))


def test_engine_cache_follows_setattr(tmp_path):
    a, b, ca, cb = _compiled_pair()
    x = torch.randn(2, 64)
    torch.testing.assert_close(ca(x), a(x))
    ca._torchkiln_engine_0 = cb._torchkiln_engine_0.clone()
    torch.testing.assert_close(ca(x), b(x))
    torch.jit.save(ca, tmp_path / "m.ts")
    torch.testing.assert_close(torch.jit.load(tmp_path / "m.ts")(x), b(x))


def test_an_engine_attribute_made_another_dtype_in_place_is_refused():
    """`.data` set to a view of the same bytes as another dtype keeps the storage, version and size: the engine
    loaded from those bytes is not reused, and the attribute is refused as any non-uint8 one."""
    _, _, ca, _ = _compiled_pair()
    x = torch.randn(2, 64)
    ca(x)
    ca._torchkiln_engine_0.data = ca._torchkiln_engine_0.view(torch.int8)
    with pytest.raises(torchkiln.EngineFormatError, match="must be a uint8 tensor of engine bytes, got a torch.int8"):
        ca(x)


def test_engine_of_another_module_is_refused(tmp_path):
    ca = torchkiln.compile(MLP().eval(), SPEC)
    other = torchkiln.compile(MLP(classes=7).eval(), SPEC)
    ca._torchkiln_engine_0 = other._torchkiln_engine_0
    with pytest.raises(torchkiln.EngineFormatError, match=r"expects .*float32\[2,10\].*float32\[2,7\]"):
        ca(torch.randn(2, 64))
    torch.jit.save(ca, tmp_path / "m.ts")
    with pytest.raises(torchkiln.EngineFormatError, match=r"float32\[2,10\]"):
        torchkiln.load(tmp_path / "m.ts")(torch.randn(2, 64))


@pytest.mark.parametrize("model, shape, out_shape", [(MLP(), (2, 64), (2, 10)),
                                                      (WithUnsupportedOp(), (2, 3, 16, 16), (2, 4))])
def test_meta_inputs_propagate_shapes(model, shape, out_shape):
    compiled = torchkiln.compile(model.eval(), [torchkiln.Input(shape)])
    out = compiled(torch.empty(shape, device="meta"))
    assert out.device.type == "meta" and tuple(out.shape) == out_shape and out.dtype == torch.float32


def test_fake_tensor_mode_propagates_shapes():
    compiled = torchkiln.compile(MLP().eval(), SPEC)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        out = compiled(mode.from_tensor(torch.randn(2, 64)))
    assert isinstance(out, FakeTensor) and tuple(out.shape) == (2, 10)


def test_fake_engine_blob_uses_the_recorded_signature():
    compiled = torchkiln.compile(MLP().eval(), SPEC)
    signature = compiled.graph.findNode("torchkiln::execute_engine").inputsAt(2).toIValue()
    with FakeTensorMode() as mode:
        blob = mode.from_tensor(compiled._torchkiln_engine_0)
        (out,) = torch.ops.torchkiln.execute_engine([mode.from_tensor(torch.randn(2, 64))], blob, signature)
    assert isinstance(out, FakeTensor) and tuple(out.shape) == (2, 10) and out.dtype == torch.float32


class _Strided(torch.nn.Module):
    """Output dims that are expressions of dynamic input dims: ((h - 1) // 2 + 1 - 3) // 2 + 1."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(4, 5, 3, stride=2)

    def forward(self, x):
        return torch.relu(self.b(torch.relu(self.a(x))))


@pytest.fixture(scope="module")
def dynamic_strided():
    torch.manual_seed(0)
    model = _Strided().eval()
    spec = torchkiln.Input(min_shape=(1, 3, 8, 8), opt_shape=(2, 3, 16, 16), max_shape=(4, 3, 32, 32))
    compiled = torchkiln.compile(model, [spec])
    signature = compiled.graph.findNode("torchkiln::execute_engine").inputsAt(2).toIValue()
    assert "s0=1..4" in signature, signature  # the dynamic input dims name their symbols
    return model, compiled, signature


@pytest.mark.parametrize("shape", [(1, 3, 9, 8), (3, 3, 32, 17)])
def test_fake_tensor_mode_gives_a_dynamic_engine_output_shapes(dynamic_strided, shape):
    model, compiled, _ = dynamic_strided
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        out = compiled(mode.from_tensor(torch.randn(shape)))
    with torch.no_grad():
        assert isinstance(out, FakeTensor) and out.shape == model(torch.randn(shape)).shape


def test_symbolic_input_sizes_give_output_sizes_as_expressions(dynamic_strided):
    from torch.fx.experimental.proxy_tensor import make_fx

    _, compiled, signature = dynamic_strided
    graph = make_fx(lambda x, blob: torch.ops.torchkiln.execute_engine([x], blob, signature)[0],
                    tracing_mode="symbolic")(torch.randn(2, 3, 20, 11), compiled._torchkiln_engine_0)
    x, _, call, out = (n.meta["val"] for n in graph.graph.nodes if "val" in n.meta)
    assert out.shape[1] == 5
    for d in (0, 2, 3):
        assert isinstance(out.shape[d], torch.SymInt), out.shape
        assert out.shape[d].node.expr.free_symbols == x.shape[d].node.expr.free_symbols
    assert [s.node.hint for s in (out.shape[0], out.shape[2], out.shape[3])] == [2, 4, 2]


def test_a_module_recording_the_old_dynamic_signature_still_runs(dynamic_strided):
    """Modules compiled before input dims named their symbols record `1..4` where now `s0=1..4` stands."""
    from torchkiln.runtime.execute_op import legacy_signature

    model, compiled, signature = dynamic_strided
    old = legacy_signature(signature)
    assert "=" not in old and old != signature
    x = torch.randn(2, 3, 12, 10)
    blob = compiled._torchkiln_engine_0
    (out,) = torch.ops.torchkiln.execute_engine([x], blob, old)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_x = mode.from_tensor(x)
        with pytest.raises(torchkiln.EngineFormatError, match="no input dim names"):
            torch.ops.torchkiln.execute_engine([fake_x], mode.from_tensor(blob), old)
    (meta,) = torch.ops.torchkiln.execute_engine([x.to("meta")], blob, old)  # the real engine's bytes tell
    assert meta.shape == out.shape


@pytest.mark.parametrize("dim", ["__import__('os').getpid()", "s0.real", "(s0", "s9", "s0 ** s0", "Max(s0, s0/2)"])
def test_an_output_dim_that_is_no_expression_of_the_inputs_is_refused(dim):
    signature = f"inputs: float32[s0=1..4,3]; outputs: float32[{dim},2]"
    with pytest.raises(torchkiln.EngineFormatError, match="output dim"):
        torch.ops.torchkiln.execute_engine([torch.empty(2, 3, device="meta")], torch.empty(4, dtype=torch.uint8,
                                                                                          device="meta"), signature)


@pytest.mark.parametrize("dim, message", [
    ("((s0**8)**8)**8", "too large"), ("(((((((((s0**8)**8)**8)**8)**8)**8)**8)**8)**8)", "too large"),
    ("(s0+1)**8*(s0+2)**8", "too large"), ("((s0+7)**8+1)**8", "too large"),
    ("s0-9", "is -6 for these input sizes"), ("99999999999999999999", "is 99999999999999999999 for these"),
    ("s0*1" + "0" * 5000, "output dim"), ("²", "output dim"),
])
def test_an_output_dim_too_large_to_evaluate_is_refused_before_evaluating_it(dim, message):
    """An output dim's value may need at most MAX_DIM_BITS bits, input dims counted at 64: ((s0**8)**8)**8 is
    refused unevaluated (nine such powers took minutes on meta tensors, longer under symbolic shapes)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    signature = f"inputs: float32[s0=1..4,3]; outputs: float32[{dim},2]"
    blob = torch.empty(4, dtype=torch.uint8, device="meta")
    with pytest.raises(torchkiln.EngineFormatError, match=message):
        torch.ops.torchkiln.execute_engine([torch.empty(3, 3, device="meta")], blob, signature)
    if message == "too large":
        with pytest.raises(torchkiln.EngineFormatError, match=message):
            make_fx(lambda x, b: torch.ops.torchkiln.execute_engine([x], b, signature)[0],
                    tracing_mode="symbolic")(torch.randn(3, 3), torch.empty(4, dtype=torch.uint8))


def test_meta_inputs_the_engine_does_not_take_are_refused():
    """As real inputs are: a meta or fake tensor of another shape would otherwise get the engine's output shape."""
    compiled = torchkiln.compile(MLP().eval(), SPEC)
    with pytest.raises(torchkiln.EngineInputError, match=r"engine input 0: dim 0 is 3, outside \[2, 2\]"):
        compiled(torch.empty(3, 64, device="meta"))
    with pytest.raises(torchkiln.EngineInputError, match=r"engine input 0: expected 2 dims, got shape \(2, 64, 1\)"):
        compiled(torch.empty(2, 64, 1, device="meta"))
    with FakeTensorMode(allow_non_fake_inputs=True) as mode, \
            pytest.raises(torchkiln.EngineInputError, match="dim 1 is 63, outside"):
        compiled(mode.from_tensor(torch.randn(2, 63)))


def test_a_module_holds_its_engine_written_from_the_serialized_pieces():
    """Stitching writes an engine's attribute from its serialized pieces (the weights as views of the network's
    tensors), not from joined bytes copied again: the attribute holds exactly `serialize()`'s bytes, and is a
    writable normal tensor even under inference_mode."""
    from torchkiln.runtime.execute_op import engine_blob
    from torchkiln.runtime.serialization import engine_digest

    compiled = torchkiln.compile(MLP().eval(), [torchkiln.Input((2, 64))], backend="reference")
    blob = compiled._torchkiln_engine_0
    engine = torchkiln.runtime.engine.Engine.deserialize(blob.numpy().tobytes())
    data = engine.serialize()
    assert engine_digest(blob.numpy().tobytes()) == engine_digest(data)
    with torch.inference_mode():
        made = engine_blob(engine.serialized_pieces())
    assert not made.is_inference() and made.dtype == torch.uint8
    assert made.numpy().tobytes() == data == engine_blob(data).numpy().tobytes()


def test_a_compiled_module_runs_its_built_engine_but_loads_and_checks_changed_bytes(monkeypatch):
    """The first call runs the engine compile built, not one deserialized from the bytes compile just wrote from it
    (1.6 s of a 2.5 GB engine, and its checksum 1.8 s more); once the bytes are written in place, the next call
    loads them and checks them, and a corrupted byte is refused. A module saved and loaded again loads its bytes."""
    from torchkiln.runtime import serialization

    checked, loaded = [], []
    real = serialization._check_digest
    monkeypatch.setattr(serialization, "_check_digest", lambda data: checked.append(1) or real(data))
    deserialize = Engine.deserialize.__func__
    monkeypatch.setattr(Engine, "deserialize", classmethod(lambda cls, *a, **k: loaded.append(1) or
                                                           deserialize(cls, *a, **k)))
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torchkiln.compile(model, SPEC, backend="reference")
    x = torch.randn(2, 64)
    torch.testing.assert_close(compiled(x), model(x))
    assert checked == [] and loaded == []
    buffer = io.BytesIO()
    torch.jit.save(compiled, buffer)
    buffer.seek(0)
    torch.testing.assert_close(torch.jit.load(buffer)(x), model(x))
    assert checked == [1] and loaded == [1]
    checked.clear()
    blob = compiled._torchkiln_engine_0
    blob[100] ^= 1  # inside the section table or the graph: a byte the checksum covers
    with pytest.raises(torchkiln.EngineFormatError, match="checksum"):
        compiled(x)
    assert checked == [1]
