"""The C++ runtime (csrc/, libtorchkiln_runtime.so, issue 25): modules compiled and saved here run in a C++ program
with no Python in its process (examples/cpp) and give the Python runtime's outputs bit for bit; every layer kind
runs in both; the C++ loader refuses the shared engine test vectors and hostile engines as the Python one does.

The modules are compiled on the reference backend: the C++ runtime runs every layer's ATen meaning, which is what
the reference backend runs in Python (an onnxruntime engine would run its ONNX Runtime sessions in Python)."""
from __future__ import annotations

import io
import json
import logging
import os
import pathlib
import random
import shutil
import subprocess
import sys
import time
from typing import List

import filelock
import pytest
import torch
from harness import assert_matches_eager, check_compiled, tiny_bert
from test_control_flow import ROWS, SEQUENCES, WINDOWS, DataIf, Flattened, LongSequences, RowSteps, WhileLoop, _layers
from test_engine_format import DATA_DEPENDENT_HOSTILE, SUB_NETWORK_HOSTILE, data_dependent_hostile
from test_engine_fuzz import MAX_FLOPS, MAX_MEMORY, fuzz_case, run_case
from test_onnx_export import ALL_CASES, carried_body, scalar
from test_runtime_backends import engine_of

import torchkiln
from torchkiln.errors import EngineInputError
from torchkiln.ir.network import Network
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.execute_op import engine_blob, reraise_engine_error
from torchkiln.runtime.format_description import describe

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = ROOT / "build" / "cpp-test"  # kept between runs: ninja rebuilds what changed
VECTORS = ROOT / "tests" / "engine_vectors"
RUN_SECONDS = 300


def _torch_prefix() -> str:
    return torch.utils.cmake_prefix_path


def _cmake(source: pathlib.Path, build: pathlib.Path, *defines: str) -> None:
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    for step in (["cmake", "-S", str(source), "-B", str(build), *generator, f"-DCMAKE_PREFIX_PATH={_torch_prefix()}",
                  *defines], ["cmake", "--build", str(build), "-j", "2"]):
        done = subprocess.run(step, capture_output=True, text=True, timeout=1200)
        assert done.returncode == 0, f"{' '.join(step)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"


@pytest.fixture(scope="session")
def cpp():
    """The runtime library, the engine checker and examples/cpp's run_module, built once per session."""
    missing = [tool for tool in ("cmake", "c++") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"building the C++ runtime needs {' and '.join(missing)}")
    if not pathlib.Path("/usr/include/rapidjson/reader.h").exists():
        pytest.skip("building the C++ runtime needs RapidJSON's headers (apt-get install rapidjson-dev)")
    BUILD.mkdir(parents=True, exist_ok=True)
    library = BUILD / "runtime" / "libtorchkiln_runtime.so"
    with filelock.FileLock(str(BUILD / "build.lock")):  # one build at a time (pytest -n: a session per worker)
        start = time.perf_counter()
        _cmake(ROOT / "csrc", BUILD / "runtime")
        _cmake(ROOT / "examples" / "cpp", BUILD / "example", f"-DTORCHKILN_RUNTIME={library}")
        logging.getLogger(__name__).info("C++ runtime and example built in %.0f s", time.perf_counter() - start)
    return {"library": library, "check": BUILD / "runtime" / "torchkiln_check_engine",
            "run": BUILD / "example" / "run_module"}


def _no_python_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def run_in_cpp(cpp, module: torch.jit.ScriptModule, args: tuple, tmp_path: pathlib.Path):
    """Save `module`, run it on `args` in examples/cpp's program, and return what it returned."""
    model, inputs, outputs = tmp_path / "model.pt", tmp_path / "inputs.pt", tmp_path / "outputs.pt"
    torch.jit.save(module, str(model))
    torch.save(tuple(args), inputs)
    done = subprocess.run([str(cpp["run"]), str(model), str(inputs), str(outputs)], capture_output=True, text=True,
                          timeout=RUN_SECONDS, env=_no_python_env())
    assert done.returncode == 0, done.stderr
    maps = subprocess.run(["ldd", str(cpp["run"])], capture_output=True, text=True).stdout
    assert "libpython" not in maps
    return torch.load(outputs, weights_only=False)  # our own file; dicts carry a type tag


def assert_bitwise(got, want, path: str = "out") -> None:
    """Equal structure, dtypes, shapes and bits (NaN where NaN)."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got).__name__}"
        assert got.dtype == want.dtype and got.shape == want.shape, f"{path}: {got.dtype}{list(got.shape)}"
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"{path}: {m}")
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), path
        for k in want:
            assert_bitwise(got[k], want[k], f"{path}[{k!r}]")
    else:
        assert isinstance(got, (list, tuple)) and len(got) == len(want), f"{path}: {type(got).__name__}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_bitwise(g, w, f"{path}[{i}]")


def _compile(model: torch.nn.Module, inputs, **settings) -> torch.jit.ScriptModule:
    return torchkiln.compile(model.eval(), inputs=inputs, backend="reference", **settings)


_BOTH_IN_ONE_PROCESS = """
import sys, torch
if sys.argv[2] == "library-first":
    torch.ops.load_library(sys.argv[1])
import torchkiln
if sys.argv[2] == "package-first":
    torch.ops.load_library(sys.argv[1])
def kernel(op):
    return [line for line in torch._C._dispatch_dump(op).splitlines()
            if line.startswith("CompositeExplicitAutograd") and "inactive" not in line]
active = kernel("torchkiln::execute_engine")
if sys.argv[2] == "library-first":  # the library's kernel runs what a tape fits, the package's kernel the rest
    assert len(active) == 1 and "op.cpp" in active[0], active
    assert "execute_op.py" in kernel("torchkiln::execute_engine_python")[0]
else:  # the library came too late: the package's kernel runs every call
    assert len(active) == 1 and "execute_op.py" in active[0], active
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
x = torch.randn(3, 8)
compiled = torchkiln.compile(model, inputs=[x], min_block_size=1)
with torch.no_grad():
    want = model(x)
    err = (compiled(x) - want).abs().max().item()
assert err <= 1e-4 * want.abs().max().item(), err
print("ok")
"""


@pytest.mark.parametrize("order", ["library-first", "package-first"])
def test_the_library_and_the_package_share_a_python_process(cpp, tmp_path, order):
    """A Python process may load the C++ runtime library before or after importing torchkiln: the ops are defined
    once; the library's kernel takes the calls a tape fits where it came first (tests/test_cpp_hosted.py), the
    package's kernels (its backends) run the others."""
    script = tmp_path / "both.py"
    script.write_text(_BOTH_IN_ONE_PROCESS)
    done = subprocess.run([sys.executable, "-W", "error::UserWarning:torch.library", str(script),
                           str(cpp["library"]), order], capture_output=True, text=True, timeout=RUN_SECONDS)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


def test_layer_kinds_json_is_current():
    """csrc/layer_kinds.json is what scripts/render_layer_kinds.py renders from the Python registry."""
    assert json.loads((ROOT / "csrc" / "layer_kinds.json").read_text()) == json.loads(json.dumps(describe()))


class _Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, stride=2), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
            torch.nn.AdaptiveAvgPool2d(1))
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        return self.head(torch.flatten(self.features(x), 1))


def _calibrated(model: torch.nn.Module, *args) -> torch.nn.Module:
    """Batch norms given the statistics of random data (meaningful outputs, not all-zero ones)."""
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(*args)
    return model.eval()


def test_cnn_runs_in_cpp_as_in_python(cpp, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    model = _calibrated(_Cnn(), torch.randn(8, 3, 32, 32))
    compiled = _compile(model, [torchkiln.Input((2, 3, 32, 32))])
    with torch.no_grad():
        want = compiled(x)
        assert_matches_eager(want, model(x))
    assert_bitwise(run_in_cpp(cpp, compiled, (x,), tmp_path), want)


def test_run_module_device_and_runs_options_run_and_save_outputs(cpp, tmp_path):
    """`--device cpu --runs N` moves the inputs (a no-op here), saves the first call's outputs and prints a latency
    median; a bad option is refused with the usage line."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    model = _calibrated(_Cnn(), torch.randn(8, 3, 32, 32))
    compiled = _compile(model, [torchkiln.Input((2, 3, 32, 32))])
    torch.jit.save(compiled, str(tmp_path / "m.pt"))
    torch.save((x,), tmp_path / "in.pt")
    done = subprocess.run([str(cpp["run"]), "--device", "cpu", "--runs", "3", str(tmp_path / "m.pt"),
                           str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], capture_output=True, text=True,
                          timeout=RUN_SECONDS, env=_no_python_env())
    assert done.returncode == 0, done.stderr
    words = done.stdout.split()
    assert words[words.index("latency_ms_median") + 1:] == [words[words.index("latency_ms_median") + 1], "runs", "3",
                                                            "device", "cpu"]
    assert float(words[words.index("latency_ms_median") + 1]) > 0
    with torch.no_grad():
        assert_bitwise(torch.load(tmp_path / "out.pt", weights_only=False), compiled(x))
    for bad in (["--runs", "x"], ["--speed", "1"]):
        refused = subprocess.run([str(cpp["run"]), *bad, str(tmp_path / "m.pt"), str(tmp_path / "in.pt")],
                                 capture_output=True, text=True, timeout=RUN_SECONDS, env=_no_python_env())
        assert refused.returncode == 2 and "usage: run_module" in refused.stderr, refused.stderr


def test_half_precision_engines_run_in_cpp_as_in_python(cpp, tmp_path):
    """fp16 bindings and weights (the reference backend runs them on the CPU) give the Python runtime's bits."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 4)).eval().half()
    x = torch.randn(3, 8).half()
    compiled = _compile(model, [torchkiln.Input((3, 8), dtype=torch.half)], enabled_precisions={torch.half})
    with torch.no_grad():
        want, eager = compiled(x), model(x)
    assert want.dtype == torch.half
    cosine = torch.nn.functional.cosine_similarity(want.double().flatten(), eager.double().flatten(), dim=0)
    assert cosine >= 0.999 and (want.float() - eager.float()).abs().max() <= 1e-2 * eager.float().abs().max()
    assert_bitwise(run_in_cpp(cpp, compiled, (x,), tmp_path), want)


def test_onnxruntime_engines_run_in_cpp_on_the_aten_meanings(cpp, tmp_path):
    """A module compiled on the CPU's default backend (onnxruntime): the C++ runtime runs its layers' ATen meanings,
    so it matches eager within fp32 tolerance rather than ONNX Runtime's bits."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 32, 32)
    model = _calibrated(_Cnn(), torch.randn(8, 3, 32, 32))
    compiled = torchkiln.compile(model, inputs=[torchkiln.Input((2, 3, 32, 32))], backend="onnxruntime")
    with torch.no_grad():
        assert_matches_eager(run_in_cpp(cpp, compiled, (x,), tmp_path), model(x))


def test_bert_with_dynamic_batch_and_sequence_runs_in_cpp_as_in_python(cpp, tmp_path):
    model = tiny_bert()
    spec = torchkiln.Input(min_shape=(1, 4), opt_shape=(2, 16), max_shape=(8, 64), dtype=torch.int64)
    compiled = _compile(model, [spec, spec])
    for batch, seq in [(1, 4), (3, 9), (8, 64)]:
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[0, seq // 2:] = 0
        args = (torch.randint(0, 1000, (batch, seq)), mask)
        with torch.no_grad():
            want = compiled(*args)
        assert_bitwise(run_in_cpp(cpp, compiled, args, tmp_path), want, f"{batch}x{seq}")


class _EngineAndTorch(torch.nn.Module):
    """Two engine blocks around a PyTorch block (aten::erfinv is kept in PyTorch by the settings)."""

    def __init__(self):
        super().__init__()
        self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

    def forward(self, x):
        y = torch.tanh(self.a(x)) * 0.5
        return self.b(torch.erfinv(y) + x).relu()


def test_module_with_engine_and_pytorch_blocks_runs_in_cpp_as_in_python(cpp, tmp_path):
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    compiled = _compile(_EngineAndTorch(), [torchkiln.Input((3, 8))], torch_executed_ops={"aten::erfinv"},
                        min_block_size=1)
    names = [n.kind() for n in compiled.graph.nodes()]
    assert names.count("torchkiln::execute_engine") + str(compiled.code).count("execute_engine") >= 2
    with torch.no_grad():
        want = compiled(x)
    assert_bitwise(run_in_cpp(cpp, compiled, (x,), tmp_path), want)


class _DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor):
        picked = x[x > 0]
        values, counts = torch.unique(y, return_counts=True)
        return picked.sum() * 2, picked * picked.size(0), torch.nonzero(y), values * counts


def test_data_dependent_sizes_run_in_cpp_as_in_python(cpp, tmp_path):
    """nonzero, x[mask] and unique in one engine: the C++ runtime binds their sizes when they run, as Python."""
    x, y = torch.randn(4, 5), torch.randint(-2, 3, (6,))
    compiled = _compile(_DataDependent(), [torchkiln.Input((4, 5)), torchkiln.Input((6,), dtype=torch.int64)],
                        min_block_size=1)
    assert str(compiled.code).count("execute_engine") == 1
    for args in ((x, y), (-x.abs(), torch.zeros(6, dtype=torch.int64))):  # other sizes, and empty ones
        with torch.no_grad():
            want = compiled(*args)
        assert_bitwise(run_in_cpp(cpp, compiled, args, tmp_path), want)


class _Nested(torch.nn.Module):
    def forward(self, x: tuple[torch.Tensor, torch.Tensor], u: torch.Tensor):
        a = torch.relu(x[0] + u) * 2.0
        return {"a": a, "pair": (torch.sigmoid(x[1]), [a - u, x[0] * x[1]])}, a.sum(1)


def test_nested_tuple_and_dict_outputs_run_in_cpp_as_in_python(cpp, tmp_path):
    torch.manual_seed(0)
    args = ((torch.randn(3, 6), torch.randn(3, 6)), torch.randn(3, 6))  # (a dict argument comes untyped from a file)
    spec = [(torchkiln.Input((3, 6)), torchkiln.Input((3, 6))), torchkiln.Input((3, 6))]
    compiled = _compile(_Nested(), spec, min_block_size=1)
    with torch.no_grad():
        want = compiled(*args)
    assert_bitwise(run_in_cpp(cpp, compiled, args, tmp_path), want)


class _Around(torch.nn.Module):
    """A program scripted around a compiled module: it calls it on each tensor of a list."""

    def __init__(self, compiled: torch.jit.ScriptModule) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, xs: List[torch.Tensor]) -> List[torch.Tensor]:
        return [self.compiled(x) for x in xs]


def test_a_module_scripted_around_a_compiled_one_runs_in_cpp_as_in_python(cpp, tmp_path):
    """`torch.jit.script` of a module holding the module `compile` returned (not only a loaded one), called on a
    Tensor[] in C++ (run_module types a list of tensors from the file as one)."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    compiled = _compile(mlp, [torchkiln.Input(min_shape=(1, 8), opt_shape=(2, 8), max_shape=(4, 8))])
    around = torch.jit.script(_Around(compiled))
    xs = [torch.randn(b, 8) for b in (1, 3, 4)]
    with torch.no_grad():
        want = around(xs)
        assert_bitwise(want, [compiled(x) for x in xs])
        torch.testing.assert_close(want, [mlp(x) for x in xs], rtol=0, atol=1e-4 * max(w.abs().max() for w in want))
    assert_bitwise(run_in_cpp(cpp, around, (xs,), tmp_path), want)


class _Engines(torch.nn.Module):
    """Engines called by the op itself, one per layer-kind case, each on its own inputs (held by the module: lists
    read from a file come untyped)."""

    def __init__(self, engines: List[torch.Tensor], inputs: List[List[torch.Tensor]]):
        super().__init__()
        self.engines, self.inputs = engines, inputs

    def forward(self) -> List[List[torch.Tensor]]:
        return [torch.ops.torchkiln.execute_engine(xs, e, "") for xs, e in zip(self.inputs, self.engines)]


_Engines.__annotations__ = {"inputs": List[List[torch.Tensor]]}  # a type object: a case may have no inputs


def test_every_layer_kind_runs_in_cpp_as_in_python(cpp, tmp_path):
    """Every case of every layer kind (the ONNX export's cases), as a reference engine run by the Python runtime
    and by the C++ one."""
    engines, inputs, want = [], [], []
    for name, build in ALL_CASES:
        net, xs = build(torch.Generator().manual_seed(0))
        engine = engine_of(net, "reference")
        engines.append(engine_blob(engine.serialize()))
        inputs.append(xs)
        want.append(engine.execute(xs))
    got = run_in_cpp(cpp, torch.jit.script(_Engines(engines, inputs)), (), tmp_path)
    for (name, _), g, w in zip(ALL_CASES, got, want):
        assert_bitwise(g, w, name)
    covered = {layer.KIND for _, build in ALL_CASES for layer in build(torch.Generator().manual_seed(0))[0].layers}
    assert covered == set(describe()["kinds"]), set(describe()["kinds"]) - covered


class _Calls(torch.nn.Module):
    """`module` called on each of `inputs` in one process (held by the module: lists read from a file come
    untyped)."""

    def __init__(self, module: torch.nn.Module, inputs: List[torch.Tensor]):
        super().__init__()
        self.module, self.inputs = module, inputs

    def forward(self) -> List[torch.Tensor]:
        return [self.module(x) for x in self.inputs]


class _WithStep(torch.nn.Module):
    """WhileLoop with its step held: a module of one input."""

    def __init__(self, module: torch.nn.Module, step: torch.Tensor):
        super().__init__()
        self.module = module
        self.register_buffer("step", step)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x, self.step)


def _plain(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """`module` as torch.jit.load gives it back: a scripted wrapper may hold that (not torchkiln's module class)."""
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


def _randn(*shapes: tuple, scale: float = 1.0, shift: float = 0.0) -> list[torch.Tensor]:
    return [torch.randn(shape) * scale + shift for shape in shapes]


# name -> (model, the compile's example, its input spec, the layer kind it makes, inputs taking every path)
CONTROL_FLOW = {
    "data-if": lambda: (DataIf(), [torch.randn(3, 6)], None, "conditional",  # y.sum() of either sign
                        _randn((3, 6), scale=4, shift=3) + _randn((3, 6), scale=4, shift=-3) + [torch.zeros(3, 6)]),
    "while-loop": lambda: (WhileLoop(), [torch.randn(4) * 8, torch.full((4,), 0.01)], None, "loop",
                           [torch.randn(4) * scale for scale in (0.1, 3.0, 100.0)]),  # no iteration, a few, many
    "for-over-a-dynamic-dim": lambda: (RowSteps(), [torch.randn(3, 8)], [ROWS], "loop", _randn((1, 8), (8, 8), (2, 8))),
    "if-on-a-dynamic-dim": lambda: (LongSequences(), [torch.randn(2, 64, 8)], [SEQUENCES], "conditional",
                                    _randn((2, 100, 8), (3, 40, 8), (1, 65, 8), (1, 64, 8), (4, 128, 8))),
    "if-on-a-dynamic-dim-reading-s0*s1": lambda: (Flattened(on_data=False), [torch.randn(2, 80)], [WINDOWS],
                                                  "conditional", _randn((2, 100), (2, 40), (4, 50), (3, 70))),
}


@pytest.mark.parametrize("name", sorted(CONTROL_FLOW))
def test_control_flow_runs_in_cpp_as_in_python(cpp, tmp_path, name):
    """A module whose one engine holds a conditional or loop layer (data-dependent or shape-only, over dynamic dims),
    run in C++ on inputs taking each path, gives the reference backend's bits; sub-networks are bound by the outer
    network's dims (a branch reading x.flatten(), s0*s1 elements)."""
    torch.manual_seed(0)
    model, example, spec, kind, xs = CONTROL_FLOW[name]()
    compiled, _ = check_compiled(model.eval(), example, inputs=spec, backend="reference", min_block_size=1)
    assert _layers(compiled, kind), name
    plain = _plain(compiled)
    if isinstance(model, WhileLoop):
        model, compiled, plain = (_WithStep(m, example[1]) for m in (model, compiled, plain))
    with torch.no_grad():
        want = [compiled(x) for x in xs]
        for w, x in zip(want, xs):
            assert_matches_eager(w, model(x))
    assert_bitwise(run_in_cpp(cpp, torch.jit.script(_Calls(plain, xs)), (), tmp_path), want)


def test_sub_network_bounds_are_checked_by_the_cpp_loader_as_by_the_python_one(cpp, tmp_path):
    """Nesting depth, the sub-networks a kind holds, their layers and signatures, and a loop's compute (its body's
    times max_trips): EngineFormatError with the Python loader's words."""
    paths = []
    for name in sorted(SUB_NETWORK_HOSTILE):
        paths.append(tmp_path / f"{name}.engine")
        paths[-1].write_bytes(SUB_NETWORK_HOSTILE[name][0]())
    outcomes, _ = check_in_cpp(cpp, paths, MAX_MEMORY, MAX_FLOPS)
    for name, path in zip(sorted(SUB_NETWORK_HOSTILE), paths):
        text = outcomes[str(path)][0]
        assert text.startswith("EngineFormatError: ") and SUB_NETWORK_HOSTILE[name][1] in text, (name, text)


def _pointwise_cases():
    """A reference engine per row of the pointwise tables (every unary, binary and activation op) on float32
    values with NaN, infinities and zeros."""
    from torchkiln.ir import pointwise as P

    x = torch.cat([torch.linspace(-4, 4, 29), torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan")])])
    y = torch.cat([torch.linspace(3, -2, 29), torch.tensor([2.0, -0.0, 1.0, float("inf"), 0.5])])
    for table, add in ((P.UNARY, lambda n, a, b, op: n.add_unary(a, op)),
                       (P.ELEMENTWISE, lambda n, a, b, op: n.add_elementwise(a, b, op)),
                       (P.ACTIVATION, lambda n, a, b, op: n.add_activation(a, op, 2.0, 0.5))):
        for op in table:
            n = Network(f"pointwise-{op.value}")
            a, b = n.add_input("a", torch.float32, (34,)), n.add_input("b", torch.float32, (34,))
            try:
                n.mark_output(add(n, a, b, op).get_output())
                engine = engine_of(n, "reference")
                xs = [x.nan_to_num(0.5), y] if "chebyshev" in op.value else [x, y]  # eager's of NaN is uninitialized
                want = engine.execute(xs)
            except Exception:  # the op takes no float32 values (bitwise ops)
                continue
            yield op.value, engine, xs, want


def test_every_pointwise_op_runs_in_cpp_as_in_python(cpp, tmp_path):
    cases = list(_pointwise_cases())
    blobs = [engine_blob(engine.serialize()) for _, engine, _, _ in cases]
    got = run_in_cpp(cpp, torch.jit.script(_Engines(blobs, [xs for _, _, xs, _ in cases])), (), tmp_path)
    assert len(cases) > 100
    for (name, _, _, want), g in zip(cases, got):
        assert_bitwise(g, want, name)


def _gather_engine(device: str) -> Engine:
    n = Network("gather")
    data, idx = n.add_input("data", torch.float32, (4, 3)), n.add_input("idx", torch.int64, (2,))
    n.mark_output(n.add_gather(data, idx, 0).get_output())
    return engine_of(n, "reference", device)


def _loop_engine(max_trips: int) -> Engine:
    """A loop of a given trip count, and true conditions, bounded by `max_trips`."""
    n = Network("loop")
    x, r, trips = (n.add_input("x", torch.float32, (4,)), n.add_input("r", torch.float32, (4,)),
                   n.add_input("trips", torch.int64, ()))
    n.mark_output(n.add_loop(trips, scalar(n, True), [x], [r], carried_body(0.5, None), max_trips).get_output())
    return engine_of(n, "reference")


@pytest.mark.parametrize("engine, inputs", [
    (lambda: _gather_engine("cpu"), [torch.randn(4, 3), torch.tensor([0, 7])]),  # EngineIndexError
    (lambda: _gather_engine("cpu"), [torch.randn(4, 3), torch.tensor([0, 1], dtype=torch.int32)]),  # the dtype
    (lambda: _gather_engine("cpu"), [torch.randn(4, 3)]),  # EngineInputError: how many
    (lambda: _gather_engine("cuda"), [torch.randn(4, 3), torch.tensor([0, 1])]),  # a CUDA engine given CPU tensors
    (lambda: _gather_engine("cpu"), [torch.randn(4, 3).to_sparse(), torch.tensor([0, 1])]),  # a sparse input
    (lambda: _loop_engine(5), [torch.randn(4), torch.randn(4), torch.tensor(6)]),  # past max_trips
], ids=["index", "dtype", "count", "device", "layout", "loop-past-max-trips"])
def test_engine_errors_in_cpp_are_the_python_runtime_errors(cpp, tmp_path, engine, inputs):
    """The C++ runtime raises the Python runtime's error type and message (as a c10::Error naming the type), which
    torchkiln.load's mapping (reraise_engine_error) turns back into the torchkiln type."""
    engine = engine()
    with pytest.raises(EngineInputError) as raised:
        engine.execute(inputs)
    torch.jit.save(torch.jit.script(_Engines([engine_blob(engine.serialize())], [inputs])), str(tmp_path / "m.pt"))
    torch.save((), tmp_path / "in.pt")
    done = subprocess.run([str(cpp["run"]), str(tmp_path / "m.pt"), str(tmp_path / "in.pt")], capture_output=True,
                          text=True, timeout=RUN_SECONDS, env=_no_python_env())
    assert done.returncode == 1
    assert f"RuntimeError: {type(raised.value).__name__}: {raised.value}\n" in done.stderr, done.stderr
    with pytest.raises(type(raised.value)) as mapped:
        reraise_engine_error(RuntimeError(done.stderr))
    assert str(mapped.value) == str(raised.value)


def check_in_cpp(cpp, paths: list[pathlib.Path], max_memory: int, max_flops: int) -> tuple[dict[str, tuple], int]:
    """{path: (outcome, milliseconds)} of loading each file with the C++ loader (one process), and its peak RSS."""
    done = subprocess.run([str(cpp["check"]), "--max-memory", str(max_memory), "--max-flops", str(max_flops),
                           *map(str, paths)], capture_output=True, text=True, timeout=RUN_SECONDS, env=_no_python_env())
    assert done.returncode == 0, done.stderr
    outcomes, peak = {}, 0
    for line in done.stdout.splitlines():
        if line.startswith("peak_rss_kib\t"):
            peak = int(line.split("\t")[1]) << 10
            continue
        path, rest = line.split("\t", 1)
        text, ms = rest.rsplit("\t", 1)
        outcomes[path] = (text, float(ms))
    assert len(outcomes) == len(paths)
    return outcomes, peak


def test_shared_engine_vectors_load_in_cpp_as_the_manifest_says(cpp):
    """The format's test vectors (tests/engine_vectors/, which tests/test_engine_format.py loads in Python)."""
    manifest = json.loads((VECTORS / "manifest.json").read_text())
    paths = [VECTORS / name for name in manifest["vectors"]]
    outcomes, _ = check_in_cpp(cpp, paths, manifest["max_memory"], manifest["max_flops"])
    for path in paths:
        got, want = outcomes[str(path)][0], manifest["vectors"][path.name]
        prefix = manifest["library_words"].get(path.name)
        assert got.startswith(prefix) if prefix else got == want, (path.name, got)


def test_data_dependent_sizes_defined_once_before_use_in_cpp(cpp, tmp_path):
    """The C++ loader refuses a size symbol defined twice or used before its layer, as the Python one does."""
    paths = []
    for name in sorted(DATA_DEPENDENT_HOSTILE):
        paths.append(tmp_path / f"{name}.engine")
        paths[-1].write_bytes(data_dependent_hostile(name))
    outcomes, _ = check_in_cpp(cpp, paths, MAX_MEMORY, MAX_FLOPS)
    for name, path in zip(sorted(DATA_DEPENDENT_HOSTILE), paths):
        text = outcomes[str(path)][0]
        assert text.startswith("EngineFormatError: ") and DATA_DEPENDENT_HOSTILE[name][1] in text, (name, text)


FUZZ_CASES = 250


def test_fuzzed_and_hostile_engines_give_only_format_errors_in_cpp_where_python_does(cpp, tmp_path):
    """test_engine_fuzz's cases (damaged seeds and hostile networks) on the C++ loader: it loads or raises
    EngineFormatError, in bounded time and memory, and it loads exactly those that the Python loader loads."""
    paths, python = [], {}
    for i in range(FUZZ_CASES):
        rng = random.Random(f"cpp-{i}")
        data = fuzz_case(lambda n: rng.randrange(n) if n > 0 else 0)
        path = tmp_path / f"{i}.engine"
        path.write_bytes(data)
        paths.append(path)
        outcome, detail = run_case(data)
        assert outcome != "FAILURE", detail
        python[str(path)] = outcome != "format-error"
    outcomes, peak = check_in_cpp(cpp, paths, MAX_MEMORY, MAX_FLOPS)
    for path, (text, ms) in outcomes.items():
        assert text == "loaded" or text.startswith("EngineFormatError: "), (path, text)
        assert ms < 2000, (path, text, ms)
        assert (text == "loaded") == python[path], (path, text)
    _, bare = check_in_cpp(cpp, [], MAX_MEMORY, MAX_FLOPS)  # libtorch alone: ~0.1 GiB, with CUDA's libraries ~1.5
    assert peak - bare < 1 << 30, f"peak RSS {peak >> 20} MiB, {bare >> 20} MiB loading nothing"


def test_an_engine_that_does_not_fit_its_module_is_refused_in_cpp_as_in_python(cpp, tmp_path):
    """A module given another module's engine (other input shapes) is an EngineFormatError in both runtimes, with the
    same message; the C++ runtime checks a module's signature once per engine, not on every call."""
    small = _compile(torch.nn.ReLU(), [torchkiln.Input((2, 3))], min_block_size=1)
    other = _compile(torch.nn.ReLU(), [torchkiln.Input((4, 3))], min_block_size=1)
    small._torchkiln_engine_0 = other._torchkiln_engine_0
    with pytest.raises(torchkiln.EngineFormatError, match="does not fit this module") as raised:
        small(torch.randn(2, 3))
    torch.jit.save(small, str(tmp_path / "m.pt"))
    torch.save((torch.randn(2, 3),), tmp_path / "in.pt")
    done = subprocess.run([str(cpp["run"]), str(tmp_path / "m.pt"), str(tmp_path / "in.pt")], capture_output=True,
                          text=True, timeout=RUN_SECONDS, env=_no_python_env())
    assert done.returncode == 1 and f"EngineFormatError: {raised.value}" in done.stderr, done.stderr
