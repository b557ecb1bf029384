"""The CPU benchmark: torchkiln against its peers, in one process, batch 1, fp32, the same threads for all.

Peers: eager PyTorch (inference mode), TorchScript (traced, frozen, torch.jit.optimize_for_inference),
torch.compile (default mode), ONNX Runtime on the model exported directly with torch.onnx.export (a failed
export is a row note), and torchkiln (default settings: the onnxruntime backend on the CPU).
Latencies are taken round-robin across the peers of a model (so a change of load on a shared machine falls on
all of them alike). Models: ResNet-18 and MobileNetV2 (built in code as torchvision builds them), transformers'
BertModel and GPT2Model (4 layers, hidden 256, sequence 128). Per peer: compile time, median latency, max abs error
against eager (and relative to max|eager|). Prints a table with ratios (vs eager, vs ONNX Runtime direct)
and the geomeans; writes JSON. Not a test.

    python scripts/bench_cpu.py [--threads 2] [--runs 50] [--models resnet18,bert] [--json bench_cpu.json]
"""
from __future__ import annotations

import argparse
import io
import json
import math
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
import torch
import transformers

import torchkiln
from torchkiln.bench.timing import time_interleaved as interleaved
from torchkiln.examples import mobilenet_v2, resnet18
from torchkiln.examples.zoo import LastHiddenState


def bert() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    config = transformers.BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=1024, max_position_embeddings=512)
    ids = torch.randint(0, config.vocab_size, (1, 128))
    return LastHiddenState(transformers.BertModel(config)), [ids, torch.ones(1, 128, dtype=torch.long)]


def gpt2() -> tuple[torch.nn.Module, list[torch.Tensor]]:
    config = transformers.GPT2Config(vocab_size=50257, n_embd=256, n_layer=4, n_head=4, n_positions=1024,
                                     use_cache=False)
    return LastHiddenState(transformers.GPT2Model(config)), [torch.randint(0, config.vocab_size, (1, 128))]


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, list[torch.Tensor]]]] = {
    "resnet18": lambda: (resnet18(), [torch.randn(1, 3, 224, 224)]),
    "mobilenet_v2": lambda: (mobilenet_v2(), [torch.randn(1, 3, 224, 224)]),
    "bert": bert,
    "gpt2": gpt2,
}
PEERS = ("eager", "torchscript", "torch.compile", "ort_direct", "torchkiln")


def torchscript(model: torch.nn.Module, example: list[torch.Tensor]) -> Callable[..., torch.Tensor]:
    traced = torch.jit.trace(model, tuple(example), check_trace=False)
    optimized = torch.jit.optimize_for_inference(torch.jit.freeze(traced.eval()))
    for _ in range(3):  # the profiling executor specializes over the first runs
        optimized(*example)
    return optimized


def compiled(model: torch.nn.Module, example: list[torch.Tensor]) -> Callable[..., torch.Tensor]:
    fn = torch.compile(model)
    fn(*example)  # compiles
    return fn


def ort_direct(model: torch.nn.Module, example: list[torch.Tensor], threads: int) -> Callable[..., torch.Tensor]:
    buffer = io.BytesIO()
    names = [f"input{i}" for i in range(len(example))]
    torch.onnx.export(model, tuple(example), buffer, input_names=names, output_names=["output"], opset_version=17,
                      dynamo=False)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(buffer.getvalue(), options, providers=["CPUExecutionProvider"])
    feeds = {n: x.numpy() for n, x in zip(names, example)}
    return lambda *_: torch.from_numpy(np.asarray(session.run(None, feeds)[0]))


def torchkiln_peer(model: torch.nn.Module, example: list[torch.Tensor], threads: int) -> Callable[..., torch.Tensor]:
    return torchkiln.compile(model, example, ort_threads=threads)


def prepare(name: str, peer: str, model: torch.nn.Module, example: list[torch.Tensor], ref: torch.Tensor,
            threads: int) -> tuple[dict[str, object], Callable[[], object] | None]:
    """The peer's compiled callable (None if it failed) and its row: compile time, error against eager."""
    row: dict[str, object] = {"model": name, "peer": peer}
    try:
        start = time.perf_counter()
        with warnings.catch_warnings(), torch.inference_mode(peer not in ("torch.compile", "torchkiln")):
            warnings.simplefilter("ignore")
            fn = {"eager": lambda: model,
                  "torchscript": lambda: torchscript(model, example),
                  "torch.compile": lambda: compiled(model, example),
                  "ort_direct": lambda: ort_direct(model, example, threads),
                  "torchkiln": lambda: torchkiln_peer(model, example, threads)}[peer]()
        row["compile_s"] = 0.0 if peer == "eager" else time.perf_counter() - start
        with torch.inference_mode():
            out = fn(*example)
            for _ in range(5):  # warm-up
                fn(*example)
        err = (out.double() - ref.double()).abs().max().item()
        row["max_abs_err"], row["rel_err"] = err, err / max(ref.abs().max().item(), 1e-30)
        return row, lambda: fn(*example)
    except Exception as e:  # a peer that cannot run this model is a row note, not the end of the benchmark
        row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}"
        traceback.print_exc(limit=2, file=sys.stderr)
    return row, None


def time_interleaved(fns: dict[str, Callable[[], object]], runs: int, rounds: int = 10) -> dict[str, float]:
    """Median ms of each callable over `runs` calls, taken round-robin (torchkiln.bench.timing.time_interleaved)."""
    with torch.inference_mode():
        times = interleaved(fns, torch.device("cpu"), runs, 0, rounds)
    return {peer: statistics.median(t) for peer, t in times.items()}


def table(rows: list[dict[str, object]]) -> str:
    by = {(r["model"], r["peer"]): r for r in rows}
    lines = [f"{'model':13} {'peer':14} {'compile s':>9} {'median ms':>10} {'vs eager':>8} {'vs ORT':>7} "
             f"{'max abs err':>11} {'rel err':>8}  note"]
    for r in rows:
        eager, direct = by.get((r["model"], "eager"), {}), by.get((r["model"], "ort_direct"), {})
        ms = r.get("ms")
        vs_eager = f"{eager['ms'] / ms:.2f}x" if ms and eager.get("ms") else "-"
        vs_ort = f"{direct['ms'] / ms:.2f}x" if ms and direct.get("ms") else "-"
        lines.append(f"{r['model']:13} {r['peer']:14} {r.get('compile_s', float('nan')):9.2f} "
                     f"{ms if ms else float('nan'):10.2f} {vs_eager:>8} {vs_ort:>7} "
                     f"{r.get('max_abs_err', float('nan')):11.2e} {r.get('rel_err', float('nan')):8.1e}  "
                     f"{r.get('note', '')}")
    for peer in PEERS[1:]:
        ratios = [by[(m, "eager")]["ms"] / by[(m, peer)]["ms"] for m in dict.fromkeys(r["model"] for r in rows)
                  if by.get((m, peer), {}).get("ms") and by.get((m, "eager"), {}).get("ms")]
        if ratios:
            geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
            lines.append(f"geomean speedup over eager, {peer}: {geo:.2f}x over {len(ratios)} models")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--json", default="bench_cpu.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    for name in args.models.split(","):
        torch.manual_seed(0)
        model, example = MODELS[name]()
        model.eval()
        with torch.inference_mode():
            ref = model(*example)
        fns, model_rows = {}, []
        for peer in args.peers.split(","):
            row, fn = prepare(name, peer, model, example, ref, args.threads)
            model_rows.append(row)
            if fn is not None:
                fns[peer] = fn
        medians = time_interleaved(fns, args.runs)
        for row in model_rows:
            row["ms"] = medians.get(row["peer"])
            print(f"{name}: {row}", file=sys.stderr, flush=True)
        rows += model_rows
    print(table(rows))
    with open(args.json, "w") as f:
        json.dump({"threads": args.threads, "runs": args.runs, "torch": torch.__version__,
                   "onnxruntime": ort.__version__, "torchkiln": torchkiln.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
