"""The OpInfo conformance suite's CI subset (torchkiln.coverage.opinfo): common ops of PyTorch's op_db, each float32
sample traced, compiled with min_block_size=1 on the reference and onnxruntime backends and compared with eager,
in three variants (tensors as inputs; the tensors after the first as constants; NaN/inf, 0-d, empty values).
The full sweep is scripts/opinfo_sweep.py (table in docs/coverage.md)."""
import logging

import pytest
import torch

pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest (the [test] extra)")

from torchkiln.cli import main  # noqa: E402
from torchkiln.coverage.opinfo import (OpResult, Outcome, engine_fraction, mismatch, op_infos, read_table, run_op,
                                      write_table)

SUBSET = [
    # elementwise
    "add", "sub", "mul", "div.no_rounding_mode", "exp", "log", "sqrt", "tanh", "sigmoid", "abs", "neg", "clamp",
    "where", "pow", "maximum", "nn.functional.relu", "nn.functional.gelu",
    # reductions
    "sum", "mean", "amax", "argmax", "var", "std", "prod",
    # matmul family
    "matmul", "mm", "bmm", "addmm", "nn.functional.linear",
    # views and shapes
    "reshape", "view", "permute", "transpose", "flatten", "squeeze", "unsqueeze", "cat", "stack", "expand", "t",
    # convolution, pooling, normalization, softmax
    "nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.max_pool2d", "nn.functional.avg_pool2d",
    "nn.functional.layer_norm", "nn.functional.batch_norm", "nn.functional.group_norm", "softmax", "log_softmax",
    # indexing
    "index_select", "gather", "nn.functional.embedding", "masked_fill", "__getitem__",
    # special functions, losses, diagonals, lerp, products, NaN-ignoring reductions
    "special.i0e", "igamma", "nn.functional.mse_loss", "nn.functional.cross_entropy", "diagonal", "lerp", "cross",
    "nansum",
]

# The subset's ops that run in an engine today (on some sample, variant and backend): a regression fails.
ENGINE_FLOOR = set(SUBSET)

LIMIT = 3  # samples per op and variant (special values: per kind)


@pytest.fixture(autouse=True)
def _quiet(caplog):
    caplog.set_level(logging.ERROR, logger="torchkiln")


@pytest.mark.parametrize("name", SUBSET)
def test_op_conforms(name):
    (info,) = op_infos([name])
    result = run_op(info, limit=LIMIT)
    assert result.tested, f"{name}: no sample compiled ({dict(result.skipped)})"
    bad = {f"{variant}/{backend}": f"{cell.summary()}: {cell.reasons.get(cell.worst)}"
           for (variant, backend), cell in result.cells.items() if cell.worst in ("WRONG", "ERROR")}
    assert not bad, f"{name}: {bad}"
    if name in ENGINE_FLOOR:
        assert result.engine, f"{name} no longer runs in an engine: " + "; ".join(
            f"{v}/{b}: {c.reasons.get(c.best)}" for (v, b), c in result.cells.items())


def test_stored_table_round_trips_and_the_command_prints_its_fraction(tmp_path, capsys):
    result = OpResult("add")
    result.cell("inputs", "reference").add(Outcome("ENGINE"))
    result.cell("inputs", "reference").add(Outcome("WRONG", "output: max abs error 1 > 0.0001 x max|eager| 2"))
    other = OpResult("cholesky")
    other.cell("inputs", "onnxruntime").add(Outcome("FALLBACK", "aten::cholesky: no converter or evaluator"))
    untested = OpResult("bernoulli")
    untested.skipped["random"] += 2
    path = tmp_path / "table.tsv"
    write_table([result, other, untested], path, ["a header"])
    back = {r.op: r for r in read_table(path)}
    assert back["add"].cell("inputs", "reference").summary() == "ENGINE 1, WRONG 1"
    assert back["add"].cell("inputs", "reference").reasons["WRONG"].startswith("output: max abs error")
    assert back["cholesky"].cell("inputs", "onnxruntime").best == "FALLBACK"
    assert not back["bernoulli"].tested
    assert engine_fraction(list(back.values())) == (1, 2)
    assert main(["coverage", "--opinfo", str(path)]) == 0
    assert "OpInfo ops with an engine on a float32 sample (scripts/opinfo_sweep.py): 1/2 (50.0%)" in (
        capsys.readouterr().out)


def test_bundled_table_is_packaged():
    engine, tested = engine_fraction(read_table())
    assert tested > 500 and 0 < engine <= tested


def test_mismatch_names_what_differs():
    ref = torch.tensor([1.0, float("nan"), float("inf")])
    assert mismatch(ref.clone(), ref) is None
    assert "nan at (2,)" in mismatch(torch.tensor([1.0, float("nan"), float("nan")]), ref)
    assert "max abs error" in mismatch(torch.tensor([1.001, float("nan"), float("inf")]), ref)
    assert "torch.float64[3]" in mismatch(ref.double(), ref)
    assert "2 values where eager gives 1" in mismatch((ref, ref), ref)
    assert mismatch(torch.empty(3), torch.zeros(3), values=False) is None
