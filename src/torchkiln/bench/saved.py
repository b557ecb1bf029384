"""trtexec-style benchmark of one saved TorchScript module (`python -m torchkiln bench MODEL.ts --shape ...`).

A module compiled by torchkiln is run as it is; a plain one is compiled first for the given input specs (its
build time is reported). Random inputs of the specs (at their opt shape) go through `iters` timed calls after
`warmup` untimed ones: latency p50/p90/p99, mean, min, max and throughput. `profile` adds, like trtexec's
--dumpProfile, each engine's steps (a layer, an ONNX Runtime node or a fused kernel) with their time per call
(runtime/profile.py: the steps run one by one, each timed), a per-op table from torch.profiler (aggregated by op
name or record_function label, top entries by self time: what runs outside the engines too), and on a GPU the time
per call by kernel class (kernel_classes.py).
"""
from __future__ import annotations

import os
import time
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.bench.kernel_classes import by_class, format_classes
from torchkiln.bench.timing import summarize, synchronize, time_calls
from torchkiln.compiler import compile as torchkiln_compile
from torchkiln.input_spec import parse_input_spec
from torchkiln.runtime.profile import StepProfiler, format_profile
from torchkiln.settings import ENGINE_PRECISIONS, Input
from torchkiln.stitching.module import load
from torchkiln.stitching.stitch import engine_attrs


class BenchInputError(ValueError):
    """What the user gave cannot be benchmarked (no such file, a bad input spec, not a TorchScript module)."""


def _engines(module: torch.jit.ScriptModule) -> int:
    """How many torchkiln engines a (compiled) module holds."""
    return len(engine_attrs(module))


def _specs(shapes: Sequence[str]) -> list[Input]:
    if not shapes:
        raise BenchInputError("give the module's inputs with --shape, one per input, e.g. --shape '(1,3,224,224)@f32'")
    try:
        return [parse_input_spec(s) for s in shapes]
    except ValueError as e:
        raise BenchInputError(str(e)) from None


def profile_calls(fn: Any, device: torch.device, iters: int, top: int
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Time per op name (or record_function label) over `iters` calls: on a GPU the device time of the kernels each
    op launched ("op" rows) and of each kernel ("kernel" rows), on the CPU the op's own CPU time; with calls, total,
    per call and share of its kind's total; the `top` largest of each kind. Also every kernel row (for
    kernel_classes.by_class)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(iters):
                fn()
            synchronize(device)
        events = prof.key_averages()
    rows: dict[str, list[dict[str, Any]]] = {"op": [], "kernel": []}
    for event in events:
        kind = "kernel" if event.device_type != torch.autograd.DeviceType.CPU else "op"
        us = event.self_cpu_time_total if device.type == "cpu" else \
            getattr(event, "self_device_time_total", getattr(event, "self_cuda_time_total", 0))
        if us > 0:
            rows[kind].append({"kind": kind, "name": event.key, "calls": event.count, "total_ms": us / 1e3})
    table = []
    for kind_rows in rows.values():
        total = sum(r["total_ms"] for r in kind_rows) or 1.0
        kind_rows.sort(key=lambda r: -r["total_ms"])
        for r in kind_rows[:top]:
            r.update(ms_per_iter=r["total_ms"] / iters, percent=100 * r["total_ms"] / total)
            table.append(r)
    return table, rows["kernel"]


def run_saved(path: str, shapes: Sequence[str], device: str | torch.device = "cpu", iters: int = 100,
              warmup: int = 10, precision: torch.dtype = torch.float32, profile: bool = False,
              profile_iters: int = 10, profile_top: int = 25) -> dict[str, Any]:
    """Latency, throughput and build time of the saved module at `path` on inputs of `shapes` (input spec strings,
    see torchkiln.input_spec); BenchInputError for what the user gave wrong."""
    if iters < 1 or warmup < 0:
        raise BenchInputError(f"need --iters >= 1 and --warmup >= 0, got {iters} and {warmup}")
    if precision not in ENGINE_PRECISIONS:
        raise BenchInputError(f"precision {precision} is not an engine precision; use one of {ENGINE_PRECISIONS}")
    if not os.path.isfile(path):
        raise BenchInputError(f"{path}: no such file")
    specs = _specs(shapes)
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BenchInputError("--device cuda was asked for but CUDA is not available here")
    start = time.perf_counter()
    try:
        module = load(path, map_location=dev)
    except Exception as e:
        raise BenchInputError(f"{path}: cannot be loaded as a TorchScript module ({type(e).__name__}: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''})") from None
    result: dict[str, Any] = {"model": path, "device": str(dev), "inputs": [repr(s) for s in specs],
                              "load_s": time.perf_counter() - start, "iters": iters, "warmup": warmup}
    engines = _engines(module)
    result["compiled_by_bench"] = engines == 0
    if engines == 0:  # a plain module: compile it first
        start = time.perf_counter()
        module = torchkiln_compile(module, inputs=specs, enabled_precisions={precision}, device=dev)
        result["build_s"] = time.perf_counter() - start
        result["precision"] = str(precision).removeprefix("torch.")
        engines = _engines(module)
    else:
        result["build_s"] = None  # built when it was compiled and saved
    result["engines"] = engines
    torch.manual_seed(0)
    inputs = [spec.example(dev) for spec in specs]  # random floats and bools, ones for integers (safe as indices)

    def call() -> Any:
        return module(*inputs)

    with torch.no_grad():
        times = time_calls(call, dev, iters, warmup)
        latency = summarize(times)
        batch = inputs[0].shape[0] if inputs[0].dim() else 1
        result.update(latency_ms=latency, batch=batch, throughput_qps=1e3 / latency["mean"],
                      throughput_items_per_s=batch * 1e3 / latency["mean"])
        if profile:
            result["profile"], kernels = profile_calls(call, dev, profile_iters, profile_top)
            result["profile_iters"] = profile_iters
            result["step_profile"] = profile_steps(call, dev, profile_iters)
            if dev.type == "cuda":
                result["kernel_classes"] = by_class(kernels, profile_iters, latency["p50"])
    return result


def profile_steps(fn: Any, device: torch.device, iters: int) -> list[dict[str, Any]]:
    """Each engine's step table (runtime/profile.py) over `iters` calls of `fn`, after one profiled warm-up call
    (which makes the profiled sessions and compiles kernels)."""
    with StepProfiler(warmup=1) as profiler:
        for _ in range(iters + 1):
            fn()
        synchronize(device)
    return [p.to_json() for p in profiler.profiles()]


def format_report(result: dict[str, Any], sort: str = "order") -> str:
    """The report as text; `sort` orders the step tables: "order" (the engine's) or "time" (slowest first)."""
    lat = result["latency_ms"]
    build = f"{result['build_s']:.2f} s (compiled here, {result['precision']})" if result["compiled_by_bench"] \
        else "- (a torchkiln-compiled module)"
    lines = [f"model: {result['model']} ({result['engines']} engine(s)) on {result['device']}",
             f"inputs: {', '.join(result['inputs'])}",
             f"load: {result['load_s']:.2f} s   build: {build}",
             f"latency over {result['iters']} calls after {result['warmup']} warm-up: p50 {lat['p50']:.3f} ms, "
             f"p90 {lat['p90']:.3f} ms, p99 {lat['p99']:.3f} ms, mean {lat['mean']:.3f} ms, "
             f"min {lat['min']:.3f} ms, max {lat['max']:.3f} ms",
             f"throughput: {result['throughput_qps']:.1f} qps, {result['throughput_items_per_s']:.1f} items/s "
             f"(batch {result['batch']})"]
    for profile in result.get("step_profile", []):
        lines += ["", format_profile(profile, sort)]
    if "kernel_classes" in result:
        lines += ["", "time per call by kernel class: " + format_classes(result["kernel_classes"])]
    if "profile" in result:
        what = "device time" if result["device"].startswith("cuda") else "CPU time"
        for kind in ("op", "kernel"):
            rows = [r for r in result["profile"] if r["kind"] == kind]
            if rows:
                lines += ["", f"profile: {what} per {kind} over {result['profile_iters']} calls (top {len(rows)})",
                          f"{kind:60} {'calls':>7} {'total ms':>10} {'ms/iter':>9} {'%':>6}"]
                lines += [f"{r['name'][:60]:60} {r['calls']:7d} {r['total_ms']:10.3f} {r['ms_per_iter']:9.4f} "
                          f"{r['percent']:6.1f}" for r in rows]
    return "\n".join(lines)
