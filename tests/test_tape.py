"""Tapes (docs/tape_format.md): recorded at build where asked, kept through the engine's bytes, refused where a replay
could go another way than the recording, and checked on load by the Python loader (the C++ loader's checks are in
tests/test_cpp_tape.py)."""
import logging
import struct

import pytest
import torch

import torchkiln
from torchkiln.errors import EngineFormatError
from torchkiln.runtime import tape_format
from torchkiln.runtime.backends import BackendOptions
from torchkiln.runtime.engine import Engine, InputBinding


class _Cnn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        return torch.softmax(self.head(y.mean((2, 3))), -1)


class _Embedding(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.table = torch.nn.Embedding(50, 16)
        self.head = torch.nn.Linear(16, 4)

    def forward(self, ids):
        return self.head(torch.tanh(self.table(ids)))


def _engine(module: torch.nn.Module, x: torch.Tensor, **settings) -> Engine:
    torch.manual_seed(0)
    compiled = torchkiln.compile(module.eval(), inputs=[x], backend="reference", **settings)
    return Engine.deserialize(bytes(compiled._c.getattr("_torchkiln_engine_0").numpy()))


@pytest.fixture(scope="module")
def cnn_engine() -> Engine:
    torch.manual_seed(0)
    return _engine(_Cnn(), torch.randn(2, 3, 16, 16), native_tape=True)


def test_a_cpu_build_asked_for_a_tape_records_one_that_survives_its_bytes(cnn_engine):
    assert len(cnn_engine.tapes) == 1
    doc, blob = tape_format.decode(cnn_engine.tapes[0], "tape")
    assert doc["target"]["device_type"] == "cpu" and doc["target"]["torch"] == torch.__version__.split("+")[0]
    assert doc["inputs"] == [{"dtype": "float32", "shape": [2, 3, 16, 16]}]
    ops = [i["op"] for i in doc["body"] if "op" in i]
    assert "aten::_convolution" in ops and "aten::addmm" in ops and "aten::_softmax" in ops
    # the body reads the weights the prologue bound, by reference to the engine's own: no constant copies
    assert doc["constants"] == [] and blob == b""
    bound = {i["out"]: tuple(i["weight"]) for i in doc["prologue"] if "weight" in i}
    layers = cnn_engine.network.layers
    assert all(name in layers[j].weights for j, name in bound.values()) and len(bound) == 4
    again = Engine.deserialize(cnn_engine.serialize())
    assert again.tapes == cnn_engine.tapes


def test_an_engine_of_dynamic_shapes_gets_a_tape_at_its_optimization_smallest_and_largest_inputs():
    """Then, by default, at every other batch of its range (4 shapes: at most native_tape_shapes)."""
    torch.manual_seed(0)
    spec = torchkiln.Input(min_shape=(1, 3, 16, 16), opt_shape=(2, 3, 16, 16), max_shape=(4, 3, 16, 16))
    for extra, batches in ((0, [2, 1, 4]), (None, [2, 1, 4, 3])):
        engine = _engine(_Cnn(), spec, native_tape=True,
                         **({"native_tape_shapes": extra} if extra is not None else {}))
        assert [tape_format.decode(t, "tape")[0]["inputs"][0]["shape"] for t in engine.tapes] == \
            [[b, 3, 16, 16] for b in batches]


def test_no_tape_unless_asked_off_the_cuda_backend():
    torch.manual_seed(0)
    assert _engine(_Cnn(), torch.randn(2, 3, 16, 16)).tapes == []


def test_a_body_that_reads_a_value_on_the_host_gets_no_tape(caplog):
    """The reference gather checks its indices on the host: a later call could raise where the recording did not."""
    with caplog.at_level(logging.INFO, logger="torchkiln.runtime.tape"):
        engine = _engine(_Embedding(), torch.randint(0, 50, (2, 7)), native_tape=True)
    assert engine.tapes == []
    assert any("aten::_local_scalar_dense" in r.getMessage() and "another course" in r.getMessage()
               for r in caplog.records)


def _with_tape(engine: Engine, doc: dict, blob: bytes = b"") -> bytes:
    copy = Engine.deserialize(engine.serialize())
    copy.tapes = [tape_format.encode(doc, blob)]
    return copy.serialize()


def _doc(engine: Engine) -> dict:
    return tape_format.decode(engine.tapes[0], "tape")[0]


def _first(doc: dict, key: str) -> dict:
    return next(i for i in doc["body"] + doc["prologue"] if key in i)


def with_launch(doc: dict, **keys) -> dict:
    """`doc` with a kernel of no params (an empty cubin) and, at the body's end, a launch of it with `keys` added."""
    doc["kernels"].append({"name": "k", "cubin": [0, 0], "num_warps": 1, "shared": 0, "params": []})
    doc["body"].append({"launch": len(doc["kernels"]) - 1, "grid": [1, 1, 1], "args": [], **keys})
    return doc


HOSTILE = {
    "an id past num_values": (lambda d: d["outputs"].__setitem__(0, d["num_values"]), "value id"),
    "a value read before it is written": (lambda d: next(i for i in d["prologue"] if "op" in i)["args"].__setitem__(
        0, {"t": d["outputs"][0]}), "before anything"),
    "a value written twice": (lambda d: d["body"].append(dict(d["body"][-1])), "a second time"),
    "an unknown weight": (lambda d: _first(d, "weight")["weight"].__setitem__(1, "nope"), "has no weight"),
    "a weight of no layer": (lambda d: _first(d, "weight")["weight"].__setitem__(0, 10 ** 6), "layer"),
    "an unknown dtype": (lambda d: d["inputs"][0].__setitem__("dtype", "float128"), "unknown dtype"),
    "an unknown argument tag": (lambda d: _first(d, "op")["args"].append({"pointer": 3}), "unknown argument tag"),
    "two instruction kinds": (lambda d: d["body"][0].__setitem__("launch", 0), "exactly one of the keys"),
    "a kernel past the table": (lambda d: d["body"].append({"launch": 0, "grid": [1, 1, 1], "args": []}),
                                "kernel"),
    "a constant past the blob": (lambda d: d["constants"].append({"data": [0, 4], "dtype": "float32", "shape": [1],
                                                                  "strides": [1], "device": "cpu"}), "data length"),
    "too few inputs": (lambda d: d["inputs"].clear(), "0 inputs"),
    "a foreign device": (lambda d: d["target"].__setitem__("device_type", "tpu"), "device_type"),
    "a pdl of 1": (lambda d: with_launch(d, pdl=1), "'pdl' must be true or false"),
    "a pdl of a string": (lambda d: with_launch(d, pdl="true"), "'pdl' must be true or false"),
    "a pdl of null": (lambda d: with_launch(d, pdl=None), "'pdl' must be true or false"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_tape_is_an_engine_format_error(cnn_engine, case):
    mutate, message = HOSTILE[case]
    doc = _doc(cnn_engine)
    mutate(doc)
    with pytest.raises(EngineFormatError, match=message):
        Engine.deserialize(_with_tape(cnn_engine, doc))


def test_a_launch_with_another_argument_count_than_its_kernel_is_refused(cnn_engine):
    doc = _doc(cnn_engine)
    doc["kernels"] = [{"name": "k", "cubin": [0, 4], "num_warps": 4, "shared": 0, "params": ["*fp32", "i32"]}]
    doc["body"].append({"launch": 0, "grid": [1, 1, 1], "args": [{"t": 0}]})
    with pytest.raises(EngineFormatError, match="1 args for kernel 0's 2 params"):
        Engine.deserialize(_with_tape(cnn_engine, doc, b"\0" * 4))
    doc["body"][-1]["args"] = [3, 4]
    with pytest.raises(EngineFormatError, match="a pointer param takes a tensor value"):
        Engine.deserialize(_with_tape(cnn_engine, doc, b"\0" * 4))


def test_a_launch_marked_programmatic_or_not_loads(cnn_engine):
    """`pdl` true, false or absent (a tape written before the field: a plain launch)."""
    doc = _doc(cnn_engine)
    for keys in ({"pdl": True}, {"pdl": False}, {}):
        with_launch(doc, **keys)
    again = Engine.deserialize(_with_tape(cnn_engine, doc))
    assert [i.get("pdl") for i in _doc(again)["body"] if "launch" in i] == [True, False, None]


@pytest.mark.parametrize("header, message", [
    (b"TKTAPX\0\0" + struct.pack("<IQ", 1, 2) + b"{}", "bad magic"),
    (tape_format.MAGIC + struct.pack("<IQ", 2, 2) + b"{}", "version 2"),
    (tape_format.MAGIC + struct.pack("<IQ", 1, 99) + b"{}", "runs past"),
    (tape_format.MAGIC + struct.pack("<IQ", 1, 3) + b"{\"a", "does not parse"),
    (tape_format.MAGIC + struct.pack("<IQ", 1, 3) + b"NaN", "does not parse"),
    (tape_format.MAGIC[:5], "truncated"),
])
def test_a_tape_section_with_a_bad_header_is_refused(cnn_engine, header, message):
    copy = Engine.deserialize(cnn_engine.serialize())
    copy.tapes = [header]
    with pytest.raises(EngineFormatError, match=message):
        Engine.deserialize(copy.serialize())


def test_work_on_the_meta_device_is_not_recorded():
    """Shapes a step works out on meta tensors are the host's business: nothing for a replay to run."""
    from torchkiln.runtime.tape import _Recorder

    recorder = _Recorder({}, torch.device("cpu"))
    x = torch.randn(3)
    recorder.define(x)
    with recorder:
        shape = (torch.empty(2, 3, device="meta") @ torch.empty(3, 4, device="meta")).shape
        y = x + shape[1]
    assert [i["op"] for i in recorder.instructions] == ["aten::add"]
    assert recorder.instructions[0]["args"] == [{"t": 0}, 4] and recorder.known(y) == 1


def test_a_zero_dim_constant_the_run_reads_is_stored_with_its_bytes():
    """A scalar tensor no recorded call made (a 0-dim float64 constant) is stored whole; viewing it as bytes needs
    one dim first (a 0-dim tensor cannot change its element size)."""
    from torchkiln.runtime.tape import _Recorder

    recorder = _Recorder({}, torch.device("cpu"))
    x = torch.randn(3)
    recorder.define(x)
    scale = torch.tensor(2.5, dtype=torch.float64)
    with recorder:
        x * scale
    (constant,) = recorder.constants
    assert constant["shape"] == [] and constant["dtype"] == "float64"
    assert struct.unpack("<d", bytes(recorder.blob)) == (2.5,)


def _compiled(pdl: bool):
    """A kernel in a generated kernel's form (`PDL` last, its wait first) compiled for a Hopper GPU, chained as
    `codegen.chain_options` asks (PDL=True and Triton's launch_pdl) or not: Triton's own compile, which needs no GPU."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.language.extra.cuda import gdc_wait

    @triton.jit
    def add_one_kernel(x, n, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
        if PDL:
            gdc_wait()
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)

    source = ASTSource(add_one_kernel, {"x": "*fp32", "n": "i32", "BLOCK": "constexpr", "PDL": "constexpr"},
                       {"BLOCK": 128, "PDL": pdl})
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"launch_pdl": pdl, "num_warps": 4})


def test_a_launch_of_a_kernel_compiled_chained_is_written_down_as_programmatic(tmp_path, monkeypatch):
    """A chained kernel (compiled with launch_pdl, which Triton's launcher launches programmatically dependent) is a
    kernel row of its own, its launches are marked `"pdl": true` and the plain kernel's launches carry no `pdl`;
    the tape made of them loads."""
    pytest.importorskip("triton", reason="triton is not installed")
    from torchkiln.runtime.serialization import DTYPES
    from torchkiln.runtime.tape import _Recorder

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    plain, chained = _compiled(False), _compiled(True)
    assert (plain.metadata.launch_pdl, chained.metadata.launch_pdl) == (False, True)
    recorder = _Recorder({}, torch.device("cpu"))
    x = torch.zeros(300)
    recorder.define(x)
    for kernel, pdl in ((plain, False), (chained, True), (chained, True), (plain, False)):
        recorder.launch((3, 1, 1), 0, (x, 300, 128, pdl))  # every parameter's, as Triton's launcher gets them
        recorder.launched(kernel)
    assert recorder.instructions == [
        {"launch": 0, "grid": [3, 1, 1], "args": [{"t": 0}, 300]},
        {"launch": 1, "grid": [3, 1, 1], "args": [{"t": 0}, 300], "pdl": True},
        {"launch": 1, "grid": [3, 1, 1], "args": [{"t": 0}, 300], "pdl": True},
        {"launch": 0, "grid": [3, 1, 1], "args": [{"t": 0}, 300]}]
    assert [k["params"] for k in recorder.kernels] == [["*fp32", "i32"]] * 2
    target = {"device_type": "cuda", "device_name": "NVIDIA H100", "capability": "9.0", "torch": "2.13.0",
              "triton": "3.6.0"}
    doc = {"target": target, "inputs": [{"dtype": "float32", "shape": [300]}], "num_values": 1,
           "kernels": recorder.kernels, "constants": [], "prologue": [], "body": recorder.instructions,
           "outputs": [0]}
    tape_format.check(tape_format.encode(doc, bytes(recorder.blob)), "tape", [], 1, 1, DTYPES)


def test_a_recording_chains_generated_steps_as_a_captured_run_does(cnn_engine, monkeypatch):
    """The runner records under `codegen.captured_later` (the C++ runtime captures the body), so on a GPU that
    chains it links generated steps there as inside its own graphs; outside a recording an uncaptured run does not."""
    from torchkiln.runtime import tape
    from torchkiln.runtime.backends.cuda import codegen

    monkeypatch.setattr(codegen, "chains", lambda device: True)  # a GPU that chains (none here)
    gpu = torch.device("cuda")
    chains_when_run = []
    make_runner = tape.make_runner

    def observed(*args, **kwargs):
        runner = make_runner(*args, **kwargs)
        run = runner.run
        runner.run = lambda inputs: chains_when_run.append(codegen.chains_steps(gpu, False)) or run(inputs)
        return runner

    monkeypatch.setattr(tape, "make_runner", observed)
    tape.record_tape(cnn_engine, torch.device("cpu"))
    assert chains_when_run == [True, True]  # the prologue's call and the body's
    assert not codegen.chains_steps(gpu, False)


def chain_engine() -> Engine:
    """A cuda engine of test_cuda_chained_launch's network (untimed: its product stays a library call): a row kernel,
    an indexed kernel chained to it, a library product, then a row kernel not chained to it."""
    from test_cuda_chained_launch import chain_network

    net = chain_network()
    bindings = [InputBinding(t.name, t.dtype, t.shape, t.shape, t.shape) for t in net.inputs]
    return Engine(net, bindings, "cuda", torch.float32, net.name, "cuda", BackendOptions(timing_iterations=0))


CHAINING_GPU = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0),
                                  reason="needs a GPU that chains launches (compute capability 9.0 or later)")


@CHAINING_GPU
def test_a_gpu_tape_marks_the_launches_the_captured_runner_chains():
    """The tape's body launches the indexed kernel (alone) programmatically dependent, as the captured runner chains
    it; the Python runner uncaptured (cuda_graphs=False) chains nothing."""
    from torchkiln.runtime.backends.cuda.runner import CudaRunner
    from torchkiln.runtime.tape import record_tape

    engine = chain_engine()
    device = torch.device("cuda", torch.cuda.current_device())
    doc = tape_format.decode(record_tape(engine, device), "tape")[0]
    assert [i.get("pdl", False) for i in doc["body"] if "launch" in i] == [False, True, False]
    x = torch.randn(4, 16, 32, device=device)
    for graphs, links in ((True, {2}), (False, set())):
        options = BackendOptions(timing_iterations=0, cuda_graphs=graphs)
        runner = CudaRunner(engine.network, engine.plan_for(device), device, options)
        runner.run([x])
        assert [set(b.links) for b in runner._bound.values()] == [links]
