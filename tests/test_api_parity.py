"""Torch-TensorRT's names in torchkiln: Device, dtype, memory_format, logging, dump_build_info, set_device,
torchkiln.ts, ir= and arg_inputs=, save, the build-tuning compile settings and Input's extras (tensor_domain,
torch_tensor, from_tensors, shape, settable fields)."""
import io
import re
import logging

import pytest
import torch
from harness import assert_matches_eager

import torchkiln
from torchkiln.settings import CompileSettings


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return ConvNet().eval()


# --- Device ---------------------------------------------------------------------------------------------------

def test_device_forms():
    GPU, DLA, CPU = torchkiln.DeviceType.GPU, torchkiln.DeviceType.DLA, torchkiln.DeviceType.CPU
    d = torchkiln.Device("cuda:1")
    assert (d.device_type, d.gpu_id, d.dla_core, d.allow_gpu_fallback) == (GPU, 1, -1, False)
    assert torchkiln.Device("gpu:0") == torchkiln.Device(gpu_id=0) == torchkiln.Device(device_type=GPU, gpu_id=0)
    assert torchkiln.Device._from({"device_type": GPU, "gpu_id": 0}) == torchkiln.Device("cuda:0")
    assert torchkiln.Device(torch.device("cuda", 2)).gpu_id == 2
    dla = torchkiln.Device("dla:1", allow_gpu_fallback=True)
    assert (dla.device_type, dla.dla_core, dla.gpu_id, dla.allow_gpu_fallback) == (DLA, 1, 0, True)
    assert dla.to(torch.device) == torch.device("cuda", 0)
    cpu = torchkiln.Device(torch.device("cpu"))
    assert cpu.device_type == CPU and cpu.to(torch.device) == torch.device("cpu")
    assert str(torchkiln.Device("cuda:0")) == "Device(type=GPU, gpu_id=0)"
    with pytest.raises(ValueError, match="no DLA engines"):
        torchkiln.Device("dla:0").to(torch.device)
    for bad, message in [("tpu:0", "is not a device"), ({"gpu": 0}, "unknown keys"), (3, "is not a device")]:
        with pytest.raises(ValueError, match=message):
            torchkiln.Device._from(bad)
    with pytest.raises(ValueError, match="gpu_id must be an int >= 0"):
        torchkiln.Device(gpu_id=-1)


def test_compile_takes_device_dtype_enum_and_build_settings(model, caplog):
    x = torch.randn(1, 3, 6, 6)
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        compiled = torchkiln.compile(
            model, [torchkiln.Input((1, 3, 6, 6), dtype=torchkiln.dtype.f32)], enabled_precisions={torchkiln.dtype.float},
            device={"device_type": torchkiln.DeviceType.CPU}, workspace_size=1 << 22, sparse_weights=True,
            dla_sram_size=1 << 20, refit=False, num_avg_timing_iters=4, disable_tf32=True,
            capability=torchkiln.EngineCapability.STANDARD, allow_shape_tensors=False)
    no_effect = [r.getMessage() for r in caplog.records if "no effect" in r.getMessage()]
    assert no_effect == ["workspace_size=4194304, sparse_weights=True: no effect on torchkiln's engines (accepted "
                         "for Torch-TensorRT compatibility)"]  # one warning; defaults and meaningful ones unlisted
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))
    torchkiln.compile(model, [torchkiln.Input((1, 3, 6, 6))], device=torchkiln.Device("cpu"))


def test_build_settings_are_stored_and_validated():
    s = CompileSettings.create([torchkiln.Input((2,))], num_avg_timing_iters=8, disable_tf32=True,
                               capability="safety", dla_global_dram_size=1 << 20)
    assert (s.num_avg_timing_iters, s.disable_tf32, s.capability) == (8, True, torchkiln.EngineCapability.SAFETY)
    assert s.settings_without_effect() == ["capability=<EngineCapability.SAFETY: 'safety'>",
                                           "dla_global_dram_size=1048576"]
    assert CompileSettings.create([torchkiln.Input((2,))]).num_avg_timing_iters == 10
    for kwargs, message in [
        ({"num_avg_timing_iters": -1}, "num_avg_timing_iters must be an int >= 0"),
        ({"disable_tf32": "yes"}, "disable_tf32 must be True or False"),
        ({"workspace_size": -1}, "workspace_size must be an int >= 0"),
        ({"dla_sram_size": 1.5}, "dla_sram_size must be an int >= 0"),
        ({"capability": "fast"}, "capability must be a torchkiln.EngineCapability"),
        ({"sparse_weights": 1}, "sparse_weights must be True or False"),
    ]:
        with pytest.raises(ValueError, match=message):
            CompileSettings.create([torchkiln.Input((2,))], **kwargs)


# --- dtype ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,expected", [
    ("f32", torch.float32), ("float", torch.float32), ("float32", torch.float32), ("half", torch.float16),
    ("f16", torch.float16), ("bf16", torch.bfloat16), ("i32", torch.int32), ("int32", torch.int32),
    ("i64", torch.int64), ("long", torch.int64), ("i8", torch.int8), ("u8", torch.uint8), ("b", torch.bool),
    ("bool", torch.bool), ("f64", torch.float64), ("double", torch.float64),
])
def test_dtype_names_map_to_torch(name, expected):
    member = getattr(torchkiln.dtype, name)
    assert member.to(torch.dtype) == expected
    assert torchkiln.dtype._from(expected) == member  # aliases are the same member
    assert torchkiln.Input((2,), dtype=member).dtype == expected


def test_dtype_errors():
    with pytest.raises(ValueError, match="is not a type torchkiln knows"):
        torchkiln.dtype._from(torch.complex64)
    with pytest.raises(ValueError, match="only torch.dtype is a target"):
        torchkiln.dtype.f32.to(str)


# --- logging --------------------------------------------------------------------------------------------------

def test_logging_levels_and_context_managers(model, caplog):
    Level, tklog = torchkiln.logging.Level, logging.getLogger("torchkiln")
    assert (Level.Error, Level.Warning, Level.Info, Level.Debug) == (logging.ERROR, logging.WARNING, logging.INFO,
                                                                     logging.DEBUG)
    assert Level.Graph < Level.Debug < Level.Info < Level.InternalError
    before = tklog.level
    for manager, level in [(torchkiln.logging.errors, Level.Error), (torchkiln.logging.warnings, Level.Warning),
                           (torchkiln.logging.info, Level.Info), (torchkiln.logging.debug, Level.Debug),
                           (torchkiln.logging.graphs, Level.Graph),
                           (torchkiln.logging.internal_errors, Level.InternalError)]:
        with manager():
            assert torchkiln.logging.get_reportable_log_level() == level
        assert tklog.level == before
    caplog.set_level(logging.NOTSET)
    with torchkiln.logging.debug():
        torchkiln.compile(model, [torchkiln.Input((1, 3, 6, 6))])
    assert any(r.getMessage().startswith("graph after freeze:") for r in caplog.records)
    caplog.clear()
    with torchkiln.logging.errors():
        torchkiln.compile(model, [torchkiln.Input((1, 3, 6, 6))], workspace_size=1)
    assert not [r for r in caplog.records if r.name.startswith("torchkiln") and r.levelno < logging.ERROR]
    try:
        torchkiln.logging.set_reportable_log_level(Level.Info)
        assert torchkiln.logging.get_reportable_log_level() == Level.Info
        torchkiln.logging.log(Level.Info, "hello from the test")
        assert caplog.records[-1].getMessage() == "hello from the test"
    finally:
        tklog.setLevel(before)


# --- dump_build_info, set_device -------------------------------------------------------------------------------

def test_dump_build_info():
    buffer = io.StringIO()
    text = torchkiln.dump_build_info(buffer)
    assert buffer.getvalue() == text
    assert f"torchkiln: {torchkiln.__version__}\n" in text and f"torch: {torch.__version__}\n" in text
    assert "backends: {'reference': ['cpu', 'cuda'], 'onnxruntime': ['cpu'], 'cuda': ['cuda']}" in text
    assert f"cuda available: {torch.cuda.is_available()}" in text


def test_a_module_without_weights_takes_its_device_from_the_example_inputs():
    from torchkiln.compiler import _example_device

    meta = torch.empty(2, device="meta")
    assert _example_device([torchkiln.Input((2,)), {"x": (3, meta)}]) == torch.device("meta")
    assert _example_device([torchkiln.Input((2,))]) is None
    assert _example_device([torchkiln.Input((2,)), torchkiln.Input.from_tensor(meta)]) == torch.device("meta")


def test_set_device():
    with pytest.raises(ValueError, match="there is no CUDA device 99"):
        torchkiln.set_device(99)
    with pytest.raises(ValueError, match="gpu_id must be an int"):
        torchkiln.set_device("0")
    if torch.cuda.is_available():
        torchkiln.set_device(0)
        assert torch.cuda.current_device() == 0


# --- torchkiln.ts -----------------------------------------------------------------------------------------------

def test_ts_namespace_compiles_with_a_spec(model):
    x = torch.randn(2, 3, 6, 6)
    script = torch.jit.script(model)
    spec = torchkiln.ts.TensorRTCompileSpec(inputs=[torchkiln.Input((2, 3, 6, 6))],
                                            enabled_precisions={torch.float}, min_block_size=1)
    with torch.no_grad():
        for compiled, rtol in [
            (torchkiln.ts.compile(script, spec), 1e-4),
            (torchkiln.ts.compile(script, {"forward": spec}), 1e-4),
            (torchkiln.ts.compile(script, input_signature=(torchkiln.Input((2, 3, 6, 6)),)), 1e-4),
            (torchkiln.ts.compile(script, inputs=[x], enabled_precisions={torchkiln.dtype.half}, backend="reference"),
             2e-2),  # float16 layers
        ]:
            assert_matches_eager(compiled(x), model(x), rtol=rtol)
    with pytest.raises(ValueError, match="min_block_size must be an int >= 1"):
        torchkiln.ts.TensorRTCompileSpec(inputs=[torchkiln.Input((1,))], min_block_size=0)
    with pytest.raises(ValueError, match="unknown compile settings \\['workspace'\\]"):
        torchkiln.ts.TensorRTCompileSpec(inputs=[torchkiln.Input((1,))], workspace=1)
    with pytest.raises(ValueError, match="torchkiln compiles forward only"):
        torchkiln.ts.compile(script, {"forward": spec, "other": spec})
    with pytest.raises(ValueError, match="not also as keywords"):
        torchkiln.ts.compile(script, spec, min_block_size=2)


def test_ts_engine_functions(model):
    script = torch.jit.script(model)
    assert torchkiln.ts.check_method_op_support(script, "forward")
    engine = torchkiln.ts.convert_method_to_trt_engine(script, "forward", inputs=[torchkiln.Input((1, 3, 6, 6))])
    module = torchkiln.ts.embed_engine_in_new_module(engine, device=torchkiln.Device("cpu"))
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        assert_matches_eager(module(x), model(x))


# --- Input extras -----------------------------------------------------------------------------------------------

def test_input_shape_and_from_tensors():
    assert torchkiln.Input((1, 3)).shape == (1, 3)
    ranged = torchkiln.Input(min_shape=(1, 3), opt_shape=(2, 3), max_shape=(4, 3))
    assert ranged.shape == {"min_shape": (1, 3), "opt_shape": (2, 3), "max_shape": (4, 3)}
    a, b = torch.randn(2, 3), torch.arange(4)
    specs = torchkiln.Input.from_tensors([a, b])
    assert [(s.shape, s.dtype) for s in specs] == [((2, 3), torch.float32), ((4,), torch.int64)]
    assert specs[0].torch_tensor is not None and torch.equal(specs[0].torch_tensor, a)
    with pytest.raises(ValueError, match="takes a list or tuple of tensors"):
        torchkiln.Input.from_tensors(a)


def test_input_torch_tensor_and_example_tensor():
    t = torch.arange(6).reshape(2, 3)
    for spec in (torchkiln.Input(torch_tensor=t), torchkiln.Input(example_tensor=t),
                 torchkiln.Input((2, 3), dtype=torch.int64, torch_tensor=t)):
        assert (spec.shape, spec.dtype) == ((2, 3), torch.int64)
        assert torch.equal(spec.example_tensor(), t)  # shape analysis runs on it
    ranged = torchkiln.Input(min_shape=(1, 3), opt_shape=(2, 3), max_shape=(4, 3), dtype=torch.int64,
                             torch_tensor=t)
    assert torch.equal(ranged.example_tensor("opt_shape"), t)
    assert ranged.example_tensor("max_shape").shape == (4, 3)
    for kwargs, message in [
        (dict(shape=(2, 3), dtype=torch.float32, torch_tensor=t), "torch_tensor has dtype torch.int64 but the Input's dtype is "
                                             "torch.float32"),
        (dict(shape=(3, 3), dtype=torch.int64, torch_tensor=t), "outside the Input's shape range"),
        (dict(torch_tensor=t, example_tensor=t), "not both"),
        (dict(torch_tensor=[1, 2]), "must be a torch.Tensor"),
        (dict(torch_tensor=torch.nested.nested_tensor([t.float()])), "must be a tensor with a shape, got a nested"),
    ]:
        with pytest.raises(ValueError, match=message):
            torchkiln.Input(**kwargs)
    with pytest.raises(ValueError, match="this Input is a range"):
        ranged.example_tensor()
    with pytest.raises(ValueError, match="optimization_profile_field must be one of"):
        ranged.example_tensor("best")


def test_tensor_domain_is_used_for_random_inputs():
    spec = torchkiln.Input((1000,), tensor_domain=(2.0, 3.0))
    assert spec.tensor_domain == (2.0, 3.0)
    values = spec.example(torch.device("cpu"))
    assert values.min() >= 2.0 and values.max() < 3.0 and values.unique().numel() > 100
    ints = torchkiln.Input((1000,), dtype=torch.int32, tensor_domain=(-2, 3)).example(torch.device("cpu"))
    assert ints.dtype == torch.int32 and set(ints.unique().tolist()) == {-2, -1, 0, 1, 2}
    assert torchkiln.Input((3,)).tensor_domain is None
    for bad in [(1, 1), (2, 1), (0, float("inf")), (1,), "ab", (True, 2)]:
        with pytest.raises(ValueError, match="tensor_domain must be \\(low, high\\)"):
            torchkiln.Input((3,), tensor_domain=bad)


def test_tensor_domain_reaches_shape_analysis():
    class Lookup(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(10, 4)

        def forward(self, idx):
            return self.emb(idx) * 2

    model = Lookup().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input((5,), dtype=torch.int64, tensor_domain=(0, 10))],
                                 min_block_size=1)
    idx = torch.tensor([0, 9, 3, 3, 7])
    with torch.no_grad():
        assert_matches_eager(compiled(idx), model(idx))


# --- ir=, arg_inputs=, top-level names ---------------------------------------------------------------------------

def test_ir_ts_and_default_are_accepted_and_any_other_ir_is_refused(model):
    x = torch.randn(1, 3, 6, 6)
    script = torch.jit.script(model)
    with torch.no_grad():
        for compiled in (torchkiln.compile(model, inputs=[x], ir="ts"), torchkiln.compile(model, [x], ir="default"),
                         torchkiln.ts.compile(script, inputs=[x], ir="torchscript")):
            assert_matches_eager(compiled(x), model(x))
        engine = torchkiln.convert_method_to_trt_engine(script, "forward", inputs=[x], ir="ts")
        assert_matches_eager(torchkiln.embed_engine_in_new_module(engine)(x), model(x))
    for call in (torchkiln.compile, torchkiln.ts.compile, torchkiln.convert_method_to_trt_engine):
        with pytest.raises(ValueError, match="ir='dynamo': torchkiln compiles TorchScript; use ir='ts' or "
                                             "ir='default'"):
            call(model, inputs=[x], ir="dynamo")


def test_arg_inputs_is_another_name_for_inputs(model):
    x = torch.randn(1, 3, 6, 6)
    with torch.no_grad():
        assert_matches_eager(torchkiln.compile(model, arg_inputs=[torchkiln.Input((1, 3, 6, 6))])(x), model(x))
        engine = torchkiln.convert_method_to_trt_engine(model, arg_inputs=[x])
        assert_matches_eager(torchkiln.embed_engine_in_new_module(engine)(x), model(x))
    with pytest.raises(ValueError, match="give inputs or arg_inputs \\(another name for it\\), not both"):
        torchkiln.compile(model, inputs=[x], arg_inputs=[x])


def test_save_writes_torchscript_that_load_reads(model, tmp_path):
    x = torch.randn(1, 3, 6, 6)
    compiled = torchkiln.compile(model, ir="ts", inputs=[x], min_block_size=1)
    for output_format in ("torchscript", "ts"):
        path = tmp_path / f"{output_format}.ts"
        torchkiln.save(compiled, path, output_format=output_format, inputs=[x], extra_files={"note": "hi"})
        files = {"note": ""}
        loaded = torch.jit.load(path, _extra_files=files)
        assert files["note"] in ("hi", b"hi")
        with torch.no_grad():
            assert_matches_eager(torchkiln.load(path)(x), model(x))
            assert_matches_eager(loaded(x), model(x))
    with pytest.raises(ValueError, match="output_format='exported_program': torchkiln saves TorchScript"):
        torchkiln.save(compiled, tmp_path / "m.ep", output_format="exported_program")
    with pytest.raises(ValueError, match="save takes a compiled \\(TorchScript\\) module, got ConvNet"):
        torchkiln.save(model, tmp_path / "m.ts")


def test_engine_capability_default_is_standard(model, caplog):
    assert torchkiln.EngineCapability.default is torchkiln.EngineCapability.STANDARD
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        torchkiln.compile(model, [torchkiln.Input((1, 3, 6, 6))], capability=torchkiln.EngineCapability.default)
    assert not [r for r in caplog.records if "no effect" in r.getMessage()]


# --- Input: memory_format, dtype.unknown, settable fields --------------------------------------------------------

def test_memory_format_names_and_a_channels_last_input(model):
    mf = torchkiln.memory_format
    assert (mf.linear, mf.hwc) == (mf.contiguous, mf.channels_last)
    assert mf._from(torch.channels_last) is mf.channels_last and mf.contiguous.to(torch.memory_format) == \
        torch.contiguous_format
    for fmt in (mf.channels_last, torch.channels_last, "channels_last"):
        spec = torchkiln.Input((1, 3, 6, 6), format=mf._from(fmt))
        assert spec.format == spec.memory_format == torch.channels_last
    with pytest.raises(ValueError, match="is not a layout torchkiln's engines take"):
        mf._from(torch.preserve_format)
    x = torch.randn(1, 3, 6, 6).contiguous(memory_format=torch.channels_last)
    compiled = torchkiln.compile(model, [torchkiln.Input((1, 3, 6, 6), format=mf.channels_last)])
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))


def test_an_input_without_a_dtype_has_dtype_unknown():
    for spec in (torchkiln.Input((2, 3)), torchkiln.Input((2, 3), dtype=torchkiln.dtype.unknown),
                 torchkiln.ts.TorchScriptInput(shape=(2, 3), dtype=None)):
        assert (spec.dtype, spec.explicit_dtype) == (torchkiln.dtype.unknown, False)
        assert spec.example_tensor().dtype == torch.float32
    assert torchkiln.Input((2, 3), dtype=torchkiln.dtype.half).explicit_dtype
    assert torchkiln.Input.from_tensor(torch.zeros(2, dtype=torch.half)).explicit_dtype
    assert torchkiln.ts.TorchScriptInput is torchkiln.Input and torchkiln.ts.TorchScriptDevice is torchkiln.Device
    with pytest.raises(ValueError, match="dtype.unknown has no torch dtype"):
        torchkiln.dtype.unknown.to(torch.dtype)


def test_input_fields_can_be_set_and_are_checked_when_set():
    spec = torchkiln.Input((1, 3, 4, 4))
    spec.dtype = torch.half
    assert (spec.dtype, spec.explicit_dtype) == (torch.float16, True)
    spec.memory_format = torchkiln.memory_format.channels_last
    spec.shape = (2, 3, 4, 4)
    spec.name = "image"
    assert (spec.format, spec.opt_shape, spec.name) == (torch.channels_last, (2, 3, 4, 4), "image")
    for field, value, message in [
        ("dtype", torch.complex64, "Input dtype torch.complex64 is not supported"),
        ("shape", (2, 3), "channels_last needs a 4-d shape"),
        ("max_shape", (1, 3, 4, 4), "min <= opt <= max"),
        ("format", torch.preserve_format, "not supported; use torch.contiguous_format or torch.channels_last"),
    ]:
        with pytest.raises(ValueError, match=message):
            setattr(spec, field, value)
    assert (spec.dtype, spec.format, spec.opt_shape) == (torch.float16, torch.channels_last, (2, 3, 4, 4))
    with pytest.raises(AttributeError, match="Input.example_data cannot be set; settable: shape"):
        spec.example_data = torch.zeros(1)


# --- logging: Torch-TensorRT's torch_tensorrt.ts.logging names ----------------------------------------------------

def test_ts_logging_prefix_colour_and_level():
    from torchkiln.log import STYLE, Formatter

    tslog = torchkiln.ts.logging
    assert tslog is torchkiln.logging
    before = (tslog.get_logging_prefix(), tslog.get_is_colored_output_on(), logging.getLogger("torchkiln").level)
    record = logging.LogRecord("torchkiln.partitioning", logging.WARNING, __file__, 1, "two blocks", None, None)
    try:
        tslog.set_logging_prefix("Python API Test: ")
        assert tslog.get_logging_prefix() == "Python API Test: "
        assert Formatter().format(record) == "Python API Test: WARNING torchkiln.partitioning: two blocks"
        tslog.set_is_colored_output_on(True)
        assert tslog.get_is_colored_output_on()
        assert Formatter().format(record) == \
            "Python API Test: \033[33mWARNING\033[0m torchkiln.partitioning: two blocks"
        tslog.set_reportable_log_level(tslog.Level.Error)
        assert tslog.get_reportable_log_level() == tslog.Level.Error
        with pytest.raises(ValueError, match="set_logging_prefix takes a str"):
            tslog.set_logging_prefix(None)
        with pytest.raises(ValueError, match="set_is_colored_output_on takes True or False"):
            tslog.set_is_colored_output_on("yes")
    finally:
        STYLE.prefix, STYLE.colored = before[0], before[1]
        logging.getLogger("torchkiln").setLevel(before[2])


def test_ptq_names_port_and_a_wrong_calibrator_is_refused_by_name(model):
    """Torch-TensorRT's ptq names exist (the calibrators are tested in test_quantization.py); a calibrator that is
    none of them is refused naming the setting."""
    assert torchkiln.ptq.CalibrationAlgo.ENTROPY_CALIBRATION_2 is torchkiln.ptq.CalibrationAlgo.ENTROPY
    assert torchkiln.ptq.CalibrationAlgo.MINMAX_CALIBRATION is torchkiln.ptq.CalibrationAlgo.MAX
    with pytest.raises(ValueError, match="calibrator must be a torchkiln.ptq.DataLoaderCalibrator"):
        torchkiln.compile(model, [torchkiln.Input((1, 3, 6, 6))], enabled_precisions={torch.int8},
                          calibrator=object())
