"""The onnxruntime backend: a CPU engine as ONNX Runtime sessions, with the layers ONNX cannot express run on
the reference meanings inside the same call, in order.

The plan (`plan_segments`, deterministic, so a loaded engine makes the same one from its network):
1. each layer goes to ONNX Runtime unless `layer_reason` gives why not: `onnx_export.supports` declines it, it
   touches bfloat16 (ORT's CPU provider has next to no bfloat16 kernels and numpy no bfloat16 type to hand
   tensors over in), or it is a gather or scatter whose run-time indices need a check ORT does not make
   (below);
2. consecutive layers with the same placement form a segment, in network order;
3. a run of ORT layers between reference layers that only moves data (views, casts, concatenation, shape,
   fill) runs on the reference backend too: ATen does those as fast as ORT, and a session boundary would cost
   a session call (~10-30 us of ORT overhead) for nothing. A network that ORT runs whole is one session
   however small, so every op test checks ORT's form of its layers.
Constant layers are not placed: each segment reads the constants it needs as its own (ONNX initializers,
or the reference executor's weights), so a constant never crosses a segment boundary.

The session kernels' tactic is the session settings (one intra-op thread or the threads asked for, worker threads
spinning or not) measured fastest when the plan is made (session_settings.py).

Each ORT segment is one `InferenceSession`, made once per engine and device (at the engine's first call,
also after loading engine bytes) and reused. Tensors cross as numpy views of torch CPU tensors (no copy for
contiguous inputs) and come back through `torch.from_numpy` of ORT's output arrays (numpy arrays over buffers ORT
makes per call: no copy either), so ORT outputs never alias inputs, weights or another call's outputs; reference
segments clone what may alias, as the reference executor does. Io binding (inputs bound by pointer, outputs into
tensors made per call) was measured slower: more Python calls per run (an 18-layer residual CNN at batch 1: 26-38
us over `session.run` alone, against 3-13 us for the numpy views through the session's own run).

Gather indices made at run time: ORT's gathers wrap a negative index where torch raises, so the exported graph
turns a negative one into one past any dim, which ORT refuses like any index past the end; the call then runs
again on the reference backend, which raises the documented EngineIndexError. Nothing is checked per call.

A dynamic-shape network runs on ORT only as one session (the export computes its symbolic layer parameters
from the input shapes); a reference segment would take intermediate tensors whose dims are expressions that
only the whole network's symbols define, so a network with any layer ORT cannot run uses the reference backend.
A network of static inputs whose only symbols are data-dependent sizes (nonzero, unique) is split still where each
segment binds the sizes it uses from its own inputs' dims or its own layers (`_bind_their_own_symbols`).
When ORT fails at run time (an index beyond the end, integer division by zero), the call runs again on the
reference backend, whose error (or, should it succeed, its result, with a warning) is what the caller gets.
A call that gives a layer values its ONNX form is not exact for (NaN or inf into a linear resize: the session's
guard output, `network_to_onnx(guard=True)`) runs on the reference backend too, logged at DEBUG only.

Outputs: the first call with each input-shape signature checks every session output's dtype and shape against the
network's (ONNX Runtime only warns where they differ); a mismatch raises EngineFormatError naming the tensor. A
network that is one session of static input shapes has one signature, so after that first call a call is the
session's run alone.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from torchkiln.errors import EngineFormatError
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import Dim, DimSymbol, bounds, is_symbolic, substitute, symbols_of
from torchkiln.runtime.backends.base import BackendOptions, BackendUnavailable, SessionModels
from torchkiln.runtime.backends.full_gates import full_size_gates, has_gates
from torchkiln.runtime.backends.session_settings import DEFAULT_SETTINGS, Tactic, candidates, choose_settings
from torchkiln.runtime.executor import ReferenceExecutor
from torchkiln.runtime.integer_kernels import exact_for
from torchkiln.runtime.plan import Kernel, Plan, Step, Target, target_here
from torchkiln.runtime.serialization import dtype_name
from torchkiln.runtime.symbols import MAX_CACHED_SIGNATURES, SymbolBinder

if TYPE_CHECKING:
    import numpy
    import onnx

logger = logging.getLogger(__name__)

# Layers that only move or reinterpret data; a segment of these alone is not worth a session boundary.
DATA_MOVEMENT = (L.IdentityLayer, L.ShuffleLayer, L.CastLayer, L.SliceLayer, L.ExpandLayer, L.ShapeLayer,
                 L.FillLayer, L.ConcatenationLayer, L.ConstantLayer)
TOO_SMALL = "only moves data between reference layers: not worth an ONNX Runtime session boundary"
SHARED_VIEW = "makes an engine output that shares memory with another output (as on the reference backend)"
_VIEWS = (L.IdentityLayer, L.ShuffleLayer, L.SliceLayer, L.ExpandLayer, L.CastLayer)  # may return their input's memory
# ORT graph transformers the sessions run without, by measurement. SkipLayerNormFusion: ORT 1.32's
# SkipLayerNormalization kernel takes 5-8x the time of the Add and LayerNormalization it replaces (x86, AVX-512,
# [1-32, 128, 256-768], one and two threads; a 4-layer post-norm encoder of hidden 256 at batch 8: fp32 45 -> 38
# ms, int8 28 -> 20 ms on one thread). It is off for every network: the fused kernel was slower at every shape
# measured. MatMulAddFusion: it makes a linear layer of 3-d or more input Reshape + Gemm + Reshape, where MatMul
# + Add (or BiasGelu, ORT's fusion of the Add and a GELU after it) took 0.86-0.91x the time per call on two threads
# that do not spin (a 4-layer post-norm encoder of hidden 256 at sequence 128, batch 1 and 8; a token-mixing MLP
# network at batch 8; a vision transformer of width 192 a tie) and within 2% either way on one thread; a 2-d
# linear layer is exported as Gemm, which ORT fuses with an activation after it.
DISABLED_OPTIMIZERS = ("SkipLayerNormFusion", "MatMulAddFusion")


def layer_reason(layer: L.Layer) -> str | None:
    """None if `layer` may run inside an ONNX Runtime session, else why it runs on the reference backend."""
    from torchkiln.onnx_export import supports

    if isinstance(layer, L.TopKLayer) and layer.k > 1:
        return "top-k of k > 1: ONNX Runtime orders equal values by index, torch (the reference) otherwise"
    if any(t.dtype == torch.bfloat16 for t in (*layer.inputs, *layer.outputs)):
        return "bfloat16: ONNX Runtime's CPU provider has almost no bfloat16 kernels"
    if isinstance(layer, L.GatherLayer) and _constant_out_of_range(layer):
        return "constant indices outside [0, size): the reference raises, ONNX Runtime would wrap them"
    if isinstance(layer, (L.GatherLayer, L.ScatterLayer)) and L.constant_value(layer.inputs[1]) is None:
        if isinstance(layer, L.ScatterLayer):
            return "scatter indices computed at run time: ONNX Runtime wraps negative ones, torch raises"
    return supports(layer)


def _constant_out_of_range(layer: L.GatherLayer) -> bool:
    """Whether constant indices hold a value outside [0, size) at the largest size (the layer then raises on the
    reference). Past a dynamic dim's run-time size, ORT raises too, and the call reruns on the reference."""
    idx, data = L.constant_value(layer.inputs[1]), layer.inputs[0]
    if idx is None or not idx.numel():
        return False
    if layer.mode == L.GatherMode.ND:
        return any(bool(((idx[..., d] < 0) | (idx[..., d] >= bounds(data.shape[d])[1])).any())
                   for d in range(idx.shape[-1]))
    return int(idx.min()) < 0 or int(idx.max()) >= bounds(_index_bound(layer))[1]


def _index_bound(layer: L.GatherLayer) -> Dim:
    """The size of the gathered dim (a symbol if dynamic): indices must lie in [0, size)."""
    data = layer.inputs[0]
    return data.shape[layer.axis % data.rank] if data.rank else 1


@dataclasses.dataclass
class Segment:
    """Consecutive layers placed on one backend (constant layers they read are included, first)."""

    layers: list[L.Layer]
    on_ort: bool
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)  # reference layer name -> why


def _views_of_outputs(network: Network) -> set[int]:
    """The view layers (reshape, transpose, slice...) by which one engine output views another, or two view
    one tensor: on the reference backend those outputs share memory, and PyTorch code after the engine may
    rely on it (an in-place write through one seen in the other), so torch must make those views."""
    chains: dict[int, list[list[L.Layer]]] = {}
    for t in network.outputs:
        chain = []
        while isinstance(t.producer, _VIEWS):
            chain.append(t.producer)
            t = t.producer.inputs[0]
        if t.producer is not None and not isinstance(t.producer, L.ConstantLayer):  # else the reference copies
            chains.setdefault(id(t), []).append(chain)
    return {id(layer) for found in chains.values() if len(found) > 1 for chain in found for layer in chain}


def plan_segments(network: Network) -> list[Segment]:
    """The network's layers in order, grouped into ORT and reference segments (see the module docstring)."""
    outputs = {id(t) for t in network.outputs}
    placed = [layer for layer in network.layers
              if not isinstance(layer, L.ConstantLayer) or any(id(t) in outputs for t in layer.outputs)]
    views = _views_of_outputs(network)
    segments: list[Segment] = []
    for layer in placed:
        reason = SHARED_VIEW if id(layer) in views else layer_reason(layer)
        if not segments or segments[-1].on_ort != (reason is None):
            segments.append(Segment([], reason is None))
        segments[-1].layers.append(layer)
        if reason is not None:
            segments[-1].reasons[layer.name] = reason
    if len(segments) > 1:
        for seg in segments:
            if seg.on_ort and all(isinstance(layer, DATA_MOVEMENT) for layer in seg.layers):
                seg.on_ort = False
                seg.reasons = dict.fromkeys((layer.name for layer in seg.layers), TOO_SMALL)
    merged: list[Segment] = []
    for seg in segments:
        if merged and merged[-1].on_ort == seg.on_ort:
            merged[-1].layers += seg.layers
            merged[-1].reasons.update(seg.reasons)
        else:
            merged.append(seg)
    for seg in merged:
        constants = _constants_read(seg.layers)
        seg.layers = [c for c in network.layers if id(c) in constants] + seg.layers
    return merged


def _constants_read(layers: Sequence[L.Layer]) -> set[int]:
    own = {id(layer) for layer in layers}
    return {id(t.producer) for layer in layers for t in layer.inputs
            if isinstance(t.producer, L.ConstantLayer) and id(t.producer) not in own}


def reference_layers(network: Network) -> list[tuple[str, str, str]]:
    """(layer name, kind, reason) of every layer the onnxruntime backend runs on the reference meanings."""
    kinds = {layer.name: layer.KIND for layer in network.layers}
    return [(name, kinds[name], reason) for seg in plan_segments(network) for name, reason in seg.reasons.items()]


def _subnetwork(network: Network, seg: Segment, later: set[int]) -> Network:
    """The segment as a network of its own layers (no copies): inputs are the tensors it reads from outside,
    outputs those read after it (`later`: ids of tensors later segments read, and network outputs)."""
    made = {id(t) for layer in seg.layers for t in layer.outputs}
    sub = Network(f"{network.name}/{seg.layers[0].name}")
    seen: set[int] = set()
    for layer in seg.layers:
        for t in layer.inputs:
            if id(t) not in made and id(t) not in seen:
                seen.add(id(t))
                sub.inputs.append(t)
    sub.layers = list(seg.layers)
    for layer in seg.layers:
        sub.outputs += [t for t in layer.outputs if id(t) in later]
    return sub


def _bind_their_own_symbols(network: Network, subs: list[Network]) -> bool:
    """Whether each segment of a network of static inputs can bind every symbol it uses (data-dependent sizes) from
    its own inputs' dims, each an int or one symbol, or its own data-dependent layers."""
    if symbols_of([t.shape for t in network.inputs]):
        return False
    for sub in subs:
        if any(is_symbolic(d) and not isinstance(d, DimSymbol) for t in sub.inputs for d in t.shape):
            return False
        known = symbols_of([t.shape for t in sub.inputs]) | set(sub.data_symbols())
        used = symbols_of([list(layer.params().values()) + [t.shape for t in layer.outputs] for layer in sub.layers])
        if not used <= known:
            return False
    return True


def target(device: torch.device) -> Target:
    """Plans depend on what this torchkiln exports and on the ONNX Runtime version."""
    return target_here("onnxruntime", device, [("onnxruntime", _ort().__version__)])


def make_plan(network: Network, device: torch.device, options: BackendOptions) -> Plan:
    """The plan: a "session" kernel per ORT segment, an "aten" kernel per reference segment (plan_segments); the
    session kernel's tactic is the session settings measured fastest (session_settings.py)."""
    index = {id(layer): j for j, layer in enumerate(network.layers)}
    reference = Kernel("aten", "reference segment")
    steps = [Step(0 if seg.on_ort else 1, tuple(index[id(layer)] for layer in seg.layers))
             for seg in plan_segments(network)]

    def plan(tactic: Tactic) -> Plan:
        return Plan(target(device), [Kernel("session", "onnx", tactic), reference], steps)

    if options.timing_iterations == 0 or not any(step.kernel == 0 for step in steps):
        return plan(DEFAULT_SETTINGS)
    tactics = candidates(options.ort_threads == 0 and torch.get_num_threads() > 1, has_gates(network))
    exported: list[SessionModels | None] = []  # the sessions' models, exported once for every candidate

    def runner(tactic: Tactic) -> OrtRunner:
        if not exported:
            exported.append(session_models(network, plan(DEFAULT_SETTINGS), b""))
        return OrtRunner(network, plan(tactic), device, options, models=exported[0])

    return plan(choose_settings(network, tactics, runner))


def _ort():
    """The onnxruntime module; BackendUnavailable where it is not installed."""
    try:
        import onnxruntime
    except ImportError as e:
        raise BackendUnavailable(f"onnxruntime is not installed (pip install onnxruntime): {e}") from None
    return onnxruntime


def _ort_errors(ort) -> tuple[type[Exception], ...]:
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))


class OutsideExactRange(Exception):
    """A call gave a layer values its ONNX form does not compute exactly (`ExportContext.exact_below`)."""


ATTENTION_OPSET = 23  # ONNX's Attention op


@functools.cache
def session_opset() -> int:
    """The opset of the sessions' models: 23 where this ONNX Runtime runs its Attention op (on the CPU), so that
    attention layers run as that op: ORT's fused CPU kernel, which gave the same values as MatMul-Softmax-MatMul and
    ran faster at 2 threads (an encoder of 4 attention layers, width 256, sequence 128, batch 8: 19.3 -> 18.1 ms; a
    vision transformer of width 192 over 37 tokens, batch 8: 5.3 -> 5.0 ms). Else the export's default."""
    import onnx
    from onnx import helper

    from torchkiln.onnx_export.export import DEFAULT_OPSET

    ort = _ort()
    # an Attention node, not only the opset: an ORT may load opset 23 and have no CPU kernel of the op
    qkv = [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 1, 1]) for name in "qkv"]
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 1])
    graph = helper.make_graph([helper.make_node("Attention", ["q", "k", "v"], ["y"], q_num_heads=1, kv_num_heads=1)],
                              "opset_probe", qkv, [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", ATTENTION_OPSET)], ir_version=10)
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except _ort_errors(ort) as e:
        logger.info("ONNX Runtime %s does not run opset %d's Attention op (%s): sessions use opset %d",
                    ort.__version__, ATTENTION_OPSET, e, DEFAULT_OPSET)
        return DEFAULT_OPSET
    return ATTENTION_OPSET


def integer_form(sub: Network) -> tuple[bool, bool]:
    """Whether ORT's integer kernels run `sub` exactly here, and whether its int8 weights are written as uint8 for
    that (a CPU without VNNI, weights wider than the 7 bits post-training quantization gives there: a QAT graph's):
    runtime/integer_kernels.py."""
    if exact_for(sub):
        return True, False
    unsigned = exact_for(sub, unsigned_weights=True)
    return unsigned, unsigned


def session_onnx(sub: Network, form: tuple[bool, bool] | None = None) -> onnx.ModelProto:
    """The ONNX model a session runs for `sub`: with the guard output and ONNX Runtime's own ops (`network_to_onnx`;
    not where its integer kernels would be inexact), int8 weights as uint8 where that makes them exact (`form`,
    `integer_form(sub)` where not given), in `session_opset()`."""
    from torchkiln.onnx_export import network_to_onnx

    exact, unsigned = integer_form(sub) if form is None else form
    return network_to_onnx(sub, opset=session_opset(), guard=True, contrib_ops=exact, unsigned_weights=unsigned)


def session_models(network: Network, plan: Plan | None, digest: bytes) -> SessionModels | None:
    """The ONNX model of each session `OrtRunner` makes for `plan`, in order, for the engine of SHA-256 `digest`
    (what the module cache stores with a compiled module, so that its sessions are made again without exporting);
    None where the plan is not ONNX Runtime's here (None: it cannot plan here) or a segment does not export."""
    from torchkiln.onnx_export import OnnxExportError

    if plan is None or plan.target.backend != "onnxruntime":
        return None
    try:
        models = tuple(session_onnx(sub).SerializeToString()
                       for sub, on_ort in _plan_subnetworks(network, plan) if on_ort)
    except OnnxExportError:
        return None
    return SessionModels(digest, _ort().__version__, models)


def _plan_subnetworks(network: Network, plan: Plan) -> list[tuple[Network, bool]]:
    """Each step of `plan` as a network of its own (`_subnetwork`), and whether it runs on ORT."""
    segments = [Segment([network.layers[j] for j in step.layers], plan.kernels[step.kernel].kind == "session")
                for step in plan.steps]
    read_after: list[set[int]] = []  # per segment: tensors read by later segments or returned
    later = {id(t) for t in network.outputs}
    for seg in reversed(segments):  # constants are each segment's own: they never cross a boundary
        read_after.append(set(later))
        later |= {id(t) for layer in seg.layers for t in layer.inputs if not isinstance(t.producer, L.ConstantLayer)}
    read_after.reverse()
    return [(_subnetwork(network, seg, after), seg.on_ort) for seg, after in zip(segments, read_after)]


class _Session:
    """One ORT segment: its session and its input and output names. `model`: the segment's ONNX model as
    `session_models` gave it (from a module cache entry), used instead of exporting where ORT accepts it and
    its inputs and outputs are the segment's."""

    def __init__(self, ort, sub: Network, threads: int, spin: bool, profile_prefix: str | None = None,
                 model: bytes | None = None, full_gates: bool = False) -> None:
        """`full_gates`: ORT gets the model with its channel gates at full size (full_gates.py)."""
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        self.session_name = sub.name
        options.log_severity_level = 3  # run-time errors come back as exceptions, handled by the runner
        exact, unsigned = integer_form(sub)
        if not exact:  # quantized layers run as ORT's float Q/DQ nodes: eager's exact values
            options.add_session_config_entry("session.disable_quant_qdq", "1")
        self.optimized_model = None
        if profile_prefix is not None:  # ORT's profiler on, and the graph it runs written (weights apart)
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
            self.optimized_model = options.optimized_model_filepath = f"{profile_prefix}.onnx"
            options.add_session_config_entry("session.optimized_model_external_initializers_file_name",
                                             f"{os.path.basename(profile_prefix)}.weights")
        # (a stored model may hold int8 weights exported where they were exact: a cache shared with a VNNI CPU)
        def graph(proto: onnx.ModelProto) -> bytes:
            return (full_size_gates(proto)[0] if full_gates else proto).SerializeToString()

        if model is not None and full_gates and exact and not unsigned:
            import onnx

            model = graph(onnx.load_from_string(model))
        self.session = None if model is None or not exact or unsigned else self._stored(ort, sub, model, options)
        if self.session is None:
            from torchkiln.onnx_export import OnnxExportError

            try:
                self.session = ort.InferenceSession(graph(session_onnx(sub, (exact, unsigned))), options,
                                                    providers=["CPUExecutionProvider"],
                                                    disabled_optimizers=DISABLED_OPTIMIZERS)
            except (OnnxExportError, *_ort_errors(ort)) as e:
                raise BackendUnavailable(f"ONNX Runtime refused the segment {sub.name!r}: {e}") from None
        self.input_names = [v.name for v in self.session.get_inputs()]
        self.output_names = [v.name for v in self.session.get_outputs()]
        # The compiled session's own run, where ORT has one (`_sess`): InferenceSession.run first checks in Python
        # that every input is fed, that no OrtValue of another session is, and that no WebGPU graph is captured,
        # none of which a call here can break (it feeds the session's own input names, numpy arrays, on the CPU).
        # Those checks took ~15 us a call right after a 2 ms ORT call (an 18-layer residual CNN, batch 1), whose work
        # leaves that Python to run with cold caches.
        self._run = getattr(self.session, "_sess", self.session).run
        self.outputs = list(sub.outputs)
        self.guarded = len(self.output_names) > len(self.outputs)  # the guard output (network_to_onnx) is last

    @staticmethod
    def _stored(ort, sub: Network, model: bytes, options):
        """The session of a stored model; None (logged) where ORT refuses it or it is not the segment's."""
        try:
            session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"],
                                           disabled_optimizers=DISABLED_OPTIMIZERS)
        except _ort_errors(ort) as e:
            logger.warning("segment %s: ONNX Runtime refused its stored ONNX model (%s); exporting it again",
                           sub.name, e)
            return None
        if len(session.get_inputs()) != len(sub.inputs) or len(session.get_outputs()) - len(sub.outputs) not in (0, 1):
            logger.warning("segment %s: its stored ONNX model has other inputs or outputs; exporting it again",
                           sub.name)
            return None
        return session

    def run(self, xs: list[torch.Tensor]) -> list[torch.Tensor]:
        feeds = {name: _numpy(x) for name, x in zip(self.input_names, xs)}
        outs = self._run(self.output_names, feeds, None)
        if self.guarded and outs.pop():
            raise OutsideExactRange(f"values outside the range ONNX Runtime computes exactly reached a layer of "
                                    f"{self.session_name} (NaN or inf into a linear resize, for example)")
        return [torch.from_numpy(o) for o in outs]

    def check(self, outs: list[torch.Tensor], bindings: dict[DimSymbol, int]) -> None:
        """EngineFormatError unless each output has the dtype and shape the network declares (its symbolic dims
        evaluated at `bindings`): ONNX Runtime only warns where they differ. A data-dependent size (nonzero,
        unique) is taken from the first output dim that is that size; a dim of sizes no output shows is not checked."""
        known = dict(bindings)
        for t, out in zip(self.outputs, outs):
            for d, n in zip(t.shape, out.shape):
                if isinstance(d, DimSymbol) and d not in known:
                    known[d] = n
        for t, out in zip(self.outputs, outs):
            shape = tuple(d if symbols_of(d) - known.keys() else substitute(d, known) for d in t.shape)
            if out.dtype != t.dtype or len(out.shape) != len(shape) or any(
                    isinstance(d, int) and d != n for d, n in zip(shape, out.shape)):
                where = f"{t.producer.KIND} layer {t.producer.name!r}" if t.producer is not None else "an input"
                raise EngineFormatError(
                    f"ONNX Runtime gave {dtype_name(out.dtype)}{list(out.shape)} for tensor {t.name!r} (output of "
                    f"{where}), where the engine declares {dtype_name(t.dtype)}{list(shape)}: the layer's ONNX "
                    f"export is wrong; compile with backend='reference' to run this engine")


def _numpy(x: torch.Tensor) -> numpy.ndarray:
    """A numpy view of `x`'s own memory where it is contiguous (ORT reads it in place), else of a contiguous copy
    (of its values: a negative view's are resolved)."""
    if x.is_contiguous() and not x.requires_grad and not x.is_neg():
        return x.numpy()
    return x.detach().resolve_neg().contiguous().numpy()


def _usable(models: SessionModels | None, version: str, sessions: int) -> list[bytes | None]:
    """Per session, its stored ONNX model, or None (export it) where there are none for this ORT version and
    this number of sessions (logged)."""
    if models is not None and (models.ort_version != version or len(models.models) != sessions):
        logger.info("stored ONNX models not used (ONNX Runtime %s, %d sessions; they are for %s, %d): exporting",
                    version, sessions, models.ort_version, len(models.models))
        models = None
    return [None] * sessions if models is None else [bytes(m) for m in models.models]


class OrtRunner:
    """A CPU network as ONNX Runtime sessions and reference segments, run in order."""

    def __init__(self, network: Network, plan: Plan, device: torch.device, options: BackendOptions,
                 profile_dir: str | None = None, models: SessionModels | None = None) -> None:
        """`profile_dir`: make each session with ONNX Runtime's profiler on, its files there (`end_profiling`).
        `models`: the sessions' ONNX models stored with the engine (used where they are for this ORT version and
        one per session)."""
        ort = _ort()
        if device.type != "cpu":
            raise BackendUnavailable(f"the onnxruntime backend runs on the CPU, not on {device}")
        self.network = network
        self.device = device
        self.errors = _ort_errors(ort)
        settings = next((k for k in plan.kernels if k.kind == "session"), Kernel("session", "onnx"))
        threads = 1 if settings.option("one_thread", False) else options.ort_threads or torch.get_num_threads()
        spin = settings.option("spin", True)
        gates = bool(settings.option("full_gates", False))
        planned = _plan_subnetworks(network, plan)
        subs = [sub for sub, _ in planned]
        if network.symbols() and len(subs) > 1 and not _bind_their_own_symbols(network, subs):
            # A reference segment between sessions would take intermediate tensors whose dims are expressions
            # (s0 // 2 + 1), which only the whole network's symbols define.
            names = ", ".join(f"{name} ({why})" for name, kind, why in reference_layers(network))
            raise BackendUnavailable(f"a dynamic-shape engine runs on ONNX Runtime only when all of it exports, and "
                                     f"these layers do not: {names}")
        self.steps: list[tuple[ReferenceExecutor | _Session, list[int], list[int]]] = []
        last_read: dict[int, int] = {}
        stored = iter(_usable(models, ort.__version__, sum(on_ort for _, on_ort in planned)))
        for k, (sub, on_ort) in enumerate(planned):
            prefix = None if profile_dir is None else os.path.join(profile_dir, f"session{k}")
            step = _Session(ort, sub, threads, spin, prefix, next(stored), gates) if on_ort else \
                ReferenceExecutor(sub, device)
            self.steps.append((step, [id(t) for t in sub.inputs], [id(t) for t in sub.outputs]))
            for t in sub.inputs:
                last_read[id(t)] = k
        kept = {id(t) for t in network.outputs}
        self.frees: list[list[int]] = [[] for _ in self.steps]
        for tid, k in last_read.items():
            if tid not in kept:
                self.frees[k].append(tid)
        self.input_ids = [id(t) for t in network.inputs]
        self.output_ids = [id(t) for t in network.outputs]
        self.passed_through = {id(t) for t in network.inputs} & kept  # an input returned as is: copied
        self.sessions = sum(isinstance(s, _Session) for s, _, _ in self.steps)
        self._reference: ReferenceExecutor | None = None
        self._binder = SymbolBinder.for_network(network)
        self._checked: set[tuple[tuple[int, ...], ...]] = set()  # input shapes whose outputs were checked
        # One session of static input shapes: once its outputs are checked (at the first call), a call is its run,
        # with the inputs taken in its order (`_take`, None: the network's) and the outputs put in the network's
        self._one_session: _Session | None = None
        self._take: list[int] | None = None
        self._order: list[int] | None = None
        if len(self.steps) == 1 and isinstance(self.steps[0][0], _Session) and not self.passed_through and \
                not symbols_of([t.shape for t in network.inputs]):
            self._one_session, reads, made = self.steps[0]
            self._take = None if reads == self.input_ids else [self.input_ids.index(i) for i in reads]
            self._order = None if made == self.output_ids else [made.index(i) for i in self.output_ids]
        logger.debug("network %s on onnxruntime: %d sessions, %d reference segments, %d threads (spinning: %s)",
                     network.name, self.sessions, len(self.steps) - self.sessions, threads, spin)

    def run(self, inputs: list[torch.Tensor],
            visit: Callable[[L.Layer | None, list[torch.Tensor]], None] | None = None) -> list[torch.Tensor]:
        """The network's outputs; `visit(layer, its outputs)` is called after each layer of a reference segment and
        `visit(None, the session's outputs)` after each session (per-step timing: runtime/profile.py)."""
        try:
            if self._one_session is not None and self._checked and visit is None:
                outputs = self._one_session.run(inputs if self._take is None else [inputs[k] for k in self._take])
                return outputs if self._order is None else [outputs[k] for k in self._order]
            return self._run_steps(inputs, visit)
        except self.errors as e:
            return self._run_on_reference(inputs, e)
        except OutsideExactRange as e:
            logger.debug("network %s: this call runs on the reference backend: %s", self.network.name, e)
            return self._reference_executor().run(inputs)

    def _run_steps(self, inputs: list[torch.Tensor],
                   visit: Callable[[L.Layer | None, list[torch.Tensor]], None] | None) -> list[torch.Tensor]:
        """`run`, step by step, each session's outputs checked at the first call of each input-shape signature."""
        values = dict(zip(self.input_ids, inputs))
        signature = tuple(tuple(x.shape) for x in inputs)
        bindings = None if signature in self._checked else self._binder.bind(signature) if self._binder else {}
        for (step, ins, outs), frees in zip(self.steps, self.frees):
            xs = [values[i] for i in ins]
            if isinstance(step, _Session):
                results = step.run(xs)
                if bindings is not None:  # once per input-shape signature
                    step.check(results, bindings)
                if visit is not None:
                    visit(None, results)
            else:
                results = step.run(xs, visit)
            values.update(zip(outs, results))
            for i in frees:
                del values[i]
        if bindings is not None:
            if len(self._checked) >= MAX_CACHED_SIGNATURES:
                self._checked.clear()
            self._checked.add(signature)
        return [values[i].clone() if i in self.passed_through else values[i] for i in self.output_ids]

    def end_profiling(self) -> list[tuple[str, str]]:
        """Per session made with `profile_dir`, in step order: ONNX Runtime's profile (a JSON file of events) and
        the graph it ran (an ONNX file); its profiler is off from now on."""
        return [(step.session.end_profiling(), step.optimized_model) for step, _, _ in self.steps
                if isinstance(step, _Session) and step.optimized_model is not None]

    def _reference_executor(self) -> ReferenceExecutor:
        if self._reference is None:
            self._reference = ReferenceExecutor(self.network, self.device)
        return self._reference

    def _run_on_reference(self, inputs: list[torch.Tensor], error: Exception) -> list[torch.Tensor]:
        """ONNX Runtime failed: the reference backend raises the documented error for these inputs (or, where
        it does not fail, its result is returned and the failure logged)."""
        outputs = self._reference_executor().run(inputs)
        logger.warning("network %s: ONNX Runtime failed where the reference backend did not, so this call ran "
                       "on the reference backend: %s", self.network.name, error)
        return outputs
