"""Dynamic against static shapes on the CPU backend: the CPU benchmark's BERT compiled once with static inputs
[1, 128] and once with dynamic batch 1..8 and sequence 16..128, timed interleaved in one process at [1, 128].

    python scripts/bench_dynamic_cpu.py [--threads 2] [--runs 30]

Prints each engine's build time, its error against eager, the median latencies and dynamic / static.
"""
from __future__ import annotations

import argparse
import time

import torch

import torchkiln
from bench_cpu import bert, time_interleaved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model, (ids, mask) = bert()
    model.eval()
    specs = {
        "static": [torchkiln.Input(ids.shape, dtype=torch.long), torchkiln.Input(mask.shape, dtype=torch.long)],
        "dynamic": [torchkiln.Input(min_shape=(1, 16), opt_shape=(1, 128), max_shape=(8, 128), dtype=torch.long)] * 2,
    }
    compiled = {}
    with torch.no_grad():
        ref = model(ids, mask)
        for name, inputs in specs.items():
            start = time.perf_counter()
            compiled[name] = torchkiln.compile(model, inputs)
            build = time.perf_counter() - start
            err = (compiled[name](ids, mask) - ref).abs().max().item() / ref.abs().max().item()
            print(f"{name:8s} build {build:5.1f} s   rel err {err:.1e}")
        ms = time_interleaved({name: (lambda c=c: c(ids, mask)) for name, c in compiled.items()}, args.runs)
    print(f"median ms: static {ms['static']:.3f}, dynamic {ms['dynamic']:.3f}; dynamic / static "
          f"{ms['dynamic'] / ms['static']:.3f}")


if __name__ == "__main__":
    main()
