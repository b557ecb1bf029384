"""The coverage command: `python -m torchkiln coverage` against the bundled ts_ops_floor.txt."""
import os
import re
import subprocess
import sys

import torchkiln
from torchkiln.cli import main
from torchkiln.coverage import floor_coverage, read_floor


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
