"""Plans: each backend's kernel table and steps, the memory plan, and plans in engine bytes."""
import dataclasses
import json
import logging

import pytest
import torch

import torchkiln
from torchkiln.examples import SmallResNet
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import DimSymbol
from torchkiln.ir import layers as L
from torchkiln.runtime import serialization as S
from torchkiln.runtime.backends import BackendOptions, make_plan
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.runtime.plan import Plan, Step, check_steps


@pytest.fixture(scope="module")
def engine_bytes():
    return torchkiln.convert_method_to_engine(SmallResNet().eval(), "forward", [torchkiln.Input((1, 3, 32, 32))],
                                              backend="reference")


def _chain(n: int = 4, shape=(2, 8)) -> Network:
    """x -> relu -> neg -> relu ... (n layers), one output."""
    net = Network("chain")
    t = net.add_input("x", torch.float32, shape)
    for k in range(n):
        t = (net.add_activation(t, L.ActivationType.RELU) if k % 2 == 0 else
             net.add_unary(t, L.UnaryOperation.NEG)).get_output()
    net.mark_output(t)
    return net


def test_a_built_engine_holds_its_plan_and_it_round_trips(engine_bytes):
    engine = Engine.deserialize(engine_bytes)
    assert len(engine.plans) == 1
    plan = engine.plans[0]
    assert plan.target.backend == "reference" and plan.target.device_type == "cpu"
    assert dict(plan.target.libraries)["torchkiln"] == torchkiln.__version__
    assert len(plan.steps) == len(engine.network.layers) and plan.summary() == {"aten": len(plan.steps)}
    again = Engine.deserialize(engine.serialize())
    assert again.plans[0].to_json() == plan.to_json()
    assert engine.plan_for(torch.device("cpu")) is plan  # a fitting plan is used, not remade


def test_a_plan_for_another_machine_is_replanned_with_a_warning(engine_bytes, caplog):
    sections = S.split_sections(engine_bytes)
    plan = json.loads(dict(sections)["plan.0"])
    plan["target"]["libraries"] = [["torchkiln", "0.0.1"]]
    data = S.join_sections([(n, json.dumps(plan).encode() if n == "plan.0" else d) for n, d in sections])
    engine = Engine.deserialize(data)
    x = torch.randn(1, 3, 32, 32)
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        out = engine.execute([x])[0]
    assert "has no plan for this machine" in caplog.text and "torchkiln 0.0.1" in caplog.text
    assert torch.equal(out, Engine.deserialize(engine_bytes).execute([x])[0])
    assert len(engine.plans) == 2  # the new plan is kept with the engine, and saved with it


@pytest.mark.parametrize("edit, match", [
    (lambda p: p["steps"].pop(), "leave layers uncomputed"),
    (lambda p: p["steps"][-1][1].append(p["steps"][-1][1][-1]), "lists a layer twice"),
    (lambda p: p["steps"].reverse(), "before it is made"),
    (lambda p: p["steps"][0].__setitem__(0, 99), "step 0 is malformed"),
    (lambda p: p["steps"][0].__setitem__(1, [10 ** 6]), "step 0 is malformed"),
    (lambda p: p["kernels"][0].__setitem__("kind", "python"), "kernel 0 is malformed"),
    (lambda p: p["kernels"][0].__setitem__("tactic", [["block", [1] * 3]]), "bad tactic"),
    (lambda p: p["target"].__setitem__("device_name", 7), "bad target"),
    (lambda p: p["target"].__setitem__("backend", "onnxruntime"), "another backend"),
])
def test_a_damaged_plan_is_a_format_error(engine_bytes, edit, match):
    sections = S.split_sections(engine_bytes)
    plan = json.loads(dict(sections)["plan.0"])
    edit(plan)
    data = S.join_sections([(n, json.dumps(plan).encode() if n == "plan.0" else d) for n, d in sections])
    with pytest.raises(torchkiln.EngineFormatError, match=match):
        Engine.deserialize(data)


def test_step_io_and_memory_plan_of_a_fused_plan():
    net = _chain(4)
    # Two steps of two layers each: the tensor between them is the only arena tensor.
    steps = [Step(0, (0, 1)), Step(0, (2, 3))]
    check_steps(net, steps)
    plan = Plan(make_plan("reference", net, torch.device("cpu"), BackendOptions()).target, [], steps)
    io = plan.io(net)
    assert [(s.inputs, s.outputs) for s in io] == [((0,), (2,)), ((2,), (4,))]
    assert io[0].frees == (1,) and io[1].frees == (2, 3)  # what a step makes and reads itself, too
    memory = plan.memory(net)
    assert list(memory.live) == [2] and memory.live[2] == (0, 1) and memory.slot_bytes[2] == 2 * 8 * 4
    assert memory.arena_bytes == 256  # one tensor, aligned


def test_a_later_step_may_compute_a_layer_again_from_its_inputs():
    """a = relu(x), b = -a, c = a * b. Step 0 makes a and b; step 1 computes a again (a fused kernel recomputing a
    cheap value) and c. a is step 1's own: step 0 writes only b, step 1 reads x and b. Where a third step still
    reads a, the step that made it first writes it."""
    net = Network("recompute")
    x = net.add_input("x", torch.float32, (2, 8))
    a = net.add_activation(x, L.ActivationType.RELU).get_output()
    b = net.add_unary(a, L.UnaryOperation.NEG).get_output()
    c = net.add_elementwise(a, b, L.ElementWiseOperation.PROD).get_output()
    net.mark_output(c)
    target = make_plan("reference", net, torch.device("cpu"), BackendOptions()).target
    steps = [Step(0, (0, 1)), Step(0, (0, 2))]
    check_steps(net, steps)
    io = Plan(target, [], steps).io(net)
    assert [(s.inputs, s.outputs, s.frees) for s in io] == [((0,), (2,), (1,)), ((0, 2), (3,), (2,))]
    net.mark_output(a)
    io = Plan(target, [], steps).io(net)
    assert [(s.inputs, s.outputs) for s in io] == [((0,), (1, 2)), ((0, 2), (3,))]


def test_arena_offsets_never_overlap_while_both_tensors_live():
    net = _chain(8, (4, 100))
    plan = make_plan("reference", net, torch.device("cpu"), BackendOptions())
    memory = plan.memory(net)
    slots = list(memory.live)
    assert len(slots) == 7  # every intermediate; the output is the caller's
    for a in slots:
        for b in slots:
            (la, ha), (lb, hb) = memory.live[a], memory.live[b]
            if a != b and not (ha < lb or hb < la):
                ea, eb = memory.offsets[a] + 1600, memory.offsets[b] + 1600
                assert ea <= memory.offsets[b] or eb <= memory.offsets[a]
    # a chain needs two live tensors at a time, so the arena reuses memory: two buffers, not seven
    assert memory.arena_bytes == 2 * 1792 and memory.peak_bytes() == 2 * 1600


def test_symbolic_sizes_plan_at_the_largest_shape():
    s = DimSymbol("s0", 1, 16)
    net = _chain(3, (s, 8))
    memory = make_plan("reference", net, torch.device("cpu"), BackendOptions()).memory(net)
    assert all(not isinstance(b, int) for b in memory.slot_bytes.values())
    assert memory.arena_bytes == 2 * 512  # 16 x 8 x 4 bytes each, aligned
    assert memory.peak_bytes({s: 2}) == 2 * 2 * 8 * 4


def test_onnxruntime_plan_has_session_and_reference_steps():
    pytest.importorskip("onnxruntime")
    net = Network("mixed")
    x = net.add_input("x", torch.float32, (3, 4))
    a = net.add_activation(x, L.ActivationType.RELU).get_output()
    b = net.add_elementwise(a, x, L.ElementWiseOperation.ATAN2).get_output()  # ONNX has no atan2
    c = net.add_activation(b, L.ActivationType.SIGMOID).get_output()
    net.mark_output(c)
    plan = make_plan("onnxruntime", net, torch.device("cpu"), BackendOptions())
    kinds = [plan.kernels[s.kernel].kind for s in plan.steps]
    assert kinds == ["session", "aten", "session"]
    assert dict(plan.target.libraries).keys() == {"torchkiln", "onnxruntime"}
    bindings = [InputBinding("x", torch.float32, (3, 4), (3, 4), (3, 4))]
    engine = Engine(net, bindings, "cpu", torch.float32, "mixed", "onnxruntime", plans=[plan])
    xv = torch.randn(3, 4)
    expected = torch.sigmoid(torch.atan2(torch.relu(xv), xv))
    torch.testing.assert_close(engine.execute([xv])[0], expected, rtol=0, atol=1e-6)
    again = Engine.deserialize(engine.serialize())
    assert dataclasses.astuple(again.plans[0].target) == dataclasses.astuple(plan.target)
