"""The module cache (the engine cache's first level): a warm compile loads the whole compiled module, skipping
scripting, lowering, partitioning and building, and gives the cold compile's module; any change of the weights, the
code, an attribute, the input specs, a setting or the target is a miss; entries share the engine cache's size cap;
nothing is read or written with the switches off."""
import collections
import dataclasses
import importlib
import logging
import os
import subprocess
import sys
import time
import types

import pytest
import torch
from torch import nn

import torchkiln
from harness import assert_matches_eager
from torchkiln.cache import engines_dir, key
from torchkiln.compiler import compile_with_report
from torchkiln.examples.models import randomize_batch_norm
from torchkiln.runtime.execute_op import SESSION_MODELS, engine_from_blob
from torchkiln.runtime.serialization import engine_digest

CACHE = {"cache_built_engines": True, "reuse_cached_engines": True}
SHAPE = (2, 3, 8, 8)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)
        self.scale = 1.0

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x))) * self.scale
        return self.fc(y.mean((2, 3)))


class Traced(nn.Module):
    """Cannot be scripted (a *args forward), so it is traced: Python control flow on `self.extra` is baked in."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.extra = False

    def forward(self, *args):
        y = torch.relu(self.fc(args[0]))
        return torch.sigmoid(y) if self.extra else y


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHKILN_CACHE_DIR", str(tmp_path / "cache"))
    return engines_dir()


def _model() -> nn.Module:
    torch.manual_seed(0)
    model = ConvNet()
    randomize_batch_norm(model)
    return model.eval()


def _compile(model, caplog, shape=SHAPE, **options):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        return compile_with_report(model, [torchkiln.Input(shape)], **options)


def _modules(cache):
    return sorted(cache.glob("*.module")) if cache.exists() else []


def _hit(caplog) -> bool:
    return "module cache hit" in caplog.text


def test_a_warm_compile_loads_the_cold_compiles_module(cache, caplog):
    model, x = _model(), torch.randn(SHAPE)
    cold, cold_report = _compile(model, caplog, **CACHE)
    assert "module cache miss" in caplog.text and len(_modules(cache)) == 1
    warm, warm_report = _compile(model, caplog, **CACHE)
    assert _hit(caplog) and "engine cache" not in caplog.text and "converting" not in caplog.text
    assert warm_report == cold_report and len(_modules(cache)) == 1
    with torch.no_grad():
        assert torch.equal(warm(x), cold(x))
        assert_matches_eager(warm(x), model(x))


def test_a_module_of_two_engines_loads_each(cache, caplog):
    """Each engine is stored apart from the archive and goes back to its own attribute."""
    model, x = _model(), torch.randn(SHAPE)
    options = dict(torch_executed_ops=["aten::mean"], min_block_size=1, **CACHE)
    cold, cold_report = _compile(model, caplog, **options)
    warm, warm_report = _compile(model, caplog, **options)
    assert _hit(caplog) and warm_report == cold_report and warm_report.num_engine_blocks == 2
    with torch.no_grad():
        assert torch.equal(warm(x), cold(x))
        assert_matches_eager(warm(x), model(x))


def _weight(model):
    with torch.no_grad():
        model.fc.weight[0, 0] += 1e-3
    return model, SHAPE, {}


def _attribute(model):
    model.scale = 2.0
    return model, SHAPE, {}


def _forward(model):
    """The forward code changes (replaced at run time), the state dict does not."""
    class Other(ConvNet):
        def forward(self, x):
            return self.fc(torch.sigmoid(self.bn(self.conv(x))).mean((2, 3)))

    model.__class__ = Other
    return model, SHAPE, {}


@pytest.mark.parametrize("change", [
    pytest.param(_weight, id="a weight value"),
    pytest.param(_attribute, id="a plain attribute its code reads"),
    pytest.param(_forward, id="the forward code"),
    pytest.param(lambda m: (m, (1, 3, 8, 8), {}), id="an input shape"),
    pytest.param(lambda m: (m, SHAPE, {"min_block_size": 2}), id="a setting"),
    pytest.param(lambda m: (m, SHAPE, {"backend": "reference"}), id="the target"),
])
def test_any_change_of_the_key_is_a_miss(cache, caplog, change):
    model = _model()
    _compile(model, caplog, **CACHE)
    model, shape, options = change(model)
    changed, _ = _compile(model, caplog, shape, **CACHE, **options)
    assert "module cache miss" in caplog.text and not _hit(caplog)
    assert len(_modules(cache)) == 2
    x = torch.randn(shape)
    with torch.no_grad():
        assert_matches_eager(changed(x), model(x))


def test_another_library_version_or_grad_mode_is_a_miss(cache, caplog, monkeypatch):
    """An upgraded ONNX Runtime (its installed version) and torch's grad mode (which a trace records) are in the
    key."""
    model = _model()
    _compile(model, caplog, **CACHE)
    with torch.no_grad():
        _compile(model, caplog, **CACHE)
    assert "module cache miss" in caplog.text and not _hit(caplog)
    installed = key._version
    monkeypatch.setattr(key, "_version", lambda p: installed(p) + (".post1" if p == "onnxruntime" else ""))
    _compile(model, caplog, **CACHE)
    assert "module cache miss" in caplog.text and not _hit(caplog) and len(_modules(cache)) == 3


def test_a_traced_modules_python_control_flow_is_in_the_key(cache, caplog):
    torch.manual_seed(0)
    model, x = Traced().eval(), torch.randn(4, 16)
    _compile(model, caplog, (4, 16), min_block_size=1, **CACHE)
    model.extra = True
    changed, _ = _compile(model, caplog, (4, 16), min_block_size=1, **CACHE)
    assert "module cache miss" in caplog.text and not _hit(caplog)
    with torch.no_grad():
        assert_matches_eager(changed(x), model(x))
    _compile(model, caplog, (4, 16), min_block_size=1, **CACHE)
    assert _hit(caplog)


SOURCE = """
import torch
from torch import nn


class Edited(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        return torch.{act}(self.fc(x))
"""


def test_an_edited_source_file_is_a_miss(cache, caplog, tmp_path, monkeypatch):
    """The class keeps its name, file and line; the file's content is checked on reuse."""
    path = tmp_path / "edited_model.py"
    path.write_text(SOURCE.format(act="relu"))
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("edited_model")
    torch.manual_seed(0)
    model, x = module.Edited().eval(), torch.randn(4, 16)
    _compile(model, caplog, (4, 16), min_block_size=1, **CACHE)
    path.write_text(SOURCE.format(act="tanh"))
    module = importlib.reload(module)
    edited = module.Edited().eval()
    edited.load_state_dict(model.state_dict())
    compiled, _ = _compile(edited, caplog, (4, 16), min_block_size=1, **CACHE)
    assert "edited_model.py changed" in caplog.text and not _hit(caplog)
    with torch.no_grad():
        assert_matches_eager(compiled(x), edited(x))
        assert not torch.allclose(compiled(x), model(x))
    sys.modules.pop("edited_model")


def test_a_python_module_loaded_since_is_a_miss(cache, caplog, tmp_path, monkeypatch):
    """Code imported after the cold compile could have changed what runs (a patched function)."""
    model = _model()
    monkeypatch.syspath_prepend(str(tmp_path))
    _compile(model, caplog, **CACHE)
    (tmp_path / "imported_since.py").write_text("VALUE = 1\n")
    importlib.import_module("imported_since")
    _compile(model, caplog, **CACHE)
    assert "imported_since is loaded now" in caplog.text and not _hit(caplog)
    sys.modules.pop("imported_since")


def test_a_module_loaded_from_another_file_or_another_import_path_is_a_miss(cache, caplog, tmp_path, monkeypatch):
    """The same module name, found elsewhere (another checkout on sys.path first), is other code."""
    for folder, act in (("a", "relu"), ("b", "tanh")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "moved_model.py").write_text(SOURCE.format(act=act))
    monkeypatch.syspath_prepend(str(tmp_path / "a"))
    torch.manual_seed(0)
    model = importlib.import_module("moved_model").Edited().eval()
    _compile(model, caplog, (4, 16), min_block_size=1, **CACHE)
    monkeypatch.syspath_prepend(str(tmp_path / "b"))
    _compile(model, caplog, (4, 16), min_block_size=1, **CACHE)
    assert "import path (sys.path)" in caplog.text and not _hit(caplog)
    sys.modules.pop("moved_model")
    moved = importlib.import_module("moved_model").Edited().eval()
    moved.load_state_dict(model.state_dict())
    compiled, _ = _compile(moved, caplog, (4, 16), min_block_size=1, **CACHE)
    assert not _hit(caplog)
    x = torch.randn(4, 16)
    with torch.no_grad():
        assert_matches_eager(compiled(x), moved(x))
    sys.modules.pop("moved_model")


def test_a_module_whose_file_is_gone_from_sys_modules_is_a_miss(cache, caplog, tmp_path, monkeypatch):
    """A module loaded from a file at the cold compile, replaced by one made in memory (other code, no file)."""
    model = _model()
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "replaced_helper.py").write_text("VALUE = 1\n")
    importlib.import_module("replaced_helper")
    _compile(model, caplog, **CACHE)
    sys.modules["replaced_helper"] = types.ModuleType("replaced_helper")
    _compile(model, caplog, **CACHE)
    assert "replaced_helper is loaded from no file" in caplog.text and not _hit(caplog)
    sys.modules.pop("replaced_helper")


def test_a_script_module_hits_and_misses_on_its_weights(cache, caplog):
    model, x = _model(), torch.randn(SHAPE)
    scripted = torch.jit.script(model)
    cold, _ = _compile(scripted, caplog, **CACHE)
    warm, _ = _compile(scripted, caplog, **CACHE)
    assert _hit(caplog)
    with torch.no_grad():
        assert torch.equal(warm(x), cold(x))
        scripted.fc.weight[0, 0] += 1e-3
    changed, _ = _compile(scripted, caplog, **CACHE)
    assert "module cache miss" in caplog.text
    with torch.no_grad():
        assert_matches_eager(changed(x), scripted(x))


def test_a_module_with_hooks_is_not_cached_whole_but_its_engines_are(cache, caplog):
    model = _model()
    model.fc.register_forward_hook(lambda m, i, o: o)
    _compile(model, caplog, **CACHE)
    assert "not cached whole" in caplog.text and not _modules(cache)
    _compile(model, caplog, **CACHE)
    assert "engine cache hit" in caplog.text


class _Queue(collections.deque):
    """A deque with attributes: its items are not among them."""


def test_an_attribute_whose_state_the_key_cannot_read_is_not_cached_whole(cache, caplog):
    model = _model()
    model.queue = _Queue([1.0])
    model.queue.name = "q"
    _compile(model, caplog, **CACHE)
    assert "not cached whole" in caplog.text and "built on a C type" in caplog.text and not _modules(cache)


def test_modules_and_engines_share_the_size_cap(cache, caplog, monkeypatch):
    model = _model()
    _compile(model, caplog, (1, 3, 8, 8), **CACHE)
    first = sorted(cache.iterdir())
    now = time.time()
    for path in first:
        os.utime(path, (now - 100, now - 100))
    monkeypatch.setenv("TORCHKILN_CACHE_SIZE", str(sum(p.stat().st_size for p in first) + 100))
    _compile(model, caplog, (2, 3, 8, 8), **CACHE)
    assert "evicted" in caplog.text
    left = sorted(cache.iterdir())
    assert not set(first) & set(left) and len(_modules(cache)) == 1


@pytest.mark.parametrize("options", [{}, {"reuse_cached_engines": True}], ids=["off", "reuse only"])
def test_no_file_is_written_unless_cache_built_engines(cache, caplog, options):
    _compile(_model(), caplog, **options)
    assert not cache.exists() or not any(cache.iterdir())


def test_nothing_is_reused_unless_reuse_cached_engines(cache, caplog):
    model = _model()
    _compile(model, caplog, cache_built_engines=True)
    _compile(model, caplog, cache_built_engines=True)
    assert not _hit(caplog) and "engine cache hit" not in caplog.text and "converting" in caplog.text


def test_a_damaged_module_entry_is_a_logged_miss_and_deleted(cache, caplog):
    model, x = _model(), torch.randn(SHAPE)
    _compile(model, caplog, **CACHE)
    (entry,) = _modules(cache)
    data = entry.read_bytes()
    entry.write_bytes(data[:-100] + bytes(100))
    compiled, _ = _compile(model, caplog, reuse_cached_engines=True)
    assert "damaged" in caplog.text and not _hit(caplog) and not entry.exists()
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))


def test_a_damaged_engine_in_a_module_entry_is_a_logged_miss_and_deleted(cache, caplog):
    """A byte of the stored engine changed: a miss (its CRC-32), never a hit that fails at the first call."""
    model, x = _model(), torch.randn(SHAPE)
    cold, _ = _compile(model, caplog, **CACHE)
    (entry,) = _modules(cache)
    data = bytearray(entry.read_bytes())
    engine = cold._c.getattr("_torchkiln_engine_0").numpy().tobytes()
    data[data.index(engine) + len(engine) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    compiled, _ = _compile(model, caplog, reuse_cached_engines=True)
    assert "damaged" in caplog.text and not _hit(caplog) and not entry.exists()
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))


def test_a_warm_module_outlives_its_entry_and_saves_whole(cache, caplog, tmp_path):
    """The loaded engines are the entry's bytes (mapped): deleting or replacing the entry changes nothing, and the
    module saves and loads with its engines."""
    model, x = _model(), torch.randn(SHAPE)
    _compile(model, caplog, **CACHE)
    warm, _ = _compile(model, caplog, **CACHE)
    assert _hit(caplog)
    for entry in cache.iterdir():
        entry.unlink()
    with torch.no_grad():
        assert_matches_eager(warm(x), model(x))
    torch.jit.save(warm, tmp_path / "warm.ts")
    with torch.no_grad():
        assert_matches_eager(torchkiln.load(tmp_path / "warm.ts")(x), model(x))


def test_a_dynamic_compile_is_not_cached_whole_but_its_engines_are(cache, caplog):
    """Its partition report has symbolic dims, which the entry's JSON header cannot carry exactly."""
    model, x = _model(), torch.randn(3, 3, 8, 8)
    spec = torchkiln.Input(min_shape=(1, 3, 8, 8), opt_shape=(2, 3, 8, 8), max_shape=(4, 3, 8, 8))
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="torchkiln"):
            compiled = torchkiln.compile(model, [spec], **CACHE)
        assert "not cached whole" in caplog.text and not _modules(cache)
    assert "engine cache hit" in caplog.text
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))


WARM_FIRST_CALL = """
import sys, torch, torchkiln
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 6 * 6, 4)).eval()
compiled = torchkiln.compile(model, [torchkiln.Input((2, 3, 8, 8))], cache_built_engines=True,
                             reuse_cached_engines=True)
with torch.no_grad():
    out = compiled(torch.linspace(-2, 2, 2 * 3 * 8 * 8).reshape(2, 3, 8, 8))
torch.save(out, sys.argv[1])
print("onnx imported" if any(m == "onnx" or m.startswith("onnx.") for m in sys.modules) else "no onnx")
"""


def test_a_warm_modules_first_call_imports_no_onnx(cache, tmp_path):
    """The sessions of a warm module are made from the ONNX models stored with it: no export, no `import onnx`
    (135 ms); its outputs are the cold module's."""
    script = tmp_path / "first_call.py"
    script.write_text(WARM_FIRST_CALL)
    env = dict(os.environ, TORCHKILN_CACHE_DIR=str(cache.parent), TORCHKILN_PROGRESS="0",
               PYTHONPATH=os.pathsep.join([os.path.dirname(torchkiln.__path__[0]), os.environ.get("PYTHONPATH", "")]))
    runs = [subprocess.run([sys.executable, str(script), str(tmp_path / f"{k}.pt")], env=env, check=True,
                           capture_output=True, text=True).stdout.split("\n")[-2] for k in ("cold", "warm")]
    assert runs == ["onnx imported", "no onnx"]
    assert torch.equal(torch.load(tmp_path / "warm.pt"), torch.load(tmp_path / "cold.pt"))


def _warm_blob(model, caplog):
    _compile(model, caplog, **CACHE)
    warm, _ = _compile(model, caplog, **CACHE)
    assert _hit(caplog)
    blob = warm._c.getattr("_torchkiln_engine_0")
    stored = getattr(blob, SESSION_MODELS)
    assert stored.engine_digest == engine_digest(blob.numpy()) and len(stored.models) == 1
    return warm, blob, stored


@pytest.mark.parametrize("change", ["engine", "onnxruntime", "model"])
def test_stored_onnx_models_of_other_engine_bytes_or_onnxruntime_are_not_used(cache, caplog, change):
    """Stored models for other engine bytes, another ONNX Runtime version, or bytes ORT refuses: the sessions are
    made by exporting the network again (logged where the models are for this engine), with eager's outputs."""
    model, x = _model(), torch.randn(SHAPE)
    warm, blob, stored = _warm_blob(model, caplog)
    replaced = {"engine": dataclasses.replace(stored, engine_digest=bytes(32)),
                "onnxruntime": dataclasses.replace(stored, ort_version="0.0"),
                "model": dataclasses.replace(stored, models=(b"not an ONNX model",))}[change]
    setattr(blob, SESSION_MODELS, replaced)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="torchkiln"), torch.no_grad():
        assert_matches_eager(warm(x), model(x))
    engine = engine_from_blob(blob)
    assert engine.session_models is (None if change == "engine" else replaced)
    assert ("exporting" in caplog.text) == (change != "engine")


def test_a_damaged_onnx_model_in_a_module_entry_is_a_logged_miss_and_deleted(cache, caplog):
    model, x = _model(), torch.randn(SHAPE)
    _, _, stored = _warm_blob(model, caplog)
    (entry,) = _modules(cache)
    data = bytearray(entry.read_bytes())
    onnx_model = bytes(stored.models[0])
    data[data.index(onnx_model) + len(onnx_model) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    compiled, _ = _compile(model, caplog, reuse_cached_engines=True)
    assert "damaged" in caplog.text and "ONNX model" in caplog.text and not _hit(caplog) and not entry.exists()
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))
