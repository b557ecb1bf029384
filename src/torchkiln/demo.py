"""The main job on a bundled example: compile a model, compare it with eager PyTorch."""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from torchkiln.bench.timing import load_warning, relative_spread, summarize, time_interleaved
from torchkiln.compiler import compile
from torchkiln.examples import MLP, SmallResNet
from torchkiln.runtime.cpu_load import LoadMeter
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
    eager_ms: float  # medians
    engine_ms: float
    max_abs_error: float
    max_abs_reference: float
    threads: int = 1
    eager_spread: float = 0.0  # interquartile range over median
    engine_spread: float = 0.0
    warning: str | None = None  # why the timings are noisy (a loaded machine), or None

    @property
    def speedup(self) -> float:
        return self.eager_ms / self.engine_ms


def run_demo(model_name: str = "resnet", device: str = "cpu", iters: int = 20, seed: int = 0,
             threads: int | None = None) -> DemoResult:
    """Compile a bundled model and time it against eager: both on `threads` CPU threads (default: torch's number),
    interleaved in rounds (bench.timing), medians with their spread, and a warning where the machine was busy."""
    torch.manual_seed(seed)
    factory, shape = MODELS[model_name]
    dev = as_device(device)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        model = factory().eval().to(dev)
        x = torch.randn(shape, device=dev)
        start = time.perf_counter()
        compiled = compile(model, inputs=[Input(shape)], enabled_precisions={torch.float32}, device=dev)
        compile_seconds = time.perf_counter() - start
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            reference = model(x)  # true fp32, as the engine computes
            out = compiled(x)
            meter = LoadMeter().start()
            times = time_interleaved({"eager": lambda: model(x), "torchkiln": lambda: compiled(x)}, dev, iters, 3,
                                     rounds=min(5, iters))
            other_load = meter.stop()
    finally:
        torch.set_num_threads(before)
    eager, engine = summarize(times["eager"]), summarize(times["torchkiln"])
    return DemoResult(model_name, str(dev), compile_seconds, eager["p50"], engine["p50"],
                      (out - reference).abs().max().item(), reference.abs().max().item(), threads or before,
                      relative_spread(eager), relative_spread(engine),
                      load_warning(other_load, relative_spread(eager)) if dev.type == "cpu" else None)

