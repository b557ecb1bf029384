"""The public entry points: compile, convert_method_to_engine, embed_engine_in_new_module, support checks."""
from __future__ import annotations

import collections
import logging
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from torchkiln.builder import BuildSettings, build_engine
from torchkiln.conversion.block_converter import convert_block
from torchkiln.conversion.registry import is_registered, load_all
from torchkiln.errors import UnsupportedOperatorError
from torchkiln.frontend import to_torchscript
from torchkiln.log import debug_logging
from torchkiln.lowering import LoweredModule, lower
from torchkiln.conversion.resolve import Resolver
from torchkiln.partitioning.control_flow import fold_static_conditionals
from torchkiln.partitioning.report import PartitionReport, make_report
from torchkiln.partitioning.segment import Partition, partition
from torchkiln.partitioning.shape_analysis import analyze_shapes
from torchkiln.partitioning.support import Target, is_io_plumbing
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.settings import CompileSettings, Input
from torchkiln.runtime.execute_op import engine_blob
from torchkiln.stitching.stitch import ENGINE_ATTR, stitch
from torchkiln.torchscript import Graph, Node, binding_name, node_key, source_location, value_key

logger = logging.getLogger("torchkiln")

_SETTING_NAMES = ("enabled_precisions", "device", "min_block_size", "torch_executed_ops", "torch_executed_modules",
                  "require_full_compilation", "truncate_long_and_double", "debug")


def _module_device(module: torch.nn.Module) -> torch.device | None:
    for t in list(module.parameters()) + list(module.buffers()):
        return t.device
    return None


def _settings(module: torch.nn.Module, inputs: Any, options: dict[str, Any]) -> CompileSettings:
    unknown = sorted(set(options) - set(_SETTING_NAMES))
    if unknown:
        raise ValueError(f"unknown compile settings {unknown}; known: {list(_SETTING_NAMES)}")
    settings = CompileSettings.create(inputs, default_device=_module_device(module), **options)
    module_device = _module_device(module)
    if module_device is not None and module_device.type != settings.device.type:
        raise ValueError(f"device: the module's weights are on {module_device} but device is {settings.device}; "
                         f"move the module with module.to({str(settings.device)!r}) first")
    return settings


def _examples(settings: CompileSettings) -> list[torch.Tensor]:
    return [spec.example(settings.device) for spec in settings.inputs]


def _prepare(module: torch.nn.Module, settings: CompileSettings, method: str = "forward"
             ) -> tuple[LoweredModule, dict[int, Any], list[torch.Tensor]]:
    """Frontend, lowering and shape analysis: everything before partitioning."""
    if any(spec.is_dynamic for spec in settings.inputs):
        raise NotImplementedError("inputs with min_shape != max_shape (dynamic shapes) are not supported yet")
    load_all()
    examples = _examples(settings)
    script = to_torchscript(module, examples)
    lowered = lower(script, settings, method)
    n_args = len(list(lowered.graph.inputs())) - 1
    if n_args != len(settings.inputs):
        raise ValueError(f"inputs: {method}() takes {n_args} inputs but {len(settings.inputs)} were given")
    metas = analyze_shapes(lowered.graph, lowered.module, examples)
    while fold_static_conditionals(lowered.graph, Resolver(metas)):  # new top-level values need shapes
        torch._C._jit_pass_dce(lowered.graph)
        metas = analyze_shapes(lowered.graph, lowered.module, examples)
    return lowered, metas, examples


def _unsupported(part: Partition) -> dict[str, list[Node]]:
    found: dict[str, list[Node]] = collections.defaultdict(list)
    for node, decision in zip(part.nodes, part.decisions):
        if decision.target == Target.TORCH and not is_io_plumbing(node):
            found[node_key(node)].append(node)
    return found


def _require_full(part: Partition) -> None:
    found = _unsupported(part)
    engines = sum(b.is_engine for b in part.blocks)
    if found or engines > 1:
        lines = [f"  {op} x{len(nodes)} ({part.decision(nodes[0]).reason.value}) at "
                 + ", ".join(source_location(n) for n in nodes[:3]) for op, nodes in sorted(found.items())]
        raise UnsupportedOperatorError(
            "require_full_compilation=True but the graph cannot run as one engine; ops left in PyTorch:\n"
            + "\n".join(lines or ["  (none: the engine blocks are split by collection nodes)"]))


def _build_blocks(part: Partition, settings: CompileSettings, name: str) -> list[bytes]:
    engines = []
    build = BuildSettings(compute_dtype=settings.compute_dtype, device=settings.device)
    blocks = [b for b in part.blocks if b.is_engine]
    for k, block in enumerate(blocks):
        logger.info("converting engine block %d/%d (%d nodes)", k + 1, len(blocks), len(block.nodes))
        network = convert_block(block.nodes, block.inputs, block.outputs, part.metas, settings, f"{name}_{k}")
        bindings = [InputBinding(t.name, t.dtype, t.shape, t.shape, t.shape) for t in network.inputs]
        engines.append(build_engine(network, bindings, build, f"{name}_{k}").serialize())
    return engines


def compile_with_report(module: torch.nn.Module, inputs: Sequence[Input | torch.Tensor] | None = None,
                        **options: Any) -> tuple[torch.jit.ScriptModule, PartitionReport]:
    """`compile`, also returning the partition report (blocks, ops, fallback reasons)."""
    with debug_logging(bool(options.get("debug"))):
        start = time.perf_counter()
        settings = _settings(module, inputs, options)
        lowered, metas, _ = _prepare(module, settings)
        part = partition(lowered.graph, metas, settings)
        report = make_report(part)
        logger.debug("partition report:\n%s", report)
        if settings.require_full_compilation:
            _require_full(part)
        engines = _build_blocks(part, settings, type(module).__name__)
        compiled = stitch(lowered.module, part, engines)
        logger.info("compiled %s in %.2fs: %d engine blocks, %d torch blocks", type(module).__name__,
                    time.perf_counter() - start, report.num_engine_blocks, report.num_torch_blocks)
        return compiled, report


def compile(
    module: torch.nn.Module,
    inputs: Sequence[Input | torch.Tensor] | None = None,
    enabled_precisions: Iterable[Any] | None = None,
    device: Any = None,
    min_block_size: int = 3,
    torch_executed_ops: Iterable[str] = (),
    torch_executed_modules: Iterable[str] = (),
    require_full_compilation: bool = False,
    truncate_long_and_double: bool = False,
    debug: bool = False,
    **more: Any,
) -> torch.jit.ScriptModule:
    """Compile a module into a ScriptModule whose convertible parts run through torchkiln engines."""
    compiled, _ = compile_with_report(
        module, inputs, enabled_precisions=enabled_precisions, device=device, min_block_size=min_block_size,
        torch_executed_ops=torch_executed_ops, torch_executed_modules=torch_executed_modules,
        require_full_compilation=require_full_compilation, truncate_long_and_double=truncate_long_and_double,
        debug=debug, **more)
    return compiled


def partition_report(module: torch.nn.Module, inputs: Sequence[Input | torch.Tensor], **options: Any
                     ) -> PartitionReport:
    """Dry run: lower and partition as `compile` would, build nothing, and return the report."""
    with debug_logging(bool(options.get("debug"))):
        settings = _settings(module, inputs, options)
        lowered, metas, _ = _prepare(module, settings)
        return make_report(partition(lowered.graph, metas, settings))


def _graph_ops(graph: Graph) -> Iterable[Node]:
    stack = [graph.block()]
    while stack:
        for node in stack.pop().nodes():
            yield node
            stack.extend(node.blocks())


def unsupported_ops(module: torch.nn.Module, method_name: str = "forward",
                    inputs: Sequence[Input | torch.Tensor] | None = None) -> dict[str, int]:
    """Ops of the lowered method that no converter or evaluator handles, with their counts.

    Control flow (prim::If, prim::Loop) is not counted (partitioning handles it); the ops inside it are.

    `inputs` are only needed when `module` must be traced (it cannot be scripted).
    """
    load_all()
    settings = CompileSettings.create(inputs or [Input((1,))], default_device=_module_device(module))
    script = to_torchscript(module, _examples(settings) if inputs else [])
    graph = lower(script, settings, method_name).graph
    counts: dict[str, int] = collections.Counter()
    for node in _graph_ops(graph):
        if node.kind() not in ("prim::If", "prim::Loop") and not is_registered(node):
            counts[node_key(node)] += 1
    return dict(sorted(counts.items()))


def check_method_op_support(module: torch.nn.Module, method_name: str = "forward",
                            inputs: Sequence[Input | torch.Tensor] | None = None) -> bool:
    """True when every op of the method has a converter or evaluator (see `unsupported_ops`)."""
    missing = unsupported_ops(module, method_name, inputs)
    for op, count in missing.items():
        logger.warning("unsupported op %s (x%d)", op, count)
    return not missing


def convert_method_to_engine(module: torch.nn.Module, method_name: str = "forward",
                             inputs: Sequence[Input | torch.Tensor] | None = None, **options: Any) -> bytes:
    """Compile one method into a single engine and return its serialized bytes.

    The engine's inputs are the method's inputs in order; its outputs are the returned tensors
    (a returned tuple or list of tensors is flattened).
    """
    with debug_logging(bool(options.get("debug"))):
        settings = _settings(module, inputs, dict(options, require_full_compilation=True))
        lowered, metas, _ = _prepare(module, settings, method_name)
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
        build = BuildSettings(compute_dtype=settings.compute_dtype, device=settings.device)
        return build_engine(network, bindings, build, method_name).serialize()


def _identifier(name: str, index: int) -> str:
    clean = re.sub(r"\W", "_", name)
    return clean if clean.isidentifier() and not clean.startswith("_") and clean != "self" else f"input_{index}"


def embed_engine_in_new_module(engine_bytes: bytes, input_binding_names: Sequence[str] | None = None,
                               output_binding_names: Sequence[str] | None = None,
                               device: Any = None) -> torch.jit.ScriptModule:
    """A ScriptModule whose forward(*inputs) runs the engine (one output: a tensor; several: a tuple)."""
    engine = Engine.deserialize(engine_bytes)
    n_in, n_out = len(engine.bindings), len(engine.network.outputs)
    names = list(input_binding_names) if input_binding_names is not None else [b.name for b in engine.bindings]
    if len(names) != n_in:
        raise ValueError(f"input_binding_names: the engine has {n_in} inputs, got {len(names)} names")
    if output_binding_names is not None and len(output_binding_names) != n_out:
        raise ValueError(f"output_binding_names: the engine has {n_out} outputs, got {len(output_binding_names)}")
    if device is not None and torch.device(device).type != engine.device_type:
        raise ValueError(f"device: the engine was built for {engine.device_type}, not {device}")
    args = [_identifier(n, i) for i, n in enumerate(names)]
    if len(set(args)) != len(args):
        args = [f"input_{i}" for i in range(n_in)]
    # A fresh class each time: TorchScript cannot define forward twice on one class.
    module = type("EmbeddedEngine", (torch.jit.ScriptModule,), {"__module__": "torchkiln.embedded"})()
    module._c._register_attribute(ENGINE_ATTR.format(0), torch._C.TensorType.get(), engine_blob(engine_bytes))
    result = "outs[0]" if n_out == 1 else "(" + ", ".join(f"outs[{i}]" for i in range(n_out)) + ")"
    rtype = "Tensor" if n_out == 1 else f"Tuple[{', '.join(['Tensor'] * n_out)}]"
    signature = ", ".join(f"{a}: Tensor" for a in args)
    module.define(
        f"def forward(self, {signature}) -> {rtype}:\n"
        f"    outs = torch.ops.torchkiln.execute_engine([{', '.join(args)}], self.{ENGINE_ATTR.format(0)})\n"
        f"    return {result}\n")
    return module
