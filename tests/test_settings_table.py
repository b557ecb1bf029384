"""The settings table: every setting reaches the API (create), the command line (its flag parses into the same
value), docs/settings.md and the backend options (where it feeds one). The tests are generated from the table,
so a new row is checked everywhere it must arrive."""
import argparse
import pathlib
import subprocess
import sys

import pytest
import torch

import torchkiln
from torchkiln.cli import build_parser
from torchkiln.compiler import _build_settings
from torchkiln.runtime.backends import BACKENDS, BackendOptions
from torchkiln.settings import CompileSettings
from torchkiln.settings_table import (ENGINE_BACKENDS, MAX_TIMING_ITERATIONS, SETTINGS, add_setting_arguments,
                                      render_markdown, settings_from_args)

ROOT = pathlib.Path(__file__).resolve().parents[1]
TABLE = pathlib.Path(torchkiln.settings_table.__file__)
INPUTS = [torchkiln.Input((2, 3))]
# settings whose example is their default here: only cpu exists on a machine without CUDA
SAME_AS_DEFAULT = {"device"}
WITH_FLAG = [s for s in SETTINGS if s.flag is not None]
WITH_BACKEND = [s for s in SETTINGS if s.backend is not None]


def _ids(rows):
    return [s.name for s in rows]


@pytest.mark.parametrize("setting", SETTINGS, ids=_ids(SETTINGS))
def test_every_setting_reaches_the_api(setting):
    created = CompileSettings.create(INPUTS, **{setting.name: setting.example})
    default = CompileSettings.create(INPUTS)
    assert getattr(created, setting.name) == setting.check(setting.name, setting.example, {"inputs": INPUTS})
    assert (getattr(created, setting.name) != getattr(default, setting.name)) == (setting.name not in SAME_AS_DEFAULT)
    assert getattr(default, setting.name) == getattr(CompileSettings(inputs=tuple(INPUTS)), setting.name)


@pytest.mark.parametrize("setting", WITH_FLAG, ids=_ids(WITH_FLAG))
def test_every_flag_gives_the_value_the_api_takes(setting):
    args = build_parser().parse_args(["compile", "in.ts", "out.ts", *setting.example_args])
    given = settings_from_args(args)
    assert list(given) == [setting.name]
    assert getattr(CompileSettings.create(INPUTS, **given), setting.name) == \
        getattr(CompileSettings.create(INPUTS, **{setting.name: setting.example}), setting.name)


def test_flags_not_given_leave_every_setting_to_compile():
    assert settings_from_args(build_parser().parse_args(["compile", "in.ts", "out.ts"])) == {}


@pytest.mark.parametrize("setting", SETTINGS, ids=_ids(SETTINGS))
def test_every_setting_is_in_the_docs(setting):
    row = next((line for line in (ROOT / "docs" / "settings.md").read_text().splitlines()
                if line.startswith(f"| `{setting.name}` |")), None)
    assert row is not None and setting.doc in row
    assert all(option in row for option in (setting.flag.options if setting.flag else ()))


def test_the_docs_are_what_the_table_renders():
    """Regenerate with `python scripts/render_settings.py`."""
    assert (ROOT / "docs" / "settings.md").read_text() == render_markdown()


@pytest.mark.parametrize("setting", WITH_BACKEND, ids=_ids(WITH_BACKEND))
def test_every_backend_setting_reaches_the_backend_options(setting):
    options = _build_settings(CompileSettings.create(INPUTS, **{setting.name: setting.example})).backend_options
    assert getattr(options, setting.backend.name) == setting.backend.convert(setting.example)
    assert getattr(options, setting.backend.name) != getattr(BackendOptions(), setting.backend.name)


def test_backend_options_are_the_table_fields_and_keep_their_renames():
    options = _build_settings(CompileSettings.create(INPUTS, disable_tf32=False, num_avg_timing_iters=3))
    assert options.backend_options == BackendOptions(ort_threads=0, allow_tf32=True, timing_iterations=3,
                                                     cuda_graphs=True)
    assert BackendOptions.from_json(BackendOptions(allow_tf32=True).to_json()) == BackendOptions(allow_tf32=True)


@pytest.mark.parametrize("raw,message", [
    ({"allow_tf32": "yes"}, "allow_tf32 must be True or False"),
    ({"timing_iterations": MAX_TIMING_ITERATIONS + 1}, "timing_iterations must be an int >= 0 and <= 10000"),
    ({"ort_threads": -1}, "ort_threads must be an int >= 0 and <= 1024"),
    ({"cuda_graphs": 1}, "cuda_graphs must be True or False"),
])
def test_backend_options_are_checked_as_their_settings_are(raw, message):
    with pytest.raises(ValueError, match=message):
        BackendOptions.from_json(raw)


def test_a_setting_is_refused_where_its_backend_option_would_be():
    """The check is one: a timing count an engine's bytes may not hold is refused by create() already."""
    with pytest.raises(ValueError, match="num_avg_timing_iters must be an int >= 0 and <= 10000"):
        CompileSettings.create(INPUTS, num_avg_timing_iters=MAX_TIMING_ITERATIONS + 1)


def test_unknown_settings_are_named():
    with pytest.raises(ValueError, match=r"unknown compile settings \['calibration_data'\]"):
        CompileSettings.create(INPUTS, calibration_data=object())


def test_backend_choices_are_the_registry():
    action = next(a for a in build_parser()._subparsers._group_actions[0].choices["compile"]._actions
                  if a.dest == "backend")
    assert list(action.choices) == ["auto", *BACKENDS]
    assert {name: row.devices for name, row in BACKENDS.items()} == \
        {name: frozenset(row.devices) for name, row in ENGINE_BACKENDS.items()}
    args = build_parser().parse_args(["compile", "in.ts", "out.ts", "--backend", "cuda"])
    assert settings_from_args(args) == {"backend": "cuda"}


def test_a_precision_flag_names_itself_in_its_error():
    args = build_parser().parse_args(["compile", "in.ts", "out.ts", "-p", "f8"])
    with pytest.raises(ValueError, match="^-p: unknown dtype 'f8'"):
        settings_from_args(args)


def test_the_table_loads_and_parses_without_torch():
    """The command line builds its parser before torch is imported: the table needs only the standard library."""
    code = (
        "import argparse, importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('settings_table', {str(TABLE)!r})\n"
        "table = sys.modules['settings_table'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(table)\n"
        "parser = argparse.ArgumentParser()\n"
        "table.add_setting_arguments(parser)\n"
        "args = parser.parse_args(['--backend', 'cuda', '--min-block-size', '2', '--no-disable-tf32'])\n"
        "print(sorted(table.settings_from_args(args).items()), 'torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[('backend', 'cuda'), ('disable_tf32', False), ('min_block_size', 2)] False"


def test_add_setting_arguments_leaves_other_flags_alone():
    parser = argparse.ArgumentParser()
    add_setting_arguments(parser)
    assert {a.dest for a in parser._actions} - {"help"} == {s.name for s in WITH_FLAG}
    assert CompileSettings.create(INPUTS, enabled_precisions={torch.float16}).compute_dtype == torch.float16
