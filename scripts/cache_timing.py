"""Cold and warm compile times with the engine cache, each in a fresh process (docs/engine_cache.md's table).

For each model and round: a compile without the cache (cold), one that stores (cold, storing) and one that loads
what it stored (warm), each in a new Python process with an empty (then the same) $TORCHKILN_CACHE_DIR; CPU seconds
of the `compile` call, of the compiled module's first call and of both (time to the first result), the median of
the rounds (and the load average, as the machine may be shared).

    OMP_NUM_THREADS=1 python scripts/cache_timing.py [--rounds 3] [--device cuda] [resnet] [bert]

On `--device cuda` the engines are built for the GPU in float16 (timing tactics and compiling kernels: what a warm
rebuild skips), and the times are wall-clock seconds, with the GPU synchronized.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = ("resnet", "bert")

CHILD = """
import sys, time, torch, torchkiln
torch.manual_seed(0)
if sys.argv[1] == "resnet":  # the README demo's model
    from torchkiln.examples import SmallResNet
    model, spec = SmallResNet().eval(), torchkiln.Input((1, 3, 224, 224))
else:  # a BERT encoder: transformers, 4 layers, hidden 256, random weights (traced)
    import transformers
    from torchkiln.examples.zoo import LastHiddenState
    config = transformers.BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=1024, max_position_embeddings=128)
    model, spec = LastHiddenState(transformers.BertModel(config)).eval(), torchkiln.Input((1, 64), dtype=torch.int64)
cache, device = sys.argv[2] == "1", torch.device(sys.argv[3])
clock = time.perf_counter if device.type == "cuda" else time.process_time
options = {"enabled_precisions": {torch.float16}, "device": device} if device.type == "cuda" else {}
model = model.to(device)
start = clock()
compiled = torchkiln.compile(model, [spec], cache_built_engines=cache, reuse_cached_engines=cache, **options)
compiled_at = clock()
with torch.no_grad():
    compiled(spec.example(device))
if device.type == "cuda":
    torch.cuda.synchronize()
print(compiled_at - start, clock() - compiled_at)
"""


def _run(model: str, cache: bool, folder: str, device: str) -> tuple[float, float]:
    env = dict(os.environ, TORCHKILN_CACHE_DIR=folder, TRITON_CACHE_DIR=os.path.join(folder, "triton"),
               TORCHKILN_PROGRESS="0",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", CHILD, model, "1" if cache else "0", device], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return float(out[-2]), float(out[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # no `choices`: Python 3.11's argparse checks an empty list of models against them
    parser.add_argument("models", nargs="*", help="resnet, bert or both (the default)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = parser.parse_args()
    if set(args.models) - set(MODELS):
        parser.error(f"models are {', '.join(MODELS)}, got {', '.join(args.models)}")
    print(f"load average at the start: {_load()}")
    print("| model | cold | cold, storing | warm | warm / cold | first call: cold | first call: warm "
          "| compile + first call: cold | warm | warm / cold |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model in args.models or MODELS:
        runs: dict[str, list[tuple[float, float]]] = {"cold": [], "storing": [], "warm": []}
        for _ in range(args.rounds):
            with tempfile.TemporaryDirectory() as folder:
                runs["cold"].append(_run(model, False, folder, args.device))
                runs["storing"].append(_run(model, True, folder, args.device))
                runs["warm"].append(_run(model, True, folder, args.device))
        mid = {k: (statistics.median(c for c, _ in v), statistics.median(f for _, f in v),
                   statistics.median(c + f for c, f in v)) for k, v in runs.items()}
        print(f"| {model} | {mid['cold'][0]:.3f} s | {mid['storing'][0]:.3f} s | {mid['warm'][0]:.3f} s | "
              f"{mid['warm'][0] / mid['cold'][0]:.1%} | {mid['cold'][1]:.3f} s | {mid['warm'][1]:.3f} s | "
              f"{mid['cold'][2]:.3f} s | {mid['warm'][2]:.3f} s | {mid['warm'][2] / mid['cold'][2]:.1%} |")
    print(f"load average at the end: {_load()}, {os.cpu_count()} CPUs")


def _load() -> str:
    """The 1, 5 and 15 minute load averages (/proc/loadavg)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
