"""The coverage command: `python -m torchkiln coverage` against the bundled ts_ops_floor.txt."""
import os
import re
import subprocess
import sys

import torch

import torchkiln
from torchkiln.cli import main
from torchkiln.coverage import floor_coverage, floor_overloads, overload_coverage, read_floor, read_seen
from torchkiln.coverage.overloads import model_overloads
from torchkiln.examples import SmallResNet


def test_bundled_floor_is_packaged():
    ops = read_floor()
    assert len(ops) == 207 and len(set(ops)) == 207
    assert ops[0] == "aten::Bool" and "trt::const" in ops


def test_command_prints_a_table_and_the_count(capsys):
    assert main(["coverage"]) == 0
    out = capsys.readouterr().out
    match = re.search(r"^coverage: (\d+)/207 \((\d+\.\d)%\)$", out, re.M)
    assert match, out[-500:]
    covered = sum(r.covered for r in floor_coverage())
    assert int(match.group(1)) == covered
    assert float(match.group(2)) == round(100 * covered / 207, 1)
    assert re.search(r"^aten::to\s+.*\.dtype\b", out, re.M)  # a converter overload listed
    assert re.search(r"^aten::__getitem__\s+-\s+.*\.t\b", out, re.M)  # an evaluator-only op


def test_trt_ops_are_torchkiln_ops():
    rows = {r.op: r for r in floor_coverage(["trt::const", "trt::attn_bias_from_attn_mask"])}
    assert rows["trt::const"].name == "torchkiln::const"
    assert rows["trt::const"].converters == ("torchkiln::const",)
    assert rows["trt::attn_bias_from_attn_mask"].covered


def test_missing_and_require_full_with_a_custom_floor(tmp_path, capsys):
    floor = tmp_path / "floor.txt"
    floor.write_text("# ops\naten::cat\naten::no_such_op\n\nprim::ListConstruct\n")
    assert main(["coverage", "--floor", str(floor), "--missing"]) == 0
    out = capsys.readouterr().out
    assert "aten::no_such_op  MISSING" in out and "aten::cat " not in out
    assert "coverage: 2/3 (66.7%)" in out
    assert main(["coverage", "--floor", str(floor), "--require-full"]) == 1
    floor.write_text("aten::cat\nprim::ListConstruct\n")
    assert main(["coverage", "--floor", str(floor), "--require-full"]) == 0
    assert "coverage: 2/2 (100.0%)" in capsys.readouterr().out


def test_supported_ops_lists_converters_and_evaluators():
    ops = torchkiln.supported_ops()
    assert "aten::slice.Tensor" in ops["converters"] and "aten::append.t" in ops["evaluators"]


def test_module_entry_point_runs():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(torchkiln.__file__)),
                                                                    os.environ.get("PYTHONPATH")] if p))
    result = subprocess.run([sys.executable, "-m", "torchkiln", "coverage", "--missing"], capture_output=True,
                            text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert re.search(r"^coverage: \d+/207 ", result.stdout, re.M)


def test_the_command_counts_overloads(capsys):
    assert main(["coverage"]) == 0
    out = capsys.readouterr().out
    seen = overload_coverage(read_seen())
    floor = overload_coverage(floor_overloads())
    match = re.search(r"^overloads seen in real graphs \(CI zoo, examples\): (\d+)/(\d+) ", out, re.M)
    assert match and int(match.group(1)) == sum(r.covered for r in seen) and int(match.group(2)) == len(seen)
    match = re.search(r"^overloads of the floor's ops: (\d+)/(\d+) ", out, re.M)
    assert match and int(match.group(1)) == sum(r.covered for r in floor) and int(match.group(2)) == len(floor)
    assert len(floor) > 2 * 207  # overloads, not op names: the count no longer hides them


def test_floor_overloads_are_torchscripts_without_out_variants():
    keys = floor_overloads(["aten::add", "aten::cos", "trt::const"])
    assert {"aten::add.Tensor", "aten::add.str", "aten::add.t", "aten::cos.float", "torchkiln::const"} <= set(keys)
    assert not any(k.endswith((".out", "_out")) for k in keys)
    rows = {r.key: r for r in overload_coverage(keys)}
    assert rows["aten::add.Tensor"].by == "converter" and rows["aten::add.t"].by == "evaluator"
    assert rows["aten::add.int"].by == "evaluator"  # numbers only: the op's own evaluator takes it
    assert rows["aten::cos"].by == "converter" and not rows["aten::cos.float"].covered


def test_missing_lists_the_overloads_nothing_covers(capsys):
    assert main(["coverage", "--missing"]) == 0
    out = capsys.readouterr().out
    assert "overloads of the floor's ops with no converter or evaluator:" in out
    assert re.search(r"^  aten::cos: .*\bfloat\b", out, re.M)


def test_the_bundled_overloads_of_real_graphs_are_current():
    """An example model's lowered graph shows no overload the bundled list lacks (else rerun
    scripts/collect_overloads.py), and the list names the model for what it shows."""
    seen = read_seen()
    found = model_overloads(SmallResNet(), [torch.randn(2, 3, 64, 64)])
    assert found and found <= set(seen), sorted(found - set(seen))
    assert all("resnet" in seen[key] for key in found)
