"""Which GPU kernels each step of a torchkiln engine launches, for zoo models on the cuda backend: the ATen work a
library or generated step hides (a copy, a bias add ATen's linear makes for an input it cannot view as a matrix)
and what the ATen steps launch. The engine's steps run one by one (runtime.profile.StepProfiler, which records an
event after each) under torch.profiler; a launch between two of those events belongs to the step between them.

    PYTHONPATH=src python scripts/step_kernels.py maxvit_t:32 swin_t-224:32 [--all] [--top 14]

Per engine it prints its kernel time (steps one by one, so more than a replayed graph's), then the steps whose
launches include an ATen kernel (`at::native`), a copy or a memset, and every ATen step that launches anything,
grouped by step kind and layer name, largest first (`--all`: every step's kernels). fp16; random weights made
meaningful as `bench --zoo` makes them.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import tempfile

import torch

from torchkiln.bench.compare import build_peer, case_inputs, load_models
from torchkiln.examples.zoo import find_zoo_model
from torchkiln.runtime.profile import StepProfiler

ATEN_MARKS = ("at::native", "Memcpy", "Memset")
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def launches_by_step(trace_path: str) -> list[list[tuple[str, float]]]:
    """The trace's GPU work (name, us) in groups: one per gap between two event records, in launch order."""
    with open(trace_path) as f:
        events = json.load(f)["traceEvents"]
    gpu = {e["args"].get("correlation"): e for e in events if e.get("cat") in GPU_CATEGORIES}
    calls = sorted((e for e in events if e.get("cat") in RUNTIME_CATEGORIES), key=lambda e: e["ts"])
    groups: list[list[tuple[str, float]]] = [[]]
    for call in calls:
        if "EventRecord" in call["name"]:
            groups.append([])
        elif call["args"].get("correlation") in gpu:
            kernel = gpu[call["args"]["correlation"]]
            groups[-1].append((kernel["name"], float(kernel.get("dur", 0))))
    return groups


def short(kernel: str) -> str:
    """A kernel's name without its template arguments' bulk: ATen's functor kept (what the kernel computes)."""
    head = kernel.split("<")[0][:40]
    functor = next((part for part in kernel.split("<") if "Functor" in part or "copy_kernel" in part), "")
    return f"{head}<{functor.split('(')[0][:40]}>" if functor else head


def profile(spec: str, show_all: bool, top: int) -> None:
    name, batch = spec.split(":") if ":" in spec else (spec, "1")
    zoo_model, device = find_zoo_model(name), torch.device("cuda")
    models = load_models(zoo_model, device, torch.half)
    inputs, reference = case_inputs(zoo_model, models, int(batch), device, torch.half)
    row, run = build_peer("torchkiln", models[torch.half], inputs, torch.half, reference)
    print(f"== {spec}: " + ", ".join(f"{k} {row[k]}" for k in ("build_s", "cosine", "blocks", "reason") if k in row))
    if run is None:
        return
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with StepProfiler() as steps:
        run()
        run()  # the first call of each engine is the profiler's warm-up
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=activities) as prof:
            run()
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        groups = launches_by_step(path)
    start = 1  # the group before the first event is the call's own work before its steps
    for engine in steps.profiles():
        table = engine.to_json()["steps"]
        mine, start = groups[start:start + len(table)], start + len(table) + 1
        total = sum(us for group in mine for _, us in group)
        print(f"-- engine {engine.to_json().get('engine', '')}: {len(table)} steps, {total:.0f} us of kernels")
        found: dict[tuple[str, str, tuple[str, ...]], list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for step, launched in zip(table, mine):
            aten = step["kind"].startswith("aten")
            shown = launched if (aten or show_all) else [k for k in launched if any(m in k[0] for m in ATEN_MARKS)]
            if shown:
                entry = found[(step["kind"], step["name"][:70], tuple(short(k) for k, _ in shown))]
                entry[0] += 1
                entry[1] += sum(us for _, us in shown)
        for (kind, layer, kernels), (count, us) in sorted(found.items(), key=lambda kv: -kv[1][1])[:top]:
            print(f"  {us:8.1f} us {count:3d}x {kind:26s} {layer} {list(kernels)[:4]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="zoo model names, each with :BATCH (default 1)")
    parser.add_argument("--all", action="store_true", help="every step's kernels, not only the ATen ones")
    parser.add_argument("--top", type=int, default=14, help="rows per engine")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a GPU: the cuda backend's steps launch CUDA kernels")
    for spec in args.models:
        profile(spec, args.all, args.top)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
