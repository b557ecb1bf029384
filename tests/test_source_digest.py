"""torchkiln's source digest, remembered by its files' stat: a later process reads it instead of the files; an edited
file (even keeping its size and modification time) is a new digest; files changed in the last moments are hashed and
the digest is not remembered; a cache folder that cannot be written only costs the hashing."""
import json
import os
import time

import pytest

from torchkiln.cache import source_digest as sd
from torchkiln.runtime.backends.cuda.cache import CACHE_ENV

SETTLED_S = 0.05


@pytest.fixture
def tree(tmp_path, monkeypatch):
    """A package of two files, settled (older than SETTLED_S), and a cache folder."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(sd, "SETTLED_NS", int(SETTLED_S * 1e9))
    root = tmp_path / "pkg"
    (root / "sub").mkdir(parents=True)
    (root / "a.py").write_text("A = 1\n")
    (root / "sub" / "b.py").write_text("B = 2\n")
    time.sleep(2 * SETTLED_S)
    return str(root)


def _stamps(tmp_path):
    return [json.loads(p.read_text()) for p in (tmp_path / "cache" / "source").glob("*.json")]


def test_a_later_call_reads_the_remembered_digest(tree, tmp_path, monkeypatch):
    digest = sd.source_digest(tree)
    assert digest == sd.compute(tree, sd.source_files(tree)) and [s["digest"] for s in _stamps(tmp_path)] == [digest]
    monkeypatch.setattr(sd, "compute", lambda root, files: pytest.fail("the files were read again"))
    assert sd.source_digest(tree) == digest


def test_an_edit_keeping_size_and_modification_time_is_a_new_digest(tree, tmp_path):
    before = sd.source_digest(tree)
    path = os.path.join(tree, "a.py")
    st = os.stat(path)
    with open(path, "w") as f:
        f.write("A = 3\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    just_edited = sd.source_digest(tree)
    assert just_edited != before and just_edited == sd.compute(tree, sd.source_files(tree))
    assert [s["digest"] for s in _stamps(tmp_path)] == [before]  # changed moments ago: not remembered
    time.sleep(2 * SETTLED_S)
    assert sd.source_digest(tree) == just_edited and [s["digest"] for s in _stamps(tmp_path)] == [just_edited]


def test_a_new_file_is_a_new_digest(tree):
    before = sd.source_digest(tree)
    with open(os.path.join(tree, "sub", "c.py"), "w") as f:
        f.write("")
    time.sleep(2 * SETTLED_S)
    assert sd.source_digest(tree) != before


def test_a_cache_folder_that_cannot_be_written_costs_only_the_hashing(tree, tmp_path, monkeypatch):
    (tmp_path / "not_a_folder").write_text("")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "not_a_folder"))
    assert sd.source_digest(tree) == sd.compute(tree, sd.source_files(tree))
