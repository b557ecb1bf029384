"""INT8 against fp32 on the CPU: torchkiln's onnxruntime engine of each model built twice (fp32, and int8 calibrated
on random samples at the model's shapes), timed side by side in one process, interleaved, on the same threads.

Models: a ResNet-style CNN (ResNet-18 as torchvision builds it, 224x224, batch norms made non-trivial) and a
BERT-style encoder (transformers' BertModel, 4 layers, hidden 256, sequence 128), at batch 1 and 8. Per model and
batch: the median latency of each build with half its interquartile range, the int8 speedup, the int8 output's
cosine against fp32, and /proc/loadavg before and after (other processes share the cores). Not a test.

The peer, timed in the same rounds ("ort-int8"): ONNX Runtime's own static quantization of the model, as a user
without torchkiln gets it: `torch.onnx.export`, `onnxruntime.quantization.quant_pre_process`, `quantize_static`
(QDQ, int8 weights per channel, uint8 activations, MinMax on the same calibration samples, its default operator
types), run in an ORT session with its default optimizations on the same threads.

    python scripts/bench_int8_cpu.py [--threads 2] [--runs 30] [--batches 1,8] [--models resnet18,bert] [--no-peer]
"""
from __future__ import annotations

import argparse
import io
import logging
import os
import statistics
import tempfile
import warnings
from collections.abc import Callable

import onnxruntime
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


def ort_static_int8(model: torch.nn.Module, example: list[torch.Tensor], samples: list[list[torch.Tensor]],
                    threads: int) -> Callable[..., torch.Tensor]:
    """ONNX Runtime's own static int8 quantization of the model (the module docstring's peer), as a callable."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    buffer = io.BytesIO()
    torch.onnx.export(model, tuple(example), buffer, dynamo=False, opset_version=17)
    names = [i.name for i in onnxruntime.InferenceSession(buffer.getvalue()).get_inputs()]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.feeds = iter([{n: x.numpy() for n, x in zip(names, xs)} for xs in samples])

        def get_next(self) -> dict | None:
            return next(self.feeds, None)

    with tempfile.TemporaryDirectory() as folder:
        fp32, ready, int8 = (os.path.join(folder, f"{n}.onnx") for n in ("fp32", "ready", "int8"))
        with open(fp32, "wb") as f:
            f.write(buffer.getvalue())
        quant_pre_process(fp32, ready)
        quantize_static(ready, int8, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = onnxruntime.InferenceSession(int8, options, providers=["CPUExecutionProvider"])
    first = [session.get_outputs()[0].name]
    return lambda *xs: torch.from_numpy(session.run(first, {n: x.numpy() for n, x in zip(names, xs)})[0])


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
    parser.add_argument("--peer", action=argparse.BooleanOptionalAction, default=True,
                        help="also time ONNX Runtime's own static quantization (the module docstring)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.getLogger("torchkiln").setLevel(logging.ERROR)
    rows = []
    for name in args.models.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            torch.manual_seed(0)
            model, example, sample = MODELS[name](batch)
            model.eval()
            samples = [sample() for _ in range(args.calibration_samples)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                built = {"fp32": torchkiln.compile(model, example, ort_threads=args.threads),
                         "int8": torchkiln.compile(model, example, ort_threads=args.threads,
                                                   enabled_precisions={torch.int8},
                                                   calibration_inputs=[tuple(xs) for xs in samples])}
                if args.peer:
                    built["ort-int8"] = ort_static_int8(model, example, samples, args.threads)
            with torch.inference_mode():
                fp32 = built["fp32"](*example).flatten().double()
                cosine = {k: float(torch.nn.functional.cosine_similarity(fp32, fn(*example).flatten().double(), dim=0))
                          for k, fn in built.items() if k != "fp32"}
                before = loadavg()
                times = time_interleaved({k: (lambda fn=fn: fn(*example)) for k, fn in built.items()},
                                         torch.device("cpu"), args.runs, 3)
            stats = {k: (statistics.median(t), (percentile(t, 75) - percentile(t, 25)) / 2) for k, t in times.items()}
            rows.append((name, batch, stats, cosine, before, loadavg()))
            print(f"{name} batch {batch}: " + ", ".join(f"{k} {v[0]:.2f} ms" for k, v in stats.items()), flush=True)
    print(f"\nmedian ms ± half the interquartile range, {args.threads} threads, {args.runs} runs each, interleaved; "
          "speedup and cosine against fp32")
    peers = ["int8"] + (["ort-int8"] if args.peer else [])
    print(f"{'model':9} {'batch':>5} {'fp32 ms':>15} " + " ".join(f"{k + ' ms':>15} {'speedup':>7} {'cosine':>8}"
                                                           for k in peers) + "  loadavg before / after")
    for name, batch, stats, cosine, before, after in rows:
        f, fs = stats["fp32"]
        print(f"{name:9} {batch:5} {f:9.2f} ± {fs:4.2f} " + " ".join(
            f"{stats[k][0]:9.2f} ± {stats[k][1]:4.2f} {f / stats[k][0]:6.2f}x {cosine[k]:8.5f}" for k in peers)
            + f"  {before} / {after}")


if __name__ == "__main__":
    main()
