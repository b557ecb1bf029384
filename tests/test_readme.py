"""README.md: its quick-start runs as written, its test command is what CI runs, and it stays short."""
import pathlib
import re
import runpy

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 160
MAX_CELL_CHARS = 200


def _block_after(text: str, heading: str, language: str) -> str:
    """The first fenced code block of `language` after the line `heading`."""
    section = text.split(f"\n{heading}\n", 1)[1]
    return section.split(f"```{language}\n", 1)[1].split("\n```", 1)[0]


def test_quick_start_runs(tmp_path, monkeypatch, capsys):
    code = _block_after(README.read_text(), "## Quick start", "python")
    script = tmp_path / "quick_start.py"
    script.write_text(code + "\n")
    monkeypatch.chdir(tmp_path)
    namespace = runpy.run_path(str(script))
    assert (tmp_path / "small_cnn.ts").is_file()
    expected, out = namespace["expected"], namespace["out"]
    assert expected.abs().max() > 0.0
    assert (out - expected).abs().max() <= 1e-4 * expected.abs().max()
    assert "max abs error against eager:" in capsys.readouterr().out


def test_first_lines_are_the_fresh_machine_commands():
    """The README opens with setup + demo and the test command; CI runs the same test command."""
    commands = [line for line in _block_after(README.read_text(), "On a fresh machine (Python 3.10+), from the "
                                              "repository root:", "bash").splitlines()
                if not line.startswith("#")]
    assert len(commands) == 2
    assert commands[0].endswith("-m torchkiln demo")
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands[1] in ci


def test_readme_is_short():
    assert len(README.read_text().splitlines()) <= MAX_README_LINES


@pytest.mark.parametrize("name", ["README.md", "docs/api.md"])
def test_table_cells_are_short(name):
    long_cells = [
        (number, cell.strip()[:60])
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1) if line.startswith("|")
        for cell in re.split(r"(?<!\\)\|", line.strip().strip("|")) if len(cell.strip()) > MAX_CELL_CHARS
    ]
    assert not long_cells, f"{name}: table cells over {MAX_CELL_CHARS} characters (line, start): {long_cells}"
