"""torchkiln against its peers on the model zoo (`python -m torchkiln bench --zoo`).

For each model and batch size, in one process, on the same inputs and precision, each peer (peers.py) is built
(wall clock of compile + first call), checked against fp32 eager (cosine similarity, max abs error; TF32 off for
the reference) and timed (median and spread of many calls after a warm-up; on the CPU all peers interleaved in
rounds on the same threads, with the load other processes put on the machine meanwhile). The "best peer" of a
case is the fastest of BEST_PEER_CANDIDATES of the device; the result holds the ratio torchkiln / best peer per
case and its geomean over the cases. A peer that fails is recorded with its one-line reason; a model that cannot
be built is skipped with its reason. A model list can be run in chunks (`zoo_models(..., chunk="K/N")`, one call
each) and their results merged (`merge_results`) into one.
"""
from __future__ import annotations

import copy
import importlib.metadata
import json
import logging
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchkiln._version import __version__
from torchkiln.bench.kernel_classes import by_class, format_classes, launches
from torchkiln.bench.peers import BEST_PEER_CANDIDATES, DEFAULT_PEERS, PEERS
from torchkiln.bench.saved import profile_calls
from torchkiln.bench.timing import geomean, load_warning, relative_spread, summarize, synchronize, time_interleaved
from torchkiln.examples.blocks import BLOCKS
from torchkiln.examples.zoo import (CPU, HOLDOUT, SOURCES, UNSEEN, UNSEEN2, WIDE, ZooModel, find_zoo_model,
                                   load_zoo_model)
from torchkiln.runtime.cpu_load import LoadMeter
from torchkiln.runtime.engine import usable_cores

logger = logging.getLogger("torchkiln.bench")

DEFAULT_MODELS = ("resnet50", "mobilenet_v2", "vit_b_16", "bert-base")
# `bench --zoo [SET]`, `--blocks`
ZOO_SETS = {"default": DEFAULT_MODELS, "wide": WIDE, "holdout": HOLDOUT, "unseen": UNSEEN, "unseen2": UNSEEN2,
            "cpu": CPU, "blocks": tuple(BLOCKS)}
PROFILE_ITERS = 10  # calls profiled per case with --profile


def one_line(error: BaseException) -> str:
    """`Type: first line of the message`, at most 200 characters."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:200]


def flat_output(out: Any) -> torch.Tensor:
    """A model's output as one tensor: its tensors (in tuples, lists, dicts and named tuples, nested; None left out:
    a scripted Inception3 returns its logits with no auxiliary ones) flattened and concatenated in order, as float32
    where there are several. TypeError where it holds something else, or no tensor."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict):
        parts = [flat_output(v) for v in out.values() if v is not None]
    elif isinstance(out, (tuple, list)):
        parts = [flat_output(v) for v in out if v is not None]
    else:
        raise TypeError(f"the peer returned {type(out).__name__}, not tensors")
    if not parts:
        raise TypeError(f"the peer returned {type(out).__name__} holding no tensor")
    return parts[0] if len(parts) == 1 else torch.cat([p.detach().reshape(-1).float() for p in parts])


def _accuracy(out: Any, reference: torch.Tensor) -> dict[str, float]:
    """Cosine similarity and max abs error of `out` (`flat_output`) against the fp32 reference, in float64."""
    o, r = flat_output(out).detach().double().flatten(), reference.double().flatten()
    if o.shape != r.shape:
        raise ValueError(f"output has {o.numel()} elements, the reference {r.numel()}")
    cosine = (o @ r / (o.norm() * r.norm()).clamp_min(1e-300)).item()
    return {"cosine": cosine, "max_abs_error": (o - r).abs().max().item(), "max_abs_reference": r.abs().max().item()}


def load_models(zoo_model: ZooModel, device: torch.device, precision: torch.dtype) -> dict[torch.dtype, torch.nn.Module]:
    """A zoo model built on `device` (seeded: the same weights in every process), in fp32 and in `precision`."""
    torch.manual_seed(0)
    built = {torch.float32: load_zoo_model(zoo_model, device)}
    built[precision] = built[torch.float32] if precision == torch.float32 else \
        copy.deepcopy(built[torch.float32]).to(precision)
    return built


def case_inputs(zoo_model: ZooModel, models: dict[torch.dtype, torch.nn.Module], batch: int, device: torch.device,
                precision: torch.dtype) -> tuple[list[torch.Tensor], torch.Tensor]:
    """A case's inputs in `precision` (seeded by the batch size) and its fp32 reference output (TF32 off)."""
    torch.manual_seed(batch)
    inputs = [x.to(device) for x in zoo_model.inputs(batch)]
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        reference = flat_output(models[torch.float32](*inputs)).float().clone()  # true fp32
    return [x.to(precision) if x.is_floating_point() else x for x in inputs], reference


def build_peer(name: str, model: torch.nn.Module, inputs: Sequence[torch.Tensor], precision: torch.dtype,
               reference: torch.Tensor) -> tuple[dict[str, Any], Callable[[], Any] | None]:
    """One peer built for one case: its row (build time, accuracy; or the reason it failed) and its runner."""
    device = inputs[0].device
    row: dict[str, Any] = {"peer": name}
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            synchronize(device)
            start = time.perf_counter()
            run = PEERS[name](model, inputs, precision)
            synchronize(device)
            row["build_s"] = time.perf_counter() - start
            row.update(_accuracy(run(), reference))
            if hasattr(run, "blocks"):
                row["blocks"] = run.blocks
    except Exception as e:  # a peer that cannot run this case is a row note, never the end of the benchmark
        logger.debug("peer %s failed", name, exc_info=True)
        row.update(status="failed", reason=one_line(e))
        return row, None
    return row, run


def _time_peers(runners: dict[str, Callable[[], Any]], rows: dict[str, dict[str, Any]], device: torch.device,
                batch: int, iters: int, warmup: int, rounds: int, profile: bool) -> float:
    """Time the built peers interleaved (timing.time_interleaved), each row given its latency statistics (and with
    `profile`, torchkiln's GPU time per call by kernel class); the share of the CPU other processes used
    meanwhile."""
    meter = LoadMeter().start()
    try:
        with torch.no_grad():
            times = time_interleaved(runners, device, iters, warmup, rounds)
    except Exception as e:  # a peer that fails on a later call: all are timed again without it
        failed = next((n for n in runners if _fails(runners[n])), None)
        if failed is None:
            raise
        rows[failed].update(status="failed", reason=one_line(e))
        return _time_peers({n: r for n, r in runners.items() if n != failed}, rows, device, batch, iters, warmup,
                           rounds, profile)
    other_load = meter.stop()
    for name, ts in times.items():
        stats = summarize(ts)
        rows[name].update(status="ok", ms=stats["p50"], latency_ms=stats, spread=relative_spread(stats),
                          items_per_s=batch * 1e3 / stats["p50"])
        if profile and device.type == "cuda":  # every peer's launches; torchkiln's time by kernel class
            with torch.no_grad():
                _, kernels = profile_calls(runners[name], device, PROFILE_ITERS, 0)
            rows[name]["kernels_per_call"] = launches(kernels, PROFILE_ITERS)
            if name == "torchkiln":
                rows[name]["kernel_classes"] = by_class(kernels, PROFILE_ITERS, stats["p50"])
    return other_load


def _fails(run: Callable[[], Any]) -> bool:
    try:
        with torch.no_grad():
            run()
    except Exception:
        return True
    return False


def _case(model_name: str, zoo_model: ZooModel, models: dict[torch.dtype, torch.nn.Module], batch: int,
          device: torch.device, precision: torch.dtype, peers: Sequence[str], iters: int, warmup: int,
          progress: Callable[[str], None], profile: bool = False, rounds: int = 5) -> dict[str, Any]:
    run_inputs, reference = case_inputs(zoo_model, models, batch, device, precision)
    case: dict[str, Any] = {"model": model_name, "source": zoo_model.source, "batch": batch, "peers": {}}
    # On the CPU every peer is built, then all are timed interleaved (host load falls on all alike); on CUDA (CUDA
    # events time the device, and models may be large) each peer is built, timed and freed in turn.
    groups = [list(peers)] if device.type == "cpu" else [[name] for name in peers]
    loads, lost = [], None
    for group in groups:
        runners: dict[str, Callable[[], Any]] = {}
        for name in group:
            if lost:
                row, run = {"peer": name, "status": "failed", "reason": lost}, None
            else:
                row, run = build_peer(name, models[precision], run_inputs, precision, reference)
                if run is None and (error := cuda_context_error(device)):
                    lost = f"not run: the CUDA context is unusable after {name} failed ({error})"
            case["peers"][name] = row
            if run is not None:
                runners[name] = run
            else:
                progress(f"  {model_name} batch {batch} {name}: failed ({row['reason']})")
        if lost:
            for name in runners:
                case["peers"][name].update(status="failed", reason=lost)
        elif runners:
            loads.append(_time_peers(runners, case["peers"], device, batch, iters, warmup, rounds, profile))
        del runners
        if device.type == "cuda" and not lost:
            torch.cuda.empty_cache()
    if loads:
        case["other_load"] = max(loads)
        if warning := load_warning(case["other_load"], case["peers"].get("eager", {}).get("spread")):
            case["warning"] = warning
            logger.warning("%s batch %d: %s", model_name, batch, warning)
    for name, row in case["peers"].items():
        if row["status"] == "ok":
            blocks = row.get("blocks")
            progress(f"  {model_name} batch {batch} {name}: {row['ms']:.3f} ms (IQR {row['spread']:.0%}), build "
                     f"{row['build_s']:.1f} s, cosine {row['cosine']:.6f}" +
                     (f", {blocks['engine']} engine / {blocks['torch']} PyTorch blocks" if blocks else "") +
                     (f"; in PyTorch: {'; '.join(blocks['in_pytorch'][:5])}" if blocks and blocks.get("in_pytorch")
                      else ""))
    ok = {n: r for n, r in case["peers"].items() if r["status"] == "ok"}
    best = min((n for n in BEST_PEER_CANDIDATES[device.type] if n in ok), key=lambda n: ok[n]["ms"], default=None)
    if best is not None:
        case.update(best_peer=best, best_ms=ok[best]["ms"], best_items_per_s=ok[best]["items_per_s"])
    if "torchkiln" in ok:
        case.update(torchkiln_ms=ok["torchkiln"]["ms"], torchkiln_items_per_s=ok["torchkiln"]["items_per_s"])
        if best is not None:
            case["ratio"] = ok["torchkiln"]["ms"] / ok[best]["ms"]
            if "latency_ms" in ok[best]:  # the fastest calls' ratio: what a burst of load on a shared machine spares
                case["ratio_of_min"] = ok["torchkiln"]["latency_ms"]["min"] / ok[best]["latency_ms"]["min"]
        if "torchkiln-session" in ok:  # what the module's call adds to its session's run, fastest calls compared
            case["call_overhead_us"] = (ok["torchkiln"]["latency_ms"]["min"] -
                                        ok["torchkiln-session"]["latency_ms"]["min"]) * 1e3
        if "eager" in ok:
            case["speedup_over_eager"] = ok["eager"]["ms"] / ok["torchkiln"]["ms"]
    return case


def cuda_context_error(device: torch.device) -> str | None:
    """Why the CUDA context can no longer run anything (a device-side assert is sticky), or None."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
    except Exception as e:
        return one_line(e)
    return None


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {"torch": torch.__version__, "torchkiln": __version__, "python": platform.python_version(),
                           "platform": platform.platform(), "device": str(device)}
    if device.type == "cuda":
        env.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    for package in ("torchvision", "transformers"):  # installed: the import can fail (zoo.import_torchvision)
        try:
            env[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            env[package] = None
    return env


def run_comparison(models: Sequence[str] = DEFAULT_MODELS, batches: Sequence[int] = (1, 32),
                   device: str | torch.device = "cuda", precision: torch.dtype | None = None, iters: int = 100,
                   warmup: int = 20, peers: Sequence[str] | None = None, sources: Sequence[str] = SOURCES,
                   progress: Callable[[str], None] = logger.info, profile: bool = False, threads: int | None = None,
                   rounds: int = 5) -> dict[str, Any]:
    """Every peer on every (model, batch) case; the whole result as JSON-ready data (with `profile`, torchkiln's GPU
    time per call by kernel class too). Peers (default: DEFAULT_PEERS of the device) run on `threads` CPU threads
    (default: torch's number now), torchkiln's and ORT's sessions included; they are timed interleaved, in
    `rounds` rounds."""
    device = torch.device(device)
    precision = precision or (torch.float16 if device.type == "cuda" else torch.float32)
    peers = list(DEFAULT_PEERS[device.type] if peers is None else peers)
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        raise ValueError(f"unknown peer(s) {unknown}; use some of {list(PEERS)}")
    if iters < 1 or warmup < 0 or rounds < 1 or not batches or any(b < 1 for b in batches):
        raise ValueError(f"need iters >= 1, warmup >= 0, rounds >= 1 and batch sizes >= 1; got iters={iters}, "
                         f"warmup={warmup}, rounds={rounds}, batches={list(batches)}")
    if threads is not None and not 1 <= threads <= usable_cores():
        raise ValueError(f"threads must be in [1, {usable_cores()}] (the usable cores), got {threads}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        cases = _run_cases(models, batches, device, precision, iters, warmup, peers, sources, progress, profile,
                            rounds)
    finally:
        torch.set_num_threads(before)
    loaded = [c for c in cases if "warning" in c]
    return {
        "config": {"models": list(models), "batches": list(batches), "device": str(device),
                   "precision": str(precision).removeprefix("torch."), "iters": iters, "warmup": warmup,
                   "rounds": rounds, "threads": threads or before, "peers": peers, "sources": list(sources),
                   "best_peer_of": list(BEST_PEER_CANDIDATES[device.type])},
        "environment": {**environment(device), "cores": usable_cores()},
        "cases": cases,
        "loaded_cases": len(loaded),
        **_geomean_of(cases),
    }


def _run_cases(models: Sequence[str], batches: Sequence[int], device: torch.device, precision: torch.dtype,
               iters: int, warmup: int, peers: Sequence[str], sources: Sequence[str],
               progress: Callable[[str], None], profile: bool, rounds: int) -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = []
    lost = None  # set once the CUDA context is unusable: every later case is skipped with this reason
    for name in models:
        if lost:
            cases += [{"model": name, "batch": b, "skipped": lost, "peers": {}} for b in batches]
            continue
        try:
            zoo_model = find_zoo_model(name, sources)
            built = load_models(zoo_model, device, precision)
        except Exception as e:  # unavailable here (no torchvision) or failing to build: skipped, with the reason
            reason = one_line(e)
            progress(f"{name}: skipped ({reason})")
            cases += [{"model": name, "batch": b, "skipped": reason, "peers": {}} for b in batches]
            continue
        progress(f"{name} ({zoo_model.source})")
        for batch in model_batches(batches, zoo_model.max_batch):
            if lost:
                cases.append({"model": name, "batch": batch, "skipped": lost, "peers": {}})
                continue
            try:
                cases.append(_case(name, zoo_model, built, batch, device, precision, peers, iters, warmup, progress,
                                   profile, rounds))
            except Exception as e:  # the inputs or the fp32 reference failed
                cases.append({"model": name, "batch": batch, "skipped": one_line(e), "peers": {}})
            if error := cuda_context_error(device):
                lost = f"not run: the CUDA context is unusable ({error})"
        del built
    return cases


def zoo_models(zoo_set: str = "default", models: str | None = None, chunk: str | None = None) -> list[str]:
    """The models of a zoo set, or the comma-separated `models` instead; with `chunk` "K/N", the K-th (from 1) of N
    contiguous slices of them, as even as can be. ValueError naming what is wrong."""
    if zoo_set not in ZOO_SETS:
        raise ValueError(f"unknown zoo set {zoo_set!r}; use one of {list(ZOO_SETS)}")
    names = [m for m in models.split(",") if m] if models else list(ZOO_SETS[zoo_set])
    if chunk is None:
        return names
    k, _, n = chunk.partition("/")
    if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n) <= len(names)):
        raise ValueError(f"--chunk {chunk!r}: need K/N with 1 <= K <= N <= {len(names)} (the number of models)")
    k, n = int(k), int(n)
    return names[(k - 1) * len(names) // n:k * len(names) // n]


def model_batches(batches: Sequence[int], max_batch: int | None) -> list[int]:
    """The batch sizes a model runs at: each of `batches` capped at the model's largest, without repeats."""
    return list(dict.fromkeys(min(b, max_batch) if max_batch else b for b in batches))


def _geomean_of(cases: Sequence[dict[str, Any]]) -> dict[str, Any]:
    ratios = [c["ratio"] for c in cases if "ratio" in c]
    speedups = [c["speedup_over_eager"] for c in cases if "speedup_over_eager" in c]
    of_min = [c["ratio_of_min"] for c in cases if "ratio_of_min" in c]
    return {"geomean_ratio": geomean(ratios) if ratios else None, "cases_in_geomean": len(ratios),
            "geomean_ratio_of_min": geomean(of_min) if of_min else None,
            "geomean_speedup_over_eager": geomean(speedups) if speedups else None}


MERGE_MUST_MATCH = (("config", "device"), ("config", "precision"), ("config", "iters"), ("config", "warmup"),
                    ("config", "threads"), ("config", "best_peer_of"), ("environment", "gpu"), ("environment", "torch"),
                    ("environment", "torchkiln"))  # what makes the timings of two results comparable


def load_results(paths: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    """The JSON results (`bench --zoo ... --json FILE`) of `paths`, each with its path; ValueError naming a file
    that cannot be read."""
    results = []
    for path in paths:
        try:
            with open(path) as f:
                results.append((path, json.load(f)))
        except (OSError, ValueError) as e:
            raise ValueError(f"{path} cannot be read as JSON ({one_line(e)})") from None
    return results


def merge_results(results: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One result of several, each with a name (the chunks of one model list, each run in its own call on the same
    machine): their cases in order, the models, batches and peers of all, the geomean over all cases. ValueError
    where two differ in what makes timings comparable (device, GPU, precision, versions, iterations) or repeat a
    case."""
    if not results:
        raise ValueError("no results to merge")
    for name, result in results:
        if not isinstance(result, dict) or not {"config", "environment", "cases"} <= set(result):
            raise ValueError(f"{name} is not a result of `bench --zoo` or `--blocks`")
    (first_name, first), *rest = results
    for name, result in rest:
        for part, key in MERGE_MUST_MATCH:
            if result[part].get(key) != first[part].get(key):
                raise ValueError(f"{name} and {first_name} differ in {key}: {result[part].get(key)!r} and "
                                 f"{first[part].get(key)!r}")
    cases, where = [], {}
    for name, result in results:
        for case in result["cases"]:
            key = (case["model"], case["batch"])
            if key in where:
                raise ValueError(f"{case['model']} batch {case['batch']} is in both {where[key]} and {name}")
            where[key] = name
            cases.append(case)

    def union(key: str) -> list[Any]:
        return list(dict.fromkeys(x for _, result in results for x in result["config"][key]))
    config = {**first["config"], "models": union("models"), "batches": union("batches"), "peers": union("peers"),
              "merged_from": [name for name, _ in results]}
    return {"config": config, "environment": first["environment"], "cases": cases, **_geomean_of(cases)}


def _ms(row: dict[str, Any] | None) -> str:
    """The median, and half the interquartile range as a share of it where recorded: `12.345 ±4%`."""
    if row is None:
        return "-"
    if row["status"] != "ok":
        return "failed"
    return f"{row['ms']:.3f}" + (f" ±{row['spread'] / 2:.0%}" if "spread" in row else "")


def format_table(result: dict[str, Any]) -> str:
    """Latency per case and peer (median ± half the interquartile range), best peer, torchkiln, their ratio,
    torchkiln's speedup over eager and throughputs; the peers' build times and accuracy; the failures; the cases
    timed on a loaded machine; the geomeans."""
    peers = result["config"]["peers"]
    width = max(14, *(len(p) for p in peers))
    name = max([14, *(len(c["model"]) for c in result["cases"])])  # the model column's width
    head = f"{'model':{name}} {'batch':>5} " + " ".join(f"{p:>{width}}" for p in peers)
    threads = f", {result['config']['threads']} threads" if "threads" in result["config"] else ""
    lines = [f"median latency, ms ± half the interquartile range ({result['config']['precision']}, "
             f"{result['config']['device']}{threads}; ratio = torchkiln / best of "
             f"{', '.join(result['config']['best_peer_of'])}, of medians and of the fastest calls; x eager = eager / "
             "torchkiln)",
             head + f" {'best peer':>17} {'ratio':>6} {'(min)':>6} {'x eager':>7} {'torchkiln it/s':>14} "
             f"{'best it/s':>10}"]
    failures = []
    for c in result["cases"]:
        if "skipped" in c:
            lines.append(f"{c['model']:{name}} {c['batch']:>5} skipped: {c['skipped']}")
            continue
        cells = " ".join(f"{_ms(c['peers'].get(p)):>{width}}" for p in peers)
        ratio = f"{c['ratio']:.2f}" if "ratio" in c else "-"
        speedup = f"{c['speedup_over_eager']:.2f}" if "speedup_over_eager" in c else "-"
        of_min = f"{c['ratio_of_min']:.2f}" if "ratio_of_min" in c else "-"
        tk = f"{c['torchkiln_items_per_s']:.1f}" if "torchkiln_items_per_s" in c else "-"
        best = f"{c['best_items_per_s']:.1f}" if "best_items_per_s" in c else "-"
        lines.append(f"{c['model']:{name}} {c['batch']:>5} {cells} {c.get('best_peer', '-'):>17} {ratio:>6} "
                     f"{of_min:>6} {speedup:>7} {tk:>14} {best:>10}")
        failures += [f"  {c['model']} batch {c['batch']} {p}: {r['reason']}" for p, r in c["peers"].items()
                     if r["status"] == "failed"]
    lines += ["", "build s / cosine / max abs error against fp32 eager", head]
    for c in result["cases"]:
        if "skipped" not in c:
            cells = []
            for p in peers:
                r = c["peers"].get(p)
                cells.append(f"{r['build_s']:.1f}/{r['cosine']:.5f}/{r['max_abs_error']:.1e}"
                             if r and r["status"] == "ok" else "-")
            lines.append(f"{c['model']:{name}} {c['batch']:>5} " + " ".join(f"{s:>{width}}" for s in cells))
    profiled = [c for c in result["cases"] if "kernel_classes" in c["peers"].get("torchkiln", {})]
    if profiled:
        lines += ["", "torchkiln's time per call by kernel class (ms, share of the call)"]
        lines += [f"{c['model']:{name}} {c['batch']:>5} {format_classes(c['peers']['torchkiln']['kernel_classes'])}"
                  for c in profiled]
    counted = [c for c in result["cases"] if any("kernels_per_call" in r for r in c.get("peers", {}).values())]
    if counted:
        lines += ["", "kernel launches per call (memcpy and memset included)", head]
        for c in counted:
            cells = [f"{c['peers'][p]['kernels_per_call']:.0f}" if "kernels_per_call" in c["peers"].get(p, {})
                     else "-" for p in peers]
            lines.append(f"{c['model']:{name}} {c['batch']:>5} " + " ".join(f"{s:>{width}}" for s in cells))
    if failures:
        lines += ["", "failed:"] + failures
    overheads = [f"  {c['model']} batch {c['batch']}: {c['call_overhead_us']:.1f} us" for c in result["cases"]
                 if "call_overhead_us" in c]
    if overheads:
        lines += ["", "torchkiln's call over its ONNX Runtime session's run alone (fastest calls):"] + overheads
    loaded = [f"  {c['model']} batch {c['batch']}: {c['warning']}" for c in result["cases"] if "warning" in c]
    if loaded:
        lines += ["", "timed on a loaded machine (compare these with care):"] + loaded
    geo = result["geomean_ratio"]
    lines += ["", f"geomean ratio torchkiln / best peer: {geo:.3f} over {result['cases_in_geomean']} case(s)"
              if geo is not None else "geomean ratio torchkiln / best peer: - (no case has both)"]
    if result.get("geomean_ratio_of_min") is not None:
        lines.append(f"geomean ratio of the fastest calls: {result['geomean_ratio_of_min']:.3f}")
    if result.get("geomean_speedup_over_eager") is not None:
        lines.append(f"geomean speedup of torchkiln over eager: {result['geomean_speedup_over_eager']:.3f}")
    return "\n".join(lines)
