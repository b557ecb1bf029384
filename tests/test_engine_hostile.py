"""Hostile engines and engine attributes (with valid checksums: made on purpose, not damaged): refused with
EngineFormatError naming what was expected, in bounded time, or run within this machine's means."""
import copy
import io
import logging

import pytest
import torch
from test_engine_format import _pack, _split

import torchkiln
from torchkiln.examples import MLP
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import DimSymbol
from torchkiln.runtime.engine import Engine, InputBinding, usable_cores

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def model_and_compiled():
    model = MLP().eval()
    return model, torchkiln.compile(model, [torchkiln.Input((2, 64))])


def _saved_and_loaded(module):
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torchkiln.load(buffer)


_OF = "engine attribute must be a uint8 tensor of engine bytes, got "


@pytest.mark.filterwarnings("ignore:.*(deprecated|beta state)")  # quantized and sparse CSR tensors warn so
@pytest.mark.parametrize("kind, message", [
    ("bfloat16", _OF + "a torch.bfloat16 tensor"), ("int8", _OF + "a torch.int8 tensor"),
    ("quantized", _OF + r"a quantized tensor \(torch.quint8\)"), ("sparse", _OF + "a torch.sparse_coo tensor"),
    ("sparse_csr", _OF + "a torch.sparse_csr tensor"), ("meta", "engine attribute is on the meta device"),
])
def test_an_engine_attribute_of_another_kind_is_a_format_error(model_and_compiled, kind, message):
    model, compiled = model_and_compiled
    blob = compiled._torchkiln_engine_0
    hostile = {"bfloat16": lambda: blob.to(torch.bfloat16), "int8": lambda: blob.to(torch.int8),
               "quantized": lambda: torch.quantize_per_tensor(blob.float(), 1.0, 0, torch.quint8),
               "sparse": blob.to_sparse, "sparse_csr": lambda: blob.view(1, -1).to_sparse_csr(),
               "meta": lambda: blob.to("meta")}[kind]()
    module = copy.deepcopy(compiled)
    module._torchkiln_engine_0 = hostile
    x = torch.randn(2, 64)
    for m in (module, _saved_and_loaded(module)):
        with pytest.raises(torchkiln.EngineFormatError, match=message):
            m(x)
        with torch.inference_mode(), pytest.raises(torchkiln.EngineFormatError, match=message):
            m(x)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-6)  # the module itself still runs


def test_an_engine_attribute_that_is_none_is_a_format_error(model_and_compiled):
    """A saved module whose engine attribute was pickled as None reaches the op as None."""
    _, compiled = model_and_compiled
    signature = compiled.graph.findNode("torchkiln::execute_engine").inputsAt(2).toIValue()
    with pytest.raises(torchkiln.EngineFormatError, match=_OF + "None"):
        torch.ops.torchkiln.execute_engine([torch.randn(2, 64)], None, signature)
    with pytest.raises(torchkiln.EngineFormatError, match=_OF + "None"):
        torch.ops.torchkiln.execute_engine([torch.empty(2, 64, device="meta")], None, signature)


def test_an_engine_asking_for_more_ort_threads_than_cores_runs_with_one_per_core(caplog):
    """ort_threads=1024 (the settings' bound) made the first call start 1,026 threads: an engine built on a larger
    machine gets one thread per usable core here, with a warning, and keeps its setting in its bytes."""
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
    data = torchkiln.convert_method_to_engine(model, "forward", [torchkiln.Input((2, 4))], ort_threads=1)
    _, graph, weights = _split(data)
    graph["ort_threads"] = 1024
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        engine = Engine.deserialize(_pack(graph, weights))
    assert f"asks for 1024 ONNX Runtime threads; this machine has {usable_cores()} usable cores" in caplog.text
    assert engine.backend == "onnxruntime" and engine.backend_options.ort_threads == 1024
    [(step, _, _)] = engine.runner(CPU).steps
    assert step.session.get_session_options().intra_op_num_threads == usable_cores()
    x = torch.randn(2, 4)
    with torch.no_grad():
        torch.testing.assert_close(engine.execute([x])[0], model(x), rtol=1e-5, atol=1e-6)
    assert Engine.deserialize(engine.serialize()).backend_options.ort_threads == 1024


def _slice_engine() -> bytes:
    """An engine slicing x[s0, s1] to its own shape: its output shape is a parameter a hostile file may change."""
    s0, s1 = DimSymbol("s0", 1, 4), DimSymbol("s1", 1, 4)
    network = Network("h")
    x = network.add_input("x", torch.float32, (s0, s1))
    network.mark_output(network.add_slice(x, (0, 0), (s0, s1), (1, 1)).get_output())
    return Engine(network, [InputBinding("x", torch.float32, (1, 1), (2, 2), (4, 4))], "cpu", torch.float32,
                  "h").serialize()


S0, S1 = {"op": "sym", "name": "s0"}, {"op": "sym", "name": "s1"}


@pytest.mark.parametrize("tree, message", [
    ({"op": "mul", "args": [S0] * 64}, r"s0\*\*64 is a power above 8"),
    ({"op": "mul", "args": [{"op": "add", "args": [S0, S1, 1]}] * 60}, "expanded, it has over 256 terms"),
    ({"op": "max", "args": [{"op": "add", "args": [{"op": "mul", "args": [S0, S1]}, k]} for k in range(64)]},
     "a max of 64 arguments"),
], ids=["power", "squared-sums", "wide-max"])
def test_an_engine_whose_dims_blow_up_is_refused_at_load(tree, message):
    _, graph, weights = _split(_slice_engine())
    layer = graph["network"]["layers"][0]
    layer["params"]["shape"][0] = layer["outputs"][0]["shape"][0] = tree
    with pytest.raises(torchkiln.EngineFormatError, match=rf"parameter 'shape': .*{message}"):
        Engine.deserialize(_pack(graph, weights))
