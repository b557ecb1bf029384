"""Remove Contiguous: engine tensors have no strides, so contiguous() is the identity."""
from __future__ import annotations

from torchkiln.lowering.registry import lowering_pass, rewrite
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Graph


@lowering_pass()
def remove_contiguous(graph: Graph, settings: CompileSettings) -> bool:
    """Replace aten::contiguous(x, format) by x."""
    return rewrite(graph, """
        graph(%x, %format):
            %y = aten::contiguous(%x, %format)
            return (%y)""", """
        graph(%x, %format):
            return (%x)""")
