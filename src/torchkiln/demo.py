"""The main job on a bundled example: compile a model, compare it with eager PyTorch."""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

from torchkiln.compiler import compile
from torchkiln.examples import MLP, SmallResNet
from torchkiln.settings import Input, as_device

MODELS: dict[str, tuple[Callable[[], torch.nn.Module], tuple[int, ...]]] = {
    "resnet": (SmallResNet, (1, 3, 224, 224)),
    "mlp": (MLP, (32, 64)),
}


@dataclasses.dataclass(frozen=True)
class DemoResult:
    model: str
    device: str
    compile_seconds: float
    eager_ms: float
    engine_ms: float
    max_abs_error: float
    max_abs_reference: float

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.engine_ms


def _median_ms(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def run_demo(model_name: str = "resnet", device: str = "cpu", iters: int = 20, seed: int = 0) -> DemoResult:
    torch.manual_seed(seed)
    factory, shape = MODELS[model_name]
    dev = as_device(device)
    model = factory().eval().to(dev)
    x = torch.randn(shape, device=dev)
    start = time.perf_counter()
    compiled = compile(model, inputs=[Input(shape)], enabled_precisions={torch.float32}, device=dev)
    compile_seconds = time.perf_counter() - start
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        reference = model(x)  # true fp32, as the engine computes
        out = compiled(x)
        eager_ms = _median_ms(lambda: model(x), dev, iters)
        engine_ms = _median_ms(lambda: compiled(x), dev, iters)
    return DemoResult(model_name, str(dev), compile_seconds, eager_ms, engine_ms,
                      (out - reference).abs().max().item(), reference.abs().max().item())
