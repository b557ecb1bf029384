"""Channel gates at full size for ONNX Runtime's blocked layout (runtime/backends/full_gates.py): the rewrite keeps
the values bit for bit, ORT's optimized graph then keeps a squeeze-excitation block's map blocked (no reorder
between the first layer and the last), what is not a channel gate's multiply is left alone, and the tactic is
offered only to networks with gates and runs where the plan holds it. No timing is asserted."""
import collections

import pytest
import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.backends import BackendOptions, make_plan, session_settings
from torchkiln.runtime.backends.full_gates import full_size_gates, gate_shapes, has_gates
from torchkiln.runtime.backends.onnxruntime import session_onnx
from torchkiln.runtime.engine import Engine, InputBinding

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
CPU = torch.device("cpu")
SHAPE = (2, 16, 6, 6)
E = L.ElementWiseOperation


def conv(net: Network, x, c_in: int, c_out: int, k: int):
    w = torch.randn(c_out, c_in, k, k) / (c_in * k * k) ** 0.5
    return net.add_convolution_nd(x, w, torch.randn(c_out) / 4, stride=(1, 1), padding=(k // 2, k // 2),
                                  dilation=(1, 1)).get_output()


def se_block(op: E = E.PROD, gate_shape: str = "channel") -> Network:
    """conv 3x3 + ReLU, a squeeze-excitation gate (mean, 1x1 conv + ReLU, 1x1 conv + sigmoid) applied by `op`, a
    1x1 conv. `gate_shape` "spatial" gates by a [N, 1, H, W] map instead (not a channel gate)."""
    torch.manual_seed(0)
    net = Network("se")
    c = SHAPE[1]
    x = net.add_activation(conv(net, net.add_input("x", torch.float32, SHAPE), c, c, 3), L.ActivationType.RELU)
    y = x.get_output()
    if gate_shape == "channel":
        g = net.add_reduce(y, L.ReduceOperation.AVG, (2, 3), True).get_output()
        g = net.add_activation(conv(net, g, c, 8, 1), L.ActivationType.RELU).get_output()
        g = net.add_activation(conv(net, g, 8, c, 1), L.ActivationType.SIGMOID).get_output()
    else:
        g = net.add_activation(conv(net, y, c, 1, 1), L.ActivationType.SIGMOID).get_output()
    net.mark_output(conv(net, net.add_elementwise(y, g, op).get_output(), c, c, 1))
    return net


def session(model, optimized: str | None = None):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    if optimized is not None:
        options.optimized_model_filepath = optimized
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def test_gate_shapes():
    assert gate_shapes((2, 16, 6, 6), (2, 16, 1, 1))
    assert not gate_shapes((2, 16, 1, 1), (2, 16, 1, 1))  # nothing to resize
    assert not gate_shapes((2, 16, 6, 6), (2, 1, 6, 6))  # a spatial gate
    assert not gate_shapes((2, 16, 6, 6), (1, 16, 1, 1))  # broadcast over the batch too
    assert not gate_shapes((2, 16, 6), (2, 16, 1))  # not a 2-D map
    assert not gate_shapes((2, 16, None, 6), (2, 16, 1, 1))  # a size shape inference left open


def test_gates_at_full_size_give_the_same_bits_and_keep_the_blocked_layout(tmp_path):
    model = session_onnx(se_block())
    rewritten, count = full_size_gates(model)
    assert count == 1
    assert collections.Counter(n.op_type for n in rewritten.graph.node)["Resize"] == 1
    x = torch.randn(SHAPE).numpy()
    before = session(model, str(tmp_path / "before.onnx"))
    after = session(rewritten, str(tmp_path / "after.onnx"))
    name = before.get_inputs()[0].name
    for got, want in zip(after.run(None, {name: x}), before.run(None, {name: x})):
        assert (got == want).all()
    ops_before = [n.op_type for n in onnx.load(str(tmp_path / "before.onnx")).graph.node]
    if "ReorderInput" not in ops_before:
        pytest.skip("ONNX Runtime does not block channels on this CPU (its NCHWc block size is 1)")
    ops_after = [n.op_type for n in onnx.load(str(tmp_path / "after.onnx")).graph.node]
    assert ops_before.count("ReorderOutput") > 1  # the gate took the map out of the blocked layout ...
    middle = [k for k, op_type in enumerate(ops_after) if op_type.startswith("Reorder")]
    assert middle == [0, len(ops_after) - 1], ops_after  # ... and now it stays blocked from first layer to last


def test_what_is_not_a_channel_gate_is_left_alone():
    assert not has_gates(se_block(gate_shape="spatial"))
    assert full_size_gates(session_onnx(se_block(gate_shape="spatial")))[1] == 0
    assert full_size_gates(session_onnx(se_block(E.SUM)))[1] == 0  # ORT keeps a channel-shaped add blocked itself
    assert has_gates(se_block()) and not has_gates(se_block(E.SUM))


def test_the_tactic_is_offered_to_networks_with_gates_and_runs_from_the_plan(monkeypatch):
    assert (("full_gates", True),) in session_settings.candidates(False, gates=True)
    assert all(dict(t).get("full_gates") is None for t in session_settings.candidates(True))
    offered = []

    def choose(network, tactics, runner_for):
        offered.append(list(tactics))
        return (("full_gates", True),)

    monkeypatch.setattr("torchkiln.runtime.backends.onnxruntime.choose_settings", choose)
    net = se_block()
    plan = make_plan("onnxruntime", net, CPU, BackendOptions())
    assert (("full_gates", True),) in offered[0]
    engine = Engine(net, [InputBinding("x", torch.float32, SHAPE, SHAPE, SHAPE)], "cpu", torch.float32, "se",
                    "onnxruntime", plans=[plan])
    from torchkiln.runtime.backends import onnxruntime as backend

    rewrites = []
    monkeypatch.setattr(backend, "full_size_gates", lambda model: rewrites.append(full_size_gates(model)[1]) or
                        full_size_gates(model))
    again = Engine.deserialize(engine.serialize())
    again.runner(CPU)
    assert rewrites == [1]  # the loaded engine's session got the rewritten graph
    plain = Engine(net, [InputBinding("x", torch.float32, SHAPE, SHAPE, SHAPE)], "cpu", torch.float32, "se",
                   "onnxruntime", plans=[make_plan("onnxruntime", net, CPU, BackendOptions(timing_iterations=0))])
    x = torch.randn(SHAPE)
    assert torch.equal(again.execute([x])[0], plain.execute([x])[0])
