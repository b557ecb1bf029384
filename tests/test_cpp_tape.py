"""Tapes in the C++ runtime (docs/tape_format.md): CPU tapes recorded on the reference backend are replayed by the
C++ runtime (TORCHKILN_TAPE_LOG=1 says so) and give the Python runtime's bits, on their first call and later ones;
a call the tape does not fit runs the layers, with one warning; a tape's operator arguments are typed by the
operators' schemas; the C++ loader refuses hostile tapes as the Python one does, with its words, in bounded time;
a kernel launch gets the bytes Triton's launcher would give it, a chained one its programmatic dependent launch
(through a stand-in CUDA driver: no GPU here)."""
from __future__ import annotations

import dataclasses
import json
import random
import struct
import subprocess
from typing import List

import pytest
import torch
from test_cpp_runtime import (RUN_SECONDS, _calibrated, _Cnn, _Engines, _no_python_env, assert_bitwise, check_in_cpp,
                              cpp)
from test_engine_fuzz import MAX_FLOPS, MAX_MEMORY
from test_tape import CHAINING_GPU, HOSTILE, chain_engine, with_launch

import torchkiln
from torchkiln.runtime import tape_format
from torchkiln.runtime.tape import record_tape, tape_shapes
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.execute_op import engine_blob

__all__ = ["cpp"]  # test_cpp_runtime's fixture: the runtime, its check tool and run_module, built into one folder


class _Encoder(torch.nn.Module):
    """A post-norm transformer encoder layer: SDPA and a GELU feed-forward, each followed by a layer norm."""

    def __init__(self, d: int = 16, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.ff = torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(), torch.nn.Linear(2 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d)
        x = self.norm1(x + self.out(a))
        return self.norm2(x + self.ff(x))


def _taped(model: torch.nn.Module, spec: torchkiln.Input, extra: int = 0) -> tuple[torch.Tensor, Engine]:
    """The engine blob of `model` compiled whole on the reference backend with CPU tapes (at `extra` more shapes than
    its optimization, smallest and largest), and its engine."""
    compiled = torchkiln.compile(model.eval(), inputs=[spec], backend="reference", native_tape=True,
                                 native_tape_shapes=extra, min_block_size=1)
    blob = compiled._c.getattr("_torchkiln_engine_0")
    engine = Engine.deserialize(bytes(blob.numpy()))
    assert len(engine.tapes) == len(tape_shapes(engine, extra)) and not compiled._c.hasattr("_torchkiln_engine_1")
    return blob, engine


@pytest.fixture(scope="module")
def cnn() -> tuple[torch.Tensor, Engine]:
    torch.manual_seed(0)
    return _taped(_calibrated(_Cnn(), torch.randn(8, 3, 32, 32)), torchkiln.Input((2, 3, 32, 32)))


def _run_engines(cpp, blobs: List[torch.Tensor], inputs: List[List[torch.Tensor]], tmp_path, **env: str):
    """Each engine blob called by the op on its inputs in one C++ process: (outputs, stderr, return code)."""
    torch.jit.save(torch.jit.script(_Engines(blobs, inputs)), str(tmp_path / "m.pt"))
    torch.save((), tmp_path / "in.pt")
    done = subprocess.run([str(cpp["run"]), str(tmp_path / "m.pt"), str(tmp_path / "in.pt"), str(tmp_path / "out.pt")],
                          capture_output=True, text=True, timeout=RUN_SECONDS, env={**_no_python_env(), **env})
    outputs = torch.load(tmp_path / "out.pt", weights_only=False) if done.returncode == 0 else None
    return outputs, done.stderr, done.returncode


def _python(blob: torch.Tensor, xs: List[torch.Tensor]) -> List[torch.Tensor]:
    with torch.no_grad():
        return torch.ops.torchkiln.execute_engine(xs, blob, "")


def test_recorded_tapes_run_in_cpp_as_the_python_runtime_runs_the_plan(cpp, cnn, tmp_path):
    """A CNN, an MLP with a dynamic batch and an attention encoder: each engine's tape runs in C++ (its first call
    runs the prologue, later ones the body again) with the Python runtime's bits. The dynamic engine holds tapes at
    its optimization, smallest and largest batches (tapes 0, 1 and 2); a call at another batch runs the layers, with
    one warning naming the tapes' inputs."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    cases = [(cnn[0], [[torch.randn(2, 3, 32, 32)] for _ in range(3)]),
             (_taped(mlp, torchkiln.Input(min_shape=(1, 8), opt_shape=(3, 8), max_shape=(8, 8)))[0],
              [[torch.randn(3, 8)], [torch.randn(5, 8)], [torch.randn(3, 8)], [torch.randn(8, 8)],
               [torch.randn(1, 8)], [torch.randn(8, 8)]]),
             (_taped(_Encoder(), torchkiln.Input((2, 5, 16)))[0], [[torch.randn(2, 5, 16)] for _ in range(2)])]
    blobs = [blob for blob, calls in cases for _ in calls]
    inputs = [xs for _, calls in cases for xs in calls]
    got, stderr, code = _run_engines(cpp, blobs, inputs, tmp_path, TORCHKILN_TAPE_LOG="1")
    assert code == 0, stderr
    for k, (blob, xs, g) in enumerate(zip(blobs, inputs, got)):
        assert_bitwise(g, [o.cpu() for o in _python(blob, xs)], f"call {k}")
    names = [Engine.deserialize(bytes(blob.numpy())).name for blob, _ in cases]
    for name in names:
        assert stderr.count(f"torchkiln: engine '{name}' runs tape 0 on cpu") == 1, stderr
    for k in (1, 2):
        assert stderr.count(f"torchkiln: engine '{names[1]}' runs tape {k} on cpu") == 1, stderr
    warned = [line for line in stderr.splitlines() if "not a tape" in line]
    assert len(warned) == 1 and f"'{names[1]}'" in warned[0] and all(
        f"float32[{b}, 8]" in warned[0] for b in (3, 1, 8, 5)), stderr


def test_a_dynamic_engine_has_a_tape_at_every_shape_of_a_small_range_or_at_powers_of_two(cpp, tmp_path):
    """`native_tape_shapes`: a dynamic batch of 1-8 gets a tape at every batch, and C++ runs one at each with the
    Python runtime's bits and no warning; a batch of 1-40 gets tapes at the powers of two (and at its optimization,
    smallest and largest batches), and a batch between them runs the layers."""
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    blob, engine = _taped(mlp, torchkiln.Input(min_shape=(1, 8), opt_shape=(3, 8), max_shape=(8, 8)), 8)
    assert [tape_format.decode(t, "tape")[0]["inputs"][0]["shape"][0] for t in engine.tapes] == [3, 1, 8, 2, 4, 5, 6, 7]
    wide = _taped(mlp, torchkiln.Input(min_shape=(1, 8), opt_shape=(3, 8), max_shape=(40, 8)), 8)[1]
    assert [s[0][0] for s in tape_shapes(wide, 8)] == [3, 1, 40, 2, 4, 8, 16, 32]
    assert [s[0][0] for s in tape_shapes(wide, 5)] == [3, 1, 40]  # (six powers of two: more than 5)
    inputs = [[torch.randn(b, 8)] for b in range(1, 9)]
    got, stderr, code = _run_engines(cpp, [blob] * 8, inputs, tmp_path, TORCHKILN_TAPE_LOG="1")
    assert code == 0 and "not a tape" not in stderr, stderr
    for k, (xs, g) in enumerate(zip(inputs, got)):
        assert_bitwise(g, _python(blob, xs), f"batch {k + 1}")
    assert all(f"runs tape {k} on cpu" in stderr for k in range(8)), stderr


def test_tapes_share_what_their_prologues_make_from_weights_alone(cpp, tmp_path):
    """Two tapes of one engine (batches 1 and 2) whose prologues copy a weight that their bodies read: the second
    tape takes the first's copy (logged) and returns the same bits. Where a body writes into that copy (an in-place
    operator), nothing is shared."""
    torch.manual_seed(0)
    _, engine = _taped(torch.nn.Linear(8, 4), torchkiln.Input(min_shape=(1, 8), opt_shape=(1, 8), max_shape=(2, 8)))
    weight = next(j for j, layer in enumerate(engine.network.layers) if "value" in layer.weights)
    linear = next(j for j, layer in enumerate(engine.network.layers) if "bias" in layer.weights)
    prologue = [{"weight": [weight, "value"], "out": 1}, {"op": "aten::clone", "overload": "", "args": [_t(1)],
                                                          "kwargs": {}, "out": [2]},
                {"weight": [linear, "bias"], "out": 3}]
    body = [{"op": "aten::t", "overload": "", "args": [_t(2)], "kwargs": {}, "out": [4]},
            {"op": "aten::addmm", "overload": "", "args": [_t(3), _t(0), _t(4)], "kwargs": {}, "out": [5]}]
    in_place = [{"op": "aten::mul_", "overload": "Tensor", "args": [_t(2), 1.0], "kwargs": {}, "out": [6]}, *body]
    blobs = []
    for steps in (body, in_place):
        copy = Engine.deserialize(engine.serialize())
        docs = [dict(_doc(engine), inputs=[{"dtype": "float32", "shape": [b, 8]}], num_values=7, kernels=[],
                     constants=[], prologue=prologue, body=steps, outputs=[5]) for b in (1, 2)]
        copy.tapes = [tape_format.encode(doc, b"") for doc in docs]
        blobs.append(engine_blob(copy.serialize()))
    inputs = [[torch.randn(1, 8)], [torch.randn(2, 8)]] * 2
    got, stderr, code = _run_engines(cpp, [blobs[0], blobs[0], blobs[1], blobs[1]], inputs, tmp_path,
                                     TORCHKILN_TAPE_LOG="1")
    assert code == 0, stderr
    w, b = (engine.network.layers[weight].weights["value"], engine.network.layers[linear].weights["bias"])
    for xs, g in zip(inputs, got):
        assert_bitwise(g, [torch.addmm(b, xs[0], w.clone().t())])
    assert stderr.count(f"engine '{engine.name}' tape 1 on cpu took 1 of its prologue's values") == 1, stderr
    assert stderr.count("of its prologue's values") == 1, stderr


def _with_doc(engine: Engine, doc: dict, blob: bytes = b"") -> torch.Tensor:
    copy = Engine.deserialize(engine.serialize())
    copy.tapes = [tape_format.encode(doc, blob)]
    return engine_blob(copy.serialize())


def _doc(engine: Engine) -> dict:
    return tape_format.decode(engine.tapes[0], "tape")[0]


def test_a_tape_for_another_torch_runs_the_layers_and_says_so(cpp, cnn, tmp_path):
    doc = _doc(cnn[1])
    doc["target"]["torch"] = "0.1.0"
    blob, x = _with_doc(cnn[1], doc), torch.randn(2, 3, 32, 32)
    got, stderr, code = _run_engines(cpp, [blob, blob], [[x], [x]], tmp_path, TORCHKILN_TAPE_LOG="1")
    assert code == 0, stderr
    assert_bitwise(got, [_python(blob, [x])] * 2)
    assert "runs tape" not in stderr, stderr
    assert stderr.count("not a tape: its tapes are for cpu torch 0.1.0, not cpu torch") == 1, stderr


def _t(value: int) -> dict:
    return {"t": value}


# A hand-written body of (3, 8) float32 -> (3, 4) float32 whose arguments take every kind the schemas give:
# Tensor[] returns flattened, an int Scalar by name, dtype/layout/device/bool kwargs, Tensor?[] with None, an
# optional Scalar left None, floats as tagged strings, a strided constant on the engine device, an int list, and
# numbers for Tensor arguments (wrapped numbers: `x * 0.5` reaches a dispatch mode as aten::mul.Tensor(x, 0.5)).
_ARGUMENTS_BODY = [
    {"op": "aten::split_with_sizes", "overload": "", "args": [_t(0), [4, 4], 1], "kwargs": {}, "out": [1, 2]},
    {"op": "aten::add", "overload": "Tensor", "args": [_t(1), _t(2)], "kwargs": {"alpha": 2}, "out": [3]},
    {"op": "aten::full", "overload": "", "args": [[3, 4], {"float": "-inf"}],
     "kwargs": {"dtype": {"dtype": "float32"}, "layout": {"layout": "strided"}, "device": {"device": "engine"},
                "pin_memory": False}, "out": [4]},
    {"constant": 0, "out": 5},
    {"op": "aten::index", "overload": "Tensor", "args": [_t(3), [None, _t(5)]], "kwargs": {}, "out": [6]},
    {"op": "aten::clamp", "overload": "", "args": [_t(6), None, 1.5], "kwargs": {}, "out": [7]},
    {"op": "aten::gt", "overload": "Scalar", "args": [_t(7), 0], "kwargs": {}, "out": [8]},
    {"op": "aten::where", "overload": "self", "args": [_t(8), _t(7), _t(4)], "kwargs": {}, "out": [9]},
    {"constant": 1, "out": 10},
    {"op": "aten::mul", "overload": "Tensor", "args": [_t(9), _t(10)], "kwargs": {}, "out": [11]},
    {"op": "aten::contiguous", "overload": "", "args": [_t(11)],
     "kwargs": {"memory_format": {"memory_format": "contiguous_format"}}, "out": [12]},
    {"op": "aten::mul", "overload": "Tensor", "args": [_t(12), 0.5], "kwargs": {}, "out": [13]},
    {"op": "aten::sub", "overload": "Tensor", "args": [_t(13), 3], "kwargs": {}, "out": [14]},
]


def _arguments_tape(engine: Engine) -> tuple[dict, bytes]:
    index = torch.tensor([3, 2, 1, 0])
    scale = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    doc = _doc(engine)
    doc.update(num_values=15, kernels=[], prologue=[], body=_ARGUMENTS_BODY, outputs=[14], constants=[
        {"data": [0, 32], "dtype": "int64", "shape": [4], "strides": [1], "device": "engine"},
        {"data": [32, 48], "dtype": "float32", "shape": [3, 4], "strides": [1, 3], "device": "engine"}])
    return doc, index.numpy().tobytes() + scale.numpy().tobytes()


def _arguments_want(x: torch.Tensor) -> torch.Tensor:
    index = torch.tensor([3, 2, 1, 0])
    scale = torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7
    a, b = x.split_with_sizes([4, 4], 1)
    y = torch.add(a, b, alpha=2)[:, index].clamp(None, 1.5)
    return (torch.where(y > 0, y, torch.full((3, 4), float("-inf"))) * scale).contiguous() * 0.5 - 3


def test_operator_arguments_follow_their_schemas(cpp, tmp_path):
    """A hand-written tape (the recorder makes few of these argument kinds on a CPU), run twice; an operator this
    torch does not have, an argument its schema's type cannot take and one neither given nor defaulted are
    EngineFormatErrors naming the tape, the instruction and the operator or argument."""
    torch.manual_seed(0)
    _, engine = _taped(torch.nn.Linear(8, 4), torchkiln.Input((3, 8)))
    doc, data = _arguments_tape(engine)
    blob, xs = _with_doc(engine, doc, data), [torch.randn(3, 8), torch.randn(3, 8)]
    Engine.deserialize(bytes(blob.numpy()))  # the Python loader takes it too
    got, stderr, code = _run_engines(cpp, [blob, blob], [[x] for x in xs], tmp_path, TORCHKILN_TAPE_LOG="1")
    assert code == 0 and "runs tape 0 on cpu" in stderr, stderr
    for g, x in zip(got, xs):
        assert_bitwise(g, [_arguments_want(x)])
    for change, words in [
            (lambda body: body[6].update(op="aten::no_such_op"),
             "body instruction 6: this torch has no operator aten::no_such_op.Scalar"),
            (lambda body: body[6]["args"].__setitem__(1, "zero"),
             "body instruction 6 (aten::gt) argument 'other': a Scalar argument cannot take what the tape gives"),
            (lambda body: body[9]["args"].pop(),
             "body instruction 9 (aten::mul): argument 'other' is given no value and has no default")]:
        bad = json.loads(json.dumps(doc))
        change(bad["body"])
        _, stderr, code = _run_engines(cpp, [_with_doc(engine, bad, data)], [[xs[0]]], tmp_path)
        assert code == 1 and f"EngineFormatError: engine tape 0: {words}" in stderr, stderr


def _header(magic: bytes, version: int, n: int, text: bytes) -> bytes:
    return magic + struct.pack("<IQ", version, n) + text


_HEADERS = {
    "bad magic": (_header(b"TKTAPX\0\0", 1, 2, b"{}"), "bad magic"),
    "another version": (_header(tape_format.MAGIC, 2, 2, b"{}"), "tape version 2"),
    "JSON past the section": (_header(tape_format.MAGIC, 1, 99, b"{}"), "runs past"),
    "truncated JSON": (_header(tape_format.MAGIC, 1, 3, b'{"a'), "its JSON does not parse"),
    "NaN": (_header(tape_format.MAGIC, 1, 3, b"NaN"), "its JSON does not parse"),
    "truncated header": (tape_format.MAGIC[:5], "truncated"),
}


def _mutated(doc: dict, name: str) -> dict:
    doc = json.loads(json.dumps(doc))
    HOSTILE[name][0](doc)
    return doc


def test_hostile_tapes_are_format_errors_in_cpp(cpp, cnn, tmp_path):
    """test_tape's hostile tapes (ids, weights, dtypes, tags, kernels, blob ranges), bad headers and launches whose
    arguments do not match their kernel: the C++ loader refuses each with the Python loader's words, quickly."""
    engine = cnn[1]
    cases = {name: (bytes(_with_doc(engine, _mutated(_doc(engine), name)).numpy()), HOSTILE[name][1])
             for name in HOSTILE}
    for name, (section, words) in _HEADERS.items():
        copy = Engine.deserialize(engine.serialize())
        copy.tapes = [section]
        cases[name] = (copy.serialize(), words)
    kernel = {"name": "k", "cubin": [0, 4], "num_warps": 4, "shared": 0, "params": ["*fp32", "i32"]}
    for name, args, words in [("too few launch args", [_t(0)], "1 args for kernel 0's 2 params"),
                              ("a number for a pointer", [3, 4], "a pointer param takes a tensor value"),
                              ("a tensor for a scalar", [_t(0), _t(0)], "a i32 param takes a number")]:
        doc = _doc(engine)
        doc["kernels"] = [kernel]
        doc["body"].append({"launch": 0, "grid": [1, 1, 1], "args": args})
        cases[name] = (bytes(_with_doc(engine, doc, b"\0" * 4).numpy()), words)
    doc = _doc(engine)
    doc["kernels"] = [{**kernel, "cubin": [2, 4]}]
    cases["a cubin past the blob"] = (bytes(_with_doc(engine, doc, b"\0" * 4).numpy()), "cubin length")
    paths, python = [], []
    for k, (data, _) in enumerate(cases.values()):
        paths.append(tmp_path / f"{k}.engine")
        paths[-1].write_bytes(data)
        python.append(_python_outcome(data))
    outcomes, _ = check_in_cpp(cpp, paths, MAX_MEMORY, MAX_FLOPS)
    for (name, (_, words)), path, said in zip(cases.items(), paths, python):
        text, ms = outcomes[str(path)]
        assert text.startswith("EngineFormatError: engine tape 0") and words in text, (name, text)
        assert _same_outcome(text, said), (name, text, said)
        assert ms < 2000, (name, ms)


def _python_outcome(data: bytes) -> str:
    """What the Python loader says of engine bytes, in the check tool's words."""
    try:
        engine = Engine.deserialize(data)
    except torchkiln.EngineFormatError as e:
        return f"EngineFormatError: {e}"
    return f"loaded, {len(engine.tapes)} tapes"


def _same_outcome(cpp_text: str, python_text: str) -> bool:
    """The same words, but where the JSON does not parse (then each loader's JSON library has its own)."""
    words = "its JSON does not parse"
    return cpp_text == python_text or words in python_text and cpp_text.startswith(python_text.split(words)[0] + words)


def _damaged(text: bytes, rng: random.Random) -> bytes:
    """`text` with one digit changed, one character dropped or one byte replaced."""
    at = rng.randrange(len(text))
    choice = rng.randrange(3)
    if choice == 0:
        digits = [k for k, c in enumerate(text) if chr(c).isdigit()]
        at = rng.choice(digits)
        return text[:at] + str(rng.randrange(10)).encode() + text[at + 1:]
    if choice == 1:
        return text[:at] + text[at + 1:]
    return text[:at] + bytes([rng.choice(b'{}[],:"0-9aet.')]) + text[at + 1:]


DAMAGED_CASES = 120


def test_damaged_tapes_load_in_cpp_exactly_where_they_load_in_python(cpp, cnn, tmp_path):
    """Tapes with their JSON damaged at random (the CNN's, with launches marked chained and not): the C++ loader
    loads the ones the Python loader loads (the tape counted) and refuses the others with the Python loader's words."""
    engine = cnn[1]
    text = json.dumps(with_launch(with_launch(_doc(engine), pdl=True), pdl=False), separators=(",", ":")).encode()
    paths, python = [], {}
    for k in range(DAMAGED_CASES):
        damaged = _damaged(text, random.Random(f"tape-{k}"))
        copy = Engine.deserialize(engine.serialize())
        copy.tapes = [_header(tape_format.MAGIC, 1, len(damaged), damaged)]
        data = copy.serialize()
        paths.append(tmp_path / f"{k}.engine")
        paths[-1].write_bytes(data)
        python[str(paths[-1])] = _python_outcome(data)
    done = subprocess.run([str(cpp["check"]), "--tapes", *map(str, paths)], capture_output=True, text=True,
                          timeout=RUN_SECONDS, env=_no_python_env())
    assert done.returncode == 0, done.stderr
    lines = [line.split("\t") for line in done.stdout.splitlines() if not line.startswith("peak_rss_kib")]
    assert len(lines) == len(paths)
    for path, text_, ms in lines:
        assert _same_outcome(text_, python[path]), (path, text_, python[path])
    loaded = sum(said == "loaded, 1 tapes" for said in python.values())
    assert 0 < loaded < len(paths)


def _launch_check(cpp, driver: str) -> list[str]:
    """What torchkiln_launch_check prints through the stand-in CUDA driver in build folder `driver`."""
    tools = cpp["check"].parent
    done = subprocess.run([str(tools / "torchkiln_launch_check")], capture_output=True, text=True, timeout=RUN_SECONDS,
                          env={**_no_python_env(), "LD_LIBRARY_PATH": str(tools / driver)})
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _launches(lines: list[str]) -> list[list[str]]:
    return [line.split() for line in lines if line.startswith("cuLaunchKernel")]


_PLAIN = ["cuLaunchKernel", "2", "3", "4", "128", "1", "1", "65536", "0x1234", "(nil)"]  # grid, block, shared, stream


def test_kernel_launches_pack_their_arguments_as_tritons_launcher_does(cpp):
    """The runner's launch of a kernel taking every param type, through a stand-in CUDA driver that prints its calls
    (csrc/tools/fake_libcuda.cpp; no GPU here): the context made current, the shared memory opted into, the block of
    32 x num_warps threads, each argument's bytes (fp16 rounded once from the double, bf16 truncated from the float),
    Triton's two null scratch pointers, and no launch of an empty grid. A chained launch (`pdl`) is cuLaunchKernelEx's
    with one attribute, programmatic stream serialization (6) allowed (1), as Triton launches a launch_pdl kernel."""
    lines = _launch_check(cpp, "fake_driver")
    pointer = int(next(line for line in lines if line.startswith("data_ptr ")).split()[1], 16)
    launches = _launches(lines)
    assert [line for line in lines if not line.startswith(("data_ptr", "cuLaunchKernel"))] == [
        "cuCtxSetCurrent", "cuModuleGetFunction every_type", "cuFuncGetAttribute 1", "cuFuncSetAttribute 8 65536"]
    assert len(launches) == 2 and launches[0][:10] == _PLAIN
    half = struct.unpack("<H", struct.pack("<e", 1 + 2 ** -11 + 2 ** -40))[0]
    assert half == 0x3C01  # rounded up; a float on the way would have rounded it to 1.0
    single = struct.unpack("<I", struct.pack("<f", 0.1))[0]
    want = [pointer, 1, 0xFD, 0xFFFF, 0xFFFFFFF9, 1 << 40, 2 ** 64 - 1, half, single >> 16, single,
            struct.unpack("<Q", struct.pack("<d", 0.1))[0], 0, 0]
    assert [int(word, 16) for word in launches[0][10:]] == want
    assert launches[1][:13] == ["cuLaunchKernelEx", "5", "1", "1", "128", "1", "1", "65536", "0x1234", "(nil)",
                                "attributes", "1", "6:1"]
    assert launches[1][13:] == launches[0][10:]


def test_a_chained_launch_is_a_plain_one_where_the_driver_has_no_launch_kernel_ex(cpp):
    """A driver before CUDA 11.8 (no cuLaunchKernelEx): the chained launch is cuLaunchKernel's, its arguments the
    same; the kernel's wait then returns at once."""
    launches = _launches(_launch_check(cpp, "fake_driver_before_11_8"))
    assert [launch[:10] for launch in launches] == [_PLAIN, ["cuLaunchKernel", "5", "1", "1", *_PLAIN[4:]]]
    assert launches[1][10:] == launches[0][10:]


@CHAINING_GPU
def test_a_gpu_tape_replays_its_chained_launch_with_the_python_runtimes_bits(cpp, tmp_path):
    """A GPU tape whose body holds a programmatic dependent launch runs in C++ (the prologue, then the body captured
    and replayed) with the bits of the Python runtime, which runs the plan captured and chained too."""
    engine = chain_engine()
    device = torch.device("cuda", torch.cuda.current_device())
    engine.tapes.append(record_tape(engine, device))
    assert any(i.get("pdl") for i in _doc(engine)["body"])
    blob = engine_blob(engine.serialize())
    inputs = [[torch.randn(4, 16, 32, device=device)] for _ in range(3)]
    got, stderr, code = _run_engines(cpp, [blob] * len(inputs), inputs, tmp_path, TORCHKILN_TAPE_LOG="1")
    assert code == 0, stderr
    assert stderr.count(f"torchkiln: engine '{engine.name}' runs tape 0 on cuda") == 1, stderr
    for k, (xs, g) in enumerate(zip(inputs, got)):
        assert_bitwise(g, [o.cpu() for o in _python(blob, xs)], f"call {k}")


class _Tokens(torch.nn.Module):
    """Token embeddings (a gather of the input ids) and an encoder layer."""

    def __init__(self):
        super().__init__()
        self.embed, self.encoder = torch.nn.Embedding(50, 16), _Encoder()

    def forward(self, ids):
        return self.encoder(self.embed(ids))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_dynamic_gpu_engine_between_its_tapes_replays_a_cuda_graph_per_shape(cpp, tmp_path):
    """A cuda engine of dynamic shapes called in C++ at shapes between those its tapes were recorded at: the first
    call at each shape captures the layers as a CUDA graph (TORCHKILN_TAPE_LOG says so once per shape), later calls
    replay it; the outputs have the bits of the same layers run uncaptured (the engine with cuda_graphs=False) and
    eager's values (fp32, TF32 off). An id out of range at a captured shape is still EngineIndexError: the indices
    the engine reads from its inputs are checked before the replay."""
    torch.manual_seed(0)
    model = _Tokens().cuda().eval()
    spec = torchkiln.Input(min_shape=(1, 2), opt_shape=(2, 8), max_shape=(4, 16), dtype=torch.long)
    blob = torchkiln.compile(model, inputs=[spec], device=torch.device("cuda"), min_block_size=1)._c.getattr(
        "_torchkiln_engine_0")
    engine = Engine.deserialize(bytes(blob.numpy()))
    name = engine.name
    engine.backend_options = dataclasses.replace(engine.backend_options, cuda_graphs=False)
    blobs = {True: blob, False: engine_blob(engine.serialize())}
    shapes = [(3, 5), (3, 5), (2, 11), (3, 5), (2, 11), (2, 11)]
    inputs = [[torch.randint(0, 50, shape, device="cuda")] for shape in shapes]
    runs = {}
    for graphs, engine_bytes in blobs.items():
        outputs, stderr, code = _run_engines(cpp, [engine_bytes] * len(inputs), inputs, tmp_path,
                                             TORCHKILN_TAPE_LOG="1")
        assert code == 0, stderr
        runs[graphs] = outputs, stderr
    captured = runs[True][1]
    for shape in ("[3, 5]", "[2, 11]"):
        assert captured.count(f"torchkiln: engine '{name}' captures its layers for inputs int64{shape}") == 1, \
            captured
    assert "captures its layers" not in runs[False][1]
    with torch.no_grad():
        for k, xs in enumerate(inputs):
            assert_bitwise(runs[True][0][k], runs[False][0][k], f"call {k}")
            want = model(*xs).cpu()
            got = runs[True][0][k][0]
            assert (got - want).abs().max() <= 1e-4 * want.abs().max(), f"call {k}"
    bad = inputs[0][0].clone()
    bad[1, 2] = 50
    _, stderr, code = _run_engines(cpp, [blob] * 2, [inputs[0], [bad]], tmp_path, TORCHKILN_TAPE_LOG="1")
    assert code != 0 and "captures its layers" in stderr, stderr
    assert "EngineIndexError" in stderr and "index 50 is out of range" in stderr, stderr
