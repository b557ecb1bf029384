"""The partition report: as data, as text, in the debug log, and the dry run that builds nothing."""
import json
import logging

import pytest
import torch

import torchkiln
from torchkiln.compiler import compile_with_report
from torchkiln.partitioning.report import BoundaryValue, PartitionReport
from torchkiln.partitioning.support import Fallback
from test_partitioning_blocks import ForcedOps, WithBrokenConverter

_lib = torch.library.Library("tk_report", "DEF")
_lib.define("opaque(Tensor x) -> Tensor")
_lib.impl("opaque", lambda x: x.exp() - 1.0, "CompositeExplicitAutograd")


class Middle(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.fc = torch.nn.Linear(4 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.conv(x))
        y = torch.ops.tk_report.opaque(y)
        return self.fc(torch.flatten(y, 1))


SPEC = [torchkiln.Input((2, 3, 4, 4))]


@pytest.fixture(scope="module")
def report() -> PartitionReport:
    return torchkiln.partition_report(Middle().eval(), SPEC, min_block_size=1)


def test_report_blocks_ops_and_boundaries(report):
    assert report.name == "Middle.forward"
    assert [(b.index, b.target) for b in report.blocks] == [(0, "engine"), (1, "torch"), (2, "engine")]
    first, middle, last = report.blocks
    assert first.ops == ("aten::_convolution", "aten::relu") or first.ops == ("aten::conv2d", "aten::relu")
    assert first.inputs == (BoundaryValue("x", "Tensor", (2, 3, 4, 4), torch.float32),)
    assert first.output_shapes == ((2, 4, 4, 4),) and middle.input_shapes == ((2, 4, 4, 4),)
    assert last.ops == ("aten::flatten.using_ints", "aten::linear")
    assert last.output_shapes == ((2, 10),)
    (fallback,) = middle.fallback
    assert fallback.op == "tk_report::opaque" and fallback.reason == Fallback.NO_CONVERTER
    assert fallback.reason == "no converter or evaluator"  # a Fallback compares equal to its text
    assert fallback.location.endswith("test_partitioning_report.py:27")


def test_report_text(report):
    text = str(report).splitlines()
    assert text[0] == "partition of Middle.forward: 2 engine blocks, 1 torch block; 4 of 5 ops in engines"
    assert text[1].startswith("[0] engine 2 ops") and text[1].endswith("(x: f32[2,3,4,4]) -> (y: f32[2,4,4,4])")
    assert text[3].startswith("[1] torch  1 op ")
    assert text[4] == "      tk_report::opaque at test_partitioning_report.py:27 -- no converter or evaluator"
    assert text[-1] == "left in PyTorch: tk_report::opaque x1"


def test_report_as_plain_data(report):
    data = json.loads(json.dumps(report.as_dict()))
    assert data["num_engine_blocks"] == 2 and data["num_torch_blocks"] == 1
    middle = data["blocks"][1]
    assert middle["fallback"][0]["reason"] == "no converter or evaluator"
    assert middle["inputs"][0] == {"name": "y", "type": "Tensor", "shape": [2, 4, 4, 4], "dtype": "torch.float32"}


def test_a_dynamic_report_as_plain_data_and_a_static_one_read_back(report):
    dynamic = torchkiln.partition_report(
        torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4)).eval(),
        [torchkiln.Input(min_shape=(1, 4), opt_shape=(2, 4), max_shape=(8, 4))])
    data = json.loads(json.dumps(dynamic.as_dict()))
    assert isinstance(data["blocks"][0]["inputs"][0]["shape"][0], str)  # a symbolic dim, as text
    with pytest.raises(ValueError, match="dynamic shape"):
        PartitionReport.from_dict(data)
    assert PartitionReport.from_dict(json.loads(json.dumps(report.as_dict()))) == report


def test_forced_op_reason_in_the_report():
    report = torchkiln.partition_report(ForcedOps().eval(), [torchkiln.Input((2, 8))], min_block_size=1,
                                        torch_executed_ops={"aten::relu"})
    assert report.fallback_reasons == {Fallback.FORCED_OP: 1}
    assert "aten::relu at test_partitioning_blocks.py:" in str(report)
    assert "-- forced by torch_executed_ops: 'aten::relu' is in torch_executed_ops" in str(report)


def test_dry_run_does_not_convert():
    # WithBrokenConverter's converter fails: only a real build finds out and moves that op to PyTorch
    dry = torchkiln.partition_report(WithBrokenConverter().eval(), [torchkiln.Input((2, 8))], min_block_size=1)
    assert (dry.num_engine_blocks, dry.num_torch_blocks) == (1, 0)
    _, built = compile_with_report(WithBrokenConverter().eval(), [torchkiln.Input((2, 8))], min_block_size=1)
    assert (built.num_engine_blocks, built.num_torch_blocks) == (2, 1)


def test_compile_with_debug_logs_the_report(caplog):
    with caplog.at_level(logging.DEBUG, logger="torchkiln"):
        torchkiln.compile(Middle().eval(), SPEC, min_block_size=1, debug=True)
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("partition report:")]
    assert len(logged) == 1
    assert "partition of Middle.forward: 2 engine blocks, 1 torch block" in logged[0]
    assert "tk_report::opaque at test_partitioning_report.py:27 -- no converter or evaluator" in logged[0]


@pytest.mark.parametrize("ops", [["relu"], ["aten::relu.Tensor.extra"], ["aten::"]])
def test_bad_torch_executed_ops_name(ops):
    with pytest.raises(ValueError, match="torch_executed_ops: .* is not an op name"):
        torchkiln.partition_report(Middle().eval(), SPEC, torch_executed_ops=ops)
