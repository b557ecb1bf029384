"""Values lowering can know before run time: constants, and what depends only on the compiled input shapes."""
from __future__ import annotations

from typing import TYPE_CHECKING

from torchkiln.conversion import load_all
from torchkiln.analysis.resolve import Resolver
from torchkiln.analysis.input_shapes import input_meta
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Graph, is_tensor_type, value_key

if TYPE_CHECKING:
    from torchkiln.lowering.registry import LoweringContext


def input_resolver(graph: Graph, settings: CompileSettings) -> Resolver:
    """A resolver that runs the evaluators over constants and the method inputs' shapes and dtypes.

    Intermediate tensors have no shapes yet (shape analysis comes after lowering), so a value that
    depends on one stays unresolved (`NotStatic`).
    """
    load_all()
    params = list(graph.inputs())[1:]  # after self
    metas = {value_key(v): input_meta(k, spec.min_shape, spec.opt_shape, spec.max_shape, spec.dtype, settings.device)
             for k, (v, spec) in enumerate(zip(params, settings.inputs)) if is_tensor_type(v.type())}
    return Resolver(metas)


def context_resolver(graph: Graph, ctx: LoweringContext) -> Resolver:
    """What shape analysis saw, when a pass runs again after it (`ctx.metas`); else `input_resolver`."""
    return Resolver(ctx.metas) if ctx.metas is not None else input_resolver(graph, ctx.settings)
