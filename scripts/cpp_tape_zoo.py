"""Zoo models in the C++ runtime, on a GPU: each model compiled in fp16 (the cuda backend records a tape), saved, run
by examples/cpp's run_module with no Python in its process, and compared with the Python runtime: whether the
outputs are identical, and the median per-call latency of each (wall time between device synchronizations, and the
time between CUDA events recorded before and after the call). A row also counts its tape's chained launches
(`chained_launches`: those marked "pdl" of all in tape 0's body).

    PYTHONPATH=src python scripts/cpp_tape_zoo.py --run-module build/cpp-test/example/run_module --work /tmp/w \
        --batch 1 --models efficientnet_b0,swin_t-224            (default models: the wide zoo)
        [--dynamic-batch 8]                                       (engines of a dynamic batch, called at --batch)

Build run_module first (docs/deployment.md). A model that fails to compile or run is reported and skipped.
"""
import argparse
import json
import logging
import os
import pathlib
import subprocess
import sys
import time

import torch

import torchkiln
from cpp_cuda_check import _engine, _event_ms, _median_ms
from torchkiln.examples.zoo import WIDE, find_zoo_model, load_zoo_model
from torchkiln.runtime import tape_format

LOG = logging.getLogger("cpp_tape_zoo")


def _tensors(value: object) -> list[torch.Tensor]:
    """The tensors of a module's output, in order (tuples, lists and dicts by key order)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    return [t for item in value for t in _tensors(item)] if isinstance(value, (list, tuple)) else []


def time_saved(stem: str, runs: int) -> None:
    """In a process of its own: the saved module loaded and timed on its saved inputs (median ms, printed as JSON),
    its outputs saved beside it (`{stem}.{mode}.pt`, the mode by whether the C++ runtime library hosts its calls)."""
    from torchkiln.runtime.execute_op import HOSTED

    module = torchkiln.load(f"{stem}.pt")
    inputs = [x.cuda() for x in torch.load(f"{stem}.inputs.pt")]
    with torch.no_grad():
        outputs = _tensors(module(*inputs))
        ms = _median_ms(lambda: module(*inputs), "cuda", runs)
    mode = "hosted" if HOSTED else "python"
    torch.save([t.cpu() for t in outputs], f"{stem}.{mode}.pt")
    print(json.dumps({"mode": mode, "ms": round(ms, 3)}))


def in_python(stem: pathlib.Path, runs: int, library: str, hosted: bool) -> dict:
    """`time_saved` in a fresh Python process, the C++ runtime library hosting its calls or not."""
    env = {**os.environ, "TORCHKILN_RUNTIME_LIBRARY": library, "TORCHKILN_NATIVE_RUNTIME": "1" if hosted else "0",
           "TORCHKILN_TAPE_LOG": "1"}
    done = subprocess.run([sys.executable, __file__, "--time-saved", str(stem), "--runs", str(runs)],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "failed"}
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "ran_tape": "runs tape" in done.stderr}


def check(name: str, batch: int, work: pathlib.Path, run_module: str, runs: int, library: str = "",
          dynamic_batch: int = 0) -> dict:
    """One model: compile (with a batch dim of 1 to `dynamic_batch` where that is set), time in Python, run and time
    in C++, compare."""
    model_def = find_zoo_model(name)
    batch = min(batch, model_def.max_batch or batch)
    model = load_zoo_model(model_def, "cuda").half()
    inputs = [x.cuda().half() if x.is_floating_point() else x.cuda() for x in model_def.inputs(batch)]
    specs = [torchkiln.Input(min_shape=(1, *x.shape[1:]), opt_shape=tuple(x.shape),
                             max_shape=(max(dynamic_batch, batch), *x.shape[1:]), dtype=x.dtype)
             for x in inputs] if dynamic_batch else inputs
    start = time.perf_counter()
    compiled = torchkiln.compile(model, inputs=specs, enabled_precisions={torch.half})
    tapes = _engine(compiled).tapes if compiled._c.hasattr("_torchkiln_engine_0") else []
    row = {"model": name, "batch": batch, "compile_s": round(time.perf_counter() - start, 1), "tapes": len(tapes)}
    if tapes:  # tape 0's body: its launches chained (programmatic dependent, "pdl") of all its launches
        body = tape_format.decode(tapes[0], "tape")[0]["body"]
        row["chained_launches"] = f"{sum(bool(i.get('pdl')) for i in body)}/{sum('launch' in i for i in body)}"
    with torch.no_grad():
        want = _tensors(compiled(*inputs))
        row["python_ms"] = round(_median_ms(lambda: compiled(*inputs), "cuda", runs), 3)
        row["python_event_ms"] = round(_event_ms(lambda: compiled(*inputs), runs), 3)
    stem = work / f"{name}-b{batch}"
    torch.jit.save(compiled, f"{stem}.pt")
    torch.save(tuple(x.cpu() for x in inputs), f"{stem}.inputs.pt")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"TORCHKILN_TAPE_LOG": "1"}
    start = time.perf_counter()
    done = subprocess.run([run_module, "--device", "cuda", "--runs", str(runs), f"{stem}.pt", f"{stem}.inputs.pt",
                           f"{stem}.cpp.pt"], capture_output=True, text=True, env=env, timeout=600)
    row["cpp_process_s"] = round(time.perf_counter() - start, 2)
    if done.returncode != 0:
        row["error"] = done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "failed"
        return row
    words = done.stdout.split()
    row["cpp_ms"] = round(float(words[words.index("latency_ms_median") + 1]), 3)
    row["cpp_event_ms"] = round(float(words[words.index("event_ms_median") + 1]), 3)
    row["ran_tape"] = "runs tape" in done.stderr
    got = _tensors(torch.load(f"{stem}.cpp.pt", weights_only=False))
    row["identical"] = len(got) == len(want) and all(torch.equal(g, w.cpu()) for g, w in zip(got, want))
    row["max_abs_diff"] = max(((g.double() - w.cpu().double()).abs().max().item() for g, w in zip(got, want)
                               if g.shape == w.shape), default=float("nan"))
    row["cpp_over_python"] = round(row["cpp_ms"] / row["python_ms"], 3)
    if library:  # one runtime: a Python process with the library (its kernel runs what a tape fits) and without
        python, hosted = in_python(stem, runs, library, False), in_python(stem, runs, library, True)
        row["python_process"], row["hosted_process"] = python, hosted
        if "ms" in python and "ms" in hosted:
            row["hosted_over_python"] = round(hosted["ms"] / python["ms"], 3)
            row["hosted_identical"] = all(torch.equal(a, b) for a, b in zip(
                torch.load(f"{stem}.python.pt"), torch.load(f"{stem}.hosted.pt")))
    for path in work.glob(f"{stem.name}.*"):
        path.unlink()
    return row


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-module", help="examples/cpp's run_module, built")
    parser.add_argument("--library", default="", help="libtorchkiln_runtime.so: also time each module in a Python "
                        "process that it hosts, and in one without it")
    parser.add_argument("--time-saved", help=argparse.SUPPRESS)
    parser.add_argument("--work", type=pathlib.Path)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--models", default=",".join(WIDE))
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--dynamic-batch", type=int, default=0, metavar="MAX",
                        help="compile with a dynamic batch of 1 to MAX (the call at --batch then runs one of the "
                             "engine's tapes at other shapes: docs/tape_format.md); 0: static shapes")
    parser.add_argument("--deadline", type=float, default=0, help="seconds after which no new model starts; 0: none")
    args = parser.parse_args()
    if args.time_saved:
        return time_saved(args.time_saved, args.runs)
    if not (args.run_module and args.work):
        parser.error("--run-module and --work are needed")
    args.work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    for name in args.models.split(","):
        if args.deadline and time.perf_counter() - start > args.deadline:
            print(json.dumps({"model": name, "skipped": "deadline"}), flush=True)
            continue
        try:
            row = check(name, args.batch, args.work, args.run_module, args.runs, args.library, args.dynamic_batch)
        except Exception as e:  # one model's failure is its row
            row = {"model": name, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
