"""Shape-only layers and predicates (ir/shape_only.py) on networks built by hand: a conditional whose predicate
comes from the input shapes alone (a dim's value, a shape layer) is decided by the shapes; one that reads tensor
data, even in part, is not; a data-dependent size is not a shape. A loop's iterations are decided by the shapes
where its trip count is (a dim, a constant) and its body's condition is a constant (a for loop)."""
import pytest
import torch
from test_onnx_export import carried_body, scalar, subnetwork

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.shape_only import decided_by_shapes, shape_only_layers, shape_only_predicate, shape_only_trips
from torchkiln.ir.symbolic import DimSymbol

E = L.ElementWiseOperation
B, S = DimSymbol("b", 1, 8), DimSymbol("s", 32, 128)


def _from_dim(net, x):
    """x.size(1) > 64, from the dim's value."""
    return net.add_elementwise(net.add_layer(L.DimValueLayer, [], value=S).get_output(), scalar(net, 64),
                               E.GREATER).get_output()


def _from_shape_layer(net, x):
    """shape(x)[0] * 16 == shape(x)[1], from a shape layer."""
    shape = net.add_shape(x).get_output()
    dim = lambda i: net.add_layer(L.GatherLayer, [shape, scalar(net, i)], axis=0,  # noqa: E731
                                  mode=L.GatherMode.DEFAULT).get_output()
    return net.add_elementwise(net.add_elementwise(dim(0), scalar(net, 16), E.PROD).get_output(), dim(1),
                               E.EQUAL).get_output()


def _from_data(net, x):
    """x.sum() > 0."""
    total = net.add_reduce(x, L.ReduceOperation.SUM, (0, 1), False).get_output()
    return net.add_elementwise(total, scalar(net, 0.0), E.GREATER).get_output()


def _mixed(net, x):
    """x.size(1) > 64 and x.sum() > 0: one operand reads data."""
    return net.add_elementwise(_from_dim(net, x), _from_data(net, x), E.AND).get_output()


def _network(predicate):
    """A conditional on `predicate(net, x)` choosing exp(x) or x (x: [b, s] float)."""
    net = Network("conditional")
    x = net.add_input("x", torch.float32, (B, S))
    then = subnetwork("then", [((B, S), torch.float32)], lambda n, a: n.add_unary(a, L.UnaryOperation.EXP).get_output())
    otherwise = subnetwork("else", [((B, S), torch.float32)], lambda n, a: a)
    layer = net.add_conditional(predicate(net, x), [x], then, otherwise)
    net.mark_output(layer.get_output())
    return net, layer


@pytest.mark.parametrize("predicate, decided", [(_from_dim, True), (_from_shape_layer, True), (_from_data, False),
                                                (_mixed, False)], ids=["dim-value", "shape-layer", "data", "mixed"])
def test_a_predicate_is_shape_only_where_it_comes_from_the_shapes_alone(predicate, decided):
    net, layer = _network(predicate)
    assert shape_only_predicate(net, layer) is decided
    assert decided_by_shapes(net) == ({net.layers.index(layer)} if decided else set())


def test_a_layer_that_is_not_a_conditional_has_no_shape_only_predicate():
    net, layer = _network(_from_dim)
    predicate_layer = layer.inputs[0].producer
    assert net.layers.index(predicate_layer) in shape_only_layers(net)
    assert not shape_only_predicate(net, predicate_layer)


def test_a_data_dependent_size_is_not_a_shape():
    """shape(nonzero(x))[0] > 0 depends on x's values: the shape layer, the comparison and the conditional are not
    shape-only (the constant is)."""
    net = Network("nonzero")
    x = net.add_input("x", torch.float32, (B, S))
    found = net.add_non_zero(x).get_output()
    count = net.add_layer(L.GatherLayer, [net.add_shape(found).get_output(), scalar(net, 0)], axis=0,
                          mode=L.GatherMode.DEFAULT).get_output()
    predicate = net.add_elementwise(count, scalar(net, 0), E.GREATER).get_output()
    then = subnetwork("then", [((B, S), torch.float32)], lambda n, a: n.add_unary(a, L.UnaryOperation.EXP).get_output())
    layer = net.add_conditional(predicate, [x], then, subnetwork("else", [((B, S), torch.float32)], lambda n, a: a))
    net.mark_output(layer.get_output())
    assert {net.layers[j].KIND for j in shape_only_layers(net)} == {"constant"}
    assert not shape_only_predicate(net, layer)


def _loop(trips, limit):
    """A loop over c = c * 0.5 + r + i of x's [4] values, `trips(net, x)` times at most, while sum(c) < `limit`
    (None: a for loop)."""
    net = Network("loop")
    x = net.add_input("x", torch.float32, (S,))
    n = net.add_input("n", torch.float32, (4,))
    count = trips(net, x)
    layer = net.add_loop(count, scalar(net, True), [n], [n], carried_body(0.5, limit), 1000)
    net.mark_output(layer.get_output())
    return net, layer


def _dim(net, x):
    return net.add_layer(L.DimValueLayer, [], value=S).get_output()


def _data(net, x):
    total = net.add_reduce(x, L.ReduceOperation.SUM, (0,), False).get_output()
    return net.add_cast(total, torch.int64).get_output()


@pytest.mark.parametrize("trips, limit, decided", [(_dim, None, True), (lambda net, x: scalar(net, 10), None, True),
                                                   (_data, None, False), (_dim, 30.0, False)],
                         ids=["dim-for", "constant-for", "data-trips", "while"])
def test_a_loops_iterations_are_decided_by_the_shapes_where_its_count_is_and_its_body_never_stops_it(
        trips, limit, decided):
    net, layer = _loop(trips, limit)
    assert shape_only_trips(net, layer) is decided
    assert decided_by_shapes(net) == ({net.layers.index(layer)} if decided else set())
