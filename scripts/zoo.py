"""The full-size model zoo (run on a GPU machine with torchvision, timm and transformers installed).

For each model: compile with torchkiln (fp32), then report the fraction of ops converted (engine ops over all
ops), the engine and torch block counts, max abs error against eager relative to max|eager|, and compile time.
Usage: python scripts/zoo.py [--device cuda] [--models resnet50,bert-base] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
import warnings

import torch

import torchkiln
from torchkiln.compiler import compile_with_report
from torchkiln.examples.zoo import find_zoo_model, load_zoo_model


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
    engine_ops = sum(len(b.ops) for b in report.blocks if b.target == "engine")
    torch_ops = sum(len(b.ops) for b in report.blocks if b.target == "torch")
    return {"model": name, "converted": engine_ops / max(engine_ops + torch_ops, 1),
            "engines": report.num_engine_blocks, "torch_blocks": report.num_torch_blocks,
            "max_abs_error": err, "max_abs_ref": scale, "rel_error": err / scale if scale else float(err > 0),
            "compile_s": seconds,
            "passes": err <= 1e-4 * scale, "fallback": report.fallback_ops}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--json")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    device = torch.device(args.device)
    rows = []
    for name in args.models.split(","):
        try:
            rows.append(run(name, device))
        except Exception as e:  # one model's failure must not hide the others' results
            traceback.print_exc()
            rows.append({"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
        print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'model':20} {'converted':>9} {'engines':>7} {'torch':>5} {'rel err':>9} {'tol ok':>6} {'compile s':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:20} ERROR {r['error']}")
            continue
        print(f"{r['model']:20} {r['converted']:9.1%} {r['engines']:7d} {r['torch_blocks']:5d} "
              f"{r['rel_error']:9.2e} {str(r['passes']):>6} {r['compile_s']:9.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
