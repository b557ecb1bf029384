"""Why each pair of steps of a CUDA plan stays apart: every pair left unfused has a reason.

An *unfused edge* is a tensor a layer of one step makes and a layer of another step reads (constants and network
inputs left out: the plan holds them before any step). Its reason comes from the planner's rules (planner.py's
module docstring), asked about the finished plan, the first that applies:
- a layer on ATen, the reader's or the producer's: the generator's refusal for a pointwise layer, rule 8's for a
  movement layer (`_Movement`, `_indexed_refusal`), else no generated kernel for that layer kind;
- a library reader (cuDNN, cuBLAS, SDPA read their operands from memory: no generated prologue), for a convolution
  with whether rule 6's generated product was a candidate;
- a library producer and the epilogue rules that apply to it (a convolution's epilogue takes its only reader, not
  an engine output; matrix multiplies keep cuBLAS's bias only; SDPA takes none);
- a row step's join rule (fusion.py), rule 8's sole-reader rule for an indexed step, and rule 2's join and merge
  rules (`_join_refusal`, `_merge_refusal`) between pointwise groups;
- else "no rule fuses <producer> into <reader>".
Reporting only: the cuda backend's planning entry (which logs the edges at debug level) and the step profiler
import it; the planner does not.
"""
from __future__ import annotations

import dataclasses
import logging

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.backends.cuda import fusion
from torchkiln.runtime.backends.cuda import planner as P
from torchkiln.runtime.backends.cuda.codegen.indexed import SMALL_PRODUCT_K
from torchkiln.runtime.plan import Kernel, Plan

logger = logging.getLogger(__name__)

LIBRARY = {L.ConvolutionLayer: "cuDNN", L.MatrixMultiplyLayer: "cuBLAS", L.AttentionLayer: "SDPA"}
# what a library producer step's epilogue takes, by its kernel's op
_CUBLAS = "matrix multiplies keep cuBLAS's bias only: no generated epilogue (rule 6: linear layers stay on cuBLAS; " \
          f"rule 8b generates products of at most {SMALL_PRODUCT_K} terms an output)"
EPILOGUES = {
    "matrix_multiply": _CUBLAS,
    "linear_group": _CUBLAS,
    "quantized_matmul": "the quantized matrix multiply takes its dequantize epilogue only (rule 3)",
    "dequantized_conv": "the dequantize and cuDNN's float convolution take no epilogue (rule 3c, where the "
                        "generated quantized convolution was not timed faster)",
    "attention": "SDPA takes no epilogue (rule 5)",
    "layer_norm": "CUDA's layer norm takes no epilogue (rule 4, without Triton)",
    "patch_conv": "the patch GEMM takes no epilogue",
    "conv_relu": "cuDNN's fused call ends at its ReLU (rule 1): it takes no further layers",
    "conv_add_relu": "cuDNN's fused call ends at its ReLU (rule 1): it takes no further layers",
}
CONVOLUTION_STEPS = ("convolution", "conv_epilogue", "patch_conv", "gemm", "depthwise")
REDUCTIONS = (L.ReduceLayer, L.SoftMaxLayer, L.NormalizationLayer, L.CumulativeLayer)  # rule 4's layer kinds
EPILOGUE_GROUPS = ("pointwise", "gemm", "depthwise")  # generated steps rule 2's pointwise layers join
_PRODUCT = "(rule 6): it reads its input from memory and takes an epilogue, no prologue"
GENERATED_READERS = {  # generated kernels that replace a library call: why one reads its operands from memory
    "gemm": _PRODUCT, "depthwise": _PRODUCT,
    "attention": "(timed faster than SDPA's): it reads query, key, value and mask from memory, no prologue"}


@dataclasses.dataclass(frozen=True)
class UnfusedEdge:
    """Tensor `tensor`, made in step `producer`, read in step `reader` (indices into the plan's steps)."""

    producer: int
    reader: int
    tensor: str
    reason: str


class _Context:
    """A finished plan as the planner's rules see it."""

    def __init__(self, network: Network, plan: Plan) -> None:
        self.network = network
        self.steps = [(plan.kernels[s.kernel], list(s.layers)) for s in plan.steps]
        self.graph = P._Graph(network)
        # rule 8 ran before the layouts' tactics (rule 7) were set
        self.moves = P._Movement(network, [(Kernel(k.kind, k.op), m) for k, m in self.steps], self.graph)
        self.where: dict[int, int] = {}  # layer index -> the first step computing it
        self.step_of: dict[int, int] = {}  # tensor id -> the first step making it
        for k, (_, members) in enumerate(self.steps):
            for j in members:
                self.where.setdefault(j, k)
                for t in network.layers[j].outputs:
                    self.step_of.setdefault(id(t), k)

    def layer(self, j: int) -> L.Layer:
        return self.network.layers[j]

    def kernel(self, k: int) -> Kernel:
        return self.steps[k][0]

    def is_step(self, k: int, kind: str, *ops: str) -> bool:
        """Whether step `k` runs a `kind` kernel of one of `ops`."""
        return self.kernel(k).kind == kind and self.kernel(k).op in ops

    def sole_reader_reason(self, t) -> str:
        """Why `t` is not a value only one layer reads: an engine output, or several readers."""
        if id(t) in self.graph.returned:
            return f"{t.name!r} is an engine output (written to memory anyway)"
        readers = self.graph.readers.get(id(t), [])
        if len(readers) > 1:
            where = ", ".join(f"{r.KIND} {r.name!r} (step {self.where[self.graph.index[id(r)]]})" for r in readers)
            return f"{t.name!r} has {len(readers)} readers: {where}"
        return ""


def unfused_edges(network: Network, plan: Plan) -> list[UnfusedEdge]:
    """Every tensor made in one step and read in another, with why the two steps are apart (module docstring)."""
    ctx = _Context(network, plan)
    edges = []
    for b, (_, members) in enumerate(ctx.steps):
        made_here = {id(t) for j in members for t in network.layers[j].outputs}
        seen: set[int] = set()
        for j in members:
            for t in network.layers[j].inputs:
                if t.producer is None or isinstance(t.producer, L.ConstantLayer) or id(t) in made_here \
                        or id(t) in seen:
                    continue
                seen.add(id(t))
                a = ctx.step_of[id(t)]
                edges.append(UnfusedEdge(a, b, t.name, _reason(ctx, a, b, t, t.producer, network.layers[j])))
    return edges


def describe_step(network: Network, plan: Plan, k: int) -> str:
    """`step k (kind op: layer names)`."""
    step = plan.steps[k]
    kernel = plan.kernels[step.kernel]
    return f"step {k} ({kernel.kind} {kernel.op}: {', '.join(network.layers[j].name for j in step.layers)})"


def format_edges(network: Network, plan: Plan, edges: list[UnfusedEdge] | None = None) -> list[str]:
    """One line per unfused edge: `step i (...) -> step j (...): reason`."""
    edges = unfused_edges(network, plan) if edges is None else edges
    return [f"{describe_step(network, plan, e.producer)} -> {describe_step(network, plan, e.reader)}: {e.reason}"
            for e in edges]


def log_unfused(network: Network, plan: Plan) -> None:
    """Log each unfused edge of a cuda plan at debug level (nothing is computed unless debug logging is on)."""
    if logger.isEnabledFor(logging.DEBUG):
        for line in format_edges(network, plan):
            logger.debug("%s", line)


def _reason(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    for rule in _RULES:
        reason = rule(ctx, a, b, t, p, r)
        if reason:
            return reason
    return f"no rule fuses {ctx.kernel(a).op} ({p.KIND}) into {ctx.kernel(b).op} ({r.KIND})"


def _aten(ctx: _Context, k: int, layer: L.Layer, role: str) -> str:
    """Why `layer`, alone in ATen step `k`, has no generated kernel."""
    if ctx.kernel(k).kind != "aten":
        return ""
    head = f"the {role}, {layer.KIND} {layer.name!r}, runs on ATen"
    fusable = P._fusable()
    if fusable is None:
        return f"{head}: Triton is not installed"
    if isinstance(layer, P.POINTWISE) and (why := fusable(layer)):
        return f"{head}: {why}"
    if isinstance(layer, REDUCTIONS):
        from torchkiln.runtime.backends.cuda.codegen.reduction import reduction_fusable

        if why := reduction_fusable(layer):
            return f"{head}: {why}"
    if isinstance(layer, L.PoolingLayer) and layer.type == L.PoolingType.MAX:
        from torchkiln.runtime.backends.cuda.codegen.pooling import poolable

        if why := poolable(layer):
            return f"{head}: {why}"
    from torchkiln.runtime.backends.cuda.codegen.indexed import MOVEMENT, indexed_fusable

    if isinstance(layer, MOVEMENT):
        why = indexed_fusable(layer)
        if why is None and ctx.moves.candidate(k):
            why = ctx.moves.group(k)[3]
        elif why is None:
            why = "it copies nothing (a view) and is not a permute between two generated pointwise steps"
        if why:
            return f"{head}: rule 8 does not take it: {why}"
    return f"{head}: no generated kernel for {layer.KIND} layers"


def _aten_reader(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    return _aten(ctx, b, r, "reader")


def _aten_producer(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    return _aten(ctx, a, p, "producer")


def _library_reader(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    kernel = ctx.kernel(b)
    lib = LIBRARY.get(type(r))
    if lib is None or not (kernel.kind == "library" or kernel.op in GENERATED_READERS):
        return ""
    if kernel.kind == "generated":
        return f"the reader, {r.KIND} {r.name!r}, is a generated {kernel.op} kernel {GENERATED_READERS[kernel.op]}"
    head = f"the reader, {r.KIND} {r.name!r}, is a library call ({lib} reads its operands from memory: no generated " \
           f"prologue)"
    return head + (_product_candidate(ctx, b, r) if isinstance(r, L.ConvolutionLayer) else "")


def _product_candidate(ctx: _Context, b: int, conv: L.ConvolutionLayer) -> str:
    """Whether rule 6 had a generated product for library convolution step `b`."""
    from torchkiln.runtime.backends.cuda.codegen import have_triton
    from torchkiln.runtime.backends.cuda.codegen.depthwise import depthwise_layer
    from torchkiln.runtime.backends.cuda.codegen.gemm import gemm_layer

    if not have_triton():
        return "; no generated product (Triton is not installed)"
    op = ctx.kernel(b).op
    if P._depthwise(conv):
        why = depthwise_layer(conv)
        if why is None and op in P.DEPTHWISE_LIBRARY_OPS:
            return "; a generated depthwise kernel was a candidate (rule 6) and was not kept (the library step " \
                   "timed faster, or timing was off)"
        return f"; no generated depthwise kernel (rule 6): {why or f'a {op} step is not one it replaces'}"
    why = gemm_layer(conv)
    if why is None and op == "conv_epilogue":
        return "; a generated 1x1 GEMM was a candidate (rule 6) and was not kept (the library step timed faster, " \
               "or timing was off)"
    return f"; no generated GEMM (rule 6): {why or 'a 1x1 product is a candidate only with a generated epilogue'}"


def _library_producer(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    kernel = ctx.kernel(a)
    if kernel.op in EPILOGUES:
        return f"the producer, {p.KIND} {p.name!r}, is a {kernel.kind} {kernel.op} step: {EPILOGUES[kernel.op]}"
    if not isinstance(p, L.ConvolutionLayer) or kernel.op not in CONVOLUTION_STEPS:
        return ""
    why = ctx.sole_reader_reason(t)
    if why:
        return f"{why}: a convolution's epilogue takes its only reader (rules 1, 2, 6)"
    if kernel.kind == "generated":
        return f"the generated {kernel.op} kernel (rule 6) took its epilogue; {r.KIND} {r.name!r} is not part of it"
    if isinstance(r, P.POINTWISE) and tuple(r.outputs[0].shape) != tuple(t.shape):
        return f"iteration spaces differ: the convolution's {list(t.shape)}, the reader's {list(r.outputs[0].shape)}"
    if ctx.is_step(b, "generated", "rows"):
        why = "it has no bias" if "bias" not in p.weights else f"it is a {kernel.kind} {kernel.op} step"
        return f"a convolution joins the row step it alone feeds as the row kernel's bias, from a channels-last " \
               f"conv_epilogue step of its own; {why}"
    return ""


def _row_steps(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    for k, layer in ((a, r), (b, p)):
        members = [j for j in ctx.steps[k][1] if fusion.classify(ctx.layer(j)) in (
            fusion.OpClass.POINTWISE, fusion.OpClass.REDUCTION)]
        if ctx.is_step(k, "generated", "rows") or \
                any(fusion.classify(ctx.layer(j)) == fusion.OpClass.REDUCTION for j in members) and \
                ctx.kernel(k).op == "conv_epilogue":
            why = fusion.row_join_refusal(ctx.network, ctx.graph.index[id(layer)], members)
            seed = ctx.layer(min(j for j in members if fusion.classify(ctx.layer(j)) == fusion.OpClass.REDUCTION))
            if why:
                return f"{layer.KIND} {layer.name!r} stays out of the row group of {seed.name!r}: {why}"
            return f"{layer.KIND} {layer.name!r} is in another group than the row group of {seed.name!r}"
    return ""


def _indexed_steps(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    if not (ctx.is_step(a, "generated", "indexed") or ctx.is_step(b, "generated", "indexed")):
        return ""
    moves = ctx.moves
    if moves.sole_reader(a) != b:
        outputs = [x for j in ctx.steps[a][1] for x in ctx.layer(j).outputs]
        returned = [x.name for x in outputs if id(x) in ctx.graph.returned]
        readers = sorted({ctx.where[ctx.graph.index[id(x)]] for o in outputs for x in ctx.graph.readers.get(id(o), [])}
                         - {a})
        what = f"step {a} makes {returned[0]!r}, an engine output (written to memory anyway)" if returned else \
            f"step {a}'s outputs are read by steps {readers}"
        return f"{what}: an indexed kernel takes only the steps one step alone feeds (rule 8)"
    for k in (a, b):
        if not moves.movable(k):
            return f"step {k} ({ctx.kernel(k).kind} {ctx.kernel(k).op}) cannot be part of an indexed kernel (rule 8: " \
                   f"generated pointwise or indexed steps, and pointwise or movement layers of static shapes on ATen)"
    if b - a > P.MAX_SPAN:
        return f"step {a} runs {b - a} steps before step {b}: an indexed kernel takes producers up to {P.MAX_SPAN} " \
               f"steps back (rule 8)"
    return ""


def _pointwise_groups(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    """Rule 2 between a group making `t` and the generated pointwise layer `r` reading it (in a pointwise group, or in
    a convolution's or a generated product's epilogue)."""
    if not isinstance(r, P.POINTWISE) or not (ctx.is_step(b, "generated", *EPILOGUE_GROUPS) or
                                              ctx.is_step(b, "library", "conv_epilogue")):
        return ""
    reasons = []
    if ctx.is_step(a, "generated", *EPILOGUE_GROUPS) or ctx.is_step(a, "library", "conv_epilogue"):
        made = {id(x) for layer in ctx.network.layers for x in layer.outputs}
        lead = ctx.layer(ctx.steps[a][1][0])
        joined = P._join_refusal(r, lead, a, made, ctx.step_of, ctx.step_of)
        if joined:
            reasons.append(f"{r.KIND} {r.name!r} cannot join the group of step {a}: {joined}")
    if ctx.is_step(a, "generated", "pointwise"):
        merged = P._merge_refusal(ctx.network, ctx.steps, a, b)
        if merged:
            reasons.append(f"the group of step {a} cannot run inside step {b}: {merged}")
    return "; ".join(reasons)


def _max_pool(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    if ctx.is_step(a, "generated", "max_pool") or ctx.is_step(b, "generated", "max_pool"):
        return "the generated max pool kernel computes its layer alone"
    return ""


def _quantized_products(ctx: _Context, a: int, b: int, t, p: L.Layer, r: L.Layer) -> str:
    why_read = {"quantized_gemm": " (quantizing it in the GEMM's loads was measured slower)", "quantized_conv": ""}
    for op, what in (("quantized_gemm", "GEMM (rule 3b)"), ("quantized_conv", "convolution (rule 3c)")):
        if ctx.is_step(b, "generated", op) and isinstance(r, L.DequantizeLayer):
            return f"the reader is a generated quantized {what}: it reads its activation quantized from memory" \
                   f"{why_read[op]}, and {p.KIND} {p.name!r} writes it"
        if ctx.is_step(a, "generated", op):
            return f"the generated quantized {what} took the pointwise step that alone reads its product as its " \
                   f"epilogue; {r.KIND} {r.name!r} is not part of it"
    return ""


_RULES = (_aten_reader, _aten_producer, _library_reader, _library_producer, _quantized_products, _row_steps,
          _indexed_steps, _pointwise_groups, _max_pool)
