"""Remove Dropout: every dropout variant is the identity at inference."""
from __future__ import annotations

from torchkiln.lowering.registry import lowering_pass, rewrite
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Graph

_DROPOUTS = ("dropout", "dropout_", "feature_dropout", "feature_dropout_", "alpha_dropout", "alpha_dropout_",
             "feature_alpha_dropout", "feature_alpha_dropout_")


@lowering_pass()
def remove_dropout(graph: Graph, settings: CompileSettings) -> bool:
    """Replace aten::dropout and its variants (inference: train=False) by their input."""
    changed = False
    for op in _DROPOUTS:
        changed |= rewrite(graph, f"""
            graph(%x, %p, %train):
                %y = aten::{op}(%x, %p, %train)
                return (%y)""", """
            graph(%x, %p, %train):
                return (%x)""")
    return changed
