"""OpInfo conformance: PyTorch's own op test database (`op_db`) as the measure of what converts and converts right.

Every float32 sample of an op is traced, compiled with `min_block_size=1` on a backend and compared with eager
(values within 1e-4 x max|eager|, NaN and infinity positions, shapes, dtypes). One sample gives one status,
best first:

- ENGINE: every op of the traced graph ran in an engine (or was folded at build time) and the answer matched;
- FALLBACK: it compiled and matched, but an op stayed in PyTorch (the reason is the partition report's);
- ERROR: compiling or running raised where eager did not (the exception type and first line);
- WRONG: the compiled module's answer differs from eager's: the worst outcome.

Three variants of each sample: `inputs` (its tensors are the compiled module's inputs), `constants` (the tensors
after the first are closed over, so converters that need constant weights are reached) and `special` (NaN and
+-inf, a 0-d tensor, an empty tensor substituted for its first tensor, where eager accepts them).
Samples eager rejects, random ops and graphs tracing cannot express are left out. `scripts/opinfo_sweep.py`
runs every op and writes the stored table (`opinfo_table.tsv`) that `python -m torchkiln coverage` reads.

A backend's cases are made on its device (`backend_device`: the GPU for cuda): the samples, eager's answer, the
trace and the compiled module's run, with TF32 off in eager and in the engines (the compare is 1e-4 relative).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

logger = logging.getLogger(__name__)

STATUSES = ("ENGINE", "FALLBACK", "ERROR", "WRONG")  # best first
VARIANTS = ("inputs", "constants", "special")
BACKENDS = ("reference", "onnxruntime")  # the CPU backends: the stored table's sweep and the op fraction's
BACKEND_DEVICES = {"cuda": "cuda"}  # the device of a backend's cases where it is not the CPU
SPECIALS = ("nan_inf", "0-d", "empty")
RTOL = 1e-4  # max abs error <= RTOL * max|eager|, as the test harness
MAX_NUMEL = 1_000_000  # samples with more elements in all are skipped
TABLE_FILE = "opinfo_table.tsv"
COLUMNS = "op\tvariant\tbackend\tcounts\treason"
BACKENDS_LINE = "backends: "  # the header line naming the backends a table's sweep ran
NOT_RUN = "not run: the sweep's deadline came first"
COMPILE_OPTIONS = {"min_block_size": 1, "disable_tf32": True}  # disable_tf32: true fp32 on cuda (the default)
# Special values where eager's own answer varies with the element's position (its vector or scalar path) or the
# kernel it picks, so no compiled answer can match it everywhere: (op, kind) -> why the case is left out.
EAGER_VARIES = {
    ("nn.functional.gelu", "nan_inf"): "torch's GELU(+inf) is +inf or NaN depending on its vector path",
    ("nn.functional.scaled_dot_product_attention", "nan_inf"): "eager's CPU flash kernel gives 0 for a NaN query "
                                                               "row, its math kernel NaN",
    **{(f"special.{shifted}chebyshev_polynomial_{k}", "nan_inf"): "eager's Chebyshev U and W of NaN read "
       "uninitialized memory (a value that varies per call)" for shifted in ("", "shifted_") for k in "uw"},
}
# The same on one device only: (device type, op, kind) -> why the case is left out there.
EAGER_VARIES_ON = {
    ("cuda", "nn.functional.rms_norm", "nan_inf"): "CUDA eager's fused RMSNorm gives NaN for the finite elements "
                                                   "of a row holding an infinity, where CPU eager and the formula "
                                                   "give x * rsqrt(inf) = 0",
}
# Ops whose values are undefined (uninitialized memory): only shapes and dtypes are compared.
UNDEFINED_VALUES = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted", "new_empty",
                              "new_empty_strided"})


@dataclasses.dataclass(frozen=True)
class Case:
    """One compiled check: `fn(*inputs)` is the op on a sample, with its other tensors closed over."""

    variant: str
    fn: Callable[..., Any]
    inputs: tuple[torch.Tensor, ...]
    label: str = ""


@dataclasses.dataclass(frozen=True)
class Outcome:
    status: str
    reason: str = ""


@dataclasses.dataclass
class CellResult:
    """The outcomes of one op's samples in one variant on one backend."""

    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)  # status -> its first reason

    def add(self, outcome: Outcome) -> None:
        self.counts[outcome.status] += 1
        self.reasons.setdefault(outcome.status, outcome.reason)

    @property
    def best(self) -> str | None:
        return next((s for s in STATUSES if self.counts[s]), None)

    @property
    def worst(self) -> str | None:
        return next((s for s in reversed(STATUSES) if self.counts[s]), None)

    def summary(self) -> str:
        """'ENGINE 3, WRONG 1' (statuses best first)."""
        return ", ".join(f"{s} {self.counts[s]}" for s in STATUSES if self.counts[s])


@dataclasses.dataclass
class OpResult:
    """One op: a CellResult per (variant, backend), and why samples were left out."""

    op: str
    cells: dict[tuple[str, str], CellResult] = dataclasses.field(default_factory=dict)
    skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)  # backend -> why it has no (more) cells

    def cell(self, variant: str, backend: str) -> CellResult:
        return self.cells.setdefault((variant, backend), CellResult())

    @property
    def tested(self) -> bool:
        return any(c.counts for c in self.cells.values())

    @property
    def engine(self) -> bool:
        """ENGINE on at least one sample of any variant and backend."""
        return any(c.counts["ENGINE"] for c in self.cells.values())


def op_name(info: Any) -> str:
    """The OpInfo's name, with its variant: 'nn.functional.conv2d', 'max.reduction_with_dim'."""
    return f"{info.name}.{info.variant_test_name}" if info.variant_test_name else info.name


def backend_device(backend: str) -> torch.device:
    """The device a backend's cases are made and compared on: the CPU, or the GPU for cuda."""
    return torch.device(BACKEND_DEVICES.get(backend, "cpu"))


def supports_float32(info: Any, device: torch.device) -> bool:
    return torch.float32 in info.supported_dtypes(device.type)


def op_infos(names: Iterable[str] | None = None) -> list[Any]:
    """op_db's OpInfos that support float32 on the CPU (those named, in that order, if `names`)."""
    from torch.testing._internal.common_methods_invocations import op_db

    infos = {op_name(o): o for o in op_db if torch.float32 in o.supported_dtypes("cpu")}
    if names is None:
        return list(infos.values())
    missing = [n for n in names if n not in infos]
    if missing:
        raise KeyError(f"not OpInfo ops with float32 samples: {', '.join(missing)}")
    return [infos[n] for n in names]


def _tensor_leaves(tree: Any) -> tuple[list[Any], Any, list[int]]:
    leaves, spec = pytree.tree_flatten(tree)
    return leaves, spec, [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]


class _Call(torch.nn.Module):
    """forward(*inputs) = op(*args, **kwargs) with the tensors at `slots` taken from the inputs (for tracing:
    the other leaves, tensors included, are constants)."""

    def __init__(self, op: Callable[..., Any], leaves: list[Any], spec: Any, slots: Sequence[int]) -> None:
        super().__init__()
        self.op, self.leaves, self.spec, self.slots = op, leaves, spec, list(slots)

    def forward(self, *inputs: torch.Tensor) -> Any:
        leaves = list(self.leaves)
        for slot, value in zip(self.slots, inputs):
            leaves[slot] = value
        sample_input, args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        return self.op(sample_input, *args, **kwargs)


def _special(tensor: torch.Tensor, kind: str) -> torch.Tensor | None:
    """`tensor` with NaN, +inf and -inf in its first elements, as a 0-d tensor, or empty (None: not applicable)."""
    if kind == "nan_inf":
        if not tensor.dtype.is_floating_point or tensor.numel() == 0:
            return None
        out = tensor.clone()
        flat = out.view(-1)
        n = flat.numel()
        for i, value in enumerate((float("nan"), float("inf"), float("-inf"))[:n]):
            flat[i * n // 3 if n >= 3 else i] = value
        return out
    if kind == "0-d":
        return tensor.reshape(-1)[0].clone() if tensor.dim() > 0 and tensor.numel() > 0 else None
    if kind == "empty":
        return tensor.new_empty((0, *tensor.shape[1:])) if tensor.dim() > 0 and tensor.shape[0] > 0 else None
    raise ValueError(f"unknown special value kind {kind!r}")


def _sample_cases(op: Callable[..., Any], sample: Any, variant: str) -> Iterator[Case]:
    leaves, spec, slots = _tensor_leaves((sample.input, sample.args, sample.kwargs))
    if not slots:
        return
    tensors = [leaves[i] for i in slots]
    if variant == "inputs":
        yield Case(variant, _Call(op, leaves, spec, slots), tuple(tensors))
    elif variant == "constants":
        if len(slots) > 1:
            yield Case(variant, _Call(op, leaves, spec, slots[:1]), tuple(tensors[:1]))
    else:
        for kind in SPECIALS:
            value = _special(tensors[0], kind)
            if value is not None:
                yield Case(variant, _Call(op, leaves, spec, slots), (value, *tensors[1:]), kind)


def _eager_varies(op: str, kind: str, device: torch.device | str) -> bool:
    return (op, kind) in EAGER_VARIES or (torch.device(device).type, op, kind) in EAGER_VARIES_ON


def cases(info: Any, variant: str, limit: int, seed: int = 0, device: torch.device | str = "cpu") -> Iterator[Case]:
    """Up to `limit` cases of an op's float32 samples on `device` in one variant (for `special`: up to `limit` of
    each kind)."""
    torch.manual_seed(seed)
    taken: collections.Counter = collections.Counter()
    for sample in info.sample_inputs(torch.device(device).type, torch.float32, requires_grad=False):
        leaves = pytree.tree_leaves((sample.input, sample.args, sample.kwargs))
        if sum(t.numel() for t in leaves if isinstance(t, torch.Tensor)) > MAX_NUMEL:
            continue
        for case in _sample_cases(info.op, sample, variant):
            if _eager_varies(op_name(info), case.label, device):
                continue
            if taken[case.label] < limit:
                taken[case.label] += 1
                yield case
        labels = [k for k in SPECIALS if not _eager_varies(op_name(info), k, device)] if variant == "special" \
            else [""]
        if all(taken[k] >= limit for k in labels):
            return


def mismatch(out: Any, ref: Any, path: str = "output", values: bool = True) -> str | None:
    """Why `out` differs from eager's `ref` (structure, shape, dtype, NaN/inf positions, values), or None."""
    out_leaves, ref_leaves = pytree.tree_leaves(out), pytree.tree_leaves(ref)
    if len(out_leaves) != len(ref_leaves):
        return f"{path}: {len(out_leaves)} values where eager gives {len(ref_leaves)}"
    for i, (o, r) in enumerate(zip(out_leaves, ref_leaves)):
        where = f"{path}[{i}]" if len(ref_leaves) > 1 else path
        if not isinstance(r, torch.Tensor):
            if isinstance(o, torch.Tensor) or o != r:
                return f"{where}: {o!r} where eager gives {r!r}"
            continue
        if not isinstance(o, torch.Tensor):
            return f"{where}: a {type(o).__name__} where eager gives a tensor"
        if o.shape != r.shape or o.dtype != r.dtype:
            return f"{where}: {o.dtype}{list(o.shape)} where eager gives {r.dtype}{list(r.shape)}"
        if o.device != r.device:
            return f"{where}: on {o.device} where eager gives {r.device}"
        if not values:
            continue
        if not r.dtype.is_floating_point and not r.dtype.is_complex:
            if not torch.equal(o, r):
                return f"{where}: integer or bool values differ from eager"
            continue
        finite = torch.isfinite(r)
        special = (finite != o.isfinite()) | (r.isnan() != o.isnan()) | (r.isinf() & (o != r))
        if special.any():
            at = tuple(special.nonzero()[0].tolist())
            return f"{where}: {o[at].item()} at {at} where eager gives {r[at].item()}"
        if finite.any():
            err = (o[finite].double() - r[finite].double()).abs().max().item()
            scale = r[finite].double().abs().max().item()
            if err > RTOL * scale and err > 1e-7:
                return f"{where}: max abs error {err:.3g} > {RTOL:g} x max|eager| {scale:.3g}"
    return None


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:200] if text else ''}"


def device_error(device: torch.device) -> str | None:
    """The error a device reports (a CUDA error is sticky: every later call fails), or None; the CPU has none."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
    except Exception as e:  # noqa: BLE001 - what the device says, recorded
        return _first_line(e)
    return None


@contextlib.contextmanager
def true_fp32() -> Iterator[None]:
    """Eager's float32 convolutions and matrix multiplies without TF32 (cuDNN's default allows it) while inside (the
    cuDNN flag through its context manager: op_db's import freezes cuDNN's flags outside one)."""
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        with cudnn.flags(enabled=cudnn.enabled, benchmark=cudnn.benchmark, deterministic=cudnn.deterministic,
                         allow_tf32=False):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = matmul


def _eager(fn: Callable[..., Any], inputs: Sequence[torch.Tensor], seed: int) -> Any:
    torch.manual_seed(seed)
    with torch.no_grad():
        return fn(*[t.clone() for t in inputs])


# Allocations whose values are undefined: a traced graph returning one of them unwritten recorded the allocation of
# a kernel it could not see (torch.cuda.jiterator's launch is no ATen op), and eager's run of that trace gives
# whatever memory the allocator hands back (often the last result: equal to eager's by chance).
_UNINITIALIZED = ("aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
                  "aten::new_empty_strided")


def returns_uninitialized(graph: torch._C.Graph) -> bool:
    """Whether an output of `graph` (through tuples and lists) is an allocation nothing in the graph writes."""
    todo = list(graph.outputs())
    while todo:
        value = todo.pop()
        node = value.node()
        if node.kind() in ("prim::TupleConstruct", "prim::ListConstruct"):
            todo.extend(node.inputs())
        elif node.kind() in _UNINITIALIZED and all(use.user.kind().startswith("prim::") for use in value.uses()):
            return True
    return False


def _on_the_cpu(case: Case) -> Case:
    """`case` with every tensor it holds (inputs and closed-over ones) on the CPU."""
    fn = case.fn
    leaves = [leaf.cpu() if isinstance(leaf, torch.Tensor) else leaf for leaf in fn.leaves]
    return dataclasses.replace(case, fn=_Call(fn.op, leaves, fn.spec, fn.slots),
                               inputs=tuple(t.cpu() for t in case.inputs))


def rejected_on_the_cpu(case: Case, device: torch.device) -> str | None:
    """Why eager rejects a special-values case meant for another device than the CPU, found by running it on the
    CPU first (eager checks there on the host what a GPU checks with a device-side assert, which would end the
    process), or None."""
    if not case.label or device.type == "cpu":
        return None
    on_cpu = _on_the_cpu(case)
    try:
        _eager(on_cpu.fn, on_cpu.inputs, 0)
    except Exception as e:  # noqa: BLE001 - eager rejects the sample
        return f"eager raises {type(e).__name__} on the CPU"
    return None


def _trace(case: Case, values: bool = True) -> tuple[torch.jit.ScriptModule | None, Any, str]:
    """The traced case and eager's answer, or (None, None, why the case is left out)."""
    if len({t.device for t in case.inputs}) > 1:  # (eager's tensor_split wants its index tensor on the CPU)
        return None, None, "inputs on several devices (an engine's inputs are on the compile's device)"
    try:
        ref = _eager(case.fn, case.inputs, 0)
    except Exception as e:  # noqa: BLE001 - eager rejects the sample: nothing to compare
        return None, None, f"eager raises {type(e).__name__}"
    try:
        if mismatch(_eager(case.fn, case.inputs, 1), ref, values=values) is not None:
            return None, None, "random"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traced = torch.jit.trace(case.fn.eval(), case.inputs, check_trace=False)
        if returns_uninitialized(traced.inlined_graph):
            return None, None, "the trace returns uninitialized memory (a kernel it did not record)"
        if mismatch(_eager(traced, case.inputs, 0), ref, values=values) is not None:
            return None, None, "the trace differs from eager"
    except Exception as e:  # noqa: BLE001 - tracing cannot express the op
        return None, None, f"untraceable: {type(e).__name__}"
    return traced, ref, ""


def _specs(inputs: Sequence[torch.Tensor]) -> list[Any] | None:
    """The compile inputs of a case; None where `Input` refuses one (an empty tensor: a documented limit)."""
    from torchkiln.settings import Input

    try:
        return Input.from_tensors(inputs)
    except ValueError:
        return None


def check_case(traced: torch.jit.ScriptModule, inputs: Sequence[torch.Tensor], ref: Any, backend: str,
               values: bool = True) -> Outcome:
    """Compile a traced case on `backend` with min_block_size=1, run it and compare with eager's `ref` (its
    shapes and dtypes only, without `values`)."""
    from torchkiln.compiler import compile_with_report

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compiled, report = compile_with_report(traced, _specs(inputs), backend=backend, **COMPILE_OPTIONS)
    except Exception as e:  # noqa: BLE001 - the outcome being measured
        return Outcome("ERROR", f"compile: {_first_line(e)}")
    try:
        torch.manual_seed(0)  # as eager's run: ops left in PyTorch draw the same random numbers
        with torch.no_grad():
            out = compiled(*[t.clone() for t in inputs])
        error = device_error(backend_device(backend))  # an asynchronous CUDA error belongs to this run
        if error is not None:
            return Outcome("ERROR", f"run: {error}")
    except Exception as e:  # noqa: BLE001
        return Outcome("ERROR", f"run: {_first_line(e)}")
    wrong = mismatch(out, ref, values=values)
    if wrong is not None:
        return Outcome("WRONG", wrong)
    fallback = next((f for b in report.blocks for f in b.fallback), None)
    if fallback is not None:
        detail = f" ({fallback.detail})" if fallback.detail else ""
        return Outcome("FALLBACK", f"{fallback.op}: {fallback.reason}{detail}"[:200])
    return Outcome("ENGINE")


def run_op(info: Any, backends: Sequence[str] = BACKENDS, variants: Sequence[str] = VARIANTS, limit: int = 3,
           seed: int = 0, time_cap: float | None = None, result: OpResult | None = None) -> OpResult:
    """Check up to `limit` samples of an op per variant on each backend, the samples made on the backend's device
    (no new sample after `time_cap` s). A backend whose device has no float32 for the op, or reports an error (a
    CUDA error spoils every later call), gets a note instead of (more) cells."""
    result = result if result is not None else OpResult(op_name(info))
    deadline = None if time_cap is None else time.perf_counter() + time_cap
    by_device: dict[torch.device, list[str]] = {}
    for backend in backends:
        by_device.setdefault(backend_device(backend), []).append(backend)
    groups = list(by_device.items())
    with true_fp32():
        for i, (device, group) in enumerate(groups):
            why = (f"not applicable: no float32 on {device.type}" if not supports_float32(info, device)
                   else _run_on_device(info, device, group, variants, limit, seed, deadline, result))
            if why == "time cap":
                result.skipped[why] += 1
                result.notes.update({b: f"time cap: no sample after {time_cap:g} s" for _, g in groups[i:] for b in g})
                return result
            result.notes.update({b: why for b in group if why})
    return result


def _run_on_device(info: Any, device: torch.device, backends: Sequence[str], variants: Sequence[str], limit: int,
                   seed: int, deadline: float | None, result: OpResult) -> str:
    """run_op's cases on one device: "" when done, "time cap" or why the device stopped."""
    values = info.name not in UNDEFINED_VALUES
    error = device_error(device)  # a device unusable in this process (CUDA initialised before the fork) is named
    if error is not None:
        return f"stopped: {error}"
    for variant in variants:
        for case in cases(info, variant, limit, seed, device):
            if deadline is not None and time.perf_counter() > deadline:
                return "time cap"
            why = rejected_on_the_cpu(case, device)
            traced, ref, why = (None, None, why) if why else _trace(case, values)
            if traced is not None and _specs(case.inputs) is None:
                traced, why = None, "an empty input (Input refuses it)"
            if traced is None:
                result.skipped[why] += 1
            for backend in backends if traced is not None else ():
                outcome = check_case(traced, case.inputs, ref, backend, values)
                if outcome.status != "ENGINE":
                    logger.info("%s %s%s on %s: %s %s", result.op, variant, f" ({case.label})" * bool(case.label),
                                backend, outcome.status, outcome.reason)
                result.cell(variant, backend).add(outcome)
            error = device_error(device)
            if error is not None:
                return f"stopped: {error}"
    return ""


# The stored table: one line per (op, variant, backend) with its counts and the reason of its worst status; a
# backend's note (not run, not applicable, stopped, time cap) is a line with variant "-".

def write_table(results: Iterable[OpResult], path: str | Path, header: Sequence[str] = (),
                backends: Sequence[str] = ()) -> None:
    """Write the sweep's results as tab-separated lines: op, variant, backend, counts, worst status's reason;
    `backends` (those swept) goes into the header."""
    lines = [f"# {h}" for h in header]
    if backends:
        lines.append(f"# {BACKENDS_LINE}{' '.join(backends)}")
    lines.append(f"# {COLUMNS}")
    for r in results:
        if not r.tested:
            lines.append(f"{r.op}\t-\t-\t-\t{skipped_text(r.skipped) or 'no samples'}")
        for (variant, backend), cell in r.cells.items():
            reason = cell.reasons.get(cell.worst, "") if cell.worst != "ENGINE" else ""
            lines.append(f"{r.op}\t{variant}\t{backend}\t{cell.summary()}\t{reason}")
        lines += [f"{r.op}\t-\t{backend}\t-\t{note}" for backend, note in r.notes.items()]
    Path(path).write_text("\n".join(lines) + "\n")


def skipped_text(skipped: collections.Counter, most: int | None = None) -> str:
    """'random x4, untraceable: RuntimeError x2': why samples were left out, the commonest first."""
    return ", ".join(f"{why} x{n}" for why, n in skipped.most_common(most))


def _table_text(path: str | Path | None) -> str:
    return (resources.files("torchkiln.coverage").joinpath(TABLE_FILE).read_text() if path is None
            else Path(path).read_text())


def read_table(path: str | Path | None = None) -> list[OpResult]:
    """The results of a stored table (the bundled one by default); counts only, each with its worst reason."""
    results: dict[str, OpResult] = {}
    for line in _table_text(path).splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        op, variant, backend, counts, reason = (line.split("\t") + [""] * 5)[:5]
        result = results.setdefault(op, OpResult(op))
        if variant == "-":
            if backend != "-":
                result.notes[backend] = reason
            for why, _, n in (part.rpartition(" x") for part in reason.split(", ") if backend == "-"):
                if n.isdigit():  # a table written before the counts were: its reasons only
                    result.skipped[why] = int(n)
            continue
        cell = result.cell(variant, backend)
        for part in counts.split(", "):
            status, _, n = part.partition(" ")
            cell.counts[status] = int(n)
        if reason:
            cell.reasons[cell.worst] = reason
    return list(results.values())


def read_header(path: str | Path | None = None) -> tuple[list[str], list[str]]:
    """A stored table's header lines (without the column names and the backends line) and the backends its sweep
    ran (those of its cells and notes where the header does not name them)."""
    lines = [line[2:] for line in _table_text(path).splitlines() if line.startswith("# ")]
    named = next((line[len(BACKENDS_LINE):].split() for line in lines if line.startswith(BACKENDS_LINE)), None)
    if named is None:
        found = {b for r in read_table(path) for b in [*(b for _, b in r.cells), *r.notes]}
        named = [b for b in (*BACKENDS, *sorted(found - set(BACKENDS))) if b in found]
    return [line for line in lines if line != COLUMNS and not line.startswith(BACKENDS_LINE)], named


def merge(base: Sequence[OpResult], swept: Sequence[Sequence[OpResult]], backends: Sequence[str]) -> list[OpResult]:
    """`base` with, for each op of the `swept` tables (a shard each), the cells and notes of `backends` replaced by
    the swept ones (other backends' cells kept; ops new to `base` added). An op that a shard did not run (its
    deadline) keeps what another shard of the same merge found."""
    merged = {r.op: dataclasses.replace(r, cells=dict(r.cells), notes=dict(r.notes)) for r in base}
    found: set[tuple[str, str]] = set()
    for results in swept:
        for r in results:
            target = merged.setdefault(r.op, OpResult(r.op, skipped=collections.Counter(r.skipped)))
            for backend in backends:
                cells = {k: c for k, c in r.cells.items() if k[1] == backend}
                note = r.notes.get(backend) or ("" if cells else
                                                f"not compiled: {skipped_text(r.skipped) or 'no samples'}")
                if note == NOT_RUN and (r.op, backend) in found:
                    continue
                found.add((r.op, backend))
                target.cells = {k: c for k, c in target.cells.items() if k[1] != backend} | cells
                target.notes.pop(backend, None)
                if note:
                    target.notes[backend] = note
    return list(merged.values())


def engine_fraction(results: Sequence[OpResult], backends: Sequence[str] = BACKENDS) -> tuple[int, int]:
    """(ops with ENGINE on at least one sample, ops with at least one sample compiled) on `backends`."""
    cells = [[c for (_, b), c in r.cells.items() if b in backends] for r in results]
    tested = [op for op in cells if any(c.counts for c in op)]
    return sum(any(c.counts["ENGINE"] for c in op) for op in tested), len(tested)


def format_fraction(results: Sequence[OpResult]) -> str:
    """The op fraction on the CPU backends (the stored sweep's, comparable over time), then each other backend's
    where the table has its cells (cuda, merged from a GPU machine's sweep)."""
    def fraction(backends: Sequence[str]) -> str:
        engine, tested = engine_fraction(results, backends)
        return f"{engine}/{tested} ({100.0 * engine / max(tested, 1):.1f}%)"

    others = sorted({b for r in results for _, b in r.cells} - set(BACKENDS))
    return (f"OpInfo ops with an engine on a float32 sample (scripts/opinfo_sweep.py): {fraction(BACKENDS)}"
            + "".join(f"; on {b}: {fraction([b])}" for b in others))
