"""The public entry points: compile, convert_method_to_engine, embed_engine_in_new_module, support checks."""
from __future__ import annotations

import builtins
import collections
import dataclasses
import functools
import keyword
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch

from torchkiln import progress
from torchkiln.builder import BuildSettings, build_engine
from torchkiln.builder import bfloat16_tactic, engine_timing
from torchkiln.builder.calibration import calibrated_build, check_samples, tensor_samples
from torchkiln.builder.quantization import QuantizeRequest, log_network_cosine, quantized_build
from torchkiln.cache import EngineCache, ModuleCache
from torchkiln.conversion.block_converter import convert_block
from torchkiln.analysis.registry import is_registered
from torchkiln.conversion import load_all
from torchkiln.analysis.dynamic_shapes import analyze_dynamic_shapes
from torchkiln.analysis.resolve import Resolver
from torchkiln.analysis.shape_analysis import example_args, probe_values
from torchkiln.errors import ConversionError, EngineInputError, TorchkilnError, UnsupportedOperatorError, cause_line
from torchkiln.frontend import as_module, check_method, to_torchscript
from torchkiln.frontend.arguments import bind_static_arguments, split_named_inputs
from torchkiln.frontend.entry_arguments import take_entry_arguments
from torchkiln.frontend.input_dtypes import infer_input_dtypes, parameter_dtype
from torchkiln.log import debug_logging, warn
from torchkiln.lowering import LoweredModule, lower
from torchkiln.lowering.pipeline import rerun
from torchkiln.lowering.passes.functionalize_list_appends import functionalize_list_appends
from torchkiln.lowering.passes.functionalize_view_writes import functionalize_view_writes
from torchkiln.lowering.passes.libtorch import eliminate_dead_code
from torchkiln.lowering.passes.lower_tuples import lower_tuples
from torchkiln.lowering.passes.replace_python_ops import NOT_INLINED_ATTR, python_op_names
from torchkiln.lowering.passes.resolve_attribute_caches import resolve_attribute_caches
from torchkiln.lowering.passes.resolve_static_containers import resolve_static_containers
from torchkiln.lowering.passes.unpack_transformer_encoder_layer import unpack_transformer_encoder_layer
from torchkiln.lowering.walk import all_nodes
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import shape_range
from torchkiln.lowering.static_control_flow import fold_static_control_flow
from torchkiln.partitioning.report import Fp32Layer, PartitionReport, ReferenceLayer, make_report
from torchkiln.partitioning.segment import Partition, partition
from torchkiln.partitioning.signature import check_signature, unpack_list_inputs
from torchkiln.partitioning.support import Decision, Fallback, Target
from torchkiln.runtime.backends.base import BackendOptions, SessionModels
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.runtime.serialization import engine_digest
from torchkiln.runtime.tape import add_tape
from torchkiln.runtime.execute_op import SESSION_MODELS, engine_blob, engine_from_blob, engine_signature
from torchkiln.settings import CompileSettings, Input, as_device, load_calibration_samples
from torchkiln.settings_table import SETTINGS, backend_values
from torchkiln.stitching.engines_apart import load_apart, save_apart
from torchkiln.stitching.module import RaisesEngineErrors
from torchkiln.stitching.static_arguments import restore_static_arguments
from torchkiln.stitching.stitch import ENGINE_ATTR, stitch
from torchkiln.torchscript import Graph, Node, node_key, source_location, value_key

logger = logging.getLogger("torchkiln")

# Every keyword compile takes besides module and inputs: the settings table's.
_SETTING_NAMES = tuple(s.name for s in SETTINGS)


def _module_device(module: torch.nn.Module) -> torch.device | None:
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return None


def _example_device(inputs: Any) -> torch.device | None:
    """The device of the first example tensor among `inputs` (nested lists, tuples and dicts; an Input made from a
    tensor counts), if any."""
    if isinstance(inputs, torch.Tensor):
        return inputs.device
    if isinstance(inputs, Input):
        return None if inputs.example_data is None else inputs.example_data.device
    items = inputs.values() if isinstance(inputs, dict) else inputs if isinstance(inputs, (list, tuple)) else ()
    return next((d for d in map(_example_device, items) if d is not None), None)


def _settings(module: torch.nn.Module, inputs: Any, options: dict[str, Any]) -> CompileSettings:
    options = dict(options)
    inputs = take_entry_arguments(inputs, options)
    if "input_signature" in options:  # Torch-TensorRT's name for inputs, used for nested collections
        signature = options.pop("input_signature")
        if inputs is not None:
            raise ValueError("give inputs or input_signature (another name for it), not both")
        inputs = (signature,) if isinstance(signature, (Input, torch.Tensor)) else signature
    unknown = sorted(set(options) - set(_SETTING_NAMES))
    if unknown:
        raise ValueError(f"unknown compile settings {unknown}; known: {list(_SETTING_NAMES)}")
    if isinstance(inputs, dict):  # argument name -> Input, or -> the constant a non-tensor argument is fixed to
        inputs, options["input_names"], options["static_arguments"] = split_named_inputs(module, inputs)
    # a module without parameters or buffers runs where its example inputs are
    default_device = _module_device(module) or _example_device(inputs)
    settings = CompileSettings.create(infer_input_dtypes(inputs, module), default_device=default_device, **options)
    ignored = settings.settings_without_effect()
    if ignored:
        logger.warning("%s: no effect on torchkiln's engines (accepted for Torch-TensorRT compatibility)",
                       ", ".join(ignored))
    module_device = _module_device(module)
    if module_device is not None and module_device.type != settings.device.type:
        raise ValueError(f"device: the module's weights are on {module_device} but device is {settings.device}; "
                         f"move the module with module.to({str(settings.device)!r}) first")
    return settings


def _build_settings(settings: CompileSettings) -> BuildSettings:
    """The build settings of a compile's engines: its backend resolved; fp32 where ONNX Runtime would run.

    ONNX Runtime's CPU provider runs float16 and bfloat16 no faster than float32 on CPUs without native
    half-precision arithmetic (most of its kernels convert per op, many have no half kernel at all), so an
    onnxruntime engine is built in float32: as fast or faster, and more exact. backend="reference" keeps the
    lower precision (ATen's CPU kernels). Where the CPU computes bfloat16 natively, a bfloat16 reference build of
    each engine competes with it (builder/bfloat16_tactic.py)."""
    dtype, backend = settings.compute_dtype, settings.engine_backend
    if backend == "onnxruntime" and dtype != torch.float32:
        if bfloat16_tactic.applies(dtype, backend, settings.device):
            logger.info("enabled_precisions asks for bfloat16 on the onnxruntime backend: each engine is built in "
                        "float32 for ONNX Runtime and in bfloat16 on the reference backend, and the faster kept")
        else:
            logger.warning("enabled_precisions asks for %s, but ONNX Runtime's CPU provider does not run it faster "
                           "than float32 here, so the engines are built in float32 (backend='reference' keeps %s)",
                           dtype, dtype)
        dtype = torch.float32
    return BuildSettings(compute_dtype=dtype, device=settings.device, backend=backend,
                         backend_options=BackendOptions(**backend_values(settings)))


def _module_name(module: torch.nn.Module) -> str:
    return getattr(module, "original_name", None) or type(module).__name__


_READS_TRAINING = re.compile(r"\bself\.training\b")


def _reads_training(module: torch.nn.Module) -> bool:
    """Whether a submodule's behaviour may depend on its training flag: its TorchScript code reads
    self.training (dropout, batch norm do); a traced module's code cannot say, so yes.

    Methods are read from the compiled module (`_c`): a container's `__len__` or `__contains__` is a TorchScript
    method whose Python attribute is the container's own Python method, which has no `.code`."""
    if isinstance(module, torch.jit.TracedModule) or not isinstance(module, torch.jit.ScriptModule):
        return True
    return any(_READS_TRAINING.search(module._c._get_method(name).code) for name in module._c._method_names())


def _warn_training(module: torch.nn.Module, script: torch.jit.ScriptModule) -> None:
    """Warn when submodules that read their training flag are in training mode: engines compute what they
    compute in eval mode."""
    scripted = dict(script.named_modules())
    training = [path or "<top module>" for path, m in module.named_modules()
                if m.training and _reads_training(scripted.get(path, m))]
    if training:
        shown = ", ".join(training[:5]) + (f" (+{len(training) - 5} more)" if len(training) > 5 else "")
        warn(logger, f"{_module_name(module)} is in training mode ({shown}), but the compiled module computes its "
                     f"eval-mode behaviour (dropout off, batch norm with its running statistics); call "
                     f".eval() on it before compiling")


# A model whose parameters are one of these float types runs an input of another one cast to its type.
_CASTABLE = (torch.float32, torch.float16, torch.bfloat16)


def _cast_float_inputs(graph: Graph, signature: tuple[Any, ...], dtype: torch.dtype | None) -> list[str]:
    """Cast each float32/float16/bfloat16 tensor argument of another of these types than the model's parameters
    to theirs at the graph's entry (Torch-TensorRT accepts a half-precision Input on a float32 model, and a
    float32 one on a float16 model); the names of the arguments cast. The engine's input keeps its dtype; its
    first layer is the cast."""
    if dtype not in _CASTABLE:
        return []
    cast = []
    for param, spec in zip(list(graph.inputs())[1:], signature):
        if isinstance(spec, Input) and spec.dtype in _CASTABLE and spec.dtype != dtype:
            with graph.insert_point_guard(next(iter(graph.nodes()), graph.return_node())):
                value = graph.insert("aten::to", [param, graph.insertConstant(dtype), graph.insertConstant(False),
                                                  graph.insertConstant(False)])
            param.replaceAllUsesWith(value)
            value.node().replaceInputWith(value, param)
            cast.append(f"{param.debugName()} ({spec.dtype})")
    if cast:
        logger.warning("the model's parameters are %s and it does not run on the inputs %s, so they are cast to %s "
                       "as the engine's first layer (as Torch-TensorRT does); the outputs are the model's on the "
                       "cast inputs", dtype, ", ".join(cast), dtype)
    return cast


def _warn_python_ops(graph: Graph) -> None:
    """Warn that custom autograd Functions left in the graph keep the compiled module from being saved, and why
    each was not inlined."""
    why = {python_op_names(n)[0]: n.s(NOT_INLINED_ATTR) if n.hasAttribute(NOT_INLINED_ATTR) else ""
           for n in all_nodes(graph.block()) if n.kind() == "prim::PythonOp"}
    if why:
        names = sorted(why)
        listed = ", ".join(f"{name} ({why[name]})" if why[name] else name for name in names)
        warn(logger, f"custom torch.autograd.Function {listed} (prim::PythonOp) runs in PyTorch, so the "
                     f"compiled module runs but cannot be saved with torch.jit.save; make its forward scriptable, "
                     f"or register an inference-time equivalent with torchkiln.register_python_op("
                     f"{names[0]!r}, fn)")


# Lowering passes that run again once shape analysis made more values static (the device a cache is keyed by).
_AFTER_SHAPES = (lower_tuples, functionalize_list_appends, functionalize_view_writes, resolve_attribute_caches,
                 resolve_static_containers, unpack_transformer_encoder_layer, eliminate_dead_code)


def _prepare(module: torch.nn.Module, settings: CompileSettings, method: str = "forward"
             ) -> tuple[LoweredModule, dict[int, Any]]:
    """Frontend, lowering and shape analysis: everything before partitioning.

    Shape analysis runs the method on examples at each Input's opt shape, and with dynamic inputs also at
    min and max, so each top-level tensor's varying dims are symbols (analysis/dynamic_shapes.py).
    """
    load_all()
    examples = example_args(settings.input_signature, settings.device, "opt")
    progress.step("scripting")
    script = to_torchscript(module, examples)
    _warn_training(module, script)
    check_method(script, method)
    static = bind_static_arguments(script, method, len(settings.input_signature), settings.input_names,
                                   settings.static_arguments)
    progress.step("lowering")
    lowered = lower(script, settings, method, static_arguments=static)
    _warn_python_ops(lowered.graph)
    check_signature(lowered.graph, settings.input_signature, method)
    if unpack_list_inputs(lowered.graph, settings.input_signature):
        logger.debug("graph after unpacking list inputs:\n%s", lowered.graph)
    signature = settings.input_signature
    progress.step("shape analysis")
    try:
        metas = analyze_dynamic_shapes(lowered.graph, lowered.module, signature, settings.device, examples)
    except ValueError:
        if not _cast_float_inputs(lowered.graph, signature, parameter_dtype(script)):
            raise
        # the cast is what compile does with these inputs: an error left after it (a shape) is the one to report
        metas = analyze_dynamic_shapes(lowered.graph, lowered.module, signature, settings.device, examples)
    # Shapes make more values static: fold the control flow that depends on them, run the passes that read
    # containers again (the unrolled code's lists, a cache keyed by a device), and analyse the new top-level
    # values; until nothing changes.
    while fold_static_control_flow(lowered.graph, Resolver(metas)) | rerun(
            lowered.graph, settings, _AFTER_SHAPES, lowered.module, metas):
        metas = analyze_dynamic_shapes(lowered.graph, lowered.module, signature, settings.device, examples)
    return lowered, metas


def _left_in_torch(part: Partition) -> dict[str, list[Node]]:
    found: dict[str, list[Node]] = collections.defaultdict(list)
    for node in part.nodes:
        if part.decision(node).is_fallback:
            found[node_key(node)].append(node)
    return found


def _require_full(part: Partition) -> None:
    """Raise UnsupportedOperatorError listing every op left in PyTorch unless the method is one engine."""
    found = _left_in_torch(part)
    engines = sum(b.is_engine for b in part.blocks)
    if not found and engines <= 1:
        return
    lines = []
    for op, nodes in sorted(found.items()):
        reasons = ", ".join(dict.fromkeys(part.decision(n).reason.value for n in nodes))
        where = ", ".join(source_location(n) for n in nodes[:3])
        where += f" (+{len(nodes) - 3} more)" if len(nodes) > 3 else ""
        lines.append(f"  {op} x{len(nodes)} ({reasons}) at {where}")
    raise UnsupportedOperatorError(
        "require_full_compilation=True but the graph cannot run as one engine; ops left in PyTorch:\n"
        + "\n".join(lines or [f"  (none, but the engine nodes form {engines} blocks)"]))


def _calibration_samples(settings: CompileSettings) -> list[Sequence[Any]]:
    """The method arguments calibration runs on: the user's, the calibrator's, or random inputs at the opt shapes
    (for quantization, with a warning: random values do not have the model's ranges)."""
    if isinstance(settings.calibration_inputs, str):
        return list(load_calibration_samples(settings.calibration_inputs, len(settings.input_signature)))
    if settings.calibration_inputs:
        return list(settings.calibration_inputs)
    if settings.calibrator is not None:
        return settings.calibrator.samples()
    if settings.quant_type is not None:
        logger.warning("quantizing with ranges calibrated on random inputs; give calibration_inputs or a calibrator "
                       "with data like the model's for ranges that fit it")
    return [example_args(settings.input_signature, settings.device, "opt")]


def _quantize_request(settings: CompileSettings) -> QuantizeRequest | None:
    """What post-training quantization the settings ask for (None: none); a calibrator's algorithm and cache file
    take the place of calibration_algorithm and calibration_cache_file."""
    if settings.quant_type is None:
        return None
    calibrator = settings.calibrator
    if calibrator is None:
        return QuantizeRequest(settings.quant_type, settings.calibration_algorithm, settings.calibration_cache_file)
    return QuantizeRequest(settings.quant_type, calibrator.algo_type, calibrator.cache_file,
                           getattr(calibrator, "use_cache", True))


def block_input_values(part: Partition, module: torch.jit.ScriptModule, samples: Sequence[Sequence[Any]],
                       blocks: Sequence[Any]) -> list[list[list[Any]]]:
    """For each block, its input values when the method runs on each sample: [block][sample][input]."""
    wanted = list({value_key(v): v for b in blocks for v in b.inputs}.values())
    found = []
    for i, sample in enumerate(samples):
        try:
            values = probe_values(part.graph, module, list(sample), wanted)
        except ValueError as e:
            raise ValueError(f"calibration sample {i}: the method does not run on it: {e}") from e
        found.append(dict(zip((value_key(v) for v in wanted), values)))
    return [[[values[value_key(v)] for v in b.inputs] for values in found] for b in blocks]


def block_bindings(network: Network) -> list[InputBinding]:
    """An engine's input bindings: each network input's dtype and shape range."""
    return [InputBinding(t.name, t.dtype, *shape_range(t.shape)) for t in network.inputs]


def _quantized_block(network: Network, convert: Callable[[], Network], build: BuildSettings,
                     samples: Callable[[], Sequence[Sequence[torch.Tensor]]], request: QuantizeRequest,
                     kept: list[Fp32Layer], safety: bool) -> tuple[Engine, Callable[[bool], None]]:
    """Build one converted block with post-training quantization (its half-precision float layers checked on the
    samples where `safety`); the layers kept in float are added to `kept`. Also returns what logs them with their
    error and the network's cosine, called with whether the engine is kept: warnings about an engine the build then
    threw away (its float one ran faster) would mislead, so those are info lines."""
    origins = network.origins
    engine, layers, cosine, fp32 = quantized_build(convert, block_bindings(network), build, network.name, samples,
                                                   request, safety)
    quantized = [q for q in layers if not q.kept]
    logger.info("engine %s: %d of %d convolutions and matrix multiplies quantized to %s", engine.name,
                len(quantized), len(layers), str(request.quant_type).removeprefix("torch."))
    for q in layers:
        logger.debug("  %s layer %r: amax %.4g, own quantization error %.3g%s", q.kind, q.name, q.amax, q.error,
                     f" (kept in float: {q.kept})" if q.kept else "")
    by_reason: dict[str, list[str]] = {}
    for q in (q for q in layers if q.kept):
        node = " at ".join(origins.get(q.name, ("(made by the builder)",)))
        by_reason.setdefault(q.kept, []).append(f"{q.kind} layer {q.name!r} ({node})")
        kept.append(Fp32Layer(engine.name, q.name, q.kind, node, q.kept))
    half = _fp32_rows(engine, fp32, origins)
    kept.extend(half)

    def announce(engine_kept: bool) -> None:
        warn = logger.warning if engine_kept else logger.info
        if engine_kept:
            _announce_fp32(half, build.compute_dtype)
        for reason, names in by_reason.items():  # a reason many layers share (the backend's kernels) once
            if len(names) > 3:
                warn("engine %s: %d layers stay in float: %s (%s, ...; the partition report lists them)",
                     engine.name, len(names), reason, ", ".join(names[:2]))
            for name in names:
                (logger.debug if len(names) > 3 else warn)("engine %s: %s stays in float: %s", engine.name, name,
                                                           reason)
        if cosine is not None:
            log_network_cosine(engine.name, cosine, request, engine_kept)

    return engine, announce


def _quantized_or_float(network: Network, convert: Callable[[], Network], build: BuildSettings,
                        samples: Callable[[], Sequence[Sequence[torch.Tensor]] | None], request: QuantizeRequest,
                        kept: list[Fp32Layer], safety: bool) -> Engine:
    """`_quantized_block`; where a half-precision float type is enabled beside the quantized one (the build's
    compute dtype), the block is also built in that float type alone, and the faster of the two on the block's first
    sample is kept: enabled precisions are what the builder may use, as TensorRT's are, and a quantized engine can
    be slower than its float one (a product whose quantized kernel is no faster, the quantizers' own passes). The
    layers kept in float by the engine kept are added to `kept`; the quantized engine's warnings (layers left in
    float, its outputs' cosine) are warnings only where it is kept."""
    own: list[Fp32Layer] = []
    engine, announce = _quantized_block(network, convert, build, samples, request, own, safety)
    found = None
    if build.compute_dtype in (torch.float16, torch.bfloat16):
        try:
            found = samples()
        except ValueError as e:  # a CacheCalibrator's ranges came from its cache: it has no data to time on
            logger.info("engine %s: kept quantized, not timed against its %s build: %s", engine.name,
                        str(build.compute_dtype).removeprefix("torch."), e)
    if not tensor_samples(found):
        kept.extend(own)
        announce(True)
        return engine
    quantized = str(request.quant_type).removeprefix("torch.")
    half = str(build.compute_dtype).removeprefix("torch.")
    kept_engine = _keep_faster(engine, own, convert, build, found, safety, kept, [f"{quantized} and {half}",
                                                                                  f"{half} alone"])
    announce(kept_engine is engine)
    if kept_engine is not engine:
        logger.warning("engine %s: built in %s alone, which ran faster than with %s layers on its first calibration "
                       "sample (enabled_precisions without %s keeps the %s layers, the others then in float32)",
                       engine.name, half, quantized, half, quantized)
    return kept_engine


def _build_block(network: Network, convert: Callable[[], Network], build: BuildSettings,
                samples: Sequence[Sequence[torch.Tensor]] | None, kept: list[Fp32Layer], announce: bool = True
                ) -> Engine:
    """Build one converted block (`convert` makes it again); with `samples` (fp16/bf16 with precision_safety),
    calibrated on them: the layers it keeps in fp32 are added to `kept` (and logged, where `announce`)."""
    bindings = block_bindings(network)
    if samples is None:
        return build_engine(network, bindings, build, network.name)
    origins, name = dict(network.origins), network.name
    engine, fp32 = calibrated_build(_given_first(network, convert), bindings, build, name, samples)
    rows = _fp32_rows(engine, fp32, origins)
    if announce:
        _announce_fp32(rows, build.compute_dtype)
    kept.extend(rows)
    return engine


def _fp32_rows(engine: Engine, fp32: dict[str, str], origins: dict[str, Sequence[str]]) -> list[Fp32Layer]:
    """The layers a calibrated build kept in float32 (name -> why) as the report's rows."""
    kinds = {layer.name: layer.KIND for layer in engine.network.layers}
    return [Fp32Layer(engine.name, layer, kinds.get(layer, "?"),
                      " at ".join(origins.get(layer, ("(made by the builder)",))), reason)
            for layer, reason in fp32.items()]


def _given_first(network: Network, convert: Callable[[], Network]) -> Callable[[], Network]:
    """`convert`, whose first call returns `network` (converted already, unbuilt) instead of converting again: a
    conversion copies every weight (2.5 s of a 1.2-billion-parameter model's build)."""
    given = [network]
    return lambda: given.pop() if given else convert()


def _announce_fp32(rows: Sequence[Fp32Layer], dtype: torch.dtype) -> None:
    """Log the layers a reduced-precision build keeps in fp32, and why."""
    if rows:
        logger.warning("engine %s: %d layers kept in float32 because in %s they overflow or lose precision on the "
                       "calibration inputs (precision_safety=False turns this off):", rows[0].engine, len(rows),
                       str(dtype).removeprefix("torch."))
    for row in rows:
        logger.warning("  %s layer %r (%s): %s", row.kind, row.layer, row.node, row.reason)


def _build_timed(network: Network, convert: Callable[[], Network], build: BuildSettings,
                 samples: Sequence[Sequence[torch.Tensor]] | None, kept: list[Fp32Layer],
                 alternative: BuildSettings | None, safety: bool) -> Engine:
    """`_build_block` (calibrated on `samples` where `build` is reduced precision), and where `alternative` is the
    bfloat16 build to time against it (builder/bfloat16_tactic.py), that one too: the faster on the first sample
    is kept (its float32 layers added to `kept`)."""
    engine = _build_block(network, convert, build, samples if build.compute_dtype != torch.float32 else None, kept)
    if alternative is None or not samples:
        return engine
    try:
        return _keep_faster(engine, [], convert, alternative, samples, safety, kept,
                            ["float32 on onnxruntime", "bfloat16 on the reference backend"])
    except (RuntimeError, TorchkilnError) as e:  # e.g. an ATen kernel without a bfloat16 form
        logger.warning("engine %s: its bfloat16 build on the reference backend failed, so the float32 ONNX Runtime "
                       "engine is kept: %s", engine.name, cause_line(e))
        return engine


def _keep_faster(engine: Engine, own: list[Fp32Layer], convert: Callable[[], Network], alternative: BuildSettings,
                 samples: Sequence[Sequence[torch.Tensor]], safety: bool, kept: list[Fp32Layer],
                 labels: Sequence[str]) -> Engine:
    """`engine` (the layers it keeps in float: `own`), or the block built again with `alternative` (calibrated on
    `samples` where `safety`), whichever runs faster on the first sample (`labels`: the two, for the log). The kept
    engine's float layers are added to `kept` (and the alternative's announced: not those of a build thrown away)."""
    low: list[Fp32Layer] = []
    other = _build_block(convert(), convert, alternative, samples if safety else None, low, announce=False)
    if engine_timing.faster_engine([engine, other], samples[0], labels) == 0:
        kept.extend(own)
        return engine
    _announce_fp32(low, alternative.compute_dtype)
    kept.extend(low)
    return other


def _build_engines(part: Partition, module: torch.jit.ScriptModule, settings: CompileSettings, name: str,
                   failed: dict[Node, Decision], kept: list[Fp32Layer]) -> list[Engine] | None:
    """Convert and build every engine block; None if a block's conversion failed.

    The failing node (or, when the error names none of the block's nodes, every engine node of the block)
    is added to `failed`, to run in PyTorch. With require_full_compilation the error propagates instead.
    In fp16/bf16 with precision_safety, each engine is calibrated (`calibrated_build`); the layers kept in fp32
    are added to `kept`.
    """
    engines: list[Engine] | None = []
    build = _build_settings(settings)
    blocks = [b for b in part.blocks if b.is_engine]
    request = _quantize_request(settings)
    alternative = bfloat16_tactic.bfloat16_alternative(build, settings.compute_dtype) if request is None else None
    calibrate = (request is not None or alternative is not None or
                 settings.precision_safety and build.compute_dtype != torch.float32) and blocks
    # run once, at the first block built (a block whose engine comes from the cache needs no samples)
    samples = functools.cache(lambda: block_input_values(part, module, _calibration_samples(settings), blocks)
                              if calibrate else [None] * len(blocks))
    cache = EngineCache(settings.reuse_cached_engines, settings.cache_built_engines)
    progress.add_steps(len(blocks))
    for k, block in enumerate(blocks):
        progress.step(f"engine block {k + 1}/{len(blocks)} ({len(block.nodes)} nodes)")
        key = None if engines is None else cache.key(block.nodes, block.inputs, block.outputs, part.nodes, part.metas,
                                                     module, settings, build, f"{name}_{k}")
        cached = cache.load(key, f"{name}_{k}")
        if cached is not None:
            engines.append(cached[0])
            kept.extend(Fp32Layer(cached[0].name, *row) for row in cached[1])
            continue
        logger.info("converting engine block %d/%d (%d nodes)", k + 1, len(blocks), len(block.nodes))
        try:
            network = convert_block(block.nodes, block.inputs, block.outputs, part.metas, settings, f"{name}_{k}")
        except ConversionError as e:
            if settings.require_full_compilation:
                raise
            node = getattr(e, "node", None)
            culprits = [node] if node in block.nodes else \
                [n for n in block.nodes if part.decision(n).target != Target.TORCH]
            for n in culprits:
                failed[n] = Decision.torch(Fallback.CONVERSION_FAILED, str(e))
            logger.warning("engine block %d could not be converted, so %s PyTorch: %s", k,
                           "that node runs in" if len(culprits) == 1 else "the block stays in", e)
            engines = None
            continue
        if engines is not None:
            convert = functools.partial(convert_block, block.nodes, block.inputs, block.outputs, part.metas, settings,
                                        f"{name}_{k}")
            before = len(kept)
            block_samples = functools.cache(functools.partial(_checked_samples, samples, k, network.name,
                                                              block_bindings(network)))
            if request is not None:  # samples only where the calibration cache has no entry (or a choice needs them)
                engines.append(_quantized_or_float(network, convert, build, block_samples, request, kept,
                                                   settings.precision_safety))
            else:
                found = block_samples()
                engines.append(_build_timed(network, convert, build, found if tensor_samples(found) else None, kept,
                                            alternative, settings.precision_safety))
            _record_tape(engines[-1], settings)
            cache.save(key, engines[-1], [(r.layer, r.kind, r.node, r.reason) for r in kept[before:]])
    return engines


def _checked_samples(samples: Callable[[], list[Any]], k: int, name: str, bindings: Sequence[InputBinding]
                     ) -> Sequence[Sequence[Any]] | None:
    """Block `k`'s calibration samples (`samples()` holds every block's), checked against its engine's inputs
    (`check_samples`) where they are tensors; called once per block (its caller caches it), so each problem is
    named once however many builds of the block calibrate."""
    found = samples()[k]
    if tensor_samples(found):
        check_samples(name, bindings, found)
    return found


def _record_tape(engine: Engine, settings: CompileSettings) -> Engine:
    """The engine, with a tape of its planned run for the C++ runtime where `native_tape` asks for one (None: on the
    cuda backend); a run a tape cannot replay gets none, the reason logged."""
    if settings.native_tape if settings.native_tape is not None else engine.backend == "cuda":
        add_tape(engine, settings.device, settings.native_tape_shapes)
    return engine


def _partition_and_build(lowered: LoweredModule, metas: dict[int, Any], settings: CompileSettings,
                         name: str) -> tuple[Partition, PartitionReport, list[Engine]]:
    """Partition and build; where a conversion fails, partition again with its node in PyTorch.

    Each round moves at least one engine node to PyTorch, so this ends. The report lists the layers that
    precision calibration kept in fp32.
    """
    failed: dict[Node, Decision] = {}
    while True:
        kept: list[Fp32Layer] = []
        progress.step("partitioning")
        part = partition(lowered.graph, metas, settings, failed)
        report = make_report(part, f"{name}.forward")
        logger.debug("partition report:\n%s", report)
        if settings.require_full_compilation:
            _require_full(part)
        engines = _build_engines(part, lowered.module, settings, name, failed, kept)
        if engines is not None:
            return part, dataclasses.replace(report, fp32_layers=tuple(kept)), engines


def _reference_layers(engines: Sequence[Engine]) -> tuple[ReferenceLayer, ...]:
    """The layers onnxruntime engines run on the reference backend, each logged with the reason."""
    found = []
    for engine in engines:
        layers = engine.reference_layers()
        if layers:
            logger.info("engine %s (onnxruntime): %d of %d layers run on the reference backend", engine.name,
                        len(layers), len(engine.network.layers))
        for layer, kind, reason in layers:
            logger.info("  %s layer %r: %s", kind, layer, reason)
            found.append(ReferenceLayer(engine.name, layer, kind, reason))
    return tuple(found)


def _warn_no_engines(report: PartitionReport, settings: CompileSettings) -> None:
    """Warn that the compiled module runs wholly in PyTorch, with why (the fallback reasons' counts)."""
    reasons = report.fallback_reasons
    if not reasons:
        why = "the method has no op to run in an engine"
    else:
        why = "ops left in PyTorch: " + ", ".join(f"{n} {reason.value}" for reason, n in reasons.items())
    if Fallback.MIN_BLOCK_SIZE in reasons:
        why += f" (min_block_size={settings.min_block_size}; a lower min_block_size makes smaller engines)"
    warn(logger, f"{report.name}: compiled with 0 engines, so it runs wholly in PyTorch; {why}")


# The progress display's steps besides the engine blocks: scripting, lowering, shape analysis, partitioning, stitching.
_PHASES = 5


@dataclasses.dataclass(frozen=True)
class CompileRecord:
    """What a compiled module was compiled from (kept on it in memory, for refit_module_weights): the inputs and
    settings given to compile, and the name, shape and dtype of each parameter and buffer of the module."""

    inputs: Any
    options: dict[str, Any]
    parameters: dict[str, tuple[tuple[int, ...], torch.dtype]]


def parameter_signature(module: torch.nn.Module) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Name -> (shape, dtype) of every parameter and buffer (the module's state_dict)."""
    return {k: (tuple(v.shape), v.dtype) for k, v in module.state_dict().items() if isinstance(v, torch.Tensor)}


def _cached_module(cache: ModuleCache, key: str | None, name: str
                   ) -> tuple[torch.jit.ScriptModule, PartitionReport] | None:
    """The compiled module and report the module cache holds for `key`; None on a miss."""
    found = cache.load(key, name)
    if found is None:
        return None
    archive, blobs, sessions, header = found
    try:
        report = PartitionReport.from_dict(header.get("report"))
        compiled = load_apart(archive, blobs)
    except (ValueError, RuntimeError) as e:  # RuntimeError: torch.jit.load's for bytes it cannot read
        cache.store.discard(key, f"damaged module ({cause_line(e)})")
        return None
    for attr, models in sessions.items():  # used at the first call if the engine's bytes are these (execute_op)
        if attr in blobs:
            setattr(blobs[attr], SESSION_MODELS, models)
    logger.info("module cache hit for %s (key %s): scripting, lowering, partitioning and building skipped", name,
                key[:12])
    return compiled, report


def _store_module(cache: ModuleCache, key: str | None, name: str, compiled: torch.jit.ScriptModule,
                  report: PartitionReport) -> None:
    """Save the compiled module and its report in the module cache (where cache_built_engines is on)."""
    if key is None or not cache.store_built:
        return
    data = report.as_dict()
    try:
        PartitionReport.from_dict(data)
        archive, blobs = save_apart(compiled)
    except (ValueError, RuntimeError) as e:
        logger.info("module cache: %s is not cached whole: %s", name, cause_line(e))
        return
    cache.save(key, name, archive, blobs, data, _session_models(blobs))


def _session_models(blobs: Mapping[str, torch.Tensor]) -> dict[str, SessionModels]:
    """The ONNX models of the sessions of each onnxruntime engine among `blobs` that runs on ONNX Runtime here, as
    its first call made them (exported again: the export is deterministic), for the module cache."""
    from torchkiln.runtime.backends.onnxruntime import session_models

    found = {}
    for attr, blob in blobs.items():
        engine = engine_from_blob(blob)
        if engine.backend == "onnxruntime":
            models = session_models(engine.network, engine.plan_for(torch.device("cpu")),
                                    engine_digest(blob.numpy()))
            if models is not None:
                found[attr] = models
    return found


def compile_with_report(module: torch.nn.Module, inputs: Sequence[Any] | None = None,
                        **options: Any) -> tuple[torch.jit.ScriptModule, PartitionReport]:
    """`compile`, also returning the partition report (blocks, ops, fallback reasons)."""
    with debug_logging(bool(options.get("debug"))), progress.display(_module_name(module), _PHASES):
        start = time.perf_counter()
        module = as_module(module)
        settings = _settings(module, inputs, options)
        name = _module_name(module)
        cache = ModuleCache(settings.reuse_cached_engines, settings.cache_built_engines)
        key = cache.key(module, settings, name)
        cached = _cached_module(cache, key, name)
        if cached is not None:
            compiled, report = cached
        else:
            lowered, metas = _prepare(module, settings)
            part, report, engines = _partition_and_build(lowered, metas, settings, name)
            report = dataclasses.replace(report, reference_layers=_reference_layers(engines))
            if not engines:
                _warn_no_engines(report, settings)
            progress.step("stitching")
            compiled = stitch(lowered.module, part, engines)
            restore_static_arguments(lowered.graph, lowered.static_arguments, lowered.optional_tensors)
            _store_module(cache, key, name, compiled, report)
        compiled._torchkiln_compile = CompileRecord(inputs, options, parameter_signature(module))
        logger.info("compiled %s in %.2fs: %d engine blocks, %d torch blocks", name,
                    time.perf_counter() - start, report.num_engine_blocks, report.num_torch_blocks)
        return compiled, report


def compile(
    module: torch.nn.Module,
    inputs: Sequence[Any] | None = None,
    enabled_precisions: Iterable[Any] | None = None,
    device: Any = None,
    min_block_size: int = 3,
    torch_executed_ops: Iterable[str] = (),
    torch_executed_modules: Iterable[str] = (),
    require_full_compilation: bool = False,
    truncate_long_and_double: bool = False,
    debug: bool = False,
    ir: str = "default",
    **more: Any,
) -> torch.jit.ScriptModule:
    """Compile a module into a ScriptModule whose convertible parts run through torchkiln engines.

    `inputs` has one entry per argument of forward: a torchkiln.Input (or an example tensor, or a shape),
    or, for an argument that is a tuple, list or dict of tensors, the same structure of Inputs (nested).
    `input_signature=` and `arg_inputs=` are accepted as other names for `inputs` (Torch-TensorRT's); `ir`
    may be "default", "ts" or "torchscript" (torchkiln compiles TorchScript).
    """
    compiled, _ = compile_with_report(
        module, inputs, enabled_precisions=enabled_precisions, device=device, min_block_size=min_block_size,
        torch_executed_ops=torch_executed_ops, torch_executed_modules=torch_executed_modules,
        require_full_compilation=require_full_compilation, truncate_long_and_double=truncate_long_and_double,
        debug=debug, ir=ir, **more)
    return compiled


def partition_report(module: torch.nn.Module, inputs: Sequence[Any], **options: Any) -> PartitionReport:
    """Dry run: lower and partition as `compile` would, convert and build nothing, and return the report.

    It does not raise for require_full_compilation; a block whose conversion would fail shows as an engine.
    """
    with debug_logging(bool(options.get("debug"))):
        module = as_module(module)
        settings = _settings(module, inputs, options)
        lowered, metas = _prepare(module, settings)
        report = make_report(partition(lowered.graph, metas, settings), f"{_module_name(module)}.forward")
        logger.debug("partition report:\n%s", report)
        return report


def check_full_compilation(module: torch.nn.Module, inputs: Sequence[Any], method_name: str = "forward",
                           **options: Any) -> None:
    """Dry run of compile with require_full_compilation=True: lower, partition and convert the method as compile
    does, build no engine, and raise what compile would raise where the method is not one engine (the ops left in
    PyTorch and why, or the conversion error)."""
    with debug_logging(bool(options.get("debug"))):
        module = as_module(module)
        settings = _settings(module, inputs, dict(options, require_full_compilation=True))
        lowered, metas = _prepare(module, settings, method_name)
        part = partition(lowered.graph, metas, settings)
        _require_full(part)
        for k, block in enumerate(b for b in part.blocks if b.is_engine):
            convert_block(block.nodes, block.inputs, block.outputs, part.metas, settings,
                          f"{_module_name(module)}_{k}")


def unsupported_ops(module: torch.nn.Module, method_name: str = "forward",
                    inputs: Sequence[Any] | None = None) -> dict[str, int]:
    """Ops of the lowered method that no converter or evaluator handles, with their counts.

    Control flow (prim::If, prim::Loop) is not counted (partitioning handles it); the ops inside it are.

    `inputs` are only needed when `module` must be traced (it cannot be scripted).
    """
    load_all()
    module = as_module(module)
    settings = CompileSettings.create(inputs or [Input((1,))], default_device=_module_device(module))
    script = to_torchscript(module, example_args(settings.input_signature, settings.device) if inputs else [])
    check_method(script, method_name)
    graph = lower(script, settings, method_name).graph
    counts: dict[str, int] = collections.Counter()
    for node in all_nodes(graph.block()):
        if node.kind() not in ("prim::If", "prim::Loop") and not is_registered(node):
            counts[node_key(node)] += 1
    return dict(sorted(counts.items()))


def check_method_op_support(module: torch.nn.Module, method_name: str = "forward",
                            inputs: Sequence[Any] | None = None) -> bool:
    """True when every op of the method has a converter or evaluator (see `unsupported_ops`)."""
    missing = unsupported_ops(module, method_name, inputs)
    for op, count in missing.items():
        logger.warning("unsupported op %s (x%d)", op, count)
    return not missing


def convert_method_to_engine(module: torch.nn.Module, method_name: str = "forward",
                             inputs: Sequence[Any] | None = None, **options: Any) -> bytes:
    """Compile one method into a single engine and return its serialized bytes.

    The engine's inputs are the method's inputs in order; its outputs are the returned tensors
    (a returned tuple or list of tensors is flattened).
    """
    with debug_logging(bool(options.get("debug"))):
        module = as_module(module)
        settings = _settings(module, inputs, dict(options, require_full_compilation=True))
        if not all(isinstance(spec, Input) for spec in settings.input_signature):
            raise ValueError("inputs: convert_method_to_engine takes tensor arguments only; compile a method "
                             "with tuple, list or dict arguments with torchkiln.compile")
        lowered, metas = _prepare(module, settings, method_name)
        graph = lowered.graph
        part = partition(graph, metas, settings)
        _require_full(part)
        returned = next(graph.outputs())
        producer = returned.node()
        if producer.kind() in ("prim::TupleConstruct", "prim::ListConstruct"):
            outputs = list(producer.inputs())
            nodes = [n for n in part.nodes if n != producer]
        else:
            outputs, nodes = [returned], part.nodes
        if any(value_key(v) not in metas for v in outputs):
            raise UnsupportedOperatorError(f"{method_name} must return a tensor or a tuple/list of tensors")
        inputs_ = list(graph.inputs())[1:]
        network = convert_block(nodes, inputs_, outputs, metas, settings, method_name)
        bindings = [InputBinding(t.name, t.dtype, spec.min_shape, spec.opt_shape, spec.max_shape)
                    for t, spec in zip(network.inputs, settings.inputs)]
        build = _build_settings(settings)
        convert = functools.partial(convert_block, nodes, inputs_, outputs, metas, settings, method_name)
        request = _quantize_request(settings)
        alternative = bfloat16_tactic.bfloat16_alternative(build, settings.compute_dtype)
        if request is not None:  # the engine's inputs are the method's
            engine = _quantized_or_float(network, convert, build, lambda: _calibration_samples(settings), request,
                                         [], settings.precision_safety)
        elif alternative is not None or settings.precision_safety and build.compute_dtype != torch.float32:
            engine = _build_timed(network, convert, build, _calibration_samples(settings), [], alternative,
                                  settings.precision_safety)
        else:
            engine = build_engine(network, bindings, build, method_name)
        return _record_tape(engine, settings).serialize()


# Names an argument of a TorchScript method cannot take: they would hide what the method's code refers to.
_RESERVED = frozenset(dir(builtins)) | {
    "self", "torch", "math", "Tensor", "List", "Tuple", "Dict", "Optional", "Union", "Any", "Future",
    "annotate", "fork", "wait", "unchecked_cast", "outs"}


def _identifier(name: str, index: int) -> str:
    """`name` made an argument name (characters other than letters, digits and _ become _); input_<index>
    for a name that is a keyword, a builtin, starts with _ or starts with a digit."""
    clean = re.sub(r"\W", "_", name)
    usable = clean.isidentifier() and not clean.startswith("_") and not keyword.iskeyword(clean) \
        and not keyword.issoftkeyword(clean) and clean not in _RESERVED
    return clean if usable else f"input_{index}"


def _binding_order(given: Sequence[str] | None, names: Sequence[str], kind: str) -> list[int]:
    """The index of the engine binding each of `given` names, by its own name or by position ('input_0',
    'output_1', Torch-TensorRT's binding names); every binding once. None: the engine's order."""
    if given is None:
        return list(range(len(names)))
    if isinstance(given, str) or len(given) != len(names):
        raise EngineInputError(f"{kind}_binding_names: the engine has {len(names)} {kind}s {list(names)}, got "
                               f"{given!r}")
    order = []
    for name in given:
        position = re.fullmatch(rf"{kind}_(\d+)", name) if isinstance(name, str) else None
        if name in names:
            order.append(list(names).index(name))
        elif position and int(position.group(1)) < len(names):
            order.append(int(position.group(1)))
        else:
            last = f" to {kind}_{len(names) - 1}" if len(names) > 1 else ""
            raise EngineInputError(f"{kind}_binding_names: {name!r} is not an {kind} binding of the engine; its "
                                   f"{kind}s are {list(names)} (by position {kind}_0{last})")
    if len(set(order)) != len(order):
        raise EngineInputError(f"{kind}_binding_names: {list(given)} names an engine {kind} twice")
    return order


def embed_engine_in_new_module(engine_bytes: bytes, input_binding_names: Sequence[str] | None = None,
                               output_binding_names: Sequence[str] | None = None,
                               device: Any = None) -> torch.jit.ScriptModule:
    """A ScriptModule whose forward(*inputs) runs the engine (one output: a tensor; several: a tuple).

    `input_binding_names` and `output_binding_names` name the engine's bindings in the order forward takes and
    returns them: a binding's own name, or its position as 'input_<i>' / 'output_<i>' (Torch-TensorRT's);
    EngineInputError for a name that is no binding of the engine."""
    engine = Engine.deserialize(engine_bytes)
    inputs = _binding_order(input_binding_names, [b.name for b in engine.bindings], "input")
    outputs = _binding_order(output_binding_names, [t.name for t in engine.network.outputs], "output")
    if device is not None and as_device(device).type != engine.device_type:
        raise ValueError(f"device: the engine was built for {engine.device_type}, not {device}")
    args = [_identifier(engine.bindings[i].name, k) for k, i in enumerate(inputs)]
    if len(set(args)) != len(args):
        args = [f"input_{k}" for k in range(len(inputs))]
    in_engine_order = [args[inputs.index(i)] for i in range(len(inputs))]
    # A fresh class each time: TorchScript cannot define forward twice on one class.
    module = type("EmbeddedEngine", (RaisesEngineErrors, torch.jit.ScriptModule),
                  {"__module__": "torchkiln.embedded"})()
    module._c._register_attribute(ENGINE_ATTR.format(0), torch._C.TensorType.get(), engine_blob(engine_bytes))
    result = f"outs[{outputs[0]}]" if len(outputs) == 1 else "(" + ", ".join(f"outs[{i}]" for i in outputs) + ")"
    rtype = "Tensor" if len(outputs) == 1 else f"Tuple[{', '.join(['Tensor'] * len(outputs))}]"
    signature = ", ".join(f"{a}: Tensor" for a in args)
    module.define(
        f"def forward(self, {signature}) -> {rtype}:\n"
        f"    outs = torch.ops.torchkiln.execute_engine([{', '.join(in_engine_order)}], self.{ENGINE_ATTR.format(0)}, "
        f"{engine_signature(engine)!r})\n"
        f"    return {result}\n")
    return module
