"""Write csrc/layer_kinds.json: the engine format's layer kinds (parameters and their types, weights, input
counts) and bounds, read from the Python definitions, for the C++ loader to check engines against the same
description (tests/test_cpp_runtime.py checks the committed file is what this renders).

    python scripts/render_layer_kinds.py
"""
from __future__ import annotations

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src")]

from torchkiln.runtime.format_description import describe  # noqa: E402

if __name__ == "__main__":
    (ROOT / "csrc" / "layer_kinds.json").write_text(json.dumps(describe(), indent=1) + "\n")
