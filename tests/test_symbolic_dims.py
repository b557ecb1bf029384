"""The symbolic dim type: arithmetic, range-aware comparisons, evaluation and the bounded JSON tree."""
import pytest

from torchkiln.ir import symbolic as S


def _symbols():
    return S.DimSymbol("s0", 1, 8), S.DimSymbol("s1", 4, 64)


def test_arithmetic_evaluates_exactly_and_round_trips_through_the_tree():
    s0, s1 = _symbols()
    for e in [S.floordiv(s1, 2) * s0 + 3, S.mod(s1 + 1, 3), S.dim_max(s0, 4) - S.dim_min(s1, 9), S.floordiv(32 * s0, 32)]:
        back = S.from_tree(S.to_tree(e), {"s0": s0, "s1": s1})
        for a in range(1, 9):
            for b in (4, 5, 63, 64):
                assert S.evaluate(back, {s0: a, s1: b}) == S.evaluate(e, {s0: a, s1: b})
    assert S.floordiv(32 * s0, 32) == s0


def test_comparisons_are_decided_by_ranges_or_not_at_all():
    s0, s1 = _symbols()
    assert S.decide("ge", s0, 1) is True
    assert S.decide("eq", s0, 1) is None  # s0 may be 1: never guessed
    assert S.decide("gt", s1, 3) is True
    assert S.decide("le", S.floordiv(s1, 2), s1) is True  # by enumeration where intervals are too weak
    assert S.decide("eq", s0, s0) is True


@pytest.mark.parametrize("tree", [
    {"op": "sym", "name": "nope"}, {"op": "pow", "args": [2, 3]}, {"op": "add"}, {"op": "floordiv", "args": [1]},
    "s0 + 1", {"op": "sym", "name": "s0", "extra": 1}, 1 << 70, True,
])
def test_malformed_trees_are_refused(tree):
    s0, s1 = _symbols()
    with pytest.raises(S.SymbolicError):
        S.from_tree(tree, {"s0": s0, "s1": s1})


def test_deep_trees_are_refused():
    s0, _ = _symbols()
    tree = {"op": "sym", "name": "s0"}
    for _ in range(S.MAX_TREE_DEPTH + 2):
        tree = {"op": "add", "args": [tree, 1]}
    with pytest.raises(S.SymbolicError, match="too deep"):
        S.from_tree(tree, {"s0": s0})


@pytest.mark.parametrize("kind", ["linear", "linear_transposed_input", "attention"])
def test_shapes_read_off_inputs_agree_with_the_fake_run(kind):
    """Linear and attention shapes are read off the input shapes (torch 2.11's fake kernels fail on symbolic
    sizes); on this torch the fake run of their meaning works, and both must agree."""
    import torch

    from torchkiln.ir import layers as L
    from torchkiln.ir import symbolic_shapes
    from torchkiln.ir.reference import run_layer
    from torchkiln.ir.tensor import Tensor

    b, s = S.DimSymbol("b", 1, 8), S.DimSymbol("s", 4, 64)
    if kind == "attention":
        q, k, v = (Tensor(n, (b, 12, s, 64), torch.float16) for n in "qkv")
        layer = L.AttentionLayer(name="attn", inputs=[q, k, v], outputs=[])
    else:
        x = Tensor("x", (b, s, 32) if kind == "linear" else (b, 32, s), torch.float16)
        w = Tensor("w", (48, 32), torch.float16)
        op0 = L.MatrixOperation.NONE if kind == "linear" else L.MatrixOperation.TRANSPOSE
        layer = L.MatrixMultiplyLayer(name="mm", inputs=[x, w], outputs=[], op0=op0, op1=L.MatrixOperation.TRANSPOSE,
                                      weights={"bias": torch.zeros(48, dtype=torch.float16)})
    rule = symbolic_shapes._DIRECT_RULES[type(layer)]
    direct = rule(layer, run_layer)
    assert direct is not None
    faked = symbolic_shapes._infer(symbolic_shapes._Env(frozenset({b, s})), layer, {}, run_layer)
    assert [(tuple(shape), dtype) for shape, dtype in faked] == direct


def _chain(op, length):
    """max(max(12*s1, s0 + 11*s1), 2*s0 + 10*s1)...: sympy merges nested ones into one of many arguments (the
    ranges do not order these)."""
    terms = [{"op": "add", "args": [{"op": "mul", "args": [k, {"op": "sym", "name": "s0"}]},
                                    {"op": "mul", "args": [12 - k, {"op": "sym", "name": "s1"}]}]}
             for k in range(length + 1)]
    tree = terms[0]
    for term in terms[1:]:
        tree = {"op": op, "args": [tree, term]}
    return tree


S0_TREE, S1_TREE = {"op": "sym", "name": "s0"}, {"op": "sym", "name": "s1"}


@pytest.mark.parametrize("tree, message", [
    ({"op": "mul", "args": [S0_TREE] * 9}, r"s0\*\*9 is a power above 8"),  # the tree could not be written back
    ({"op": "mul", "args": [{"op": "mul", "args": [S0_TREE] * 8}] * 8}, r"s0\*\*64 is a power above 8"),
    ({"op": "mul", "args": [{"op": "add", "args": [S0_TREE, S1_TREE, 1]}] * 60}, "over 256 terms"),
    ({"op": "mul", "args": [{"op": "add", "args": [S0_TREE, S1_TREE, k]} for k in range(1, 9)]}, "over 256 terms"),
    ({"op": "max", "args": [{"op": "add", "args": [S1_TREE, k]} for k in range(5)]}, "a max of 5 arguments"),
    (_chain("min", 12), "a min of over 4 arguments"),
])
def test_trees_that_blow_up_are_refused(tree, message):
    """Bounded depth and node count are not enough: nodes combine into powers (repeated squaring), products of
    sums expand, and sympy compares every pair of a Max's arguments; such trees are refused as they are built."""
    s0, s1 = _symbols()
    with pytest.raises(S.SymbolicError, match=message):
        S.from_tree(tree, {"s0": s0, "s1": s1})


def test_the_largest_trees_allowed_round_trip():
    s0, s1 = _symbols()
    for tree in ({"op": "mul", "args": [S0_TREE] * S.MAX_POWER}, _chain("max", S.MAX_EXTREMUM_ARGS - 1),
                 {"op": "mul", "args": [{"op": "add", "args": [S0_TREE, S1_TREE]}] * 8}):
        d = S.from_tree(tree, {"s0": s0, "s1": s1})
        assert S.evaluate(S.from_tree(S.to_tree(d), {"s0": s0, "s1": s1}), {s0: 3, s1: 5}) == S.evaluate(
            d, {s0: 3, s1: 5})
