"""The full-size model zoo (run on a GPU machine with torchvision, timm and transformers installed).

For each model: compile with torchkiln (fp32), then report the fraction of ops converted (engine ops over all
ops), the engine and torch block counts, max abs error against eager relative to max|eager| (beside eager fp32's
own error against eager fp64, what random weights amplify rounding to), and compile time;
for a model that is not one engine, the ops left in PyTorch and why. A model that fails is listed with its error.
`--cpu-wave2` runs the second, wider set instead (torchkiln.examples.zoo.CPU_WAVE2: 55 real models at small
inputs, sized for a CPU; `pip install -e .[zoo]` brings torchvision and timm). The table is Markdown.
Usage: python scripts/zoo.py [--device cuda] [--models resnet50,bert-base | --cpu-wave2] [--json out.json]
"""
from __future__ import annotations

import argparse
import collections
import copy
import json
import re
import time
import traceback
import warnings

import torch

import torchkiln
from torchkiln.compiler import compile_with_report
from torchkiln.examples.zoo import CPU_WAVE2, find_zoo_model, import_torchvision, load_zoo_model, source_unavailable


MODELS = ("resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "densenet121", "vit_b_16",
          "convnext_tiny", "bert-base", "gpt2")  # torchkiln.examples.zoo builds them


def _flatten(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in _flatten(out[k])]
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _flatten(o)]
    return []


def run(name: str, device: torch.device) -> dict:
    torch.manual_seed(0)
    zoo_model = find_zoo_model(name)
    model = load_zoo_model(zoo_model, device)  # random weights, batch norms calibrated
    example = [x.to(device) for x in zoo_model.inputs(1)]
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        reference = _flatten(model(*example))  # true fp32, as torchkiln's fp32 engines compute
    start = time.perf_counter()
    compiled, report = compile_with_report(model, [torchkiln.Input.from_tensor(x) for x in example],
                                           enabled_precisions={torch.float32})
    seconds = time.perf_counter() - start
    with torch.no_grad():
        outputs = _flatten(compiled(*example))
    err = max((o.double() - r.double()).abs().max().item() for o, r in zip(outputs, reference))
    scale = max(r.double().abs().max().item() for r in reference)
    eager_err = _eager_fp32_error(model, example, reference)
    engine_ops = sum(len(b.ops) for b in report.blocks if b.target == "engine")
    torch_ops = sum(len(b.ops) for b in report.blocks if b.target == "torch")
    return {"model": name, "converted": engine_ops / max(engine_ops + torch_ops, 1),
            "engines": report.num_engine_blocks, "torch_blocks": report.num_torch_blocks,
            "max_abs_error": err, "max_abs_ref": scale, "rel_error": err / scale if scale else float(err > 0),
            "compile_s": seconds, "eager_fp32_rel_error": eager_err / scale if eager_err is not None else None,
            "passes": err <= 1e-4 * scale, "fallback": report.fallback_ops, "reasons": _reasons(report)}


def _eager_fp32_error(model, example: list, reference: list) -> float | None:
    """Max abs difference of eager fp32 from eager fp64 (a random-weight network can amplify rounding past the
    1e-4 tolerance by itself); None where the model does not run in fp64."""
    try:
        with torch.no_grad():
            exact = _flatten(copy.deepcopy(model).double()(*[x.double() if x.is_floating_point() else x
                                                              for x in example]))
        return max((e - r.double()).abs().max().item() for e, r in zip(exact, reference))
    except Exception:  # an op without a float64 kernel: no estimate
        return None


def _reasons(report) -> dict[str, int]:
    """'op: why (first detail)' -> how many of its nodes stay in PyTorch for that reason, most frequent first."""
    counts = collections.Counter((f.op, f.reason.value) for b in report.blocks for f in b.fallback)
    details: dict[tuple[str, str], str] = {}
    for f in (f for b in report.blocks for f in b.fallback if f.detail and f.detail != f.op):
        details.setdefault((f.op, f.reason.value), re.sub(r"\S*site-packages/", "", f.detail)[:100])
    return {f"{op}: {why}" + (f" (e.g. {details[op, why]})" if (op, why) in details else ""): n
            for (op, why), n in counts.most_common()}


def _why(row: dict) -> str:
    """The table's last column: the error, or the reasons a model is not one engine."""
    if "error" in row:
        return f"ERROR {row['error']}"
    if row["engines"] == 1 and row["torch_blocks"] == 0:
        return ""
    if not row["reasons"]:
        return "no fallback ops (engine blocks split by plumbing)" if row["engines"] > 1 else "no engine"
    return "; ".join(f"{reason} x{n}" for reason, n in list(row["reasons"].items())[:4]) + (
        f"; +{len(row['reasons']) - 4} more" if len(row["reasons"]) > 4 else "")


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def markdown_table(rows: list[dict]) -> str:
    """The zoo's results as a Markdown table."""
    lines = ["| model | converted | engines | torch blocks | rel err | tol ok | eager fp32 rel err | compile s "
             "| why not one engine |", "| --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |"]
    for r in rows:
        why = " ".join(_why(r).split()).replace("|", "\\|")
        if "error" in r:
            lines.append(f"| {r['model']} | - | - | - | - | - | - | - | {why} |")
            continue
        lines.append(f"| {r['model']} | {r['converted']:.1%} | {r['engines']} | {r['torch_blocks']} | "
                     f"{r['rel_error']:.2e} | {r['passes']} | {_fmt(r.get('eager_fp32_rel_error'))} | "
                     f"{r['compile_s']:.1f} | {why} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--cpu-wave2", action="store_true", help="run the CPU wave-2 models instead of --models")
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    if source_unavailable("torchvision") is None:
        import_torchvision()  # first: transformers and timm import torchvision, which needs it with a CPU torch
    device = torch.device(args.device)
    rows = []
    names = CPU_WAVE2 if args.cpu_wave2 else args.models.split(",")
    for name in names:
        try:
            rows.append(run(name, device))
        except Exception as e:  # one model's failure must not hide the others' results
            traceback.print_exc()
            rows.append({"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        print(json.dumps(rows[-1]), flush=True)
    print("\n" + markdown_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
