"""The ordered lowering pipeline: module passes, freezing, then graph passes.

The order, and why (docs/lowering_passes.md lists every pass):

1. Module passes read the scripted module before freezing removes its submodules.
2. freeze: inlines every call, turns attributes (weights) into constants, folds constants,
   removes most dropout and the simple tuple and Int/NumToTensor round trips. This is LibTorch's
   LowerGraph as well: no attribute read is left to lift into an input. Its optimizations are torch.jit.freeze's
   but one (`freeze`), so the graph does not depend on the weights' device.
3. Custom autograd Functions (prim::PythonOp) with a registered replacement are inlined first, so every
   later pass sees plain ops. Structure next, so every later pattern sees straight-line functional code: internal tuples,
   mutation, containers whose keys and indices are static (read where their elements are stored, before and
   after unrolling), guards the compiled shapes pass, short loops; constants the unrolled loops expose.
4. Fusions that need the original structure: the addmm/matmul If, FuseLinear (before unpack_addmm).
5. Removals and normalisations. view_to_reshape comes before remove_contiguous: view() fails on the
   strided tensor contiguous() used to copy.
6. Decompositions (skipped when the engine converts the op whole, see `_skip_reason`), then the
   scalar round trips before PeepholeOptimize (whose version changes Float(int) into an int).
7. Clean-up: peephole, constants, CSE; remove_to after CSE (x.to(x.dtype) needs one prim::dtype(x)); DCE.
8. mark_nodes_for_fallback last, on the nodes partitioning will see.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence

import torch

from torchkiln.analysis.registry import CONVERTERS
from torchkiln.conversion import load_all
from torchkiln.lowering import passes as _passes  # noqa: F401  (registers every pass)
from torchkiln.lowering.registry import PASSES, LoweringContext, LoweringPass
from torchkiln.lowering.static_arguments import fold_static_arguments
from torchkiln.module_mode import eval_mode
from torchkiln.settings import CompileSettings
from torchkiln.torchscript import Graph, StaticArgument, TensorMeta

logger = logging.getLogger("torchkiln.lowering")

MODULE_PIPELINE: tuple[str, ...] = (
    "notate_module_for_fallback",
)
GRAPH_PIPELINE: tuple[str, ...] = (
    "replace_python_ops",
    "inline_attributes",
    "create_on_target_device",
    "lower_tuples",
    "fold_isinstance_by_type",
    "remove_mutation",
    "functionalize_size_arithmetic",
    "functionalize_view_writes",
    "functionalize_list_appends",
    "resolve_attribute_caches",
    "resolve_static_containers",
    "eliminate_exception_or_pass",
    "unroll_loops",
    "resolve_static_containers",
    "constant_propagation",
    "fuse_addmm_branches",
    "fuse_linear",
    "remove_dropout",
    "view_to_reshape",
    "remove_contiguous",
    "unpack_transformer_encoder_layer",
    "unpack_addmm",
    "unpack_log_softmax",
    "unpack_hardswish",
    "unpack_hardsigmoid",
    "unpack_silu",
    "unpack_gelu",
    "unpack_rsqrt",
    "unpack_var_std",
    "replace_tile_with_repeat",
    "normalize_pad",
    "normalize_conv_transpose",
    "remove_scalar_round_trips",
    "peephole_optimize",
    "constant_propagation",
    "eliminate_common_subexpression",
    "remove_to",
    "eliminate_dead_code",
    "mark_nodes_for_fallback",
)


@dataclasses.dataclass
class LoweredModule:
    """The frozen module and the lowered graph of its method (the module's own graph, edited in place)."""

    module: torch.jit.ScriptModule
    graph: Graph
    fired: list[str]
    static_arguments: tuple[StaticArgument, ...] = ()  # folded into the graph and erased from its inputs
    optional_tensors: tuple[int, ...] = ()  # Optional[Tensor] arguments given an Input, typed Tensor in the graph


def _forced(op: str, settings: CompileSettings) -> bool:
    return op in settings.torch_executed_ops or op.split(".")[0] in settings.torch_executed_ops


def _skip_reason(p: LoweringPass, settings: CompileSettings, explicit: bool) -> str | None:
    """Why a pass must not run: it would rewrite an op the user keeps in PyTorch, or (unless the pass was
    asked for by name) the engine takes the op whole, which is faster and exact."""
    forced = [op for op in p.replaces if _forced(op, settings)]
    if forced:
        return f"torch_executed_ops keeps {', '.join(forced)} in PyTorch"
    if not explicit and p.decomposition and all(op in CONVERTERS for op in p.replaces):
        return f"the engine converts {', '.join(p.replaces)} whole"
    return None


def _status(changed: bool) -> str:
    return "changed" if changed else "no change"


def freeze(module: torch.jit.ScriptModule, method: str = "forward") -> torch.jit.ScriptModule:
    """`module` frozen, with torch.jit.freeze's optimizations (dropout removed; batch norms, adds, subtractions,
    multiplies and divides by constants folded into the convolution or linear before them) except its concatenation
    of linear layers that read one input. torch concatenates those only where their weights are on a GPU, into one
    linear whose slices replace their outputs: a graph that depends on the device, whose slices an in-place reader
    (a ReLU(inplace=True) after each linear) then writes into, which keeps the writer and its views in PyTorch (a
    windowed transformer whose blocks each run a position-bias MLP on one shared table: an engine a block on a GPU,
    one engine on the CPU). The builder groups such products itself (the CUDA planner's linear groups)."""
    preserved = [method] if method != "forward" else []
    frozen = torch.jit.RecursiveScriptModule(torch._C._freeze_module(module._c, preserved))
    torch.jit.RecursiveScriptModule._finalize_scriptmodule(frozen)
    if frozen._c._has_method("forward"):  # torch's pass reads forward only; remove_dropout takes the other methods
        torch._C._jit_pass_remove_dropout(frozen._c)
    folds = (torch._C._jit_pass_fold_frozen_conv_bn, torch._C._jit_pass_fold_frozen_conv_add_or_sub,
             torch._C._jit_pass_fold_frozen_conv_mul_or_div, torch._C._jit_pass_fold_frozen_linear_bn)
    for name in ("forward", *preserved):
        if frozen._c._has_method(name):
            graph = getattr(frozen, name).graph
            while any([fold(graph) for fold in folds]):  # every fold each round: one exposes another
                pass
    return frozen


def lower(module: torch.jit.ScriptModule, settings: CompileSettings, method: str = "forward",
          passes: Sequence[str] | None = None, static_arguments: Sequence[StaticArgument] = ()) -> LoweredModule:
    """Freeze `module` (in eval mode) and run the lowering pipeline over `method`'s graph.

    `passes` replaces the pipeline by these passes, in this order (tests run one pass this way); a
    decomposition named there runs even when the engine converts its op whole. `static_arguments` are folded
    into the graph as constants first, and erased from its inputs (lowering/static_arguments.py).
    The caller's module is not changed (module passes only read it; freezing works on a copy).
    """
    load_all()
    chosen = [PASSES[name] for name in (passes if passes is not None else MODULE_PIPELINE + GRAPH_PIPELINE)]
    ctx = LoweringContext(settings)
    fired = []
    for p in (p for p in chosen if p.stage == "module"):
        changed = p.fn(module, ctx)
        if changed:
            fired.append(p.name)
        logger.debug("module pass %s (%s): fallback modules %s", p.name, _status(changed), ctx.fallback_modules)
    with eval_mode(module):
        frozen = freeze(module, method)
    ctx.module = frozen
    graph = getattr(frozen, method).graph
    logger.debug("graph after freeze:\n%s", graph)
    optional_tensors = fold_static_arguments(graph, static_arguments)
    if static_arguments or optional_tensors:
        fired.append("fold_static_arguments")
    # The graph is linted as frozen, then after every pass that changed it (a pass that reports no change leaves
    # the graph it was given, which was linted already), and once more at the end where the last pass to run
    # reported no change: a pass that changed the graph without saying so is caught there at the latest.
    graph.lint()
    linted = True
    for p in (p for p in chosen if p.stage == "graph"):
        skip = _skip_reason(p, settings, explicit=passes is not None)
        changed = False if skip else p.fn(graph, ctx)
        if changed:
            graph.lint()
            fired.append(p.name)
        linted = bool(changed) or (linted and bool(skip))
        logger.debug("graph after lowering pass %s (%s):\n%s", p.name, f"skipped: {skip}" if skip else _status(changed),
                     graph)
    if not linted:
        graph.lint()
    return LoweredModule(frozen, graph, fired, tuple(static_arguments), optional_tensors)


def rerun(graph: Graph, settings: CompileSettings, passes: Sequence[Callable[[Graph, LoweringContext], bool]],
          module: torch.jit.ScriptModule | None = None, metas: Mapping[int, TensorMeta] | None = None) -> bool:
    """Run these graph passes (registered pass functions) again, after shape analysis made more values static
    (`metas`); True if any changed."""
    ctx = LoweringContext(settings, module=module, metas=metas)
    changed = False
    for p in passes:
        registered = PASSES.get(p.__name__)
        if registered is not None and _skip_reason(registered, settings, False) is not None:
            continue  # as in the pipeline: an op the user keeps in PyTorch is not rewritten
        if p(graph, ctx):
            changed = True
            logger.debug("graph after lowering pass %s (again, after shape analysis):\n%s", p.__name__, graph)
    return changed
