"""The engine cache: a hit gives the cold build's engine without building; any change of what an engine is made
from is a miss; the least recently used entries go over the size cap; a damaged entry is a miss; off by default."""
import importlib.metadata
import logging
import os
import time

import pytest
import torch
from torch import nn

import torchkiln
from harness import assert_matches_eager
from torchkiln.cache import EngineStore, engines_dir
from torchkiln.cache import key as cache_key
from torchkiln.examples.models import randomize_batch_norm

CACHE = {"cache_built_engines": True, "reuse_cached_engines": True}


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        return self.fc(y.mean((2, 3)))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHKILN_CACHE_DIR", str(tmp_path))
    return engines_dir()


def _model() -> nn.Module:
    model = ConvNet()
    randomize_batch_norm(model)
    return model.eval()


def _forget_modules() -> None:
    """Delete the whole compiled modules the cache holds, so that a compile uses the engine level (the module level,
    which a warm compile of an unchanged module hits first, is tested in test_module_cache.py)."""
    for path in engines_dir().glob("*.module"):
        path.unlink()


def _compile(model, caplog, shape=(2, 3, 8, 8), **options):
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        compiled = torchkiln.compile(model, [torchkiln.Input(shape)], **options)
    _forget_modules()
    return compiled


def _entries(cache):
    return sorted(cache.glob("*.engine")) if cache.exists() else []


def test_a_hit_skips_conversion_and_gives_the_cold_builds_outputs(cache, caplog):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    cold = _compile(model, caplog, **CACHE)
    assert "engine cache miss" in caplog.text and len(_entries(cache)) == 1
    warm = _compile(model, caplog, **CACHE)
    assert "engine cache hit" in caplog.text and "converting engine block" not in caplog.text
    assert len(_entries(cache)) == 1
    with torch.no_grad():
        assert torch.equal(warm(x), cold(x))
        assert_matches_eager(warm(x), model(x))


def _changed_weight(model):
    with torch.no_grad():
        model.fc.weight[0, 0] += 1e-3
    return model, (2, 3, 8, 8), {}


@pytest.mark.parametrize("change", [
    pytest.param(_changed_weight, id="a weight value"),
    pytest.param(lambda m: (m, (1, 3, 8, 8), {}), id="an input shape"),
    pytest.param(lambda m: (m, (2, 3, 8, 8), {"ort_threads": 1}), id="a setting"),
    pytest.param(lambda m: (m, (2, 3, 8, 8), {"backend": "reference"}), id="the backend"),
])
def test_any_change_of_the_key_is_a_miss(cache, caplog, change):
    model = _model()
    _compile(model, caplog, **CACHE)
    model, shape, options = change(model)
    changed = _compile(model, caplog, shape, **CACHE, **options)
    assert "engine cache miss" in caplog.text and "engine cache hit" not in caplog.text
    assert len(_entries(cache)) == 2
    x = torch.randn(shape)
    with torch.no_grad():
        assert_matches_eager(changed(x), model(x))


def test_another_library_version_misses_every_engine(cache, caplog, monkeypatch):
    """An upgraded ONNX Runtime (its version, as its installed metadata says) is a miss (test_module_cache: and of
    the module)."""
    model = _model()
    _compile(model, caplog, **CACHE)
    installed = cache_key._version
    monkeypatch.setattr(cache_key, "_version", lambda p: installed(p) + (".post1" if p == "onnxruntime" else ""))
    _compile(model, caplog, **CACHE)
    assert "engine cache miss" in caplog.text and "engine cache hit" not in caplog.text


@pytest.mark.parametrize("package", ["torch", "numpy", "onnxruntime", "onnx", "no-such-package-here"])
def test_the_versions_in_the_keys_are_the_installed_ones(package):
    try:
        expected = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        expected = "absent"
    assert cache_key._version(package) == expected


def test_the_least_recently_used_entries_go_over_the_size_cap(tmp_path, caplog):
    first, second, third = ("a" * 64, "b" * 64, "c" * 64)
    store = EngineStore(tmp_path, limit=1 << 20)
    for key in (first, second):
        store.put(key, {"engine": key[:1]}, bytes(1000))
    now = time.time()
    os.utime(store.path(first), (now - 100, now - 100))
    os.utime(store.path(second), (now - 50, now - 50))
    store.limit = store.path(first).stat().st_size * 2 + 100
    assert store.get(first) is not None  # a hit: the first entry is now the most recently used
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        store.put(third, {"engine": "c"}, bytes(1000))
    assert "evicted" in caplog.text
    assert store.path(first).exists() and not store.path(second).exists() and store.path(third).exists()


@pytest.mark.parametrize("damage", [
    pytest.param(lambda data: data[:-1] + bytes([data[-1] ^ 1]), id="a flipped byte"),
    pytest.param(lambda data: data[:len(data) // 2], id="truncated"),
    pytest.param(lambda data: b"not an entry", id="garbage"),
    pytest.param(lambda data: data.replace(b'"fp32_layers": []', b'"fp32_layers": 12'), id="a bad header field"),
])
def test_a_damaged_entry_is_a_logged_miss_and_deleted(cache, caplog, damage):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    _compile(model, caplog, **CACHE)
    (entry,) = _entries(cache)
    entry.write_bytes(damage(entry.read_bytes()))
    compiled = _compile(model, caplog, reuse_cached_engines=True)
    assert "damaged" in caplog.text and "engine cache hit" not in caplog.text
    assert not entry.exists()
    with torch.no_grad():
        assert_matches_eager(compiled(x), model(x))


@pytest.mark.parametrize("options", [{}, {"reuse_cached_engines": True}], ids=["off", "reuse only"])
def test_no_file_is_written_unless_cache_built_engines(cache, caplog, options):
    _compile(_model(), caplog, **options)
    assert not cache.exists() or not any(cache.iterdir())


def test_a_write_leaves_no_temporary_file_and_removes_stale_ones(tmp_path):
    store = EngineStore(tmp_path, limit=1 << 20)
    stale, fresh = tmp_path / ".0123456789ab.x.tmp", tmp_path / ".0123456789ab.y.tmp"  # a dead and a live writer's
    stale.write_bytes(b"half an entry")
    fresh.write_bytes(b"half an entry")
    os.utime(stale, (time.time() - 2 * 3600,) * 2)
    key = "ab" * 32
    store.put(key, {"engine": "e"}, b"engine bytes")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([fresh.name, f"{key}.engine"])
    header, data = store.get(key)
    assert header["key"] == key and data == b"engine bytes"


@pytest.mark.parametrize("text,expected", [("", 5 * 2 ** 30), ("1048576", 2 ** 20), ("500M", 500 * 2 ** 20),
                                           ("2g", 2 * 2 ** 30), ("1.5GiB", 3 * 2 ** 29)])
def test_the_size_cap_reads_torchkiln_cache_size(monkeypatch, text, expected):
    monkeypatch.setenv("TORCHKILN_CACHE_SIZE", text)
    assert EngineStore().limit == expected


def test_a_bad_size_cap_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TORCHKILN_CACHE_SIZE", "lots")
    with pytest.raises(ValueError, match="TORCHKILN_CACHE_SIZE"):
        EngineStore()


def test_the_switches_take_booleans_only(cache):
    with pytest.raises(ValueError, match="cache_built_engines must be True or False"):
        torchkiln.compile(_model(), [torchkiln.Input((2, 3, 8, 8))], cache_built_engines="yes")


class Overflows(nn.Module):
    """In float16, the square overflows: precision calibration keeps it in float32."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x) * 300
        return torch.sqrt(y * y + 1) - y.abs()


def test_a_calibrated_engine_keeps_its_fp32_layers_on_a_hit(cache, caplog):
    from torchkiln.compiler import compile_with_report

    model, x = Overflows().eval(), torch.randn(4, 16)
    options = dict(enabled_precisions={torch.float16}, backend="reference", **CACHE)
    cold, cold_report = compile_with_report(model, [torchkiln.Input((4, 16))], **options)
    _forget_modules()
    with caplog.at_level(logging.INFO, logger="torchkiln"):
        warm, warm_report = compile_with_report(model, [torchkiln.Input((4, 16))], **options)
    assert "engine cache hit" in caplog.text
    assert cold_report.fp32_layers and warm_report.fp32_layers == cold_report.fp32_layers
    with torch.no_grad():
        assert torch.equal(warm(x), cold(x))


def test_each_engine_block_of_a_split_model_hits(cache, caplog):
    model, x = _model(), torch.randn(2, 3, 8, 8)
    options = dict(torch_executed_ops=["aten::mean"], min_block_size=1, **CACHE)
    cold = _compile(model, caplog, **options)
    assert caplog.text.count("engine cache miss") == 2
    warm = _compile(model, caplog, **options)
    assert caplog.text.count("engine cache hit") == 2 and len(_entries(cache)) == 2
    with torch.no_grad():
        assert torch.equal(warm(x), cold(x))
        assert_matches_eager(warm(x), model(x))
