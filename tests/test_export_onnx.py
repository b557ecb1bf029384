"""torchkiln.export_onnx and `python -m torchkiln export-onnx`: an engine (bytes, or a compiled module made of one
engine) written as an .onnx file that onnx.checker accepts and ONNX Runtime runs to the same outputs."""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from harness import assert_matches_eager

import torchkiln
from torchkiln.examples import SmallResNet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_onnx(path: str, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    model = onnx.load(path)
    onnx.checker.check_model(model, full_check=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {v.name: x.numpy() for v, x in zip(session.get_inputs(), inputs)}
    return [torch.from_numpy(np.asarray(o)) for o in session.run(None, feeds)]


def cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"))
    return subprocess.run([sys.executable, "-m", "torchkiln", *args], capture_output=True, text=True, env=env,
                          timeout=120)


class TwoOutputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 16), torch.nn.LayerNorm(16)

    def forward(self, x, y):
        h = torch.nn.functional.gelu(self.b(self.a(x)))
        return h.softmax(-1), (h * y).sum(-1)


def test_cli_exports_a_saved_module_of_one_engine(tmp_path):
    model = TwoOutputs().eval()
    example = [torch.randn(2, 8), torch.randn(2, 16)]
    compiled = torchkiln.compile(model, example, require_full_compilation=True)
    saved, out = str(tmp_path / "m.ts"), str(tmp_path / "m.onnx")
    torch.jit.save(compiled, saved)
    result = cli("export-onnx", saved, out)
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.no_grad():
        assert_matches_eager(tuple(run_onnx(out, example)), model(*example))


def test_export_of_engine_bytes_file_and_function(tmp_path):
    model = SmallResNet().eval()
    x = torch.randn(1, 3, 32, 32)
    data = torchkiln.convert_method_to_engine(model, "forward", [x])
    engine_file, out, out2 = tmp_path / "e.engine", str(tmp_path / "e.onnx"), tmp_path / "f.onnx"
    engine_file.write_bytes(data)
    torchkiln.export_onnx(str(engine_file), out)
    torchkiln.export_onnx(data, out2)
    with torch.no_grad():
        ref = model(x)
    for path in (out, str(out2)):
        [y] = run_onnx(path, [x])
        assert_matches_eager(y, ref)


def test_a_module_with_ops_outside_its_engine_is_refused(tmp_path):
    class Mixed(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * 2 + 1) - 3

    compiled = torchkiln.compile(Mixed(), [torch.randn(2, 3)], min_block_size=1, torch_executed_ops={"aten::relu"})
    with pytest.raises(ValueError, match="made of one engine"):
        torchkiln.export_onnx(compiled, tmp_path / "m.onnx")
    saved = str(tmp_path / "m.ts")
    torch.jit.save(compiled, saved)
    result = cli("export-onnx", saved, str(tmp_path / "m.onnx"))
    assert result.returncode == 2 and "made of one engine" in result.stderr
