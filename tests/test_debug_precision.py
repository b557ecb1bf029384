"""The layer-wise numeric debugger and precision safety (issue 17): against eager on real numbers."""
import inspect
import logging
import os
import runpy
import subprocess
import sys

import pytest
import torch

import torchkiln
from harness import assert_matches_eager
from torchkiln.compiler import compile_with_report

FP16_COSINE = 0.999
FP16_RTOL = 1e-2  # fp16: max abs error <= 1e-2 x max|eager|


class Overflows(torch.nn.Module):
    """x*x with x ~ 300 leaves fp16's range (65504) before the LayerNorm brings it back."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(16, 16)
        self.ln = torch.nn.LayerNorm(16)

    def forward(self, x):
        y = self.fc(x) * 300
        z = y * y  # the overflow
        return self.ln(z) + 1


class Cancels(torch.nn.Module):
    """(x + 1000) - 1000: fp16's spacing at 1000 is 0.5, so the sum has lost x's digits before the difference."""

    def forward(self, x):
        return ((x + 1000.0) - 1000.0) * 2


def _line(cls: type, text: str) -> int:
    lines, start = inspect.getsourcelines(cls)
    return start + next(i for i, line in enumerate(lines) if text in line)


def _fp16_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert torch.isfinite(out).all()
    cosine = torch.nn.functional.cosine_similarity(out.double().flatten(), ref.double().flatten(), dim=0).item()
    assert cosine >= FP16_COSINE, cosine
    err = (out.double() - ref.double()).abs().max().item()
    assert err <= FP16_RTOL * ref.abs().max().item(), err


def _fp16(model, shape, **options):
    return compile_with_report(model, [torchkiln.Input(shape)], enabled_precisions={torch.float16},
                               backend="reference", **options)


def test_fp32_every_layer_matches_eager_and_names_its_node_and_line():
    model = Overflows().eval()
    x = torch.randn(4, 16)
    report = torchkiln.debug_precision(model, [x], enabled_precisions={torch.float32})
    assert report.precision == torch.float32 and report.first_bad is None
    assert [r.kind for r in report.rows] == ["matrix_multiply", "elementwise", "elementwise", "normalization",
                                             "elementwise"]
    assert all(r.relative <= 1e-4 and r.cosine >= 1 - 1e-9 for r in report.rows)
    square = report.rows[2]
    assert square.node.startswith("aten::mul")
    assert square.source == f"test_debug_precision.py:{_line(Overflows, 'z = y * y')}"
    (out,) = report.outputs
    ref = model(x)
    assert out.max_abs <= 1e-4 * ref.abs().max().item() and out.max_ref == pytest.approx(ref.abs().max().item())
    text = str(report)
    assert "first layer past the tolerance: none" in text and "aten::layer_norm" in text


def test_fp16_finds_the_first_layer_that_overflows():
    report = torchkiln.debug_precision(Overflows().eval(), [torchkiln.Input((4, 16))], backend="reference",
                                       precision_safety=False)
    bad = report.first_bad
    assert bad is not None and bad.node.startswith("aten::mul") and bad.index == 2
    assert bad.source.endswith(f":{_line(Overflows, 'z = y * y')}") and "inf where float32 is finite" in bad.overflow
    assert all(r.relative < 1e-2 for r in report.rows[:2])  # the layers before it are fine
    assert report.outputs[0].max_abs == float("inf")
    assert f"first layer past the tolerance: #2 {bad.name!r}" in str(report)


def test_fp16_overflow_without_safety_gives_nan_and_with_it_matches_eager(caplog):
    model = Overflows().eval()
    x = torch.randn(4, 16)
    unsafe, report = _fp16(model, (4, 16), precision_safety=False)
    assert not torch.isfinite(unsafe(x)).all() and report.fp32_layers == ()
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        safe, report = _fp16(model, (4, 16))
    _fp16_close(safe(x), model(x))
    (kept,) = report.fp32_layers
    assert kept.node.startswith("aten::mul") and kept.reason.startswith("overflows")
    assert "kept in float32 by precision calibration: 1 layer" in str(report)
    assert any(kept.layer in r.getMessage() and "overflows" in r.getMessage() for r in caplog.records)
    after = torchkiln.debug_precision(model, [x], backend="reference")
    assert after.first_bad is None and after.rows[2].kept_fp32.startswith("overflows")
    assert after.rows[2].dtype == torch.float32 and after.rows[1].dtype == torch.float16


def test_convert_method_to_engine_is_calibrated_too():
    model = Overflows().eval()
    x = torch.randn(4, 16)
    for safety in (False, True):
        engine = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input((4, 16))],
                                                    enabled_precisions={torch.float16}, backend="reference",
                                                    precision_safety=safety)
        out = torchkiln.embed_engine_in_new_module(engine)(x)
        if safety:
            _fp16_close(out, model(x))
        else:
            assert not torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cancellation_keeps_the_sum_it_reads_in_fp32(dtype):
    model = Cancels()
    x = torch.randn(4, 8)
    options = dict(enabled_precisions={dtype}, backend="reference", min_block_size=1)
    unsafe, _ = compile_with_report(model, [torchkiln.Input((4, 8))], precision_safety=False, **options)
    assert (unsafe(x) - model(x)).abs().max() > 0.1  # fp16 and bf16 lose x's digits next to 1000
    safe, report = compile_with_report(model, [torchkiln.Input((4, 8))], **options)
    assert sorted(f.node.split("(")[0] for f in report.fp32_layers) == ["aten::add", "aten::sub"]
    assert_matches_eager(safe(x), model(x))


def test_an_engine_after_a_pytorch_block_is_calibrated_on_its_own_inputs():
    class Split(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)
            self.ln = torch.nn.LayerNorm(16)

        def forward(self, x):
            y = torch.relu(self.fc(x) * 300)  # relu runs in PyTorch: the second engine reads its result
            return self.ln(y * y) + 1

    model = Split().eval()
    x = torch.randn(4, 16)
    compiled, report = _fp16(model, (4, 16), torch_executed_ops=["aten::relu"], min_block_size=1)
    assert report.num_engine_blocks == 2
    (kept,) = report.fp32_layers
    assert kept.engine == "Split_1" and kept.node.startswith("aten::mul")
    _fp16_close(compiled(x), model(x))


def test_dynamic_shapes():
    model = Overflows().eval()
    spec = torchkiln.Input(min_shape=(1, 16), opt_shape=(4, 16), max_shape=(8, 16))
    report = torchkiln.debug_precision(model, [spec], backend="reference", precision_safety=False)
    assert report.first_bad.node.startswith("aten::mul") and report.first_bad.index == 2
    compiled, partition = compile_with_report(model, [spec], enabled_precisions={torch.float16},
                                              backend="reference")
    assert len(partition.fp32_layers) == 1
    for n in (1, 8):
        x = torch.randn(n, 16)
        _fp16_close(compiled(x), model(x))


def test_user_calibration_inputs_are_used():
    class Square(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x * x, dim=-1) * 3

    model = Square()
    big = torch.randn(2, 8) * 400  # random N(0, 1) inputs do not overflow x*x; these do
    _, report = _fp16(model, (2, 8))
    assert report.fp32_layers == ()
    compiled, report = _fp16(model, (2, 8), calibration_inputs=[big])
    assert [f.node.split("(")[0] for f in report.fp32_layers] == ["aten::mul"]
    _fp16_close(compiled(big), model(big))
    with pytest.raises(ValueError, match=r"calibration_inputs\[0\]: expected a tuple of 1 arguments"):
        _fp16(model, (2, 8), calibration_inputs=[(big, big)])


def test_plot_is_skipped_with_a_message_without_matplotlib(tmp_path, caplog):
    path = tmp_path / "errors.png"
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        report = torchkiln.debug_precision(Cancels(), [torchkiln.Input((2, 4))], backend="reference",
                                           min_block_size=1, plot=path)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert not path.exists() and any("matplotlib is not installed" in r.getMessage() for r in caplog.records)
    else:
        assert path.stat().st_size > 0
    assert report.rows


def _run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(os.path.dirname(__file__), "..", "src"))
    return subprocess.run([sys.executable, "-m", "torchkiln", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_cli_debug_precision(tmp_path):
    path = str(tmp_path / "m.ts")
    torch.jit.save(torch.jit.script(Overflows().eval()), path)
    done = _run_cli("debug-precision", path, "--input", "4,16", "--no-precision-safety")
    assert done.returncode == 0, done.stderr
    assert "first layer past the tolerance: #2 'aten::mul" in done.stdout and "inf where float32" in done.stdout
    done = _run_cli("debug-precision", str(tmp_path / "missing.ts"), "--input", "4,16")
    assert done.returncode == 2 and done.stderr.startswith("torchkiln debug-precision: error: ")
    assert len(done.stderr.strip().splitlines()) == 1


def test_tutorial_runs(tmp_path):
    """docs/debugging_precision.md's code, saved as a file (so TorchScript sees its source) and run."""
    doc = os.path.join(os.path.dirname(__file__), "..", "docs", "debugging_precision.md")
    blocks = [b.split("```", 1)[0] for b in open(doc).read().split("```python\n")[1:]]
    assert len(blocks) == 3
    path = tmp_path / "tutorial.py"
    path.write_text("\n".join(blocks))
    namespace = runpy.run_path(str(path))
    assert namespace["bad"].source == "tutorial.py:13"


def test_quantized_layers_show_their_scales_and_the_kept_one_its_error():
    from test_quantization import Offset

    model = Offset().eval()
    x = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    report = torchkiln.debug_precision(model, [x], enabled_precisions={torch.int8}, calibration_inputs=[x])
    text = str(report)
    assert report.precision == torch.int8 and "in int8 against eager float32" in text
    convolutions = [r for r in report.rows if r.kind == "convolution"]
    assert [bool(r.kept_fp32) for r in convolutions] == [True, False]
    assert "quantized output error" in convolutions[0].kept_fp32 and not convolutions[0].quantized
    assert convolutions[1].quantized.startswith("int8: input scale ") and "weight scales" in convolutions[1].quantized
    assert convolutions[1].quantized in text and report.first_bad is None
