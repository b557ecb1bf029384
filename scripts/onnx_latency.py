"""Latency of the tiny BERT and the ResNet example, batch 1, 2 threads: ONNX Runtime (the exported network)
vs. torchkiln's reference executor vs. eager PyTorch; median of 50 runs after warm-up. Not a test."""
from __future__ import annotations

import statistics
import time
import warnings

import onnxruntime as ort
import torch
import transformers

import torchkiln
from torchkiln.examples import SmallResNet
from torchkiln.onnx_export import network_to_onnx
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.executor import ReferenceExecutor

THREADS, RUNS = 2, 50


class LastHiddenState(torch.nn.Module):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.model(ids, attention_mask=mask).last_hidden_state


def median_ms(fn) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def measure(name: str, model: torch.nn.Module, example: list[torch.Tensor]) -> None:
    model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engine = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input.from_tensor(t) for t in example])
    net = Engine.deserialize(engine).network
    executor = ReferenceExecutor(net, torch.device("cpu"))
    feeds = {t.name: x.numpy() for t, x in zip(net.inputs, example)}
    with torch.inference_mode():
        results = {"eager": median_ms(lambda: model(*example)),
                   "reference executor": median_ms(lambda: executor.run(example))}
    for opset in (21, 23):
        options = ort.SessionOptions()
        options.intra_op_num_threads = THREADS
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = ort.InferenceSession(network_to_onnx(net, opset).SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        results[f"onnxruntime opset {opset}"] = median_ms(lambda: session.run(None, feeds))
    print(f"{name}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in results.items()))


def main() -> None:
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, max_position_embeddings=64)
    ids, mask = torch.randint(0, 1000, (1, 16)), torch.ones(1, 16, dtype=torch.long)
    measure("tiny BERT (1x16)", LastHiddenState(transformers.BertModel(config)), [ids, mask])
    measure("SmallResNet (1x3x64x64)", SmallResNet(), [torch.randn(1, 3, 64, 64)])


if __name__ == "__main__":
    main()
