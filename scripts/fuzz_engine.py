"""A long fuzzing run of engine loading: the cases of tests/test_engine_fuzz.py, many more of them.

    PYTHONPATH=src python scripts/fuzz_engine.py --cases 10000 --seed 0 [--jobs 8]
    PYTHONPATH=src python scripts/fuzz_engine.py --seed 0 --replay 4711    # one case again, verbosely

Case i draws from its own generator, seeded by (seed, i), so any case replays alone and cases spread over
processes. Prints how many cases loaded (and ran), how many raised EngineFormatError (by category), how
many did anything else (failures, each printed), the slowest case and the memory growth of the worst
process. Exits non-zero when any case failed.
"""
from __future__ import annotations

import argparse
import collections
import multiprocessing
import os
import random
import re
import resource
import sys
import time
import tracemalloc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from test_engine_fuzz import fuzz_case, run_case, seed_engines  # noqa: E402

# EngineFormatError messages grouped by what was wrong (first match wins).
CATEGORIES = [
    ("checksum mismatch", "checksum"),
    ("truncated|padded|shorter than any engine", "truncated or padded"),
    ("bad magic|format version", "header"),
    ("section|sections", "section table"),
    ("not valid JSON|must be a JSON object", "not JSON or not an object"),
    ("nested too deeply", "nested too deeply"),
    ("integer of", "integer too long"),
    ("not valid safetensors", "weights not safetensors"),
    ("plans .* bytes", "memory ceiling"),
    ("FLOPs per call", "compute ceiling"),
    ("graph of .* bytes|metadata and plans of", "JSON section too large"),
    ("entries, over the limit|a list of .* entries", "list too long"),
    ("unknown layer kind", "unknown layer kind"),
    ("is not defined|not defined before|defined twice|used twice|listed twice", "tensor references"),
    ("missing or malformed field|bad tensor name|bad layer name|malformed", "missing or malformed field"),
    ("unknown or missing|missing weights|unknown weights", "weights"),
    ("parameter|unknown parameters", "parameter type"),
    ("binding|bindings|metadata", "bindings and metadata"),
    ("rejects inputs", "shape inference rejects"),
    ("declares .* outputs|declared", "declared outputs differ"),
    ("is not a shape|is not a dtype", "shape or dtype"),
    ("layer '", "layer validation"),
]


def categorize(message: str) -> str:
    for pattern, name in CATEGORIES:
        if re.search(pattern, message):
            return name
    return "other"


def one_case(seed: int, case: int, measure_python: bool) -> tuple[str, str, float, int]:
    """(outcome, detail, seconds, Python allocation peak in bytes or 0) of case `case`."""
    rng = random.Random(f"{seed}-{case}")
    data = fuzz_case(lambda n: rng.randrange(n) if n > 0 else 0)
    if measure_python:
        tracemalloc.start()
    start = time.perf_counter()
    outcome, detail = run_case(data)
    elapsed = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] if measure_python else 0
    if measure_python:
        tracemalloc.stop()
    return outcome, detail, elapsed, peak


def shard(seed: int, cases: range, measure_python: bool) -> tuple[list, float]:
    """Run some cases in this process; returns their results and this process' peak RSS growth (MiB)."""
    for data in seed_engines():  # warm up: the first meta-tensor call imports parts of torch
        run_case(data)
    start_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results = [(case, *one_case(seed, case, measure_python)) for case in cases]
    return results, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start_rss) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1, help="processes to spread the cases over")
    parser.add_argument("--replay", type=int, default=None, help="run only this case and print its outcome")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="also measure Python allocations per case (slower)")
    args = parser.parse_args()

    if args.replay is not None:
        outcome, detail, elapsed, _ = one_case(args.seed, args.replay, False)
        print(f"case {args.replay}: {outcome} in {elapsed * 1000:.0f} ms\n{detail}")
        return 1 if outcome == "FAILURE" else 0

    started = time.perf_counter()
    shards = [range(j, args.cases, args.jobs) for j in range(args.jobs)]
    if args.jobs == 1:
        done = [shard(args.seed, shards[0], args.tracemalloc)]
    else:
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            done = pool.starmap(shard, [(args.seed, s, args.tracemalloc) for s in shards])
    total = time.perf_counter() - started

    counts: collections.Counter[str] = collections.Counter()
    formats: collections.Counter[str] = collections.Counter()
    failures = 0
    slowest, peak_py = (0.0, -1), 0
    for results, _ in done:
        for case, outcome, detail, elapsed, peak in results:
            counts[outcome] += 1
            slowest, peak_py = max(slowest, (elapsed, case)), max(peak_py, peak)
            if outcome == "format-error":
                formats[categorize(detail)] += 1
            elif outcome == "FAILURE":
                failures += 1
                print(f"case {case} FAILED:\n{detail}", flush=True)
    print(f"{args.cases} cases, seed {args.seed}, {args.jobs} processes, {total:.1f} s")
    for outcome in ("loaded", "run-input-error", "format-error", "FAILURE"):
        print(f"  {outcome:16} {counts[outcome]}")
    for name, n in formats.most_common():
        print(f"      EngineFormatError: {name:28} {n}")
    print(f"slowest case: {slowest[0] * 1000:.0f} ms (case {slowest[1]})")
    print(f"largest peak RSS growth of one process: {max(grown for _, grown in done):.0f} MiB")
    if args.tracemalloc:
        print(f"largest Python allocation peak of one case: {peak_py / 2 ** 20:.1f} MiB")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
