"""torch.ops.torchkiln.execute_engine: the engine cache follows the module's bytes, an engine must fit the
module it is bound to, and meta / fake tensors propagate shapes without running the engine."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import torchkiln
from torchkiln.examples import MLP
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
