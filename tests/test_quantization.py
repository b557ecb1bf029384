"""Post-training quantization (int8 and fp8) through compile: trained models keep their accuracy, the calibration
cache is reused, a layer that quantizes badly stays in float (named with its error), Torch-TensorRT's ptq
calibrators work, QAT graphs keep their own scales, and ONNX Runtime runs quantized engines on integer kernels."""
from __future__ import annotations

import logging
import math

import onnx
import onnxruntime as ort
import pytest
import torch
from harness import assert_matches_eager

import torchkiln
from torchkiln.compiler import compile_with_report
from torchkiln.ir import layers as L
from torchkiln.onnx_export import network_to_onnx
from torchkiln.runtime.engine import Engine
from torchkiln.stitching.stitch import engine_attrs

I8, F8 = torch.int8, torch.float8_e4m3fn
MARGIN = 0.005  # quantized top-1 within half a point of fp32's (the issue's target)
CLASSES, TRAIN, TEST = 10, 2000, 2000


def _digits(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable 8x8 image set made here (nothing downloaded): ten fixed random templates under heavy noise, so
    that a small model reaches about 90% top-1, not 100% (a drop can show)."""
    templates = torch.randn(CLASSES, 1, 8, 8, generator=torch.Generator().manual_seed(1234))
    gen = torch.Generator().manual_seed(seed)
    y = torch.randint(0, CLASSES, (n,), generator=gen)
    return templates[y] + 2.5 * torch.randn(n, 1, 8, 8, generator=gen), y


class Cnn(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.Conv2d(16, 32, 3, padding=1, stride=2), torch.nn.ReLU())
        self.head = torch.nn.Sequential(torch.nn.Linear(32 * 16, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


class Transformer(torch.nn.Module):
    """One pre-norm encoder block over the image's 8 rows as tokens; the head reads every token."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(8, width)
        self.position = torch.nn.Parameter(torch.randn(8, width) * 0.1)
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv, self.proj = torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
        self.ff1, self.ff2 = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)
        self.head = torch.nn.Linear(8 * width, CLASSES)
        self.scale = 1 / math.sqrt(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(-1, 8, 8)) + self.position
        q, k, v = self.qkv(self.norm1(h)).chunk(3, -1)
        h = h + self.proj(torch.softmax(q @ k.transpose(1, 2) * self.scale, -1) @ v)
        h = h + self.ff2(torch.relu(self.ff1(self.norm2(h))))
        return self.head(h.flatten(1))


def _train(model: torch.nn.Module, steps: int = 60) -> torch.nn.Module:
    torch.manual_seed(0)
    x, y = _digits(TRAIN, 0)
    optimizer = torch.optim.Adam(model.parameters(), 1e-2)
    for step in range(steps):
        batch = slice(step * 100 % TRAIN, step * 100 % TRAIN + 100)
        loss = torch.nn.functional.cross_entropy(model(x[batch]), y[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


@pytest.fixture(scope="module")
def trained():
    return {"cnn": _train(Cnn()), "transformer": _train(Transformer())}


def _top1(model, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((torch.cat([model(x[i:i + BATCH]) for i in range(0, len(x), BATCH)]).argmax(1) == y).float().mean())


BATCH = 500


def _samples(n: int = 2) -> list[torch.Tensor]:
    x, _ = _digits(n * BATCH, 7)
    return list(x.split(BATCH))


def _network(module) -> list[L.Layer]:
    data = getattr(module, engine_attrs(module)[0])
    return Engine.deserialize(data.numpy().tobytes()).network.layers


@pytest.mark.parametrize("quant_type", [I8, F8], ids=["int8", "fp8"])
@pytest.mark.parametrize("name", ["cnn", "transformer"])
def test_trained_model_keeps_its_top1(trained, name, quant_type):
    model = trained[name]
    x, y = _digits(TEST, 1)
    fp32 = _top1(model, x, y)
    assert fp32 > 0.8, f"{name} trained to only {fp32:.3f}"
    compiled, report = compile_with_report(model, [torchkiln.Input((BATCH, 1, 8, 8))], enabled_precisions={quant_type},
                                           calibration_inputs=_samples())
    quantized = [layer for layer in _network(compiled) if isinstance(layer, L.DequantizeLayer)]
    assert quantized and not report.fp32_layers, report.fp32_layers
    top1 = _top1(compiled, x, y)
    assert top1 >= fp32 - MARGIN, f"{name} {quant_type}: top-1 {top1:.4f}, fp32 {fp32:.4f}"
