"""Unpack Var and Std: the mean of squared deviations, divided by max(N - correction, 0)."""
from __future__ import annotations

from torchkiln.lowering.registry import LoweringContext, lowering_pass, rewrite
from torchkiln.torchscript import Graph

_OVERLOADS = ("", ".dim", ".correction")


def _variance(dim: str, correction: str, keepdim: str, out: str) -> str:
    """IR computing `out`: sum((x - mean(x))^2) / max(N - correction, 0) over `dim` (None: every dim).

    Two passes (mean, then squared deviations) keep the precision of eager's Welford update.
    `correction` is a bool (unbiased), an int or a float: aten::Float takes each.
    """
    return f"""
            %true : bool = prim::Constant[value=1]()
            %none : NoneType = prim::Constant()
            %one : int = prim::Constant[value=1]()
            %zero : float = prim::Constant[value=0.]()
            %mean = aten::mean(%x, {dim}, %true, %none)
            %dev = aten::sub(%x, %mean, %one)
            %sq = aten::mul(%dev, %dev)
            %ss = aten::sum(%sq, {dim}, {keepdim}, %none)
            %n_in : int = aten::numel(%x)
            %n_out : int = aten::numel(%mean)
            %n : int = aten::floordiv(%n_in, %n_out)
            %n_f : float = aten::Float(%n)
            %c : float = aten::Float({correction})
            %dof : float = aten::sub(%n_f, %c)
            %divisor : float = prim::max(%dof, %zero)
            %{out} = aten::div(%ss, %divisor)"""


def _forms(op: str) -> list[tuple[str, str]]:
    """(pattern, replacement) for each TorchScript form of var or std."""
    root = "\n            %y = aten::sqrt(%var)" if op == "std" else ""
    out = "var" if op == "std" else "y"
    return [
        # correction=None means 1; must come before the general 4-input form
        (f"""
        graph(%x, %dim, %keepdim):
            %none_c : NoneType = prim::Constant()
            %y = aten::{op}(%x, %dim, %none_c, %keepdim)
            return (%y)""", """
        graph(%x, %dim, %keepdim):""" + _variance("%dim", "%one", "%keepdim", out) + root + """
            return (%y)"""),
        # var.dim(x, dim, unbiased, keepdim) and var.correction(x, dim, correction, keepdim)
        (f"""
        graph(%x, %dim, %correction, %keepdim):
            %y = aten::{op}(%x, %dim, %correction, %keepdim)
            return (%y)""", """
        graph(%x, %dim, %correction, %keepdim):""" + _variance("%dim", "%correction", "%keepdim", out) + root + """
            return (%y)"""),
        # var(x, unbiased): every dim, no keepdim
        (f"""
        graph(%x, %unbiased):
            %y = aten::{op}(%x, %unbiased)
            return (%y)""", """
        graph(%x, %unbiased):
            %false : bool = prim::Constant[value=0]()
            %all : NoneType = prim::Constant()""" + _variance("%all", "%unbiased", "%false", out) + root + """
            return (%y)"""),
    ]


@lowering_pass(replaces=tuple(f"aten::{op}{o}" for op in ("var", "std") for o in _OVERLOADS), decomposition=True)
def unpack_var_std(graph: Graph, ctx: LoweringContext) -> bool:
    """Replace aten::var/std (every overload) by mean, squared deviations, sum and a division (std: its sqrt)."""
    changed = False
    for op in ("var", "std"):
        for pattern, replacement in _forms(op):
            changed |= rewrite(graph, pattern, replacement)
    return changed
