"""Which ops of a floor list (one TorchScript op name a line) have converters or evaluators.

The bundled `ts_ops_floor.txt` lists the ops a mature TorchScript-to-engine compiler handles. An op
counts as covered when any overload of it is registered (`aten::add` by `aten::add.Tensor`...).
The floor's `trt::` ops are Torch-TensorRT's own; torchkiln has them under `torchkiln::`
(`torchkiln.ops`), so `trt::X` is looked up as `torchkiln::X`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from torchkiln.conversion import supported_ops

NAMESPACE_ALIASES = {"trt": "torchkiln"}


@dataclasses.dataclass(frozen=True)
class OpCoverage:
    """One floor op: the name torchkiln registers it under and the keys that cover it."""

    op: str
    name: str
    converters: tuple[str, ...]
    evaluators: tuple[str, ...]

    @property
    def covered(self) -> bool:
        return bool(self.converters or self.evaluators)


def read_floor(path: str | Path | None = None) -> list[str]:
    """Op names of a floor file (blank lines and '#' comments skipped); the bundled one by default."""
    if path is None:
        text = resources.files("torchkiln.coverage").joinpath("ts_ops_floor.txt").read_text()
    else:
        text = Path(path).read_text()
    ops = [line.split("#")[0].strip() for line in text.splitlines()]
    return [op for op in ops if op]


def _op_name(key: str) -> str:
    """'aten::add.Tensor' -> 'aten::add'."""
    namespace, _, rest = key.partition("::")
    return f"{namespace}::{rest.split('.')[0]}"


def _local_name(op: str) -> str:
    namespace, _, name = op.partition("::")
    return f"{NAMESPACE_ALIASES.get(namespace, namespace)}::{name}"


def floor_coverage(ops: Sequence[str] | None = None) -> list[OpCoverage]:
    """Coverage of each op of `ops` (the bundled floor by default), in order."""
    registered = supported_ops()
    by_op: dict[str, dict[str, list[str]]] = {}
    for table in ("converters", "evaluators"):
        for key in registered[table]:
            by_op.setdefault(_op_name(key), {"converters": [], "evaluators": []})[table].append(key)
    rows = []
    for op in read_floor() if ops is None else ops:
        name = _local_name(op)
        found = by_op.get(name, {"converters": [], "evaluators": []})
        rows.append(OpCoverage(op, name, tuple(found["converters"]), tuple(found["evaluators"])))
    return rows


def _overload(key: str, name: str) -> str:
    """'.Tensor' for 'aten::add.Tensor'; '(default)' for the op's own name."""
    return key[len(name):] or "(default)"


def format_report(rows: Sequence[OpCoverage], missing_only: bool = False) -> str:
    """A table (op, converter keys, evaluator keys) and the line 'coverage: N/M (P%)'."""
    shown = [r for r in rows if not (missing_only and r.covered)]
    width = max((len(r.op) for r in shown), default=2)
    lines = [f"{'op':<{width}}  {'converters':<40}  evaluators"]
    for r in shown:
        if not r.covered:
            lines.append(f"{r.op:<{width}}  MISSING")
            continue
        converters = " ".join(_overload(k, r.name) for k in r.converters) or "-"
        evaluators = " ".join(_overload(k, r.name) for k in r.evaluators) or "-"
        alias = f"  (as {r.name})" if r.name != r.op else ""
        lines.append(f"{r.op:<{width}}  {converters:<40}  {evaluators}{alias}")
    covered = sum(r.covered for r in rows)
    lines.append(f"coverage: {covered}/{len(rows)} ({100.0 * covered / max(len(rows), 1):.1f}%)")
    return "\n".join(lines)
