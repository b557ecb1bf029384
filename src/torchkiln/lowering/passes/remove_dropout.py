"""Remove Dropout: at inference (train=False) every dropout variant returns its input."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph

_DROPOUTS = ("dropout", "dropout_", "feature_dropout", "feature_dropout_", "alpha_dropout", "alpha_dropout_",
             "feature_alpha_dropout", "feature_alpha_dropout_")


@lowering_pass(replaces=tuple(f"aten::{op}" for op in _DROPOUTS))
def remove_dropout(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::dropout(x, p, train=False) and its variants by x.

    Only a constant train=False matches: F.dropout(x, training=True) is random even in eval mode and stays.
    """
    changed = False
    for op in _DROPOUTS:
        changed |= rewrite(graph, f"""
            graph(%x, %p):
                %train : bool = prim::Constant[value=0]()
                %y = aten::{op}(%x, %p, %train)
                return (%y)""", """
            graph(%x, %p):
                return (%x)""")
    return changed
