"""The full OpInfo conformance sweep (torchkiln.coverage.opinfo): every op of PyTorch's op_db with float32 samples,
each variant, each backend. Writes the stored table (src/torchkiln/coverage/opinfo_table.tsv, read by
`python -m torchkiln coverage`) and the table section of docs/coverage.md.

    python scripts/opinfo_sweep.py [--ops add sum ...] [--limit 10] [--time-cap 60] [--backends reference onnxruntime]

`--backends cuda` adds the cuda backend on a machine with a GPU (compile refuses it on a CPU-only machine).
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from torchkiln.coverage import opinfo  # noqa: E402

logger = logging.getLogger("opinfo_sweep")
DOC = ROOT / "docs" / "coverage.md"
BEGIN, END = "<!-- opinfo table: begin (scripts/opinfo_sweep.py) -->", "<!-- opinfo table: end -->"


def run_isolated(info: object, args: argparse.Namespace, variants: Sequence[str] = opinfo.VARIANTS
                 ) -> opinfo.OpResult | None:
    """run_op in a forked process, killed after twice the time cap (eager itself can crash on special values:
    linalg.eigvals of NaN in MKL); None if it did not finish."""
    receive, send = multiprocessing.Pipe(duplex=False)

    def child() -> None:
        result = opinfo.OpResult(opinfo.op_name(info))
        try:
            opinfo.run_op(info, args.backends, variants, limit=args.limit, time_cap=args.time_cap, result=result)
        except Exception as e:  # noqa: BLE001 - an op_db sample generator failing: record it, go on
            result.skipped[f"sample generation: {type(e).__name__}"] += 1
        send.send(result)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    send.close()  # the child's end only: its exit closes the pipe
    result = None
    if receive.poll(2 * args.time_cap):
        with contextlib.suppress(EOFError):
            result = receive.recv()
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join()
    if result is None:
        logger.warning("%s: %s", opinfo.op_name(info), "timed out" if process.exitcode in (None, -9)
                       else f"crashed ({process.exitcode})")
    return result


def run_op(info: object, args: argparse.Namespace) -> opinfo.OpResult:
    """run_isolated, again without special values if it did not finish."""
    result = run_isolated(info, args)
    if result is None:
        result = run_isolated(info, args, ("inputs", "constants")) or opinfo.OpResult(opinfo.op_name(info))
        result.skipped["special values crash or hang the process"] += 1
    return result


def _cell(cell: opinfo.CellResult | None) -> str:
    return cell.summary() if cell is not None and cell.counts else "-"


def _reason(result: opinfo.OpResult, backends: Sequence[str]) -> str:
    """The reason of the worst non-ENGINE cell (WRONG first), shortened for the table."""
    for status in reversed(opinfo.STATUSES[1:]):
        for variant in opinfo.VARIANTS:
            for backend in backends:
                cell = result.cells.get((variant, backend))
                if cell is not None and cell.counts[status]:
                    text = f"{variant}/{backend}: {cell.reasons.get(status, '')}"
                    return text.replace("|", "\\|").replace("\n", " ")[:160]
    return ""


def markdown(results: Sequence[opinfo.OpResult], backends: Sequence[str], header: str) -> str:
    """The docs table: one row per op, a column per (variant, backend), and the worst reason."""
    columns = [(v, b) for v in opinfo.VARIANTS for b in backends]
    short = {"reference": "ref", "onnxruntime": "ort", "cuda": "cuda"}
    lines = [BEGIN, "", header, "",
             "| op | " + " | ".join(f"{v} {short.get(b, b)}" for v, b in columns) + " | worst reason |",
             "|---|" + "---|" * len(columns) + "---|"]
    for r in results:
        if r.tested:
            cells = " | ".join(_cell(r.cells.get(c)) for c in columns)
            lines.append(f"| {r.op} | {cells} | {_reason(r, backends)} |")
        else:
            why = ", ".join(f"{k} x{n}" for k, n in r.skipped.most_common(2)) or "no float32 samples"
            lines.append(f"| {r.op} | " + " | ".join("-" for _ in columns) + f" | not compiled: {why} |")
    lines += ["", END]
    return "\n".join(lines)


def write_doc(text: str) -> None:
    doc = DOC.read_text()
    if BEGIN in doc:
        head, _, rest = doc.partition(BEGIN)
        doc = head + text + rest.partition(END)[2]
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    DOC.write_text(doc)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", nargs="*", help="OpInfo names (default: all with float32 samples)")
    parser.add_argument("--limit", type=int, default=10, help="samples per op and variant (special: per kind)")
    parser.add_argument("--time-cap", type=float, default=60.0, help="seconds per op; no new sample after it")
    parser.add_argument("--backends", nargs="*", default=list(opinfo.BACKENDS))
    parser.add_argument("--table", default=str(ROOT / "src" / "torchkiln" / "coverage" / opinfo.TABLE_FILE))
    parser.add_argument("--no-doc", action="store_true", help="do not rewrite docs/coverage.md's table")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    warnings.filterwarnings("ignore")
    logging.getLogger("torchkiln").setLevel(logging.ERROR)
    torch.set_num_threads(1)

    results = []
    start = time.perf_counter()
    infos = opinfo.op_infos(args.ops)
    for i, info in enumerate(infos):
        t = time.perf_counter()
        result = run_op(info, args)
        results.append(result)
        worst = {c.worst for c in result.cells.values()}
        logger.info("[%d/%d] %s %.1fs %s%s", i + 1, len(infos), result.op, time.perf_counter() - t,
                    "ENGINE" if result.engine else "no engine", " WRONG" * ("WRONG" in worst)
                    + " ERROR" * ("ERROR" in worst))

    header = (f"torch {torch.__version__}, {len(infos)} OpInfo ops with float32 samples, up to {args.limit} samples "
              f"per op and variant, {time.perf_counter() - start:.0f} s")
    opinfo.write_table(results, args.table, [header])
    fraction = opinfo.format_fraction(results)
    logger.info(fraction)
    if not args.no_doc:
        write_doc(markdown(results, args.backends, f"{fraction}.\n{header}."))
    for status in ("WRONG", "ERROR"):
        for backend in args.backends:
            bad = [r.op for r in results if any(c.counts[status] for (v, b), c in r.cells.items() if b == backend)]
            logger.info("%s on %s: %d ops: %s", status, backend, len(bad), " ".join(bad))
    return 0


if __name__ == "__main__":
    sys.exit(main())
