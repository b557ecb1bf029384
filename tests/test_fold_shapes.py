"""Shape-only layers (runtime/fold_shapes.py): which layers a dynamic engine's input shapes alone fix, their
values at bound shapes against eager, and the CUDA runner's steps that become those values once per
input-shape signature (run on the CPU here, generated kernels in Triton's interpreter; on a GPU at the end)."""
import pytest
import torch

import torchkiln
from harness import assert_matches_eager
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import DimSymbol
from torchkiln.runtime import fold_shapes
from torchkiln.runtime.backends import BackendOptions
from torchkiln.runtime.backends.cuda import planner
from torchkiln.runtime.backends.cuda.cache import CACHE_ENV
from torchkiln.runtime.backends.cuda.runner import bind_steps, place_weights
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.execute_op import engine_from_blob
from torchkiln.runtime.fold_shapes import ShapeFolding, shape_only_layers
from torchkiln.runtime.plan import Kernel, Plan, one_step_per_layer, slots, target_here
from torchkiln.runtime.symbols import SymbolBinder
from torchkiln.stitching.stitch import ENGINE_ATTR

CPU = torch.device("cpu")
RANGE = torchkiln.Input(min_shape=(1, 2), opt_shape=(2, 8), max_shape=(4, 32))
RANGE_1D = torchkiln.Input(min_shape=(1,), opt_shape=(8,), max_shape=(64,))


class Mask(torch.nn.Module):
    """A mask from x.size(1) (arange, compare, cast) added to x and returned; and a term from x's values."""

    def forward(self, x):
        n = x.size(1)
        keep = (torch.arange(n, device=x.device) < n // 2).to(x.dtype)
        return x + keep * 2.0, keep, x.amax(0) > 0


class Positions(torch.nn.Module):
    """1-d: sin(arange(n)) (shape-only) added to x * 3; the CUDA planner puts x * 3, the cast, the sin and the add
    in one step."""

    def forward(self, x):
        return x * 3.0 + torch.sin(torch.arange(x.size(0), device=x.device).float())


def _network(model, inp=RANGE):
    data = torchkiln.convert_method_to_engine(model.eval(), "forward", [inp], backend="reference")
    return Engine.deserialize(data).network


def _reads_input_values(network):
    """Indices of the layers whose values depend on an input's values (what no shape-only layer may be)."""
    tainted = {id(t) for t in network.inputs}
    found = set()
    for j, layer in enumerate(network.layers):
        if not isinstance(layer, L.ShapeLayer) and any(id(t) in tainted for t in layer.inputs):
            found.add(j)
            tainted.update(id(t) for t in layer.outputs)
    return found


def _values(network, tensors, shape):
    """The values of shape-only `tensors` with the network's one input of `shape`, by ShapeFolding."""
    binder = SymbolBinder.for_network(network)
    bindings = binder.bind([shape])
    found = ShapeFolding(network, []).values(tensors, bindings, lambda layer: binder.specialize(layer, bindings),
                                             [layer.weights for layer in network.layers], CPU)
    return [found[id(t)] for t in tensors]


def test_the_mask_is_shape_only_and_nothing_reading_x_is():
    network = _network(Mask())
    only = shape_only_layers(network)
    kinds = sorted(network.layers[j].KIND for j in only)
    assert kinds == ["cast", "constant", "constant", "dim_value", "elementwise", "elementwise", "fill"], kinds
    reading = _reads_input_values(network)
    assert len(reading) == 3 and not only & reading  # x + mask, amax(x), > 0
    assert only | reading == set(range(len(network.layers)))
    assert network.layers.index(network.outputs[1].producer) in only


@pytest.mark.parametrize("shape", [(3, 5), (2, 12)])
def test_values_at_two_shapes_match_eager(shape):
    network = _network(Mask())
    keep, = _values(network, [network.outputs[1]], shape)
    assert_matches_eager(keep, Mask()(torch.randn(shape))[1])


def _shape_network():
    """shape(x)[1] * 2 (a 0-d int64) and x + that: a ShapeLayer of an input is shape-only, x's reader is not."""
    b, s = DimSymbol("b", 1, 8), DimSymbol("s", 1, 64)
    network = Network("shape")
    x = network.add_input("x", torch.int64, (b, s))
    shape = network.add_shape(x).get_output()
    index = network.add_constant(torch.tensor(1)).get_output()
    dim = network.add_layer(L.GatherLayer, [shape, index], axis=0, mode=L.GatherMode.DEFAULT).get_output()
    two = network.add_constant(torch.tensor(2)).get_output()
    twice = network.add_elementwise(dim, two, L.ElementWiseOperation.PROD).get_output()
    network.mark_output(twice)
    network.mark_output(network.add_elementwise(x, twice, L.ElementWiseOperation.SUM).get_output())
    return network


@pytest.mark.parametrize("shape", [(2, 3), (5, 40)])
def test_a_shape_layer_of_an_input_is_shape_only_and_folds_to_the_bound_shape(shape):
    network = _shape_network()
    assert [network.layers[j].KIND for j in sorted(shape_only_layers(network))] == [
        "shape", "constant", "gather", "constant", "elementwise"]
    twice, = _values(network, [network.outputs[0]], shape)
    assert torch.equal(twice, torch.tensor(shape[1] * 2))


def _aten_plan(network):
    """A plan of one ATen step per layer (runs on any device)."""
    kernels, steps = one_step_per_layer(network, lambda layer: Kernel("aten", layer.KIND))
    return Plan(target_here("cuda", CPU), kernels, steps)


def _bind(network, plan, shape):
    return bind_steps(network, plan, place_weights(network, plan, CPU), SymbolBinder.for_network(network), [shape],
                      CPU, allow_tf32=False)


def test_the_runner_folds_shape_only_steps_once_per_shape_and_matches_eager():
    network = _network(Mask())
    plan = _aten_plan(network)
    only = shape_only_layers(network)
    folded = ShapeFolding(network, plan.steps).steps
    assert folded == [k for k, step in enumerate(plan.steps) if step.layers[0] in only
                      and not isinstance(network.layers[step.layers[0]], L.ConstantLayer)]
    returned = {slots(network)[id(network.outputs[1])]}
    for shape in [(3, 5), (2, 12)]:
        bound = _bind(network, plan, shape)
        x = torch.randn(shape)
        first = bound.run_eagerly([x])
        assert_matches_eager(tuple(first), Mask()(x))
        for k in folded:
            fn, ins, outs, _ = bound.fns[k]
            assert ins == []  # nothing read: the values were made when the shape was bound
            if not returned & set(outs):
                assert all(a is b for a, b in zip(fn([]), fn([])))  # the same tensors every call
        second = bound.run_eagerly([x])
        assert second[1] is not first[1]  # a folded engine output is the caller's: a fresh tensor per call
        first[1].fill_(7)
        assert_matches_eager(tuple(bound.run_eagerly([x])), Mask()(x))


def test_over_the_byte_budget_a_step_runs_per_call(monkeypatch):
    """With room for 8 bytes, only the 0-d dim value folds (the [12] arange, compare and casts do not)."""
    network = _network(Mask())
    plan = _aten_plan(network)
    monkeypatch.setattr(fold_shapes, "MAX_FOLDED_BYTES", 8)
    binder = SymbolBinder.for_network(network)
    bindings = binder.bind([(2, 12)])
    folded = ShapeFolding(network, plan.steps).fold(
        plan.io(network), {s: t for t, s in slots(network).items()}, bindings,
        lambda layer: binder.specialize(layer, bindings), place_weights(network, plan, CPU), CPU)
    assert [network.layers[plan.steps[k].layers[0]].KIND for k in folded] == ["dim_value"]
    x = torch.randn(2, 12)
    assert_matches_eager(tuple(_bind(network, plan, (2, 12)).run_eagerly([x])), Mask()(x))


@pytest.fixture
def interpreter(monkeypatch, tmp_path):
    """Generated kernels on the CPU, in Triton's interpreter (as tests/test_cuda_plan_steps.py runs them)."""
    pytest.importorskip("triton", reason="triton is not installed")
    if torch.cuda.is_available():
        pytest.skip("the GPU runs these plans in test_dynamic_engine_on_the_gpu_matches_eager_at_two_shapes")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_cuda_plans_step_of_shape_only_and_value_layers_runs_whole(interpreter):
    """The planner fuses float(arange)'s cast and sin with the add reading x * 3 (and x * 3 itself, which nothing
    else reads): that step runs whole (one kernel either way); the fill before it is folded."""
    network = _network(Positions(), RANGE_1D)
    plan = planner.make_plan(network, CPU, BackendOptions(timing_iterations=0))
    folded = ShapeFolding(network, plan.steps).steps
    kinds = [[network.layers[j].KIND for j in step.layers] for step in plan.steps]
    mixed = kinds.index(["elementwise", "cast", "unary", "elementwise"])
    assert mixed not in folded and [kinds[k] for k in folded] == [["fill"]], kinds
    for n in (5, 33):
        x = torch.randn(n)
        bound = _bind(network, plan, (n,))
        assert_matches_eager(bound.run_eagerly([x])[0], Positions()(x))
        assert [bound.fns[k][1] for k in folded] == [[]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dynamic_engine_on_the_gpu_matches_eager_at_two_shapes():
    compiled = torchkiln.compile(Mask().eval(), [RANGE], device="cuda")
    for shape in [(3, 5), (2, 12), (3, 5)]:
        x = torch.randn(shape, device="cuda")
        first = compiled(x)
        assert_matches_eager(first, Mask()(x))
        second = compiled(x)  # a replay of the captured graph
        assert second[1].data_ptr() != first[1].data_ptr()
        assert_matches_eager(second, Mask()(x))
    engine = engine_from_blob(getattr(compiled, ENGINE_ATTR.format(0)))
    assert engine.backend == "cuda"
    runner = engine.runner(x.device)  # the runner the calls above used (runners are kept per device)
    folded = ShapeFolding(runner.network, runner.plan.steps).steps
    assert folded and len(runner._bound) == 2
    assert all(bound.fns[k][1] == [] for bound in runner._bound.values() for k in folded)
