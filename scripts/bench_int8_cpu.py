"""INT8 against fp32 on the CPU: torchkiln's onnxruntime engine of each model built twice (fp32, and int8 calibrated
on random samples at the model's shapes), timed side by side in one process, interleaved, on the same threads.

Models: a ResNet-style CNN (ResNet-18 as torchvision builds it, 224x224, batch norms made non-trivial) and a
BERT-style encoder (transformers' BertModel, 4 layers, hidden 256, sequence 128), at batch 1 and 8. Per model and
batch: the median latency of each build with half its interquartile range, the int8 speedup, the int8 output's
cosine against fp32, and /proc/loadavg before and after (other processes share the cores). Not a test.

    python scripts/bench_int8_cpu.py [--threads 2] [--runs 30] [--batches 1,8] [--models resnet18,bert]
"""
from __future__ import annotations

import argparse
import logging
import statistics
import warnings
from collections.abc import Callable

import torch
import transformers

import torchkiln
from torchkiln.bench.timing import percentile, time_interleaved
from torchkiln.examples import resnet18
from torchkiln.examples.models import randomize_batch_norm
from torchkiln.examples.zoo import LastHiddenState


def resnet(batch: int) -> tuple[torch.nn.Module, list[torch.Tensor], Callable[[], list[torch.Tensor]]]:
    model = resnet18()
    randomize_batch_norm(model)
    return model, [torch.randn(batch, 3, 224, 224)], lambda: [torch.randn(batch, 3, 224, 224)]


def bert(batch: int) -> tuple[torch.nn.Module, list[torch.Tensor], Callable[[], list[torch.Tensor]]]:
    config = transformers.BertConfig(vocab_size=30522, hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                                     intermediate_size=1024, max_position_embeddings=512)

    def sample() -> list[torch.Tensor]:
        return [torch.randint(0, config.vocab_size, (batch, 128)), torch.ones(batch, 128, dtype=torch.long)]

    return LastHiddenState(transformers.BertModel(config)), sample(), sample


MODELS = {"resnet18": resnet, "bert": bert}


def loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--calibration-samples", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("torchkiln").setLevel(logging.ERROR)
    rows = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            torch.manual_seed(0)
            model, example, sample = MODELS[name](batch)
            model.eval()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = {"fp32": torchkiln.compile(model, example, ort_threads=args.threads),
                         "int8": torchkiln.compile(model, example, ort_threads=args.threads,
                                                   enabled_precisions={torch.int8},
                                                   calibration_inputs=[tuple(sample())
                                                                       for _ in range(args.calibration_samples)])}
            with torch.inference_mode():
                fp32, int8 = (built[k](*example).flatten().double() for k in ("fp32", "int8"))
                cosine = float(torch.nn.functional.cosine_similarity(fp32, int8, dim=0))
                before = loadavg()
                times = time_interleaved({k: (lambda fn=fn: fn(*example)) for k, fn in built.items()},
                                         torch.device("cpu"), args.runs, 3)
            stats = {k: (statistics.median(t), (percentile(t, 75) - percentile(t, 25)) / 2) for k, t in times.items()}
            rows.append((name, batch, stats, cosine, before, loadavg()))
            print(f"{name} batch {batch}: fp32 {stats['fp32'][0]:.2f} ms, int8 {stats['int8'][0]:.2f} ms", flush=True)
    print(f"\nmedian ms ± half the interquartile range, {args.threads} threads, {args.runs} runs each, interleaved")
    print(f"{'model':9} {'batch':>5} {'fp32 ms':>15} {'int8 ms':>15} {'speedup':>7} {'cosine':>8}  "
          "loadavg before / after")
    for name, batch, stats, cosine, before, after in rows:
        (f, fs), (i, is_) = stats["fp32"], stats["int8"]
        print(f"{name:9} {batch:5} {f:9.2f} ± {fs:4.2f} {i:9.2f} ± {is_:4.2f} {f / i:6.2f}x {cosine:8.5f}  "
              f"{before} / {after}")


if __name__ == "__main__":
    main()
