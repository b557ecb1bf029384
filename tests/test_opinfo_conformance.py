"""The OpInfo conformance suite's CI subset (torchkiln.coverage.opinfo): common ops of PyTorch's op_db, each float32
sample traced, compiled with min_block_size=1 on the reference and onnxruntime backends and compared with eager,
in three variants (tensors as inputs; the tensors after the first as constants; NaN/inf, 0-d, empty values).
The full sweep is scripts/opinfo_sweep.py (table in docs/coverage.md)."""
import logging
import os

import pytest
import torch

pytest.importorskip("expecttest", reason="torch's OpInfo database needs expecttest (the [test] extra)")

from torchkiln.cli import main  # noqa: E402
from torchkiln.coverage import opinfo_sweep  # noqa: E402
from torchkiln.coverage.opinfo import (NOT_RUN, OpResult, Outcome, backend_device, engine_fraction,  # noqa: E402
                                      format_fraction, merge, mismatch, op_infos, op_name, read_header, read_table,
                                      run_op, write_table)

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


def test_backends_map_to_their_devices():
    assert backend_device("cuda") == torch.device("cuda")
    assert backend_device("reference") == backend_device("onnxruntime") == torch.device("cpu")


def test_shards_are_disjoint_and_cover_every_op():
    names = [op_name(info) for info in op_infos()]
    shards = [opinfo_sweep.shard(names, i, 3) for i in range(3)]
    assert sorted(sum(shards, [])) == sorted(names) and all(shards)
    assert sum(len(s) for s in shards) == len(set().union(*map(set, shards))) == len(names)
    assert opinfo_sweep.parse_shard("1/2") == (1, 2)
    with pytest.raises(Exception, match="0 <= I < N"):
        opinfo_sweep.parse_shard("2/2")


def test_deadline_notes_the_ops_not_run_and_still_writes_the_table(tmp_path):
    table = tmp_path / "t.tsv"
    assert opinfo_sweep.main(["--ops", "add", "neg", "--backends", "reference", "--deadline", "0", "--table",
                              str(table), "--no-doc"]) == 0
    assert {r.op: r.notes for r in read_table(table)} == {"add": {"reference": NOT_RUN}, "neg": {"reference": NOT_RUN}}
    header, backends = read_header(table)
    assert "2 not run (deadline)" in header[0] and backends == ["reference"]


class _CrashingOp:
    """An op whose sample generator ends its process: the sweep records how, and goes on."""

    name, variant_test_name = "crashes", ""

    def supported_dtypes(self, device_type):
        return {torch.float32}

    def sample_inputs(self, *args, **kwargs):
        os._exit(3)


def test_a_crashing_process_is_recorded_and_the_sweep_goes_on():
    (add,) = op_infos(["add"])
    options = opinfo_sweep.SweepOptions(("reference",), limit=1, time_cap=30.0)
    crashed, added = opinfo_sweep.sweep([_CrashingOp(), add], options, jobs=2)
    assert dict(crashed.skipped) == {"special values: the process crashed (exit code 3)": 1,
                                     "the process crashed (exit code 3)": 1}
    assert not crashed.tested and added.cell("inputs", "reference").best == "ENGINE"


def test_merging_another_backends_table_keeps_the_stored_cells(tmp_path):
    """A shard table swept on the reference backend, its column renamed as a GPU machine's would be named, merged
    into a copy of the stored table: the stored cells stay, the new backend's are added, the doc gets its columns."""
    swept, table, doc = tmp_path / "swept.tsv", tmp_path / "table.tsv", tmp_path / "coverage.md"
    assert opinfo_sweep.main(["--ops", "add", "nn.functional.relu", "--backends", "reference", "--limit", "1",
                              "--jobs", "2", "--table", str(swept), "--no-doc"]) == 0
    renamed = tmp_path / "other.tsv"
    renamed.write_text(swept.read_text().replace("\treference\t", "\tother\t").replace("reference", "other"))
    table.write_text(opinfo_sweep.TABLE.read_text())
    doc.write_text("# coverage\n")
    merge = ["--merge", str(renamed), "--table", str(table), "--doc", str(doc)]
    assert opinfo_sweep.main(merge) == 0
    stored, merged = read_table(), {r.op: r for r in read_table(table)}
    assert len(merged) == len(stored)
    for r in stored:
        cpu = {k: (c.counts, c.reasons) for k, c in merged[r.op].cells.items() if k[1] != "other"}
        assert cpu == {k: (c.counts, c.reasons) for k, c in r.cells.items()}, r.op
    for r in read_table(swept):
        assert {v: c.counts for (v, b), c in merged[r.op].cells.items() if b == "other"} == {
            v: c.counts for (v, _), c in r.cells.items()}
    header, backends = read_header(table)
    assert backends == [*read_header()[1], "other"]
    assert header[0].startswith(read_header()[0][0]) and "; other: torch" in header[0]
    fraction = format_fraction(list(merged.values()))
    assert fraction.startswith(format_fraction(stored).split(";")[0]) and "; on other: 2/2 (100.0%)" in fraction
    text = doc.read_text()
    assert "| special ref | special ort |" in text and "| special other | worst reason |" in text
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:] for line in text.splitlines() if line.startswith("| ")}
    columns = rows["op"]
    assert [rows["add"][columns.index(f"{v} other")] for v in ("inputs", "constants", "special")] == \
        ["ENGINE 1", "ENGINE 1", "ENGINE 2"]  # the other backend's columns
    assert rows["item"][-1].startswith("not compiled: untraceable: RuntimeError x")  # the stored reasons' counts
    before = table.read_text()
    assert opinfo_sweep.main(merge) == 0 and table.read_text() == before  # merging again changes nothing


def test_spawned_processes_sweep_as_forked_ones(monkeypatch):
    """Where a GPU is unusable in a forked process the ops' processes are spawned: the same results."""
    ops, options = op_infos(["neg"]), opinfo_sweep.SweepOptions(("reference",), limit=1, time_cap=60.0)
    (forked,) = opinfo_sweep.sweep(ops, options)
    monkeypatch.setattr(opinfo_sweep, "start_method", lambda backends: "spawn")
    (spawned,) = opinfo_sweep.sweep(ops, options)
    assert spawned.tested and spawned == forked


def test_a_shard_that_did_not_run_an_op_leaves_another_shards_result():
    base = OpResult("a")
    base.cell("inputs", "reference").add(Outcome("ENGINE"))
    ran, not_run, skipped = OpResult("a"), OpResult("a", notes={"cuda": NOT_RUN}), OpResult("b")
    ran.cell("inputs", "cuda").add(Outcome("WRONG", "output: max abs error 1 > 0.0001 x max|eager| 2"))
    skipped.skipped["random"] += 2
    for shards in ([[ran], [not_run, skipped]], [[not_run, skipped], [ran]]):
        a, b = merge([base], shards, ["cuda"])
        assert a.cells == {**base.cells, **ran.cells} and not a.notes
        assert b.notes == {"cuda": "not compiled: random x2"} and not b.cells


def test_an_op_cut_short_by_its_time_cap_is_noted():
    (info,) = op_infos(["add"])
    result = run_op(info, ["reference"], time_cap=0.0)
    assert not result.tested and result.notes == {"reference": "time cap: no sample after 0 s"}


def test_a_trace_returning_an_unwritten_allocation_is_left_out():
    """A kernel the tracer cannot see (torch.cuda.jiterator's launch) leaves its output's allocation in the trace:
    its values are whatever memory comes back, so the case is not compared (the cuda sweep counted such cases
    WRONG). An allocation the graph writes in place is a value, and kept."""
    from torchkiln.coverage.opinfo import returns_uninitialized

    class Unwritten(torch.nn.Module):
        def forward(self, x):
            return x + 1, torch.empty_like(x)

    class Written(torch.nn.Module):
        def forward(self, x):
            return torch.empty_like(x).fill_(2.0) * x

    x = torch.randn(3, 4)
    assert returns_uninitialized(torch.jit.trace(Unwritten(), x).inlined_graph)
    assert not returns_uninitialized(torch.jit.trace(Written(), x).inlined_graph)
    assert not returns_uninitialized(torch.jit.trace(torch.nn.ReLU(), x).inlined_graph)


def test_special_values_eager_rejects_are_found_on_the_cpu_first():
    """On a GPU, eager checks an index with a device-side assert that ends the process (a sticky CUDA error), so a
    special-values case meant for another device runs on the CPU first, where eager raises instead."""
    from torchkiln.coverage.opinfo import Case, _Call, _tensor_leaves, _trace, rejected_on_the_cpu

    def case(x, index, label="empty"):
        leaves, spec, slots = _tensor_leaves((x, (0, index), {}))
        return Case("special", _Call(torch.index_select, leaves, spec, slots), (x, index), label)

    index, gpu = torch.tensor([0, 2]), torch.device("meta")  # (meta: a device other than the CPU; no copy is made)
    empty = case(torch.empty(0, 4), index)  # no row 2
    assert rejected_on_the_cpu(empty, gpu) == "eager raises RuntimeError on the CPU"
    assert rejected_on_the_cpu(case(torch.randn(3, 4), index), gpu) is None
    assert rejected_on_the_cpu(empty, torch.device("cpu")) is None  # the CPU run itself raises: "eager raises"
    assert rejected_on_the_cpu(case(torch.empty(0, 4), index, label=""), gpu) is None  # samples as op_db gives them
    mixed = case(torch.randn(3, 4), index.to("meta"))
    assert _trace(mixed)[2] == "inputs on several devices (an engine's inputs are on the compile's device)"
