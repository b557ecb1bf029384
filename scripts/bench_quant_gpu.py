"""INT8 and FP8 against fp16 and fp32 on a GPU: torchkiln's cuda engine of each zoo model built four ways (fp32,
fp16, fp16 with int8, fp16 with fp8; the quantized builds calibrated on `--samples` random batches at the model's
shapes), timed side by side in one process, interleaved (`torchkiln.bench.timing.time_interleaved`, CUDA events), each
build's cosine against fp32 eager, and what its plan runs (its steps' kernel rows). Not a test.

Since the quantized builds compete with their fp16 build (docs/quantization.md), a quantized build that times
slower keeps its fp16 engine; the plan column shows which was kept. `--only-quantized` leaves float16 out of the
quantized builds' precisions, so that their quantized layers are kept (the other layers then run in float32).

    python scripts/bench_quant_gpu.py [--models bert-base,resnet50] [--batch 32] [--iters 100] [--only-quantized]
        [--samples 4]

The builder's calibration lines are shown (`--samples 16 --batch 32`: 512 images, and the seconds calibration took
on them).
"""
from __future__ import annotations

import argparse
import collections
import logging
import statistics
import time
import warnings

import torch

import torchkiln
from torchkiln.bench.timing import time_interleaved
from torchkiln.examples.zoo import find_zoo_model, load_zoo_model
from torchkiln.runtime.engine import Engine
from torchkiln.stitching.stitch import engine_attrs

# build label -> (its float precision, its quantized type or None)
PRECISIONS = {"fp32": (torch.float, None), "fp16": (torch.half, None), "int8": (torch.half, torch.int8),
              "fp8": (torch.half, torch.float8_e4m3fn)}


def plan_ops(module: torch.jit.ScriptModule, device: torch.device) -> str:
    """The kernel rows of every engine's plan for `device`, most frequent first."""
    ops: collections.Counter = collections.Counter()
    for attr in engine_attrs(module):
        engine = Engine.deserialize(getattr(module, attr).numpy().tobytes())
        plan = engine.plan_for(device)
        ops.update(plan.kernels[s.kernel].op for s in plan.steps if plan.kernels[s.kernel].op != "constant")
    return ", ".join(f"{op} {n}" for op, n in ops.most_common(4))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="bert-base,resnet50")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--only-quantized", action="store_true")
    parser.add_argument("--samples", type=int, default=4, help="calibration batches (of --batch inputs each)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.getLogger("torchkiln").setLevel(logging.ERROR)
    shown = logging.StreamHandler()  # the builder's calibration lines (how many samples, how long) alone
    shown.addFilter(lambda record: "calibrat" in record.getMessage() and record.levelno == logging.INFO)
    builder = logging.getLogger("torchkiln.builder")
    builder.setLevel(logging.INFO)
    builder.addHandler(shown)
    builder.propagate = False
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    rows = []
    for name in args.models.split(","):
        zoo = find_zoo_model(name)
        model = load_zoo_model(zoo, device)
        inputs = [x.to(device) for x in zoo.inputs(args.batch)]
        samples = [tuple(x.to(device) for x in zoo.inputs(args.batch)) for _ in range(args.samples)]
        with torch.no_grad():
            reference = model(*inputs).float().flatten()
        built, info = {}, {}
        for label, (floating, quant) in PRECISIONS.items():
            precisions = {floating} if quant is None else {quant} if args.only_quantized else {floating, quant}
            start = time.perf_counter()
            options = {} if quant is None else {"calibration_inputs": samples}
            compiled = torchkiln.compile(model, [torchkiln.Input.from_tensor(x) for x in inputs],
                                         enabled_precisions=precisions, **options)
            seconds = time.perf_counter() - start
            with torch.no_grad():
                out = compiled(*inputs)
            out = (out[0] if isinstance(out, (tuple, list)) else out).float().flatten()
            cosine = float(torch.nn.functional.cosine_similarity(out, reference, dim=0))
            built[label] = compiled
            info[label] = (cosine, seconds, plan_ops(compiled, device))
        with torch.no_grad():
            times = time_interleaved({k: (lambda c=c: c(*inputs)) for k, c in built.items()}, device, args.iters, 10)
        medians = {k: statistics.median(v) for k, v in times.items()}
        rows.append((name, medians, info))
        print(f"{name} batch {args.batch}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in medians.items()), flush=True)
    print(f"\n{torch.cuda.get_device_name(device)}, batch {args.batch}, median ms of {args.iters} interleaved calls; "
          f"speedup = fp16 / that build; cosine against fp32 eager")
    for name, medians, info in rows:
        for label, ms in medians.items():
            cosine, seconds, ops = info[label]
            print(f"  {name:12} {label:5} {ms:8.3f} ms  {medians['fp16'] / ms:5.2f}x  cosine {cosine:.5f}  "
                  f"build {seconds:5.1f} s  plan: {ops}")


if __name__ == "__main__":
    main()
