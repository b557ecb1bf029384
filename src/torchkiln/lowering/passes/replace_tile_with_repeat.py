"""Replace Tile with Repeat: tile pads its repeats with leading 1s up to the input's rank; repeat does not."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph


@lowering_pass(replaces=("aten::tile",), decomposition=True)
def replace_tile_with_repeat(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::tile(x, dims) by aten::repeat(x, [1] * max(x.dim() - len(dims), 0) + dims).

    The padding is int arithmetic on the input's rank, static once shapes are known.
    """
    return rewrite(graph, """
        graph(%x, %dims):
            %y = aten::tile(%x, %dims)
            return (%y)""", """
        graph(%x, %dims):
            %one : int = prim::Constant[value=1]()
            %rank : int = aten::dim(%x)
            %given : int = aten::len(%dims)
            %zero : int = prim::Constant[value=0]()
            %short : int = aten::sub(%rank, %given)
            %missing : int = prim::max(%short, %zero)
            %unit : int[] = prim::ListConstruct(%one)
            %ones : int[] = aten::mul(%unit, %missing)
            %repeats : int[] = aten::add(%ones, %dims)
            %y = aten::repeat(%x, %repeats)
            return (%y)""")
