"""The full OpInfo sweep behind scripts/opinfo_sweep.py: each op in a process of its own (eager itself crashes on
some special values, a CUDA error spoils its process), `jobs` at a time, a shard of the ops, a deadline after which
no op starts; the stored table, docs/coverage.md's table, and merging another machine's backend column into them.

The processes are forked from this one, which never initialises CUDA (a process that did cannot fork children that
use it): torch's availability checks go through NVML (PYTORCH_NVML_BASED_CUDA_CHECK), the device's name is asked
for after the last fork, and `sweep` refuses to start when CUDA is initialised already. Where a forked process
cannot use the GPU all the same (a forked preflight says so), the processes are spawned instead.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import logging
import multiprocessing
import os
import time
import warnings
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

import torch

from torchkiln.coverage import opinfo
from torchkiln.runtime.engine import usable_cores

logger = logging.getLogger("opinfo_sweep")
DOC = Path(__file__).resolve().parents[3] / "docs" / "coverage.md"  # the source checkout's
TABLE = Path(__file__).resolve().with_name(opinfo.TABLE_FILE)
BEGIN, END = "<!-- opinfo table: begin (scripts/opinfo_sweep.py) -->", "<!-- opinfo table: end -->"
RETRY_VARIANTS = ("inputs", "constants")  # an op whose process crashed or hung runs again without special values
POLL_S = 1.0  # how often the running processes' clocks are checked
# --limit, --time-cap and --jobs where not given, by the device of the backends swept (the GPU's where any is on it):
# the CPU sweep as the stored table was made; the cuda sweep sized for two 9-minute shards on 16 cores (a compile
# there also builds Triton kernels, and each op's process initialises CUDA; docs/coverage.md gives the estimate).
DEFAULTS = {"cpu": {"limit": 10, "time_cap": 60.0, "jobs": 1}, "cuda": {"limit": 5, "time_cap": 20.0, "jobs": 0}}


@dataclasses.dataclass(frozen=True)
class SweepOptions:
    """What each op's process runs: run_op's backends, samples per variant and time cap."""

    backends: tuple[str, ...]
    limit: int
    time_cap: float


@dataclasses.dataclass
class _Job:
    """An op's running process."""

    info: Any
    variants: tuple[str, ...]
    process: Any
    receive: Connection
    started: float


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' -> (I, N): every N-th op starting at the I-th (from 0)."""
    index, _, count = text.partition("/")
    try:
        shard = int(index), int(count)
    except ValueError:
        shard = (-1, 0)
    if not 0 <= shard[0] < shard[1]:
        raise argparse.ArgumentTypeError(f"--shard takes I/N with 0 <= I < N, got {text!r}")
    return shard


def shard(items: Sequence[Any], index: int, count: int) -> list[Any]:
    return list(items[index::count])


def _quiet() -> None:
    """An op's process: torchkiln's log at errors only, no warnings, one thread."""
    warnings.filterwarnings("ignore")
    logging.getLogger("torchkiln").setLevel(logging.ERROR)
    torch.set_num_threads(1)


def _child(op: Any, options: SweepOptions, variants: tuple[str, ...], time_cap: float, send: Connection) -> None:
    """An op's process: run_op of the OpInfo (given by name to a spawned process), its result sent back."""
    _quiet()
    info = opinfo.op_infos([op])[0] if isinstance(op, str) else op
    result = opinfo.OpResult(opinfo.op_name(info))
    try:
        opinfo.run_op(info, options.backends, variants, limit=options.limit, time_cap=time_cap, result=result)
    except Exception as e:  # noqa: BLE001 - an op_db sample generator failing: record it, go on
        result.skipped[f"sample generation: {type(e).__name__}"] += 1
    send.send(result)


def _device_check(device: torch.device, send: Connection) -> None:
    send.send(opinfo.device_error(device))


def start_method(backends: Sequence[str]) -> str:
    """"fork" (fast: the ops' processes share this one's imports) where every backend is on the CPU or a forked
    process can use the backends' GPU; else "spawn" (each process imports torch and op_db again: seconds more)."""
    for device in {opinfo.backend_device(b) for b in backends} - {torch.device("cpu")}:
        receive, send = multiprocessing.Pipe(duplex=False)
        process = multiprocessing.get_context("fork").Process(target=_device_check, args=(device, send))
        process.start()
        send.close()
        try:
            error = receive.recv() if receive.poll(60) else "no answer in 60 s"
        except EOFError:
            error = "its process crashed"
        process.join(5)
        if process.is_alive():
            process.kill()
            process.join()
        if error is not None:
            logger.warning("%s is unusable in a forked process (%s): the ops' processes are spawned", device, error)
            return "spawn"
    return "fork"


def _start(info: Any, variants: tuple[str, ...], options: SweepOptions, time_cap: float, method: str) -> _Job:
    receive, send = multiprocessing.Pipe(duplex=False)
    op = info if method == "fork" else opinfo.op_name(info)  # an OpInfo does not pickle
    process = multiprocessing.get_context(method).Process(target=_child, args=(op, options, variants, time_cap, send),
                                                          daemon=True)
    process.start()
    send.close()  # the child's end only: its exit closes the pipe
    return _Job(info, variants, process, receive, time.monotonic())


def _finish(job: _Job) -> tuple[opinfo.OpResult | None, str]:
    """The job's result, or None and how its process ended (killed if still running)."""
    result = None
    if job.receive.poll():
        with contextlib.suppress(EOFError):
            result = job.receive.recv()
    job.process.join(5)
    if job.process.is_alive():
        job.process.kill()
        job.process.join()
    job.receive.close()
    how = "timed out" if job.process.exitcode in (None, -9) else f"crashed (exit code {job.process.exitcode})"
    if result is None:
        logger.warning("%s: the process %s", opinfo.op_name(job.info), how)
    return result, how


def _not_run(info: Any, backends: Sequence[str], skipped: collections.Counter) -> opinfo.OpResult:
    return opinfo.OpResult(opinfo.op_name(info), skipped=skipped, notes={b: opinfo.NOT_RUN for b in backends})


def sweep(infos: Sequence[Any], options: SweepOptions, jobs: int = 1, deadline: float | None = None
          ) -> list[opinfo.OpResult]:
    """run_op of each OpInfo in a process of its own (start_method's), `jobs` at a time, in the order given;
    results in that order.

    A process is killed after twice the time cap; the op then runs again without special values. No op starts
    after `deadline` seconds (those are noted NOT_RUN) and a running op takes no new sample after it."""
    start = time.monotonic()
    gpu = {opinfo.backend_device(b) for b in options.backends} != {torch.device("cpu")}
    # importing op_db starts CUDA where there is a GPU (torch's test helpers probe cuDNN): forked children could
    # not use it then
    method = "spawn" if gpu and torch.cuda.is_initialized() else start_method(options.backends)
    pending = collections.deque((info, opinfo.VARIANTS, collections.Counter()) for info in infos)
    running: list[_Job] = []
    skipped: dict[str, collections.Counter] = {}
    done: dict[str, opinfo.OpResult] = {}
    while pending or running:
        left = None if deadline is None else deadline - (time.monotonic() - start)
        while pending and len(running) < jobs and (left is None or left > 0):
            info, variants, skipped[opinfo.op_name(info)] = pending.popleft()
            cap = options.time_cap if left is None else min(options.time_cap, left)
            running.append(_start(info, variants, options, cap, method))
        if left is not None and left <= 0:
            done.update((opinfo.op_name(i), _not_run(i, options.backends, s)) for i, _, s in pending)
            pending.clear()
        ready = wait([j.receive for j in running], timeout=POLL_S) if running else []
        now = time.monotonic()
        for job in [j for j in running if j.receive in ready or now - j.started > 2 * options.time_cap]:
            running.remove(job)
            name = opinfo.op_name(job.info)
            result, how = _finish(job)
            if result is None and job.variants != RETRY_VARIANTS:
                pending.appendleft((job.info, RETRY_VARIANTS, collections.Counter({f"special values: the process "
                                                                                    f"{how}": 1})))
                continue
            result = result or opinfo.OpResult(name, skipped=collections.Counter({f"the process {how}": 1}))
            result.skipped.update(skipped[name])
            done[name] = result
            _log_op(len(done), len(infos), result, now - job.started)
    return [done[opinfo.op_name(i)] for i in infos]


def _log_op(i: int, n: int, result: opinfo.OpResult, seconds: float) -> None:
    worst = {c.worst for c in result.cells.values()}
    notes = "".join(f" ({b}: {note})" for b, note in result.notes.items())
    logger.info("[%d/%d] %s %.1fs %s%s%s", i, n, result.op, seconds, "ENGINE" if result.engine else "no engine",
                " WRONG" * ("WRONG" in worst) + " ERROR" * ("ERROR" in worst), notes)


# The tables and the doc

def _cell(cell: opinfo.CellResult | None) -> str:
    return cell.summary() if cell is not None and cell.counts else "-"


def _reason(result: opinfo.OpResult, backends: Sequence[str]) -> str:
    """The reason of the worst non-ENGINE cell (WRONG first), then the backends' notes, shortened for the table."""
    text = ""
    for status in reversed(opinfo.STATUSES[1:]):
        for variant in opinfo.VARIANTS:
            for backend in backends:
                cell = result.cells.get((variant, backend))
                if not text and cell is not None and cell.counts[status]:
                    text = f"{variant}/{backend}: {cell.reasons.get(status, '')}"[:160]
    if not result.tested:
        why = opinfo.skipped_text(result.skipped, 2) or "no float32 samples"
        text = f"not compiled: {why}"
    notes = "; ".join(f"{b}: {note}"[:100] for b, note in result.notes.items() if b in backends)
    return "; ".join(t for t in (text, notes) if t).replace("|", "\\|").replace("\n", " ")


def markdown(results: Sequence[opinfo.OpResult], backends: Sequence[str], header: str) -> str:
    """The docs table: one row per op, a column per (variant, backend), and the worst reason."""
    columns = [(v, b) for v in opinfo.VARIANTS for b in backends]
    short = {"reference": "ref", "onnxruntime": "ort"}
    lines = [BEGIN, "", header, "",
             "| op | " + " | ".join(f"{v} {short.get(b, b)}" for v, b in columns) + " | worst reason |",
             "|---|" + "---|" * len(columns) + "---|"]
    for r in results:
        cells = " | ".join(_cell(r.cells.get(c)) for c in columns)
        lines.append(f"| {r.op} | {cells} | {_reason(r, backends)} |")
    lines += ["", END]
    return "\n".join(lines)


def write_doc(text: str, path: Path = DOC) -> None:
    doc = path.read_text()
    if BEGIN in doc:
        head, _, rest = doc.partition(BEGIN)
        doc = head + text + rest.partition(END)[2]
    else:
        doc = doc.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(doc)


def _device_names(backends: Sequence[str]) -> str:
    """' on <GPU name>' for a backend on the GPU (asked after the last fork: it initialises CUDA), else ''."""
    devices = {opinfo.backend_device(b) for b in backends} - {torch.device("cpu")}
    names = []
    for device in sorted(devices, key=str):
        try:
            names.append(torch.cuda.get_device_name(device))
        except Exception as e:  # noqa: BLE001 - the name only labels the table
            names.append(f"{device} ({type(e).__name__})")
    return f" on {', '.join(names)}" if names else ""


def _report(results: Sequence[opinfo.OpResult], backends: Sequence[str]) -> None:
    """Log the ops WRONG and ERROR on each backend, and those with a note (not run, not applicable, stopped, time
    cap)."""
    for status in ("WRONG", "ERROR"):
        for backend in backends:
            bad = [r.op for r in results if any(c.counts[status] for (_, b), c in r.cells.items() if b == backend)]
            logger.info("%s on %s: %d ops: %s", status, backend, len(bad), " ".join(bad))
    for backend in backends:
        noted = collections.defaultdict(list)
        for r in results:
            if backend in r.notes:
                noted[r.notes[backend].partition(":")[0]].append(r.op)
        for kind, ops in noted.items():
            logger.info("%s on %s: %d ops: %s", kind, backend, len(ops), " ".join(ops))
    crashed = [r.op for r in results if any("the process" in k for k in r.skipped)]
    if crashed:
        logger.info("a process crashed or hung: %d ops: %s", len(crashed), " ".join(crashed))


def _merge(args: argparse.Namespace) -> int:
    """Merge the tables of --merge into --table (the stored one) and rewrite the doc's table from the result."""
    base_header, base_backends = opinfo.read_header(args.table)
    tables = [(opinfo.read_table(p), *opinfo.read_header(p)) for p in args.merge]
    merged_backends = list(dict.fromkeys(b for _, _, backends in tables for b in backends))
    results = opinfo.merge(opinfo.read_table(args.table), [t for t, _, _ in tables], merged_backends)
    backends = list(dict.fromkeys([*base_backends, *merged_backends]))
    head = [part for part in (base_header or [""])[0].split("; ")
            if not part.startswith(tuple(f"{b}: " for b in merged_backends))]
    header = ["; ".join(head + [line for _, lines, _ in tables for line in lines])]
    opinfo.write_table(results, args.table, header, backends)
    logger.info("merged %s of %d tables into %s", " ".join(merged_backends), len(tables), args.table)
    fraction = opinfo.format_fraction(results)
    logger.info(fraction)
    if not args.no_doc:
        write_doc(markdown(results, backends, f"{fraction}.\n{header[0]}."), Path(args.doc))
    _report(results, backends)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="The OpInfo conformance sweep (scripts/opinfo_sweep.py).")
    p.add_argument("--ops", nargs="*", help="OpInfo names (default: all with float32 samples)")
    p.add_argument("--limit", type=int, help="samples per op and variant (special: per kind); default 10, on "
                   "cuda 5")
    p.add_argument("--time-cap", type=float, help="seconds per op; no new sample after it (the process is killed "
                   "after twice this); default 60, on cuda 20")
    p.add_argument("--backends", nargs="*", default=list(opinfo.BACKENDS))
    p.add_argument("--jobs", type=int, help="ops run at a time, each in a process of its own; default 1, on cuda "
                   "one per usable core")
    p.add_argument("--shard", type=parse_shard, default=(0, 1), metavar="I/N",
                   help="every N-th op starting at the I-th (from 0)")
    p.add_argument("--deadline", type=float, help="seconds after which no op starts (those left are noted "
                   "'not run') and running ops take no new sample; the table is still written")
    p.add_argument("--table", default=str(TABLE), help="the table to write (with --merge: to merge into)")
    p.add_argument("--doc", default=str(DOC), help="the markdown file whose OpInfo table is rewritten")
    p.add_argument("--no-doc", action="store_true", help="do not rewrite the doc's table")
    p.add_argument("--merge", nargs="+", metavar="FILE", help="merge these tables' backends (a GPU machine's "
                   "shards) into --table and rewrite the doc's table; no sweep")
    return p


def _header(args: argparse.Namespace, ops: int, seconds: float, not_run: int) -> str:
    """The table's header line: the CPU sweep's as the stored table has it; another backend's (a shard) prefixed
    with its name and telling its GPU, shard, time cap and jobs."""
    cpu = tuple(args.backends) == opinfo.BACKENDS
    parts = [f"{'' if cpu else ' '.join(args.backends) + ': '}torch {torch.__version__}"
             f"{_device_names(args.backends)}",
             f"{ops} OpInfo ops with float32 samples" + ("" if args.shard == (0, 1) else " (shard {}/{})".format(
                 *args.shard)),
             f"up to {args.limit} samples per op and variant"]
    parts += [] if cpu else [f"time cap {args.time_cap:g} s", f"{args.jobs} jobs"]
    parts += [f"{seconds:.0f} s"] + ([f"{not_run} not run (deadline)"] if not_run else [])
    return ", ".join(parts)


def main(argv: Sequence[str] | None = None) -> int:
    start = time.perf_counter()
    args = parser().parse_args(argv)
    devices = {opinfo.backend_device(b).type for b in args.backends}
    for name, value in DEFAULTS["cuda" if "cuda" in devices else "cpu"].items():
        if getattr(args, name) is None:
            setattr(args, name, value or usable_cores())
    if args.merge:
        return _merge(args)
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # op_db's import asks is_available: not fork-safe
    import torchkiln.compiler  # noqa: F401 - imported once here rather than in every op's process

    infos = shard(opinfo.op_infos(args.ops), *args.shard)
    options = SweepOptions(tuple(args.backends), args.limit, args.time_cap)
    deadline = None if args.deadline is None else args.deadline - (time.perf_counter() - start)  # from the start
    results = sweep(infos, options, max(args.jobs, 1), deadline)
    not_run = sum(opinfo.NOT_RUN in r.notes.values() for r in results)
    header = _header(args, len(infos), time.perf_counter() - start, not_run)
    opinfo.write_table(results, args.table, [header], args.backends)
    fraction = opinfo.format_fraction(results)
    logger.info(fraction)
    logger.info("%s: %s", args.table, header)
    if not args.no_doc:
        write_doc(markdown(results, args.backends, f"{fraction}.\n{header}."), Path(args.doc))
    _report(results, args.backends)
    return 0
