"""`torchkiln compile` (torchtrtc's command line) and the CLI's error handling: on real saved modules, through
`python -m torchkiln` in a subprocess where the process matters, through `cli.main` in this process otherwise."""
import argparse
import os
import subprocess
import sys

import pytest
import torch
from harness import assert_matches_eager

import torchkiln
from torchkiln.cli import build_parser, main
from torchkiln.compile_command import check_accuracy
from torchkiln.runtime.execute_op import engine_from_blob
from torchkiln.stitching.stitch import ENGINE_ATTR, engine_attrs


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) + x


class SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.block = Block()
        self.fc = torch.nn.Linear(4, 5)

    def forward(self, x):
        y = self.block(torch.relu(self.stem(x)))
        return self.fc(y.mean((2, 3)))


class Unsupported(torch.nn.Module):
    def forward(self, x):
        return torch.linalg.inv(x) + 1


class LongMath(torch.nn.Module):
    def forward(self, x):
        return (x * 3 + 1) // 2


@pytest.fixture(scope="module")
def cnn(tmp_path_factory):
    """A small CNN, eval mode, saved scripted; (model, path)."""
    torch.manual_seed(0)
    model = SmallCNN().eval()
    path = tmp_path_factory.mktemp("cli") / "cnn.ts"
    torch.jit.save(torch.jit.script(model), str(path))
    return model, str(path)


def _cli(*args):
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, "-m", "torchkiln", *args], capture_output=True, text=True, timeout=300,
                          env=env)


def _engines(module):
    return len(engine_attrs(module))


def _one_error_line(err, command="compile"):
    lines = err.strip().splitlines()
    assert lines and lines[-1].startswith(f"torchkiln {command}: error: "), err
    assert "Traceback" not in err, err
    return lines[-1]


def test_dynamic_spec_compiles_in_a_subprocess_and_runs_at_two_shapes(cnn, tmp_path):
    model, path = cnn
    out = tmp_path / "out.ts"
    r = _cli("compile", path, str(out), "--input", "[(1,3,8,8);(2,3,8,8);(4,3,12,12)]@f32%contiguous",
             "--device", "cpu", "--backend", "auto", "--check-accuracy", "--atol", "0", "--rtol", "1e-4", "-v")
    assert r.returncode == 0, r.stderr
    # the build progress display (-v): one INFO line per phase on stderr, with the seconds since start
    for phase in ("loading", "compiling", "converting engine block 1/1", "compiled in", "checking accuracy",
                  "wrote"):
        assert any(phase in line and "INFO" in line and line.startswith("[") for line in r.stderr.splitlines()), \
            (phase, r.stderr)
    shapes = [line for line in r.stdout.splitlines() if line.startswith("accuracy: inputs ")]
    assert [s.split(" output")[0] for s in shapes] == [
        "accuracy: inputs (1, 3, 8, 8)", "accuracy: inputs (2, 3, 8, 8)", "accuracy: inputs (4, 3, 12, 12)"]
    assert all(s.endswith(": ok") for s in shapes)
    compiled = torch.jit.load(str(out))
    assert _engines(compiled) == 1
    for shape in [(3, 3, 8, 8), (4, 3, 11, 12)]:
        x = torch.randn(shape)
        with torch.no_grad():
            assert_matches_eager(compiled(x), model(x))


def test_static_spec_with_fallback_flags(cnn, tmp_path, capsys):
    model, path = cnn
    out = str(tmp_path / "out.ts")
    assert main(["compile", path, out, "-i", "(2,3,8,8)@f32", "--torch-executed-op", "aten::relu",
                 "--torch-executed-module", "Block", "--min-block-size", "1", "-q"]) == 0
    compiled = torch.jit.load(out)
    code = compiled.code
    assert code.count("torch.relu(") == 2  # both relus kept in PyTorch
    assert code.count("torch.conv2d(") == 1 and "torch.add(" in code  # the Block runs in PyTorch
    assert _engines(compiled) == 2  # the stem's convolution; the mean and the linear layer
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))
    capsys.readouterr()


def test_fp16_precision_and_check_accuracy_failure(cnn, tmp_path, capsys):
    model, path = cnn
    out = tmp_path / "half.ts"
    args = ["compile", path, str(out), "-i", "(1,3,8,8)", "-p", "f16", "-p", "f32", "--backend", "reference",
            "--check-accuracy", "-q"]
    assert main(args + ["--atol", "0", "--rtol", "0"]) == 1
    captured = capsys.readouterr()
    assert "FAILED" in captured.out and "max abs error" in captured.out
    assert "--check-accuracy failed (atol 0, rtol 0)" in captured.err and not out.exists()
    assert main(args + ["--rtol", "2e-2"]) == 0
    engine = engine_from_blob(getattr(torch.jit.load(str(out)), ENGINE_ATTR.format(0)))
    assert any(t.dtype == torch.float16 for layer in engine.network.layers for t in layer.outputs)
    # a float16 input on the float32 model: compiled with a cast, checked against the model on the cast input
    assert main(["compile", path, str(out), "-i", "(1,3,8,8)@f16", "--check-accuracy", "-q"]) == 0
    x = torch.randn(1, 3, 8, 8).half()
    with torch.no_grad():
        assert_matches_eager(torch.jit.load(str(out))(x), model(x.float()))


class LogOfZero(torch.nn.Module):
    def __init__(self, sign: float) -> None:
        super().__init__()
        self.sign = sign

    def forward(self, x):
        return torch.stack([x, self.sign * torch.log(x * 0), torch.log(-x.abs() - 1)])


@pytest.mark.parametrize("sign, ok", [(1.0, True), (-1.0, False)], ids=["same", "inf-sign"])
def test_check_accuracy_compares_infinities_with_their_signs(sign, ok):
    """An output that is +inf where the original gives -inf (both not finite) is an error, not a match."""
    spec = torchkiln.Input((2, 3))
    rows = check_accuracy(LogOfZero(1.0), LogOfZero(sign), [spec], torch.device("cpu"), 1e-5, 1e-3)
    assert [row.ok for row in rows] == [ok], rows
    assert ok or "NaN or infinities differ" in str(rows[0])


def test_save_engine_then_embed_engine(cnn, tmp_path, capsys):
    model, path = cnn
    engine_file, embedded = tmp_path / "cnn.engine", tmp_path / "embedded.ts"
    assert main(["compile", path, str(engine_file), "-i", "(2,3,8,8)", "--save-engine", "--check-accuracy",
                 "--require-full-compilation", "-q"]) == 0
    engine = torchkiln.Engine.deserialize(engine_file.read_bytes())  # engine bytes, not a module
    assert [tuple(b.opt_shape) for b in engine.bindings] == [(2, 3, 8, 8)]
    assert main(["compile", str(engine_file), str(embedded), "--embed-engine", "-q"]) == 0
    capsys.readouterr()
    assert main(["info", str(engine_file)]) == 0 and main(["info", str(embedded)]) == 0  # info reads both
    out = capsys.readouterr().out
    assert out.count("  inputs:  %x: float32[2, 3, 8, 8]") == 2 and f"1 engine(s) in {embedded}" in out
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert_matches_eager(torch.jit.load(str(embedded))(x), model(x))
    # --save-engine needs forward to be exactly one engine
    assert main(["compile", path, str(tmp_path / "two.engine"), "-i", "(2,3,8,8)", "--save-engine",
                 "--torch-executed-op", "aten::relu", "-q"]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert "--save-engine needs forward to compile to exactly one engine" in line and "aten::relu x2" in line
    assert not (tmp_path / "two.engine").exists()


def test_check_method_support(cnn, tmp_path, capsys):
    _, path = cnn
    assert main(["compile", path, "--check-method-support"]) == 0
    assert "every op of forward has a converter or evaluator" in capsys.readouterr().out
    unsupported = tmp_path / "inv.ts"
    torch.jit.save(torch.jit.script(Unsupported()), str(unsupported))
    assert main(["compile", str(unsupported), "--check-method-support"]) == 1
    out = capsys.readouterr().out
    assert "unsupported: aten::linalg_inv x1" in out and "1 ops of forward have no converter or evaluator" in out


def test_truncate_long_double_and_require_full_compilation(tmp_path, capsys):
    model = LongMath()
    path, out = tmp_path / "long.ts", tmp_path / "long_out.ts"
    torch.jit.save(torch.jit.script(model), str(path))
    assert main(["compile", str(path), str(out), "-i", "(2,5)@i64", "--truncate-long-double",
                 "--require-full-compilation", "--min-block-size", "1", "-q"]) == 0
    compiled = torch.jit.load(str(out))
    engine = engine_from_blob(getattr(compiled, ENGINE_ATTR.format(0)))
    assert "int32[2, 5] = elementwise" in str(engine.network) and "int64[2, 5] = elementwise" not in \
        str(engine.network)  # the arithmetic runs in 32 bits
    x = torch.randint(-100, 100, (2, 5))
    assert_matches_eager(compiled(x), model(x))
    assert main(["compile", str(path), str(out), "-i", "(2,5)@i64", "--require-full-compilation",
                 "--torch-executed-op", "aten::mul.Tensor", "--torch-executed-op", "aten::mul.Scalar", "-q"]) == 2
    assert "require_full_compilation=True but the graph cannot run as one engine" in \
        _one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("args,message", [
    (["-i", "(1,3,8,8)@f17"], "error: input spec '(1,3,8,8)@f17': unknown dtype 'f17'"),
    ([], "give the input specs after IN OUT"),
    (["-i", "(1,3,8,8)", "-p", "f8"], "-p: unknown dtype 'f8'"),
    (["-i", "(1,3,8,8)", "--min-block-size", "0"], "ValueError: min_block_size must be an int >= 1"),
    (["-i", "(1,3,8,8)", "--torch-executed-op", "relu"], "ValueError: torch_executed_ops: 'relu' is not an op"),
    (["-i", "(1,3,8,8)", "--device", "dla:0"], "torchkiln has no DLA engines"),
    (["-i", "(1,3,8,8)", "--check-accuracy", "--atol", "-1"], "--atol and --rtol must be >= 0, got -1 and 0.001"),
    (["--embed-engine", "-i", "(1,3,8,8)"], "--embed-engine takes engine bytes only"),
])
def test_bad_arguments_are_one_line(cnn, tmp_path, capsys, args, message):
    _, path = cnn
    assert main(["compile", path, str(tmp_path / "o.ts"), *args]) == 2
    assert message in _one_error_line(capsys.readouterr().err)


def test_missing_and_unreadable_files_are_one_line(tmp_path, capsys):
    junk = tmp_path / "junk.ts"
    junk.write_bytes(b"not a module")
    for argv, message in [
        (["compile", str(tmp_path / "none.ts"), "o.ts", "-i", "(1,)"], f"{tmp_path / 'none.ts'}: no such file"),
        (["compile", str(junk), "o.ts", "-i", "(1,)"], f"{junk} is not a saved TorchScript module"),
        (["compile", str(junk), "o.ts", "--embed-engine"], "EngineFormatError: engine data is truncated"),
        (["info", str(junk)], f"{junk} is neither a torchkiln engine nor a saved module"),
        (["info", str(tmp_path / "missing.engine")], f"{tmp_path / 'missing.engine'}: no such file"),
    ]:
        assert main(argv) == 2
        assert message in _one_error_line(capsys.readouterr().err, argv[0])
    with pytest.raises(torchkiln.EngineFormatError):  # --traceback lets Python's error through instead
        main(["--traceback", "compile", str(junk), "o.ts", "--embed-engine"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("mode", [["-i", "(1,3,8,8)"], ["--check-method-support"], ["--embed-engine"]],
                         ids=["compile", "check-method-support", "embed-engine"])
def test_cuda_device_without_cuda_is_one_line(cnn, tmp_path, capsys, mode):
    """The device is the error, not the file (it was once reported as 'not a saved TorchScript module')."""
    _, path = cnn
    assert main(["compile", path, str(tmp_path / "o.ts"), *mode, "--device", "cuda:0"]) == 2
    assert _one_error_line(capsys.readouterr().err) == \
        "torchkiln compile: error: --device cuda:0 was asked for but CUDA is not available here"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_demo_on_cuda_without_cuda_is_one_line(capsys):
    assert main(["demo", "--device", "cuda"]) == 2
    assert _one_error_line(capsys.readouterr().err, "demo") == \
        "torchkiln demo: error: ValueError: device: cuda was asked for but CUDA is not available here"


def test_every_command_and_flag_has_help():
    parser = build_parser()
    missing = []

    def walk(p, where):
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                helps = {a.dest: a.help for a in action._choices_actions}
                for name, sub in action.choices.items():
                    if not helps.get(name):
                        missing.append(f"{where} {name}")
                    walk(sub, f"{where} {name}")
            elif not isinstance(action, argparse._HelpAction) and not action.help:
                missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")

    walk(parser, "torchkiln")
    assert not missing, missing
    assert {"compile", "info", "demo", "export-onnx", "coverage"} <= set(
        next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)
