"""`torchkiln compile` as torchtrtc users type it: positional input specs, torchtrtc's spellings of the flags, its
flags that do not apply (refused with the reason), and --check-method-support agreeing with
--require-full-compilation. Through `cli.main` in this process, on real saved modules."""
import pathlib

import pytest
import torch
from harness import assert_matches_eager

from torchkiln.cli import build_parser, main
from torchkiln.compile_command import TORCHTRTC_FLAGS
from torchkiln.runtime.execute_op import engine_from_blob
from torchkiln.stitching.stitch import ENGINE_ATTR, engine_attrs

from test_cli_compile import cnn  # noqa: E402, F401  (the CLI tests' small CNN, saved: a fixture)


class DataDependentIf(torch.nn.Module):
    """Every op has a converter, but the branch picks a number by the data: it cannot run as one engine (an engine's
    conditional layer gives tensors)."""

    def forward(self, x):
        y = x * 2 + 1
        scale = 1.0
        if bool(y.sum() > 0):
            scale = 2.0
        return y * scale - 3


def _error_line(err):
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("torchkiln compile: error: "), err
    return lines[0]


def test_positional_specs_static_dynamic_and_after_flags(cnn, tmp_path, capsys):
    """torchtrtc's form `IN OUT SPEC...`, also with flags between them (`IN -q OUT SPEC`)."""
    model, path = cnn
    out = str(tmp_path / "static.ts")
    assert main(["compile", path, out, "(2,3,8,8)@f32"]) == 0
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert_matches_eager(torch.jit.load(out)(x), model(x))
    dynamic = str(tmp_path / "dynamic.ts")
    assert main(["compile", path, "-q", dynamic, "--mbs", "1", "[(1,3,8,8);(2,3,8,8);(4,3,12,12)]@f32%contiguous"]) == 0
    compiled = torch.jit.load(dynamic)
    for shape in [(1, 3, 8, 8), (4, 3, 11, 12)]:
        x = torch.randn(shape)
        with torch.no_grad():
            assert_matches_eager(compiled(x), model(x))
    capsys.readouterr()


def test_positional_half_spec_with_enable_precision(cnn, tmp_path, capsys):
    """`[(..);(..);(..)]@f16%contiguous --enable-precision=f16`: the engine takes float16 inputs of that range."""
    model, path = cnn
    out = str(tmp_path / "half.ts")
    assert main(["compile", path, out, "[(1,3,8,8);(2,3,8,8);(4,3,16,16)]@f16%contiguous", "--enable-precision=f16",
                 "--backend", "reference", "-q"]) == 0
    compiled = torch.jit.load(out)
    engine = engine_from_blob(getattr(compiled, ENGINE_ATTR.format(0)))
    assert engine.network.inputs[0].dtype == torch.float16
    assert [(b.min_shape, b.opt_shape, b.max_shape) for b in engine.bindings] == [
        ((1, 3, 8, 8), (2, 3, 8, 8), (4, 3, 16, 16))]
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        got, want = compiled(x.half()).float(), model(x.half().float())
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) >= 0.999
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()
    capsys.readouterr()


@pytest.mark.parametrize("argv, message", [
    (["IN", "(1,3,8,8)"], "OUT is needed"),
    (["IN", "OUT"], "give the input specs after IN OUT"),
    (["IN", "OUT", "(1,3,8,8)", "-i", "(1,3,8,8)"], "after IN OUT or with -i, not both"),
    (["IN", "OUT", "(1,3,8,8)", "--no-such-flag"], "unrecognized arguments: --no-such-flag"),
])
def test_positional_mistakes_are_one_line(cnn, tmp_path, capsys, argv, message):
    path = cnn[1]
    argv = [path if a == "IN" else str(tmp_path / "o.ts") if a == "OUT" else a for a in argv]
    assert main(["compile", *argv]) == 2
    assert message in _error_line(capsys.readouterr().err)


def test_torchtrtc_spellings_parse_as_torchkiln_flags():
    """Each spelling in the table that names a torchkiln flag gives the namespace that flag gives."""
    parser = build_parser()
    values = {"--enabled-precision": "f16", "--torch-executed-op": "aten::relu", "--torch-executed-module": "Block",
              "--min-block-size": "2"}
    aliases = [(o, f.same_as) for f in TORCHTRTC_FLAGS if f.same_as for o in f.options]
    assert {"--enable-precision", "--teo", "--tem", "--mbs", "--truncate", "--info", "-w"} <= {a for a, _ in aliases}
    for alias, flag in aliases:
        value = [values[flag]] if flag in values else []
        got = parser.parse_args(["compile", "in.ts", "out.ts", alias, *value])
        want = parser.parse_args(["compile", "in.ts", "out.ts", flag, *value])
        assert got == want, (alias, flag)
    assert parser.parse_args(["compile", "in.ts", "--enable-precision=f16"]).enabled_precisions == ["f16"]


def test_torchtrtc_fallback_flags_compile(cnn, tmp_path, capsys):
    """--teo, --tem and --mbs keep the same ops in PyTorch as torchkiln's own flags."""
    model, path = cnn
    out = str(tmp_path / "out.ts")
    assert main(["compile", path, out, "(2,3,8,8)", "--teo", "aten::relu", "--tem", "Block", "--mbs", "1"]) == 0
    compiled = torch.jit.load(out)
    assert compiled.code.count("torch.relu(") == 2 and compiled.code.count("torch.conv2d(") == 1
    assert len(engine_attrs(compiled)) == 2
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))
    capsys.readouterr()


def test_torchtrtc_settings_reach_compile(cnn, tmp_path, capsys):
    """--disable-tf32, --num-avg-timing-iters, --workspace-size, -d cpu: compile settings (a value no setting takes
    is the setting's error; one without effect is logged as such)."""
    path = cnn[1]
    out = str(tmp_path / "out.ts")
    assert main(["compile", path, out, "(1,3,8,8)", "--disable-tf32", "--num-avg-timing-iters", "2", "-d", "cpu",
                 "--workspace-size", "1024", "--sparse-weights", "--no-threshold-check"]) == 0
    err = capsys.readouterr().err
    assert "workspace_size=1024, sparse_weights=True: no effect on torchkiln's engines" in err
    assert main(["compile", path, out, "(1,3,8,8)", "--num-avg-timing-iters", "-1"]) == 2
    assert "num_avg_timing_iters must be an int >= 0" in _error_line(capsys.readouterr().err)
    assert main(["compile", path, out, "(1,3,8,8)", "--engine-capability", "turbo"]) == 2
    assert "capability must be" in _error_line(capsys.readouterr().err)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
@pytest.mark.parametrize("argv, message", [
    (["-d", "gpu"], "--device cuda:0 was asked for but CUDA is not available here"),
    (["--gpu-id", "1"], "--device cuda:1 was asked for but CUDA is not available here"),
    (["-d", "cpu", "--gpu-id", "1"], "--gpu-id goes with -d gpu"),
    (["-d", "cpu", "--device", "cpu"], "give --device, or torchtrtc's -d/--device-type and --gpu-id, not both"),
])
def test_device_type_and_gpu_id(cnn, tmp_path, capsys, argv, message):
    assert main(["compile", cnn[1], str(tmp_path / "o.ts"), "(1,3,8,8)", *argv]) == 2
    assert message in _error_line(capsys.readouterr().err)


@pytest.mark.parametrize("argv, message", [
    (["-d", "dla"], "torchkiln has no DLA engines"),
    (["--dla-core", "0"], "--dla-core: torchkiln has no DLA engines"),
    (["--allow-gpu-fallback"], "--allow-gpu-fallback: torchkiln has no DLA engines"),
    (["--dla-sram-size", "1024"], "--dla-sram-size: torchkiln has no DLA engines"),
    (["--custom-converters", "libconv.so"], "torchkiln's converters are Python"),
    (["--custom-torch-ops", "libops.so"], "torch.ops.load_library"),
])
def test_flags_that_do_not_apply_say_why(cnn, tmp_path, capsys, argv, message):
    out = tmp_path / "o.ts"
    assert main(["compile", cnn[1], str(out), "(1,3,8,8)", *argv]) == 2
    assert message in _error_line(capsys.readouterr().err) and not out.exists()


def test_check_method_support_agrees_with_require_full_compilation(tmp_path, capsys):
    """All ops of DataDependentIf have converters, but its branch gives a number by the data: compile with
    --require-full-compilation refuses it, and so does --check-method-support given the input specs."""
    path = str(tmp_path / "if.ts")
    torch.jit.save(torch.jit.script(DataDependentIf()), path)
    assert main(["compile", path, str(tmp_path / "o.ts"), "-i", "(2,8)", "--require-full-compilation", "-q",
                 "--min-block-size", "1"]) == 2
    refused = _error_line(capsys.readouterr().err)
    assert "prim::If x1 (dynamic control flow)" in refused
    assert main(["compile", path, "--check-method-support", "-i", "(2,8)", "--min-block-size", "1"]) == 1
    out = capsys.readouterr().out
    assert "forward does not compile to one engine" in out and "prim::If x1 (dynamic control flow)" in out
    assert "aten::Bool.Tensor x1 (a non-tensor value would cross an engine boundary)" in out
    # without input specs: only the op-level check, which says so
    assert main(["compile", path, "--check-method-support"]) == 0
    assert "give the input specs to check that it compiles to one engine" in capsys.readouterr().out


def test_check_method_support_follows_the_flags(cnn, capsys):
    """The dry run is the compile these flags ask for: a forced op is left in PyTorch."""
    path = cnn[1]
    assert main(["compile", "--check-method-support", path, "(2,3,8,8)"]) == 0  # bare, before IN: forward
    assert "forward compiles to one engine, with nothing left in PyTorch" in capsys.readouterr().out
    assert main(["compile", path, "--check-method-support", "forward", "-i", "(2,3,8,8)", "--teo", "aten::relu"]) == 1
    out = capsys.readouterr().out
    assert "aten::relu x2 (forced by torch_executed_ops)" in out


def test_docs_list_every_torchtrtc_flag():
    doc = (pathlib.Path(__file__).parent.parent / "docs" / "cli.md").read_text()
    missing = [o for flag in TORCHTRTC_FLAGS for o in flag.options if f"`{o}" not in doc]
    assert not missing, missing
