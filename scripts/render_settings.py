"""Write docs/settings.md: the compile settings table rendered from src/torchkiln/settings_table.py
(tests/test_settings_table.py checks the committed file is what it renders).

    python scripts/render_settings.py
"""
from __future__ import annotations

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from torchkiln.settings_table import render_markdown  # noqa: E402

if __name__ == "__main__":
    (ROOT / "docs" / "settings.md").write_text(render_markdown())
