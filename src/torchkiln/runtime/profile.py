"""Per-step profile of engines, like trtexec's --dumpProfile: the time of each step of an engine's plan, per call.

While a StepProfiler is active (`with StepProfiler() as profiler: module(*inputs)`), every engine call in that
context runs a profiled replay of its plan instead of its runner's usual path, with the same values:
- reference backend: each layer's ATen meaning, timed between layers (the executor's `visit`);
- onnxruntime backend: the engine's sessions made again with ONNX Runtime's profiler on. Each node's kernel time
  (the `end_profiling` JSON) is a row, mapped back to the layers it computes by the names the ONNX export gives
  (`{layer}/{Op}` nodes, `{layer}/{Op}:{i}` and `{layer}:{i}` tensors, `{layer}/...` initializers), which ONNX
  Runtime's fused nodes keep some of; a layer none is named after goes with the first node computing a layer that
  reads it. What a session call takes outside its kernels (feeds, fetches, ORT's own work) is a row of its own.
  Reference segments are timed per layer;
- cuda backend: the plan's steps launched one by one (no CUDA graph), a CUDA event after each.
A row's time runs from the end of the step before it to its own end (wall clock on the CPU; CUDA events on a GPU,
where it includes any time the GPU waited for the step's launch), so the rows of a call add up to the call. Each
engine's first `warmup` profiled calls are not counted: they make the profiled sessions and compile kernels.
"""
from __future__ import annotations

import bisect
import contextlib
import contextvars
import dataclasses
import json
import logging
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from torchkiln.ir import layers as L
from torchkiln.runtime.executor import ReferenceExecutor
from torchkiln.runtime.native import tapes_held

if TYPE_CHECKING:
    from torchkiln.runtime.engine import Engine

logger = logging.getLogger(__name__)

KIND_WIDTH = 30
SORTS = ("order", "time")  # how `format_profile` orders its rows: the engine's order, or slowest first
_ACTIVE: contextvars.ContextVar[StepProfiler | None] = contextvars.ContextVar("torchkiln_step_profiler",
                                                                                default=None)


def active_profiler() -> StepProfiler | None:
    """The StepProfiler active in this context, if any (Engine.execute runs its calls through it)."""
    return _ACTIVE.get()


@dataclasses.dataclass
class StepRow:
    """One step of an engine: what it is called, what runs it, the layers it computes, its ms in each call."""

    name: str
    kind: str
    layers: list[str]
    times: list[float] = dataclasses.field(default_factory=list)
    node: str | None = None  # onnxruntime: the node as ONNX Runtime names it

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times) if self.times else 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else 0.0


@dataclasses.dataclass
class EngineProfile:
    """An engine's steps, in the order they run, and its whole calls (ms each)."""

    engine: str
    backend: str
    rows: list[StepRow]
    totals: list[float]
    unfused: list[str] = dataclasses.field(default_factory=list)  # cuda: each pair of steps left apart, and why

    def to_json(self) -> dict[str, Any]:
        total = statistics.fmean(self.totals) if self.totals else 0.0
        sums = [sum(r.times[k] for r in self.rows) for k in range(len(self.totals))]
        steps = []
        for i, r in enumerate(self.rows):
            row = {"index": i, "name": r.name, "kind": r.kind, "layers": r.layers, "mean_ms": r.mean,
                   "median_ms": r.median, "percent": 100 * r.mean / total if total else 0.0}
            if r.node is not None:
                row["node"] = r.node
            steps.append(row)
        return {"engine": self.engine, "backend": self.backend, "calls": len(self.totals),
                "total_ms": {"mean": total, "median": statistics.median(self.totals) if self.totals else 0.0},
                "steps_sum_ms": {"mean": sum(r.mean for r in self.rows),
                                 "median": statistics.median(sums) if sums else 0.0},
                "steps": steps, "unfused": self.unfused}


def format_profile(profile: dict[str, Any], sort: str = "order", width: int = 60) -> str:
    """An engine's step table (EngineProfile.to_json) as text, --dumpProfile style; `sort` "time": slowest first."""
    if sort not in SORTS:
        raise ValueError(f"sort must be one of {SORTS}, got {sort!r}")
    rows = profile["steps"]
    if sort == "time":
        rows = sorted(rows, key=lambda r: -r["mean_ms"])

    def line(index: str, name: str, kind: str, mean: str, median: str, percent: str) -> str:
        return f"{index:>4}  {_cut(name, width):{width}} {_cut(kind, KIND_WIDTH):{KIND_WIDTH}} {mean:>9} " \
               f"{median:>9} {percent:>6}"
    total, steps = profile["total_ms"], profile["steps_sum_ms"]
    share = 100 * steps["mean"] / total["mean"] if total["mean"] else 0.0
    return "\n".join([
        f"engine {profile['engine']!r} on {profile['backend']}: {len(rows)} steps, time per call over "
        f"{profile['calls']} calls (steps run one by one, each timed)",
        line("#", "step (layers)", "kind", "mean ms", "median ms", "%"),
        *(line(str(r["index"]), r["name"], r["kind"], f"{r['mean_ms']:.4f}", f"{r['median_ms']:.4f}",
               f"{r['percent']:.1f}") for r in rows),
        line("", "sum of the steps", "", f"{steps['mean']:.4f}", f"{steps['median']:.4f}", f"{share:.1f}"),
        line("", "engine call", "", f"{total['mean']:.4f}", f"{total['median']:.4f}", "100.0"),
        *(["steps left apart (a value one step makes and another reads, and why they are not one kernel):"] +
          [f"  {edge}" for edge in profile["unfused"]] if profile.get("unfused") else [])])


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def step_name(layers: Sequence[str]) -> str:
    """A step's name: its layers' names joined by " + "."""
    return " + ".join(layers)


class _Clock:
    """Marks of the wall clock on the CPU, or CUDA events on the current stream; read (`deltas`) after the calls."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def deltas(self, marks: Sequence[Any]) -> list[float]:
        """Milliseconds between consecutive marks."""
        if self.cuda:
            return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]


class _Timer:
    """One engine's profiled calls on one device: `run` makes a call and keeps its marks, `finish` the rows."""

    backend = "engine"

    def __init__(self, engine: Engine, device: torch.device, runner: Any) -> None:
        self.engine = engine
        self.runner = runner
        self.clock = _Clock(device)
        self.calls: list[list[Any]] = []  # per call: a mark at its start, one after each step, one at its end

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        marks = [self.clock.mark()]
        outputs = self.replay(inputs, lambda *_: marks.append(self.clock.mark()))
        marks.append(self.clock.mark())
        self.calls.append(marks)
        return outputs

    def replay(self, inputs: list[torch.Tensor], visit: Callable[..., None]) -> list[torch.Tensor]:
        """The call, with `visit` after each step."""
        return self.runner.run(inputs)

    def steps(self) -> list[StepRow]:
        """The rows, without times, one per mark between a call's first and last."""
        return []

    def finish(self, warmup: int) -> EngineProfile:
        rows = self.steps()
        calls, counted = self.deltas(warmup, len(rows))
        for j, row in enumerate(rows):
            row.times = [calls[k][j] for k in counted]
        return EngineProfile(self.engine.name, self.backend, rows, [sum(calls[k]) for k in counted], self.unfused())

    def unfused(self) -> list[str]:
        """Each pair of steps left apart, and why (where the backend says)."""
        return []

    def deltas(self, warmup: int, steps: int) -> tuple[list[list[float]], list[int]]:
        """Each call's ms between its marks, and the calls counted: after the first `warmup`, those that made a mark
        after each of the `steps` (a call ONNX Runtime failed took another path)."""
        calls = [self.clock.deltas(marks) for marks in self.calls]
        counted = [k for k in range(warmup, len(calls)) if len(calls[k]) == steps + 1]
        if len(counted) < len(calls) - warmup:
            logger.debug("engine %s: %d profiled calls took another path and are not counted", self.engine.name,
                         len(calls) - warmup - len(counted))
        return calls, counted


class _ReferenceTimer(_Timer):
    """The reference executor, a mark after each layer."""

    backend = "reference"

    def replay(self, inputs: list[torch.Tensor], visit: Callable[..., None]) -> list[torch.Tensor]:
        return self.runner.run(inputs, visit)

    def steps(self) -> list[StepRow]:
        return [StepRow(layer.name, f"aten {layer.KIND}", [layer.name]) for _, layer, *_ in self.runner.steps]


class _CudaTimer(_Timer):
    """The cuda backend's plan, its steps launched one by one (no CUDA graph), an event after each."""

    backend = "cuda"

    def __init__(self, engine: Engine, device: torch.device, runner: Any) -> None:
        super().__init__(engine, device, runner)
        self.bound: dict[tuple[tuple[int, ...], ...], Any] = {}

    def replay(self, inputs: list[torch.Tensor], visit: Callable[..., None]) -> list[torch.Tensor]:
        r = self.runner
        shapes = tuple(tuple(x.shape) for x in inputs)
        if shapes not in self.bound:
            self.bound[shapes] = r.bind(inputs)
        outputs = self.bound[shapes].run_eagerly(inputs, visit)
        return [o.clone() if copy else o for o, copy in zip(outputs, r.may_alias)]  # as the runner returns them

    def steps(self) -> list[StepRow]:
        plan, layers = self.runner.plan, self.runner.network.layers
        rows = []
        for step in plan.steps:
            names = [layers[j].name for j in step.layers]
            kernel = plan.kernels[step.kernel]
            rows.append(StepRow(step_name(names), f"{kernel.kind} {kernel.op}", names))
        return rows

    def unfused(self) -> list[str]:
        from torchkiln.runtime.backends.cuda.fusion_report import format_edges

        return format_edges(self.runner.network, self.runner.plan)


class _OrtTimer(_Timer):
    """The onnxruntime backend's plan with profiled sessions: a mark after each session and each reference layer;
    a session's time is split into its nodes' kernel times (ONNX Runtime's profile) and the rest."""

    backend = "onnxruntime"

    def __init__(self, engine: Engine, device: torch.device, folder: str) -> None:
        from torchkiln.runtime.backends.onnxruntime import OrtRunner

        plan = engine.plan_for(device)
        super().__init__(engine, device, OrtRunner(engine.network, plan, device, engine.run_options, folder))
        layers = engine.network.layers
        self.session_layers = [[layers[j] for j in sorted(step.layers)] for step in plan.steps
                               if plan.kernels[step.kernel].kind == "session"]  # the runner's sessions, in order
        self.order: list[L.Layer | int] = []  # what each mark after a call's start ends: a layer, or session k
        for step, _, _ in self.runner.steps:
            if isinstance(step, ReferenceExecutor):
                self.order += [layer for _, layer, *_ in step.steps]
            else:
                self.order.append(sum(isinstance(what, int) for what in self.order))

    def replay(self, inputs: list[torch.Tensor], visit: Callable[..., None]) -> list[torch.Tensor]:
        return self.runner.run(inputs, visit)

    def finish(self, warmup: int) -> EngineProfile:
        profiled = self.runner.end_profiling()
        calls, counted = self.deltas(warmup, len(self.order))
        rows = []
        for j, what in enumerate(self.order):
            if isinstance(what, L.Layer):
                rows.append(StepRow(what.name, f"aten {what.KIND}", [what.name], [calls[k][j] for k in counted]))
                continue
            runs, ops = _session_runs(profiled[what][0])
            if len(runs) != len(calls):  # a call failed inside ONNX Runtime: runs and calls cannot be matched
                rows.append(StepRow(f"session {what}", "onnxruntime session", [], [calls[k][j] for k in counted]))
                continue
            covered = _node_layers(list(ops), _named_layers(profiled[what][1], self.session_layers[what]),
                                   self.session_layers[what])
            for node, op in ops.items():
                rows.append(StepRow(step_name(covered[node]) or node, f"onnxruntime {op}", covered[node],
                                    [runs[k].get(node, 0.0) for k in counted], node))
            rows.append(StepRow(f"session {what}: outside its kernels", "onnxruntime session", [],
                                [calls[k][j] - sum(runs[k].values()) for k in counted]))
        return EngineProfile(self.engine.name, self.backend, rows, [sum(calls[k]) for k in counted])


def _session_runs(events_path: str) -> tuple[list[dict[str, float]], dict[str, str]]:
    """From ONNX Runtime's profile of a session: per run, in order, the ms of each node's kernels (a node that runs
    a subgraph, an If, includes the nodes it ran); and each node's op, in the order the nodes first ran."""
    with open(events_path) as f:
        events = json.load(f)
    runs = sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("cat") == "Session" and e.get("name") == "model_run")
    starts = [start for start, _ in runs]
    per_run: list[dict[str, float]] = [{} for _ in runs]
    ops: dict[str, str] = {}
    end = -1  # where the last node counted ended: a node starting before it ran inside it (a subgraph's)
    for e in sorted((e for e in events if e.get("cat") == "Node"), key=lambda e: e["ts"]):
        if not e.get("name", "").endswith("_kernel_time") or e["ts"] < end:
            continue
        k = bisect.bisect_right(starts, e["ts"]) - 1
        if k < 0 or e["ts"] > runs[k][1]:
            continue
        end = e["ts"] + e["dur"]
        node = e["name"].removesuffix("_kernel_time")
        per_run[k][node] = per_run[k].get(node, 0.0) + e["dur"] / 1e3
        ops.setdefault(node, e.get("args", {}).get("op_name", "?"))
    return per_run, ops


def _named_layers(model_path: str, layers: Sequence[L.Layer]) -> dict[str, list[str]]:
    """Per node of the graph ONNX Runtime ran, the layers its name, its outputs and its initializers are named
    after (a fused node keeps some of the names of what it fused); a node named after none (one ONNX Runtime added,
    such as a reshape around a Gemm) takes those of the first node reading its outputs."""
    import onnx

    names = {layer.name for layer in layers if not isinstance(layer, L.ConstantLayer)}  # constants: weights
    graph = onnx.load(model_path, load_external_data=False).graph
    initializers = {t.name for t in graph.initializer}
    named: dict[str, list[str]] = {}
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        parts = [node.name, *node.output, *(i for i in node.input if i in initializers)]
        named[node.name] = list(dict.fromkeys(x for part in parts for x in _layers_named(part, names)))
        for i in node.input:
            readers.setdefault(i, []).append(node.name)
    for node in reversed(graph.node):  # readers come after: their layers are known by then
        if not named[node.name]:
            named[node.name] = next((named[r] for o in node.output for r in readers.get(o, []) if named[r]), [])
    return named


def _node_layers(nodes: Sequence[str], named: dict[str, list[str]], layers: Sequence[L.Layer]
                 ) -> dict[str, list[str]]:
    """Per node (in the order they ran), the layers it computes: those it is named after, and each layer that no
    node is named after (ONNX Runtime fused or removed its nodes) with the first node to run that computes a layer
    reading it. Constant layers are weights: no node's."""
    first: dict[str, int] = {}  # layer name -> the first node (index) computing it
    for i, node in enumerate(nodes):
        for name in named.get(node, []):
            first.setdefault(name, i)
    readers: dict[int, list[L.Layer]] = {}
    for layer in layers:
        for t in layer.inputs:
            readers.setdefault(id(t), []).append(layer)
    inherited: dict[str, int] = {}
    for layer in reversed(layers):
        if layer.name in first or isinstance(layer, L.ConstantLayer):
            continue
        found = [first.get(r.name, inherited.get(r.name)) for t in layer.outputs for r in readers.get(id(t), [])]
        found = [i for i in found if i is not None]
        if found:
            inherited[layer.name] = min(found)
    covered = {node: [name for name in named.get(node, [])] for node in nodes}
    for layer in layers:
        if layer.name in inherited:
            covered[nodes[inherited[layer.name]]].append(layer.name)
    order = {layer.name: j for j, layer in enumerate(layers)}
    return {node: sorted(names, key=lambda n: order.get(n, -1)) for node, names in covered.items()}


def _layers_named(name: str, layer_names: set[str]) -> list[str]:
    """The layer an exported name (node, tensor or initializer) belongs to: the longest layer name it starts with
    (or, as ONNX Runtime's "fused {node}", starts with after a space), followed by "/" or ":" or nothing; [] if none."""
    for start in [0, *(i + 1 for i, c in enumerate(name) if c == " ")]:
        for end in range(len(name), start, -1):
            if (end == len(name) or name[end] in "/:") and name[start:end] in layer_names:
                return [name[start:end]]
    return []


def _timer(engine: Engine, runner: Any, device: torch.device, folder: str) -> _Timer:
    """How to profile `runner` (the engine's runner on `device`, maybe the reference one its backend fell back to)."""
    from torchkiln.runtime.backends.cuda.runner import CudaRunner
    from torchkiln.runtime.backends.onnxruntime import OrtRunner

    if isinstance(runner, ReferenceExecutor):
        return _ReferenceTimer(engine, device, runner)
    if isinstance(runner, OrtRunner):
        return _OrtTimer(engine, device, folder)
    if isinstance(runner, CudaRunner):
        return _CudaTimer(engine, device, runner)
    return _Timer(engine, device, runner)  # a runner this module does not know: the whole call, no steps


class StepProfiler:
    """While active (a `with` block), every engine call in this context runs its plan's steps one by one, each
    timed (see the module docstring); after the block, `profiles()` gives each engine's table."""

    def __init__(self, warmup: int = 1) -> None:
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"warmup must be an int >= 0, got {warmup!r}")
        self.warmup = warmup
        self._timers: dict[tuple[int, torch.device], _Timer] = {}
        self._profiles: list[EngineProfile] | None = None
        self._folder: str | None = None
        self._token: contextvars.Token | None = None
        self._held = contextlib.ExitStack()

    def __enter__(self) -> StepProfiler:
        if self._token is not None or self._profiles is not None:
            raise RuntimeError("a StepProfiler runs once")
        self._folder = tempfile.mkdtemp(prefix="torchkiln-profile-")
        self._held.enter_context(tapes_held())  # calls come to the package's runner, where its steps are timed
        self._token = _ACTIVE.set(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _ACTIVE.reset(self._token)
        self._held.close()
        try:
            for device in {device for _, device in self._timers}:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
            self._profiles = [timer.finish(self.warmup) for timer in self._timers.values()]
        finally:
            shutil.rmtree(self._folder, ignore_errors=True)

    def run(self, engine: Engine, runner: Any, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """One call of `engine` (its runner on the inputs' device is `runner`), profiled."""
        device = inputs[0].device if inputs else torch.device(engine.device_type)
        key = (id(engine), device)
        if key not in self._timers:
            folder = os.path.join(self._folder, str(len(self._timers)))  # each engine's session files apart
            os.mkdir(folder)
            self._timers[key] = _timer(engine, runner, device, folder)
        return self._timers[key].run(inputs)

    def profiles(self) -> list[EngineProfile]:
        """Each profiled engine's steps and calls, in the order the engines first ran."""
        if self._profiles is None:
            raise RuntimeError("the profiles are ready once the StepProfiler's `with` block has ended")
        return self._profiles
