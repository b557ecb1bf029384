"""Methods whose arguments and results are tuples, lists and dicts of tensors (nested), scripted and traced."""
from typing import Dict, List, Tuple

import pytest
import torch
from harness import assert_matches_eager, check_compiled

import torchkiln
from torchkiln.partitioning.support import Fallback

I = torchkiln.Input

_lib = torch.library.Library("tk_collections", "DEF")
_lib.define("opaque(Tensor x) -> Tensor")
_lib.impl("opaque", lambda x: torch.tanh(x) * 0.5 + x, "CompositeExplicitAutograd")


class TupleDictIn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(6, 6)

    def forward(self, x: Tuple[torch.Tensor, torch.Tensor], d: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        a = torch.relu(self.fc(x[0]) + d["u"]) * 2.0
        b = torch.sigmoid(x[1] * d["v"]) + 1.0
        return {"a": a, "b": b, "ab": a + b}


def _tuple_dict_args():
    return (torch.randn(3, 6), torch.randn(3, 6)), {"u": torch.randn(3, 6), "v": torch.randn(3, 6)}


TUPLE_DICT_SPEC = [(I((3, 6)), I((3, 6))), {"u": I((3, 6)), "v": I((3, 6))}]


@pytest.mark.parametrize("frontend", ["script", "trace"])
def test_tuple_and_dict_inputs_and_dict_output(frontend):
    model = TupleDictIn().eval()
    args = _tuple_dict_args()
    if frontend == "trace":
        model = torch.jit.trace(model, args, strict=False)
    _, report = check_compiled(model, args, inputs=TUPLE_DICT_SPEC, engines=1, torch_blocks=0,
                               require_full_compilation=True)
    # the engine takes the parts of the arguments as flat tensors, named by their path
    assert sorted(v.name for v in report.blocks[0].inputs) == ["d['u']", "d['v']", "x[0]", "x[1]"]
    assert len(report.blocks[0].outputs) == 3


class NestedOut(torch.nn.Module):
    """A list argument consumed whole by aten::cat, and a nested tuple/list/dict result."""

    def forward(self, xs: List[torch.Tensor], y: torch.Tensor):
        c = torch.cat(xs, 1)
        s = torch.relu(c) * 2.0
        t = torch.sigmoid(y) - 0.5
        return (s, [t, s + 1.0]), {"y": y * 3.0}


@pytest.mark.parametrize("frontend", ["script", "trace"])
def test_list_input_and_nested_outputs(frontend):
    model = NestedOut().eval()
    args = ([torch.randn(2, 3), torch.randn(2, 4)], torch.randn(2, 7))
    if frontend == "trace":
        model = torch.jit.trace(model, args, strict=False)
    spec = [[I((2, 3)), I((2, 4))], I((2, 7))]
    _, report = check_compiled(model, args, inputs=spec, engines=1, torch_blocks=0, min_block_size=1)
    assert "aten::cat" in report.blocks[0].ops


class NestedTupleIn(torch.nn.Module):
    def forward(self, p: Tuple[torch.Tensor, Tuple[torch.Tensor, List[torch.Tensor]]]):
        a, (b, cs) = p
        return torch.relu(a + b) * 2.0, torch.cat(cs, 0) * 1.5


def test_nested_tuple_input_with_a_list_inside():
    args = ((torch.randn(4), (torch.randn(4), [torch.randn(2), torch.randn(3)])),)
    spec = [(I((4,)), (I((4,)), [I((2,)), I((3,))]))]
    _, report = check_compiled(NestedTupleIn(), args, inputs=spec, engines=1, torch_blocks=0, min_block_size=1)
    assert {"aten::cat", "aten::relu"} <= set(report.blocks[0].ops)


class CollectionsAroundAFallback(torch.nn.Module):
    def forward(self, x: Tuple[torch.Tensor, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
        a = torch.relu(x[0] * 2.0 + x[1])
        b = torch.ops.tk_collections.opaque(a)
        return torch.sigmoid(b * x[1]) + 1.0, a


def test_collections_around_a_pytorch_block():
    args = ((torch.randn(2, 5), torch.randn(2, 5)),)
    _, report = check_compiled(CollectionsAroundAFallback(), args, inputs=[(I((2, 5)), I((2, 5)))], engines=2,
                               torch_blocks=1, min_block_size=1)
    assert report.fallback_ops == {"tk_collections::opaque": 1}  # unpacking and packing are not fallback
    assert {v.name for v in report.blocks[2].inputs} == {"x[1]", "b"}


def test_require_full_compilation_with_a_fallback_in_collections():
    with pytest.raises(torchkiln.UnsupportedOperatorError) as info:
        torchkiln.compile(CollectionsAroundAFallback().eval(), [(I((2, 5)), I((2, 5)))], require_full_compilation=True)
    lines = str(info.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].startswith("  tk_collections::opaque x1 (no converter or evaluator) at ")


def test_unpacking_arguments_is_not_reported_as_fallback():
    report = torchkiln.partition_report(TupleDictIn().eval(), TUPLE_DICT_SPEC)
    assert report.fallback_ops == {} and report.fallback_reasons == {}
    assert Fallback.IO_PLUMBING not in str(report)


@pytest.mark.parametrize("spec, match", [
    ([I((3, 6)), {"u": I((3, 6)), "v": I((3, 6))}], r"inputs\[0\]: forward\(\) argument 'x' expects a tuple of 2"),
    ([(I((3, 6)),), {"u": I((3, 6)), "v": I((3, 6))}], r"inputs\[0\]: .* expects a tuple of 2"),
    ([(I((3, 6)), I((3, 6))), [I((3, 6))]], r"inputs\[1\]: .* expects a dict"),
    ([(I((3, 6)), I((3, 6))), {"u": I((3, 6)), "v": (I((3, 6)),)}], r"inputs\[1\]\['v'\]: .* expects a Tensor"),
    ([(I((3, 6)), I((3, 6))), {1: I((3, 6))}], r"inputs\[1\]: .* the key 1 does not fit"),
    ([(I((3, 6)), I((3, 6)))], r"forward\(\) takes 2 inputs but 1 were given"),
    ([(I((3, 6)), ()), {"u": I((3, 6))}], r"inputs\[0\]\[1\] is an empty tuple"),
])
def test_a_signature_that_does_not_match_is_named(spec, match):
    with pytest.raises(ValueError, match=match):
        torchkiln.compile(TupleDictIn().eval(), spec)


def test_a_missing_dict_key_fails_at_shape_analysis_with_a_clear_error():
    with pytest.raises(ValueError, match=r"inputs: running the method on random example inputs .* failed"):
        torchkiln.compile(TupleDictIn().eval(), [(I((3, 6)), I((3, 6))), {"u": I((3, 6))}])


def test_compiled_module_with_collections_saves_and_loads(tmp_path):
    model = TupleDictIn().eval()
    compiled = torchkiln.compile(model, TUPLE_DICT_SPEC)
    torch.jit.save(compiled, tmp_path / "m.ts")
    loaded = torch.jit.load(tmp_path / "m.ts")
    args = _tuple_dict_args()
    with torch.no_grad():
        assert_matches_eager(loaded(*args), model(*args))


class IntArgument(torch.nn.Module):
    def forward(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return x * k


def test_a_non_tensor_argument_is_refused_with_its_name():
    with pytest.raises(ValueError, match=r"inputs\[1\]: forward\(\) argument 'k' has type int here"):
        torchkiln.compile(IntArgument(), [I((2,)), I((1,))])


class IndexByRunTimeValue(torch.nn.Module):
    """A list built in the method and indexed by a value known only at run time (it once sent the partitioner's
    collection check into endless recursion)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = [x + 1, x * 2]
        i = int(x.sum() > 0)
        return xs[i] * 3


@pytest.mark.parametrize("sign", [1.0, -1.0])  # each element is picked by one of them
def test_list_indexed_by_a_run_time_value(sign):
    model = torch.jit.script(IndexByRunTimeValue().eval())
    x = torch.rand(4, 4) * sign
    compiled, report = check_compiled(model, [x], engines=None, torch_blocks=None, min_block_size=1)
    assert "aten::__getitem__.t" in report.fallback_ops
    for s in (1.0, -1.0):
        y = torch.rand(4, 4) * s
        assert_matches_eager(compiled(y), model(y))
