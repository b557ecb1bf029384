"""Input specs as strings (torchtrtc's syntax), as `torchkiln compile --input` takes them."""
import pytest
import torch
from harness import assert_matches_eager

import torchkiln
from torchkiln.input_spec import parse_dtype, parse_input_spec


def test_static_spec_with_dtype_and_format():
    spec = parse_input_spec("(1,3,224,224)@f16%contiguous")
    assert spec == torchkiln.Input((1, 3, 224, 224), dtype=torch.float16)
    assert spec.format == torch.contiguous_format
    assert parse_input_spec(" ( 2, 3 ) ") == torchkiln.Input((2, 3))  # no dtype: the model's; spaces allowed
    last = parse_input_spec("(2,3,4,5)%channels_last@bf16")  # either order
    assert (last.dtype, last.format) == (torch.bfloat16, torch.channels_last)
    assert parse_input_spec("(8)@i64").shape == (8,) and parse_input_spec("(8,)").shape == (8,)


def test_range_spec_is_min_opt_max():
    spec = parse_input_spec("[(1,3,224,224);(8,3,224,224);(32,3,224,224)]@f32")
    assert spec.shape == {"min_shape": (1, 3, 224, 224), "opt_shape": (8, 3, 224, 224),
                          "max_shape": (32, 3, 224, 224)}
    assert spec.dtype == torch.float32 and spec.is_dynamic
    assert parse_input_spec("[(1,4); (2,4); (3,4)]%linear").opt_shape == (2, 4)


@pytest.mark.parametrize("name,dtype", [
    ("f32", torch.float32), ("float", torch.float32), ("f16", torch.float16), ("half", torch.float16),
    ("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16), ("i32", torch.int32), ("int32", torch.int32),
    ("i64", torch.int64), ("long", torch.int64), ("bool", torch.bool), ("b", torch.bool), ("f64", torch.float64),
    ("double", torch.float64), ("u8", torch.uint8), ("i8", torch.int8), ("F16", torch.float16),
    ("char", torch.int8),
])
def test_dtype_names(name, dtype):
    assert parse_dtype(name) == dtype
    assert parse_input_spec(f"(2,2)@{name}").dtype == dtype


@pytest.mark.parametrize("text,part", [
    ("(1,3", "expected (d0,d1,...)"),
    ("1,3", "expected (d0,d1,...)"),
    ("(1,x)@f32", "shape '(1,x)'"),
    ("(1,3)@f17", "unknown dtype 'f17'"),
    ("(1,3)%weird", "unknown format 'weird'"),
    ("(1,3)@f16@f32", "dtype given twice"),
    ("[(1,2);(3,2)]", "needs three shapes"),
    ("[(1,2);(2,2);(x)]", "max shape '(x)'"),
    ("[(4,2);(1,2);(5,2)]", "min <= opt <= max"),
    ("[(1,2);(2,2);(3,2,1)]", "differ in rank"),
    ("(1,0)", "non-positive dimension 0"),
    ("(3,5)%channels_last", "needs a 4-d shape"),
    ("", "non-empty string"),
])
def test_bad_specs_name_the_part(text, part):
    with pytest.raises(ValueError, match="input spec") as info:
        parse_input_spec(text)
    assert part in str(info.value)


def test_a_spec_without_a_dtype_on_a_float16_model_is_float16_in_compile_and_its_accuracy_check(tmp_path, capsys):
    """As torchtrtc: no @dtype leaves the type to the model; --check-accuracy runs both modules on float16."""
    from torchkiln.cli import main

    torch.manual_seed(0)
    model = torch.jit.script(torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                                 torch.nn.Linear(64, 5)).eval().half())
    path, out = tmp_path / "half.ts", tmp_path / "out.ts"
    torch.jit.save(model, path)
    assert main(["compile", str(path), str(out), "-i", "(2,3,6,6)", "--check-accuracy", "--rtol", "1e-2"]) == 0
    assert "accuracy:" in capsys.readouterr().out
    x = torch.randn(2, 3, 6, 6).half()
    with torch.no_grad():
        out_, ref = torchkiln.load(out)(x), model(x)
    assert out_.dtype == torch.float16 and ref.abs().max() > 0.1
    assert_matches_eager(out_.float(), ref.float(), rtol=1e-2, min_cosine=0.999)


def test_compile_calibrates_on_the_samples_a_file_holds(tmp_path, caplog, capsys):
    """`--calibration-inputs PATH`: the samples torch.save wrote there are what int8 calibrates on (no warning about
    random inputs; the calibration cache holds their range), and a file torch cannot read is named."""
    import json
    import logging

    from torchkiln.cli import main

    torch.manual_seed(0)
    model = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4)))
    path, out, samples = tmp_path / "m.ts", tmp_path / "out.ts", tmp_path / "calib.pt"
    torch.jit.save(model, str(path))
    torch.save([torch.full((4, 16), 3.0) * torch.linspace(-1, 1, 16), torch.randn(4, 16)], str(samples))
    cache = tmp_path / "calib.json"
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        assert main(["compile", str(path), str(out), "-i", "(4,16)", "-p", "int8", "--calibration-inputs",
                     str(samples), "--calibration-cache-file", str(cache)]) == 0
    assert "random inputs" not in caplog.text
    layers = next(iter(json.loads(cache.read_text())["engines"].values()))["layers"]
    assert layers[0]["amax"] == pytest.approx(3.0)  # the first sample's largest |value|, above the random one's
    (tmp_path / "bad.pt").write_text("not a tensor file")
    for bad in ("bad.pt", "missing.pt"):
        assert main(["compile", str(path), str(out), "-i", "(4,16)", "-p", "int8", "--calibration-inputs",
                     str(tmp_path / bad)]) != 0
        assert "calibration_inputs: " in capsys.readouterr().err
