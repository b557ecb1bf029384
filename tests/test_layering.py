"""Imports go downward only: each part of the package imports only the parts docs/architecture.md puts below it."""
import ast
import pathlib

import torchkiln

ROOT = pathlib.Path(torchkiln.__file__).parent
# small helpers anyone uses
SHARED = {"errors", "torchscript", "settings", "settings_table", "log", "module_mode", "ops", "_version", "enums"}

# part -> the parts it may import (besides SHARED). The pipeline's phases, top to bottom, and the tools on top.
ALLOWED = {
    "ir": set(),
    "analysis": {"ir"},
    "conversion": {"analysis", "ir"},
    "onnx_export": {"ir"},
    "runtime": {"ir", "onnx_export"},
    "builder": {"ir", "runtime"},
    "partitioning": {"analysis", "ir"},
    "lowering": {"analysis", "conversion"},
    "frontend": set(),
    "stitching": {"partitioning", "analysis", "runtime"},
    "cache": {"ir", "runtime"},  # engines by a key of their TorchScript block, settings and target
    "compiler": {"frontend", "lowering", "partitioning", "analysis", "conversion", "ir", "builder", "runtime",
                 "stitching", "cache", "progress"},
    "input_spec": set(),  # text -> Input, for the command line
    "progress": set(),  # the build progress display (tqdm), driven by compiler.py
}
ALLOWED["bench"] = set(ALLOWED) | {"examples"}  # on top, like cli.py: may import everything


def _imports(path: pathlib.Path) -> set[str]:
    """The torchkiln parts a module imports, at any depth of its code (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchkiln"):
            names = [node.module] + [f"torchkiln.{a.name}" for a in node.names if node.module == "torchkiln"]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("torchkiln")]
        found.update(n.split(".")[1] for n in names if "." in n)
    return found


def _part(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def test_every_phase_imports_only_what_lies_below_it():
    wrong = []
    for path in sorted(ROOT.rglob("*.py")):
        part = _part(path)
        if part not in ALLOWED:
            continue
        for imported in _imports(path) - {part} - SHARED - ALLOWED[part]:
            wrong.append(f"{path.relative_to(ROOT)} imports torchkiln.{imported}")
    assert not wrong, "imports that go up or sideways:\n" + "\n".join(wrong)


def test_the_table_names_every_folder():
    folders = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders - {"examples", "coverage"} <= set(ALLOWED), folders - set(ALLOWED)


def test_backends_import_what_they_share_from_base_not_from_the_registry_above_them():
    backends = ROOT / "runtime" / "backends"
    upward = []
    for path in sorted(backends.rglob("*.py")):
        if path == backends / "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module == "torchkiln.runtime.backends":
                upward.append(str(path.relative_to(ROOT)))
    assert not upward, upward
