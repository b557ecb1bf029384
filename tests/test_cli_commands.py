"""The command line as a whole: --version, --help without importing torch, log levels (warnings by default, -v
INFO, -vv DEBUG, -q errors only, also after the command), and one `error:` line with exit status 2 from every
command. Through `cli.main` in this process; in a subprocess only where the process's imports are the point."""
import os
import subprocess
import sys
import warnings

import pytest
import torch

import torchkiln
from torchkiln.cli import build_parser, main
from torchkiln.onnx_export import DEFAULT_OPSET

SRC = os.path.join(os.path.dirname(__file__), "..", "src")


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 3 + 1


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A plain saved module and the same compiled and saved: (plain path, compiled path)."""
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("commands")
    plain, compiled = str(folder / "plain.ts"), str(folder / "compiled.ts")
    torch.jit.save(torch.jit.script(Scaled().eval()), plain)
    torch.jit.save(torchkiln.compile(Scaled().eval(), [torchkiln.Input((2, 8))]), compiled)
    return plain, compiled


def _python(*args, code=None):
    env = dict(os.environ, PYTHONPATH=SRC, PYTHONWARNINGS="ignore")
    argv = [sys.executable, "-X", "importtime", *(["-c", code] if code else ["-m", "torchkiln"]), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)


def _imported(stderr):
    """The modules `python -X importtime` reports."""
    return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["compile", "--help"], ["info", "--help"]])
def test_version_and_help_do_not_import_torch(args):
    done = _python(*args)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = _imported(done.stderr)
    assert "torchkiln.cli" in imported and "torch" not in imported and "torchkiln.compiler" not in imported
    if args == ["--version"]:
        assert done.stdout.startswith(f"torchkiln {torchkiln.__version__} (torch {torch.__version__}, Python ")


def test_the_console_script_parses_before_importing_torch():
    """The `torchkiln` script (sys.argv[0] .../bin/torchkiln) imports torchkiln.cli as `python -m` does."""
    done = _python(code="import sys; sys.argv = ['/venv/bin/torchkiln', '--version']\n"
                        "from torchkiln.cli import main\n"
                        "code = main(); assert 'torch' not in sys.modules, 'torch imported'; sys.exit(code)")
    assert done.returncode == 0 and done.stdout.startswith("torchkiln "), done.stderr[-2000:]


def test_import_torchkiln_registers_its_ops_for_torch_jit_load(saved):
    """Outside the command line, `import torchkiln` imports the API at once: a saved compiled module loads."""
    done = _python(code=f"import torchkiln, torch; m = torch.jit.load({saved[1]!r}); "
                        f"print(m(torch.ones(2, 8)).shape, torchkiln.compile.__module__)")
    assert done.returncode == 0 and "torch.Size([2, 8]) torchkiln.compiler" in done.stdout, done.stderr[-2000:]


def test_help_shows_the_export_opset_number(capsys):
    assert main(["export-onnx", "--help"]) == 0
    out = capsys.readouterr().out
    assert f"(default: {DEFAULT_OPSET})" in out and "DEFAULT_OPSET" not in out
    assert build_parser().parse_args(["export-onnx", "a", "b"]).opset == DEFAULT_OPSET


def test_version_flag(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"torchkiln {torchkiln.__version__} (torch ")


def _levels(err):
    return {word for line in err.splitlines() for word in ("DEBUG", "INFO", "WARNING") if f"] {word} " in line}


def test_log_levels_warnings_by_default_then_v_vv_and_q(saved, tmp_path, capsys):
    """--workspace-size logs a warning (no effect); the progress is INFO; the partition report DEBUG."""
    plain = saved[0]
    base = ["compile", plain, str(tmp_path / "o.ts"), "(2,8)", "--workspace-size", "64"]
    expected = [([], {"WARNING"}), (["-v"], {"WARNING", "INFO"}), (["-v", "-v"], {"WARNING", "INFO", "DEBUG"}),
                (["--info"], {"WARNING", "INFO"}), (["-q"], set()), (["-w"], set())]
    for flags, levels in expected:
        assert main(base + flags) == 0
        assert _levels(capsys.readouterr().err) == levels, flags
    assert main(["-v", *base]) == 0  # -v before the command, as before
    assert _levels(capsys.readouterr().err) == {"WARNING", "INFO"}


def test_a_warning_is_shown_once(saved, tmp_path, capsys):
    """torchkiln's warnings are logged and also raised as Python warnings (for notebooks): the command line shows
    the log line only."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(["compile", saved[0], str(tmp_path / "o.ts"), "(2,8)", "--teo", "aten::linear",
                     "--teo", "aten::relu", "--teo", "aten::mul", "--teo", "aten::add"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if "compiled with 0 engines" in line]
    assert len(lines) == 1 and "] WARNING torchkiln: " in lines[0]
    assert not [w for w in caught if "compiled with 0 engines" in str(w.message)]


@pytest.mark.parametrize("argv, message", [
    (["export-onnx", "{missing}", "{out}.onnx"], "torchkiln export-onnx: error: {missing}: no such file"),
    (["export-onnx", "{plain}", "{out}.onnx"], "torchkiln export-onnx: error: ValueError: export_onnx takes a "
                                               "compiled module made of one engine; this one has 0 engines"),
    (["debug-precision", "{missing}", "(2,8)"], "torchkiln debug-precision: error: {missing}: no such file"),
    (["debug-precision", "{plain}"], "torchkiln debug-precision: error: give each input of forward"),
    (["debug-precision", "{plain}", "(2,8)", "-i", "2,8"], "torchkiln debug-precision: error: give the input specs "
                                                           "after MODEL.ts or with --input, not both"),
    (["debug-precision", "{plain}", "(2,8)@f17"], "torchkiln debug-precision: error: input spec '(2,8)@f17': "
                                                  "unknown dtype 'f17'"),
    (["debug-precision", "{compiled}", "(2,8)"], "torchkiln debug-precision: error: ValueError: debug_precision "
                                                 "takes the module before compiling; this one is compiled already"),
    (["info", "{missing}"], "torchkiln info: error: {missing}: no such file"),
    (["info", "{plain}", "--no-such-flag"], "torchkiln info: error: unrecognized arguments: --no-such-flag"),
    (["no-such-command"], "torchkiln: error: argument COMMAND: invalid choice: 'no-such-command'"),
])
def test_every_command_errors_in_one_line_with_exit_2(saved, tmp_path, capsys, argv, message):
    names = dict(plain=saved[0], compiled=saved[1], missing=str(tmp_path / "missing.ts"), out=str(tmp_path / "o"))
    assert main([a.format(**names) for a in argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message.format(**names)), captured.err
    assert not os.path.exists(names["out"] + ".onnx")


def test_debug_precision_takes_compile_specs_and_the_old_shapes(saved, capsys):
    """`(2,8)@f32`, `[(1,8);(2,8);(4,8)]` (run at opt) and the old `--input 2,8`: the same layers are reported."""
    plain = saved[0]
    tables = []
    for argv in (["(2,8)@f32"], ["[(1,8);(2,8);(4,8)]"], ["--input", "2,8"], ["-i", "(2,8)", "--dtype", "f32"]):
        assert main(["debug-precision", plain, *argv, "-p", "f16"]) == 0, argv
        out = capsys.readouterr().out
        assert "first layer past the tolerance: none" in out, out
        tables.append([line.split()[1] for line in out.splitlines()[2:] if line.split()[0].isdigit()])
    assert tables[0] and all(t == tables[0] for t in tables), tables
