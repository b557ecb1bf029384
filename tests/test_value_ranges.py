"""Integer value ranges (ir/value_ranges.py): each rule's bounds, the cases that prove nothing, and a property check
that the values a network computes lie inside the range proved for them."""
import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import run_layer
from torchkiln.ir.value_ranges import MAX_DEPTH, proved_range

E = L.ElementWiseOperation
I32, I64 = torch.int32, torch.int64


def const(net: Network, *values: int, dtype=I64):
    return net.add_constant(torch.tensor(values, dtype=dtype)).get_output()


def test_constants_and_arithmetic():
    net = Network("arith")
    a, b = const(net, -2, 5), const(net, 3, 4)
    assert proved_range(a) == (-2, 5) and proved_range(b) == (3, 4)
    assert proved_range(net.add_slice(const(net, 3, 4, 7), [0], [2], [1]).get_output()) == (3, 7)  # the input's
    assert proved_range(net.add_elementwise(a, b, E.SUM).get_output()) == (1, 9)
    assert proved_range(net.add_elementwise(a, b, E.SUB).get_output()) == (-6, 2)
    assert proved_range(net.add_elementwise(a, b, E.PROD).get_output()) == (-8, 20)
    assert proved_range(net.add_elementwise(a, b, E.MAX).get_output()) == (3, 5)
    assert proved_range(net.add_elementwise(a, b, E.MIN).get_output()) == (-2, 4)
    assert proved_range(net.add_elementwise(a, b, E.FLOOR_DIV).get_output()) is None  # no rule
    assert proved_range(net.add_concatenation([a, b], 0).get_output()) == (-2, 5)
    assert proved_range(net.add_cast(a, I32).get_output()) == (-2, 5)


def test_inputs_floats_and_values_that_may_wrap_prove_nothing():
    net = Network("none")
    x = net.add_input("x", I64, (4,))
    assert proved_range(x) is None
    assert proved_range(net.add_elementwise(x, const(net, 1), E.SUM).get_output()) is None
    f = net.add_input("f", torch.float32, (4,))
    assert proved_range(net.add_cast(f, I64).get_output()) is None
    assert proved_range(net.add_elementwise(f, f, E.LESS).get_output()) == (0, 1)  # a boolean
    big = const(net, 0, 40000)
    assert proved_range(net.add_cast(big, torch.int16).get_output()) is None  # 40000 wraps in int16
    assert proved_range(net.add_cast(big, I32).get_output()) == (0, 40000)


def test_a_cumulative_sum_and_a_gather_from_a_constant_table():
    net = Network("positions")
    ids = net.add_input("ids", I64, (2, 12))
    mask = net.add_cast(net.add_elementwise(ids, const(net, 1), E.NOT_EQUAL).get_output(), I32).get_output()
    running = net.add_cumulative(mask, L.CumulativeOperation.SUM, 1).get_output()
    assert proved_range(running) == (0, 12)
    positions = net.add_elementwise(net.add_elementwise(running, mask, E.PROD).get_output(),
                                    const(net, 1, dtype=I32), E.SUM).get_output()
    assert proved_range(positions) == (1, 13)
    table = const(net, *range(5, 45))
    picked = net.add_gather(table, net.add_cast(positions, I64).get_output(), 0).get_output()
    assert proved_range(picked) == (5, 44)  # the table's values, whatever the indices
    product = net.add_cumulative(mask, L.CumulativeOperation.PROD, 1).get_output()
    assert proved_range(product) is None


def test_a_proof_looks_back_a_bounded_number_of_layers():
    net = Network("deep")
    x = const(net, 0, 1)
    for _ in range(MAX_DEPTH + 5):
        x = net.add_identity(x).get_output()
    assert proved_range(x) is None
    y = const(net, 0, 1)
    for _ in range(MAX_DEPTH - 5):
        y = net.add_identity(y).get_output()
    assert proved_range(y) == (0, 1)


def test_the_values_computed_lie_in_the_proved_range():
    """Random padded id rows through RoBERTa's position-id arithmetic: every value of every integer tensor lies in
    the range proved for it, and the positions' range is tight (both ends are reached)."""
    net = Network("roberta positions")
    ids = net.add_input("ids", I64, (3, 9))
    mask = net.add_cast(net.add_elementwise(ids, const(net, 1), E.NOT_EQUAL).get_output(), I32).get_output()
    running = net.add_cumulative(mask, L.CumulativeOperation.SUM, 1).get_output()
    positions = net.add_cast(net.add_elementwise(running, mask, E.PROD).get_output(), I64).get_output()
    net.mark_output(net.add_elementwise(positions, const(net, 1), E.SUM).get_output())
    g = torch.Generator().manual_seed(0)
    seen: dict[int, list[int]] = {}
    for trial in range(50):
        values = torch.randint(0, 6, (3, 9), generator=g)
        values[0] = 2  # a row without padding: the largest position
        values[1] = 1  # a row of padding only: the smallest
        env = {id(ids): values}
        for layer in net.layers:
            outs = run_layer(layer, [env[id(t)] for t in layer.inputs], layer.weights, torch.device("cpu"))
            for t, v in zip(layer.outputs, outs):
                env[id(t)] = v
                found = proved_range(t)
                if found is not None:
                    assert found[0] <= int(v.min()) and int(v.max()) <= found[1], (layer.name, found, v)
                    low, high = seen.get(id(t), [found[1], found[0]])
                    seen[id(t)] = [min(low, int(v.min())), max(high, int(v.max()))]
    out = net.outputs[0]
    assert proved_range(out) == (1, 10) and seen[id(out)] == [1, 10]
