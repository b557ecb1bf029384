"""Unpack GELU, both variants, with eager's constants and order of operations."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph

_ERF = """
        graph(%x):
            %one : int = prim::Constant[value=1]()
            %half : float = prim::Constant[value=0.5]()
            %one_f : float = prim::Constant[value=1.]()
            %sqrt1_2 : float = prim::Constant[value=0.70710678118654757]()
            %scaled = aten::mul(%x, %sqrt1_2)
            %erf = aten::erf(%scaled)
            %gate = aten::add(%erf, %one_f, %one)
            %halfx = aten::mul(%x, %half)
            %y = aten::mul(%halfx, %gate)
            return (%y)"""

_TANH = """
        graph(%x):
            %one : int = prim::Constant[value=1]()
            %half : float = prim::Constant[value=0.5]()
            %one_f : float = prim::Constant[value=1.]()
            %kappa : float = prim::Constant[value=0.044714999999999998]()
            %beta : float = prim::Constant[value=0.79788456080286541]()
            %x2 = aten::mul(%x, %x)
            %x3 = aten::mul(%x2, %x)
            %kx3 = aten::mul(%x3, %kappa)
            %sum = aten::add(%x, %kx3, %one)
            %inner = aten::mul(%sum, %beta)
            %tanh = aten::tanh(%inner)
            %gate = aten::add(%tanh, %one_f, %one)
            %halfx = aten::mul(%x, %half)
            %y = aten::mul(%halfx, %gate)
            return (%y)"""


@lowering_pass(replaces=("aten::gelu",), decomposition=True)
def unpack_gelu(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::gelu(x, 'none') by x*0.5*(1+erf(x/sqrt 2)) and gelu(x, 'tanh') by its tanh formula."""
    changed = False
    for approximate, replacement in (("none", _ERF), ("tanh", _TANH)):
        changed |= rewrite(graph, f"""
            graph(%x):
                %approximate : str = prim::Constant[value="{approximate}"]()
                %y = aten::gelu(%x, %approximate)
                return (%y)""", replacement)
    return changed
