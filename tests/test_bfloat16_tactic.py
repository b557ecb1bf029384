"""bfloat16 on the CPU as a tactic (builder/bfloat16_tactic.py): asked for on the onnxruntime backend where the CPU
computes bfloat16 natively, each engine is built in float32 for ONNX Runtime and in bfloat16 on the reference
backend, and the faster is kept; either way the answer is eager's within bfloat16's precision."""
import logging

import pytest
import torch

import torchkiln
from torchkiln.builder import BuildSettings, bfloat16_tactic, engine_timing
from torchkiln.runtime.execute_op import engine_from_blob
from torchkiln.stitching.stitch import ENGINE_ATTR


class _Encoder(torch.nn.Module):
    """Linear layers with GELU and a layer norm: work whose matrix multiplies bfloat16 speeds up."""

    def __init__(self, width: int = 128):
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


def _compile(x):
    model = _Encoder().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input.from_tensor(x)], enabled_precisions={torch.bfloat16})
    return model, compiled, engine_from_blob(getattr(compiled, ENGINE_ATTR.format(0)))


def test_the_alternative_is_a_bfloat16_reference_build_only_where_it_applies(monkeypatch):
    monkeypatch.setattr(bfloat16_tactic, "cpu_computes_bfloat16", lambda: True)
    ort = BuildSettings(backend="onnxruntime")
    alternative = bfloat16_tactic.bfloat16_alternative(ort, torch.bfloat16)
    assert (alternative.backend, alternative.compute_dtype) == ("reference", torch.bfloat16)
    assert bfloat16_tactic.bfloat16_alternative(ort, torch.float16) is None
    assert bfloat16_tactic.bfloat16_alternative(BuildSettings(backend="reference"), torch.bfloat16) is None
    monkeypatch.setattr(bfloat16_tactic, "cpu_computes_bfloat16", lambda: False)
    assert bfloat16_tactic.bfloat16_alternative(ort, torch.bfloat16) is None


def test_bfloat16_is_timed_against_onnxruntime_and_the_kept_engine_matches_eager(monkeypatch, caplog):
    monkeypatch.setattr(bfloat16_tactic, "cpu_computes_bfloat16", lambda: True)
    x = torch.randn(8, 64, 128)
    with caplog.at_level(logging.INFO, logger="torchkiln.builder.engine_timing"):
        model, compiled, engine = _compile(x)
    [line] = [r.getMessage() for r in caplog.records if r.name == "torchkiln.builder.engine_timing"]
    assert "float32 on onnxruntime" in line and "bfloat16 on the reference backend" in line
    assert line.count("(kept)") == 1
    kept = "onnxruntime" if "onnxruntime" in line.split("(kept)")[0].split(",")[-1] else "reference"
    assert engine.backend == kept
    with torch.no_grad():
        out, ref = compiled(x), model(x)
    cos = torch.nn.functional.cosine_similarity(out.flatten().double(), ref.flatten().double(), dim=0)
    assert cos >= 0.999 and (out - ref).abs().max() <= 5e-2 * ref.abs().max()


def test_without_native_bfloat16_the_engine_is_onnxruntimes_float32(monkeypatch, caplog):
    monkeypatch.setattr(bfloat16_tactic, "cpu_computes_bfloat16", lambda: False)
    x = torch.randn(2, 16, 128)
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        model, compiled, engine = _compile(x)
    assert engine.backend == "onnxruntime"
    assert not [r for r in caplog.records if r.name == "torchkiln.builder.bfloat16_tactic"]
    assert "are built in float32" in caplog.text
    with torch.no_grad():
        assert (compiled(x) - model(x)).abs().max() <= 1e-4 * model(x).abs().max()


def test_a_whole_method_engine_takes_the_tactic_too(monkeypatch, caplog):
    monkeypatch.setattr(bfloat16_tactic, "cpu_computes_bfloat16", lambda: True)
    model, x = _Encoder().eval(), torch.randn(4, 32, 128)
    with caplog.at_level(logging.INFO, logger="torchkiln.builder.engine_timing"):
        data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input.from_tensor(x)],
                                                  enabled_precisions={torch.bfloat16})
    assert "(kept)" in caplog.text
    with torch.no_grad():
        out, ref = torchkiln.embed_engine_in_new_module(data)(x), model(x)
    cos = torch.nn.functional.cosine_similarity(out.flatten().double(), ref.flatten().double(), dim=0)
    assert cos >= 0.999 and (out - ref).abs().max() <= 5e-2 * ref.abs().max()


class _Erfcx(torch.nn.Module):
    """A linear layer and erfcx, whose ATen CPU kernel has no bfloat16 form."""

    def __init__(self, width: int = 64):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)

    def forward(self, x):
        return torch.special.erfcx(self.linear(x))


def test_a_bfloat16_build_that_fails_leaves_onnxruntimes_float32(monkeypatch, caplog):
    """The tactic's bfloat16 build is an alternative: where it fails (erfcx has no bfloat16 kernel in ATen), the
    float32 ONNX Runtime engine is kept, as without the tactic, and the answer is float32 eager's."""
    monkeypatch.setattr(bfloat16_tactic, "cpu_computes_bfloat16", lambda: True)
    torch.manual_seed(0)
    model, x = _Erfcx().eval(), torch.randn(4, 64)
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        compiled = torchkiln.compile(model, [torchkiln.Input.from_tensor(x)], enabled_precisions={torch.bfloat16},
                                     min_block_size=1)
    assert engine_from_blob(getattr(compiled, ENGINE_ATTR.format(0))).backend == "onnxruntime"
    assert "erfcx" in caplog.text
    with torch.no_grad():
        out, ref = compiled(x), model(x)
    assert (out - ref).abs().max() <= 1e-4 * ref.abs().max()


@pytest.mark.parametrize("winner", [0, 1], ids=["float32-kept", "bfloat16-kept"])
def test_the_float32_layers_logged_are_the_kept_engines(monkeypatch, caplog, winner):
    """Precision safety's list of layers kept in float32 (a tolerance made tiny here, so that there are some) is
    logged for the bfloat16 engine only where it is the one kept."""
    from torchkiln.builder import calibration

    monkeypatch.setattr(bfloat16_tactic, "cpu_computes_bfloat16", lambda: True)
    monkeypatch.setattr(engine_timing, "faster_engine", lambda engines, inputs, labels: winner)
    monkeypatch.setitem(calibration.TOLERANCE, torch.bfloat16, 1e-7)
    x = torch.randn(2, 16, 128)
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        _, _, engine = _compile(x)
    assert engine.backend == ("onnxruntime", "reference")[winner]
    assert ("kept in float32" in caplog.text) == bool(winner)
