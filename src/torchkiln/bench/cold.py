"""Cold builds side by side (`python -m torchkiln bench --zoo --cold-builds`).

`bench --zoo` builds every peer of a case in one process, one after another: a peer built after another reuses
what that one imported and compiled (torch.compile's settings share Dynamo's and Inductor's work), so its build
times are not a cold build's. Here each peer builds each case in a process of its own (`python -m
torchkiln.bench.cold`), first with empty compile caches (torchkiln's, Triton's and Inductor's folders, made for the
case), then once more in a second process on the same folders: what a first compile costs, and what a compile
costs once its caches hold the same work. A build is the wall clock of the peer's compile and first call, as in
`bench --zoo`; the model's loading and its fp32 reference are not in it.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import torch

from torchkiln.bench.compare import build_peer, case_inputs, environment, load_models, model_batches, one_line
from torchkiln.bench.peers import PEERS
from torchkiln.bench.timing import geomean
from torchkiln.examples.zoo import find_zoo_model

CACHE_FOLDERS = {"TORCHKILN_CACHE_DIR": "torchkiln", "TRITON_CACHE_DIR": "triton",
                 "TORCHINDUCTOR_CACHE_DIR": "inductor"}
RUNS = ("fresh", "warm")
COLD_PEERS = {"cuda": ("torchkiln", "compile-ro", "compile-ro-freeze"), "cpu": ("torchkiln", "compile")}  # default
TIMEOUT_S = 1800  # one build in its process


def build_once(model: str, batch: int, peer: str, device: str, precision: str,
               sources: Sequence[str]) -> dict[str, Any]:
    """One peer's build of one case in this process: its seconds and accuracy (`compare.build_peer`'s row)."""
    device_ = torch.device(device)
    dtype = getattr(torch, precision)
    zoo_model = find_zoo_model(model, sources)
    models = load_models(zoo_model, device_, dtype)
    inputs, reference = case_inputs(zoo_model, models, batch, device_, dtype)
    row, _ = build_peer(peer, models[dtype], inputs, dtype, reference)
    return row


def _build_in_process(args: dict[str, Any], env: dict[str, str], result: str) -> dict[str, Any]:
    """`build_once` in a process of its own, which writes its row to the file `result`: the row, or a failed row
    saying why."""
    try:
        done = subprocess.run([sys.executable, "-m", "torchkiln.bench.cold", json.dumps(args), result], env=env,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"no result in {TIMEOUT_S} s"}
    if done.returncode != 0 or not os.path.isfile(result):
        error = done.stderr.strip().splitlines()
        return {"status": "failed", "reason": f"exit status {done.returncode}: {error[-1] if error else ''}"[:200]}
    with open(result) as f:
        return json.load(f)


def run_cold_builds(models: Sequence[str], batches: Sequence[int], device: str | torch.device,
                    precision: torch.dtype, peers: Sequence[str], sources: Sequence[str],
                    progress: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Every peer's fresh and warm build of every (model, batch) case, each in a process of its own; the result as
    JSON-ready data, with torchkiln's build over each peer's (`ratio`: below 1, torchkiln built faster)."""
    device = torch.device(device)
    unknown = [p for p in peers if p not in PEERS]
    if unknown or not peers:
        raise ValueError(f"unknown peer(s) {unknown}; use some of {list(PEERS)}" if unknown else
                         f"no peers given; use some of {list(PEERS)}")
    cases = []
    for model in models:
        try:
            zoo_model = find_zoo_model(model, sources)
        except Exception as e:  # unavailable here: skipped, with the reason
            progress(f"{model}: skipped ({one_line(e)})")
            cases.append({"model": model, "skipped": one_line(e), "peers": {}})
            continue
        for batch in model_batches(batches, zoo_model.max_batch):
            case: dict[str, Any] = {"model": model, "batch": batch, "peers": {}}
            for peer in peers:
                args = {"model": model, "batch": batch, "peer": peer, "device": str(device),
                        "precision": str(precision).removeprefix("torch."), "sources": list(sources)}
                row: dict[str, Any] = {}
                with tempfile.TemporaryDirectory(prefix="torchkiln-cold-") as caches:
                    env = dict(os.environ, **{var: os.path.join(caches, name) for var, name in CACHE_FOLDERS.items()})
                    for run in RUNS:
                        built = _build_in_process(args, env, os.path.join(caches, f"{run}.json"))
                        if built.get("status", "ok") != "ok":
                            row = {"status": "failed", "reason": built.get("reason", "")}
                            break
                        row.update({f"{run}_s": built["build_s"], "cosine": built.get("cosine"), "status": "ok"})
                case["peers"][peer] = row
                progress(f"  {model} batch {batch} {peer}: " + (
                    f"fresh {row['fresh_s']:.1f} s, warm {row['warm_s']:.1f} s" if row["status"] == "ok"
                    else f"failed ({row['reason']})"))
            own = case["peers"].get("torchkiln", {})
            for peer, row in case["peers"].items():
                if peer != "torchkiln" and row.get("status") == own.get("status") == "ok":
                    row.update({f"ratio_{run}": own[f"{run}_s"] / row[f"{run}_s"] for run in RUNS})
            cases.append(case)
    return {"config": {"models": list(models), "batches": list(batches), "device": str(device),
                       "precision": str(precision).removeprefix("torch."), "peers": list(peers),
                       "sources": list(sources), "mode": "cold-builds"},
            "environment": environment(device), "cases": cases}


def format_table(result: dict[str, Any]) -> str:
    """The cold builds as a markdown table: per case, each peer's fresh / warm seconds, and torchkiln's over the
    peer's; then the cases where torchkiln built slower, and the geomean ratios per peer."""
    peers = result["config"]["peers"]
    lines = ["| model | batch | " + " | ".join(f"{p} fresh / warm s" for p in peers) + " |",
             "|---|---|" + "---|" * len(peers)]
    slower, ratios = [], {p: {run: [] for run in RUNS} for p in peers}
    for case in result["cases"]:
        if "skipped" in case:
            lines.append(f"| {case['model']} | | skipped: {case['skipped']} |")
            continue
        cells = []
        for peer in peers:
            row = case["peers"].get(peer, {})
            if row.get("status") != "ok":
                cells.append(f"failed: {row.get('reason', '')}"[:80])
                continue
            cell = f"{row['fresh_s']:.1f} / {row['warm_s']:.1f}"
            if "ratio_fresh" in row:
                cell += f" ({row['ratio_fresh']:.2f} / {row['ratio_warm']:.2f})"
                for run in RUNS:
                    ratios[peer][run].append(row[f"ratio_{run}"])
                    if row[f"ratio_{run}"] > 1:
                        slower.append(f"{case['model']} batch {case['batch']}: torchkiln {run} "
                                      f"{case['peers']['torchkiln'][f'{run}_s']:.1f} s, {peer} {row[f'{run}_s']:.1f} s")
            cells.append(cell)
        lines.append(f"| {case['model']} | {case['batch']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("(in brackets: torchkiln's build over the peer's, fresh / warm; below 1, torchkiln built faster)")
    for peer in peers:
        if ratios[peer]["fresh"]:
            lines.append(f"geomean torchkiln / {peer}: fresh {geomean(ratios[peer]['fresh']):.2f}, warm "
                         f"{geomean(ratios[peer]['warm']):.2f} over {len(ratios[peer]['fresh'])} cases")
    lines.append("torchkiln built slower in: " + ("; ".join(slower) if slower else "no case"))
    return "\n".join(lines)


def main() -> None:
    """The child's side: build the case its first argument names (JSON), write its row to the file named second."""
    row = build_once(**json.loads(sys.argv[1]))
    with open(sys.argv[2], "w") as f:
        json.dump(row, f)


if __name__ == "__main__":
    main()
