"""The layer-wise numeric debugger: where does an fp16/bf16 (or fp32) engine leave eager fp32?

`debug_precision` compiles as `compile` does, then runs every engine layer by layer on the reference meanings
twice: as built (in the chosen precision, with the layers precision safety keeps in fp32) and as built in
fp32. Each layer the two builds share is one TorchScript node's computation, so the fp32 build's value is
what eager fp32 computes there; the report gives each layer's error against it, the node and source line it
came from, and the first layer whose error passes the tolerance. The compiled module's outputs are also
compared with the eager module's.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.builder import build_engine
from torchkiln.builder.calibration import TOLERANCE, compare_networks, compare_values
from torchkiln.compiler import (_build_settings, _module_name, _partition_and_build, _prepare, _settings,
                                block_bindings, block_input_values)
from torchkiln.conversion.block_converter import convert_block
from torchkiln.frontend import as_module
from torchkiln.ir import layers as L
from torchkiln.log import debug_logging
from torchkiln.partitioning.report import Fp32Layer
from torchkiln.analysis.shape_analysis import example_args
from torchkiln.stitching.stitch import engine_attrs, stitch

logger = logging.getLogger("torchkiln")
QUANT_TOLERANCE = 5e-2  # int8 / fp8: the relative error (max abs / max |fp32|) a quantized layer may carry


@dataclasses.dataclass(frozen=True)
class LayerRow:
    """One engine layer: where it came from and its error against eager fp32."""

    engine: str
    index: int  # its place among all the rows, in execution order
    name: str
    kind: str
    node: str  # the TorchScript node ("aten::mul(%z)"), or "(builder)" for a layer the builder made
    source: str  # file:line of the node's Python source
    dtype: torch.dtype  # the precision of its output in the engine
    max_abs: float
    max_ref: float
    relative: float  # max_abs / max |fp32 value|
    cosine: float
    overflow: str  # why the value does not fit the precision, "" when it does
    kept_fp32: str  # why precision safety kept it in fp32, "" when it did not
    quantized: str = ""  # a quantized layer's type and scales ("int8: input scale 0.024, weight scales 1e-3..4e-3")


@dataclasses.dataclass(frozen=True)
class OutputError:
    """One output of the compiled module against the eager module."""

    index: int
    max_abs: float
    max_ref: float
    cosine: float


@dataclasses.dataclass(frozen=True)
class PrecisionReport:
    """Every engine layer's error against eager fp32, the first past `tolerance`, and the outputs' errors."""

    name: str
    precision: torch.dtype
    tolerance: float
    rows: tuple[LayerRow, ...]
    outputs: tuple[OutputError, ...]
    fp32_layers: tuple[Fp32Layer, ...]

    @property
    def first_bad(self) -> LayerRow | None:
        """The first layer whose relative error passes the tolerance (or whose value overflows), if any."""
        return next((r for r in self.rows if r.overflow or r.relative > self.tolerance), None)

    def __str__(self) -> str:
        precision = str(self.precision).removeprefix("torch.")
        lines = [f"layer-wise error of {self.name} in {precision} against eager float32 (tolerance: relative "
                 f"error {self.tolerance:.0e})",
                 f"{'#':>4}  {'layer':40} {'kind':15} {'dtype':8} {'max abs':>9} {'relative':>9} {'cosine':>8}  "
                 f"node / source"]
        for r in self.rows:
            flag = " !" if r.overflow or r.relative > self.tolerance else ""
            note = f"  [kept fp32: {r.kept_fp32}]" if r.kept_fp32 else (f"  [{r.overflow}]" if r.overflow else "")
            note += f"  [{r.quantized}]" if r.quantized else ""
            lines.append(f"{r.index:>4}  {_cut(r.name, 40):40} {r.kind:15} {str(r.dtype).removeprefix('torch.'):8} "
                         f"{r.max_abs:9.2e} {r.relative:9.2e} {r.cosine:8.5f}  {r.node} at {r.source}{flag}{note}")
        bad = self.first_bad
        lines.append("first layer past the tolerance: " + (
            f"#{bad.index} {bad.name!r} ({bad.node} at {bad.source}): relative error {bad.relative:.2e}"
            + (f", {bad.overflow}" if bad.overflow else "") if bad else "none"))
        for o in self.outputs:
            lines.append(f"output {o.index} against the eager module: max abs error {o.max_abs:.2e} (max |eager| "
                         f"{o.max_ref:.2e}), cosine {o.cosine:.6f}")
        return "\n".join(lines)

    def plot(self, path: str | os.PathLike) -> bool:
        """Write a plot of each layer's relative error against its index (matplotlib); False, with a logged
        message, where matplotlib is not installed."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            logger.warning("debug_precision: matplotlib is not installed, so no plot was written to %s "
                           "(pip install matplotlib)", path)
            return False
        fig, ax = plt.subplots(figsize=(10, 4))
        values = [r.relative if math.isfinite(r.relative) else float("nan") for r in self.rows]
        ax.semilogy([r.index for r in self.rows], [max(v, 1e-12) for v in values], marker=".")
        ax.axhline(self.tolerance, color="red", linestyle="--", label="tolerance")
        bad = self.first_bad
        if bad is not None:
            ax.axvline(bad.index, color="orange", label=f"first past tolerance: {bad.node}")
        ax.set_xlabel("layer (execution order)")
        ax.set_ylabel("relative error vs eager fp32")
        ax.set_title(f"{self.name} in {str(self.precision).removeprefix('torch.')}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return True


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else "..." + text[-(width - 3):]


def _output_errors(compiled: torch.jit.ScriptModule, module: torch.nn.Module, data: Sequence[Any]
                   ) -> tuple[OutputError, ...]:
    with torch.no_grad():
        got, want = compiled(*data), module(*data)
    got_flat, want_flat = _tensors(got), _tensors(want)
    rows = []
    for i, (g, w) in enumerate(zip(got_flat, want_flat)):
        e = compare_values(w, g)
        rows.append(OutputError(i, e.max_abs, e.max_ref, e.cosine))
    return tuple(rows)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _quantization(layer: L.Layer) -> str:
    """A quantized layer's type and scales (its input's, its weights' per channel), "" for any other layer."""
    dq = layer.inputs[0].producer if layer.inputs else None
    if not isinstance(dq, L.DequantizeLayer) or not isinstance(layer, (L.ConvolutionLayer, L.MatrixMultiplyLayer)):
        return ""
    weight = layer.weights.get("kernel_scale")
    if weight is None and len(layer.inputs) > 1 and isinstance(layer.inputs[1].producer, L.DequantizeLayer):
        weight = layer.inputs[1].producer.weights["scale"]
    text = f"{str(dq.quant_type).removeprefix('torch.')}: input scale {float(dq.weights['scale'].max()):.3g}"
    return text + (f", weight scales {float(weight.min()):.3g}..{float(weight.max()):.3g}" if weight is not None
                   else "")


def debug_precision(module: torch.nn.Module, inputs: Sequence[Any], enabled_precisions: Any = None,
                    tolerance: float | None = None, plot: str | os.PathLike | None = None,
                    **options: Any) -> PrecisionReport:
    """Compile as `compile` would (default precision: float16), run every engine layer by layer, and report each
    layer's error against eager fp32 with its TorchScript node and source line, the first layer past
    `tolerance` (relative error; default by precision: 1e-2 for float16, 5e-2 for bfloat16, 1e-4 for float32),
    and the compiled outputs' errors against `module`. The data: the tensors given in `inputs`
    (torchkiln.Input.from_tensor or plain tensors), else random inputs at the opt shapes. `plot=path` also
    writes a plot of the errors (matplotlib, where installed)."""
    engines = len(engine_attrs(module))
    if engines:
        raise ValueError(f"debug_precision takes the module before compiling; this one is compiled already (it runs "
                         f"{engines} engine(s)): give the module that was compiled")
    with debug_logging(bool(options.get("debug"))):
        module = as_module(module)
        settings = _settings(module, inputs, dict(options, enabled_precisions=enabled_precisions or {torch.float16}))
        build = _build_settings(settings)
        if tolerance is None:
            tolerance = QUANT_TOLERANCE if settings.quant_type is not None else TOLERANCE[build.compute_dtype]
        tolerance = float(tolerance)
        data = example_args(settings.input_signature, settings.device, "opt")
        lowered, metas = _prepare(module, settings)
        name = _module_name(module)
        part, built, engines = _partition_and_build(lowered, metas, settings, name)
        blocks = [b for b in part.blocks if b.is_engine]
        values = block_input_values(part, lowered.module, [data], blocks)
        reasons = {(f.engine, f.layer): f.reason for f in built.fp32_layers}
        rows: list[LayerRow] = []
        for k, (block, engine) in enumerate(zip(blocks, engines)):
            network = convert_block(block.nodes, block.inputs, block.outputs, part.metas, settings, engine.name)
            origins = network.origins
            reference = build_engine(network, block_bindings(network),
                                     dataclasses.replace(build, compute_dtype=torch.float32), f"{engine.name}_fp32",
                                     plan=False)
            quantized = {layer.name: _quantization(layer) for layer in engine.network.layers}
            for e in compare_networks(reference.network, engine.network, values[k][0], settings.device):
                node, source = origins.get(e.name, ("(builder)", "-"))
                rows.append(LayerRow(engine.name, len(rows), e.name, e.kind, node, os.path.basename(source)
                                     if source not in ("-", "<unknown>") else source, e.dtype, e.max_abs, e.max_ref,
                                     e.relative, e.cosine, e.overflow, reasons.get((engine.name, e.name), ""),
                                     quantized.get(e.name, "")))
        compiled = stitch(lowered.module, part, engines)
        report = PrecisionReport(f"{name}.forward", settings.quant_type or build.compute_dtype, tolerance, tuple(rows),
                                 _output_errors(compiled, module, data), built.fp32_layers)
        if plot is not None:
            report.plot(plot)
        return report
