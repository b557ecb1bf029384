"""Coverage by overload: op names hide gaps (`aten::add` counts as covered by `aten::add.Tensor` while
`aten::add.str` has no evaluator), so the coverage command also counts overloads, in two sets:

- every overload TorchScript defines for the floor's ops (`out=` variants left out: scripting never
  emits them), and
- the overloads seen in real graphs: the lowered graphs of the CI zoo's models (tests/test_zoo.py) and the
  bundled examples (`torchkiln.examples`), as partitioning sees them. They are bundled in `zoo_overloads.txt`,
  one overload a line with the models that showed it; `python scripts/collect_overloads.py` writes it again.

An overload counts as covered as partitioning decides: its key is a converter or evaluator key, or (an
overload on numbers, strings and lists only) its op's name is an evaluator key.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from torchkiln.conversion import supported_ops
from torchkiln.coverage.floor import _local_name, read_floor

SEEN_FILE = "zoo_overloads.txt"


@dataclasses.dataclass(frozen=True)
class OverloadCoverage:
    """One overload key ('aten::add.Tensor'; the op's name for its default overload) and what covers it."""

    key: str
    by: str | None  # "converter", "evaluator", or None: not covered

    @property
    def covered(self) -> bool:
        return self.by is not None


def _is_out(schema: torch._C.FunctionSchema) -> bool:
    return "out" in schema.overload_name.split("_") or any(a.is_out for a in schema.arguments)


def _key(schema: torch._C.FunctionSchema) -> str:
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def _schemas(name: str) -> list[torch._C.FunctionSchema]:
    try:
        return torch._C._jit_get_schemas_for_operator(name)
    except RuntimeError:
        return []


def _scalar_only(schema: torch._C.FunctionSchema) -> bool:
    def holds_tensor(t: torch._C.JitType) -> bool:
        return "Tensor" in t.annotation_str

    return not any(holds_tensor(a.type) for a in list(schema.arguments) + list(schema.returns))


def floor_overloads(ops: Iterable[str] | None = None) -> list[str]:
    """Every overload key TorchScript defines for the floor's ops (`trt::X` as `torchkiln::X`), out= left out."""
    keys = []
    for op in read_floor() if ops is None else ops:
        keys += sorted(_key(s) for s in _schemas(_local_name(op)) if not _is_out(s))
    return list(dict.fromkeys(keys))


def read_seen(path: str | Path | None = None) -> dict[str, tuple[str, ...]]:
    """The bundled overloads of real graphs: key -> the models whose lowered graphs hold it."""
    text = (resources.files("torchkiln.coverage").joinpath(SEEN_FILE).read_text() if path is None
            else Path(path).read_text())
    seen = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if line:
            key, *models = line.split()
            seen[key] = tuple(models)
    return seen


def write_seen(seen: Mapping[str, Iterable[str]], path: str | Path) -> None:
    """Write `read_seen`'s format: one overload a line, sorted, with its models."""
    lines = ["# Overloads in the lowered graphs of the CI zoo and the bundled examples, with the models that show",
             "# them. Written by scripts/collect_overloads.py; read by `python -m torchkiln coverage`."]
    lines += [f"{key}  {' '.join(sorted(models))}" for key, models in sorted(seen.items())]
    Path(path).write_text("\n".join(lines) + "\n")


def overload_coverage(keys: Iterable[str]) -> list[OverloadCoverage]:
    """What covers each overload key, as partitioning's registry lookup decides."""
    registered = supported_ops()
    converters, evaluators = set(registered["converters"]), set(registered["evaluators"])
    rows = []
    for key in keys:
        name, _, overload = key.partition(".")
        if key in converters:
            by = "converter"
        elif key in evaluators:
            by = "evaluator"
        elif overload and name in evaluators and any(
                s.overload_name == overload and _scalar_only(s) for s in _schemas(name)):
            by = "evaluator"
        else:
            by = None
        rows.append(OverloadCoverage(key, by))
    return rows


def graph_overloads(graph: Any) -> set[str]:
    """The overload keys of every node of a graph and its blocks, control flow (prim::If, prim::Loop) left out."""
    from torchkiln.lowering.walk import all_nodes
    from torchkiln.torchscript import node_key

    return {node_key(n) for n in all_nodes(graph.block()) if n.kind() not in ("prim::If", "prim::Loop")}


def model_overloads(model: torch.nn.Module, example: Sequence[Any]) -> set[str]:
    """The overloads of a model's lowered graph as partitioning sees it (after shape analysis's folding)."""
    from torchkiln.compiler import _prepare, _settings
    from torchkiln.frontend import as_module

    module = as_module(model.eval())
    lowered, _ = _prepare(module, _settings(module, list(example), {}))
    return graph_overloads(lowered.graph)


def _line(label: str, rows: Sequence[OverloadCoverage]) -> str:
    covered = sum(r.covered for r in rows)
    return f"{label}: {covered}/{len(rows)} ({100.0 * covered / max(len(rows), 1):.1f}%)"


def format_overload_report(floor: Sequence[OverloadCoverage], seen: Sequence[OverloadCoverage],
                           models: Mapping[str, Sequence[str]] | None = None, missing_only: bool = False) -> str:
    """The overload counts (floor ops' overloads; overloads seen in real graphs), with the missing ones listed
    under --missing (the seen ones with their models)."""
    lines = []
    if missing_only:
        absent = [r.key for r in seen if not r.covered]
        if absent:
            lines.append("overloads seen in real graphs with no converter or evaluator:")
            lines += [f"  {k}  ({', '.join((models or {}).get(k, ()))})" for k in absent]
        by_op = collections.defaultdict(list)
        for r in floor:
            if not r.covered:
                by_op[r.key.split(".")[0]].append(r.key.partition(".")[2] or "(default)")
        if by_op:
            lines.append("overloads of the floor's ops with no converter or evaluator:")
            lines += [f"  {op}: {' '.join(overloads)}" for op, overloads in sorted(by_op.items())]
    lines.append(_line("overloads seen in real graphs (CI zoo, examples)", seen))
    lines.append(_line("overloads of the floor's ops", floor))
    return "\n".join(lines)
