"""One runtime (issue 25): a Python process that finds the built C++ runtime library loads it, and the library's
kernel runs every engine call that a recorded tape fits, with the Python runtime's bits; every other call (an engine
of dynamic shapes or with no tape, a bad input, a meta tensor, a step profiler's call) goes to the package's kernel,
which raises its own errors. TORCHKILN_NATIVE_RUNTIME=0 keeps the library out."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest
import torch
from test_cpp_runtime import RUN_SECONDS, _calibrated, _Cnn, assert_bitwise, cpp

import torchkiln

__all__ = ["cpp"]  # test_cpp_runtime's fixture: the runtime library, built once

_HOSTED = """
import sys, torch
import torchkiln
from torchkiln.errors import EngineInputError
from torchkiln.runtime import execute_op
from torchkiln.runtime.profile import StepProfiler

folder = sys.argv[1]
kernels = [line for line in torch._C._dispatch_dump("torchkiln::execute_engine").splitlines()
           if line.startswith(("CompositeExplicitAutograd", "Autograd"))]
assert execute_op.HOSTED and len(kernels) == 2 and all("op.cpp" in k for k in kernels), kernels
modules = {name: torchkiln.load(f"{folder}/{name}.ts") for name in ("static", "dynamic", "untaped")}
inputs = torch.load(f"{folder}/inputs.pt")
outputs = {name: [modules[name](*xs) for xs in inputs[name]] for name in modules}
torch.save(outputs, f"{folder}/outputs.pt")
x = inputs["static"][0][0]
try:
    modules["static"](x[:1])
    raise AssertionError("a batch the engine does not take ran")
except EngineInputError as e:  # the package's error, with its words
    assert "expected shape (2, 3, 32, 32), got (1, 3, 32, 32)" in str(e), e
blob = modules["static"]._c.getattr("_torchkiln_engine_0")
signature = modules["static"].code.split('"')[1]
meta = torch.ops.torchkiln.execute_engine([x.to("meta")], blob, signature)
assert meta[0].is_meta and meta[0].shape == outputs["static"][0].shape, meta
graded = modules["static"](x.clone().requires_grad_())
assert not graded.requires_grad and torch.equal(graded, outputs["static"][0])
with torch.inference_mode():  # outputs made in the caller's mode, as the package's are
    assert modules["static"](x).is_inference() and modules["dynamic"](*inputs["dynamic"][0]).is_inference()
with StepProfiler(warmup=0) as profiler:
    modules["static"](x)
assert len(profiler.profiles()) == 1 and profiler.profiles()[0].rows, profiler.profiles()
print("ok")
"""


class _Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))

    def forward(self, x):
        return self.layers(x)


def _saved(folder: pathlib.Path) -> dict[str, list[tuple[torch.Tensor, ...]]]:
    """Three compiled modules saved in `folder` (an engine of static shapes with a CPU tape, one of dynamic shapes
    with a tape, one with none) and the inputs each is called on, saved there too."""
    torch.manual_seed(0)
    cnn = _calibrated(_Cnn(), torch.randn(8, 3, 32, 32))
    mlp = _Mlp().eval()
    specs = {"static": (cnn, torchkiln.Input((2, 3, 32, 32)), True),
             "dynamic": (mlp, torchkiln.Input(min_shape=(1, 8), opt_shape=(3, 8), max_shape=(8, 8)), True),
             "untaped": (mlp, torchkiln.Input((3, 8)), False)}
    for name, (model, spec, taped) in specs.items():
        compiled = torchkiln.compile(model.eval(), inputs=[spec], backend="reference", native_tape=taped,
                                     min_block_size=1)
        torchkiln.save(compiled, str(folder / f"{name}.ts"))
    inputs = {"static": [(torch.randn(2, 3, 32, 32),) for _ in range(3)],
              "dynamic": [(torch.randn(3, 8),), (torch.randn(5, 8),)], "untaped": [(torch.randn(3, 8),)]}
    torch.save(inputs, folder / "inputs.pt")
    return inputs


def _run(script: str, library: pathlib.Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=RUN_SECONDS,
                          env={**os.environ, "TORCHKILN_RUNTIME_LIBRARY": str(library), **env})


def test_a_python_process_runs_fitting_calls_on_the_library_and_the_rest_on_the_package(cpp, tmp_path):
    inputs = _saved(tmp_path)
    done = _run(_HOSTED, cpp["library"], str(tmp_path), TORCHKILN_TAPE_LOG="1")
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-4000:]
    # the static engine's calls ran its tape (the library logs its runner's making once); the others did not
    assert done.stderr.count("runs tape") == 1 and "engine '_Cnn_0' runs tape 0 on cpu" in done.stderr, \
        done.stderr[-4000:]
    got = torch.load(tmp_path / "outputs.pt")
    for name, calls in inputs.items():
        module = torchkiln.load(str(tmp_path / f"{name}.ts"))  # this process: the package's kernel
        with torch.no_grad():
            assert_bitwise(got[name], [module(*xs) for xs in calls], name)
    assert got["static"][0].abs().max() > 0.1  # outputs that mean something


@pytest.mark.parametrize("setting", ["0", "1"])
def test_the_library_is_loaded_unless_the_setting_says_no(cpp, setting):
    done = _run("from torchkiln.runtime import execute_op; print(execute_op.HOSTED)", cpp["library"],
                TORCHKILN_NATIVE_RUNTIME=setting)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == str(setting == "1")


def test_a_library_built_against_another_torch_is_not_loaded(cpp, tmp_path):
    library = tmp_path / "libtorchkiln_runtime.so"
    shutil.copy(cpp["library"], library)
    assert pathlib.Path(f"{cpp['library']}.torch").read_text().strip() == torch.__version__.split("+")[0]
    pathlib.Path(f"{library}.torch").write_text("0.1.0\n")
    done = _run("from torchkiln.runtime import execute_op; print(execute_op.HOSTED)", library)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr[-3000:]
    assert "built against torch 0.1.0" in done.stderr
