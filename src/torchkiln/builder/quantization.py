"""Post-training quantization of one engine: calibrate activation ranges on sample inputs, measure each candidate
layer's own quantization error, keep in float the layers past the tolerance, and build with the rest quantized.

Calibration runs the block's fp32 build on the reference meanings three times over the samples: the largest
|value| of each quantized layer's activation input, then their histograms (the range each comes from, by the
chosen `CalibrationAlgo`, builder/ranges.py), then each layer on its fp32 inputs both as it is and quantized
(activation through its quantizer, weights per output channel): the relative RMS error of its output is the layer's
own error, not error carried in from layers before it. A layer whose error passes
`TOLERANCE` stays in float, named with its error.

A calibration cache (a JSON file: per engine, the ranges, the layers kept and why) makes a rebuild skip the
three passes; an entry is used only where its type, algorithm and layers are this build's.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Container, Sequence
from typing import Any

import torch

from torchkiln.builder.builder import build_engine, ship
from torchkiln.builder.calibration import calibrated_build, compare_values, tensor_samples
from torchkiln.builder.passes.quantize import Candidate, candidate, quantize_weight, quantized_relus, quantizes_output
from torchkiln.builder.ranges import Histogram, choose_amax, fake_quantized
from torchkiln.builder.settings import BuildSettings, QuantizationPlan
from torchkiln.enums import CalibrationAlgo
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.reference import dequantize, run_layer
from torchkiln.runtime.backends import BACKENDS
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.runtime.executor import ReferenceExecutor
from torchkiln.runtime.integer_kernels import FULL_WEIGHT_MAX, weight_max

logger = logging.getLogger("torchkiln.builder")

# A quantized layer's own relative error (||quantized - fp32|| / ||fp32|| of its output) past which it stays in float.
TOLERANCE = {torch.int8: 0.1, torch.float8_e4m3fn: 0.1}
# The cosine of the quantized network's outputs against its fp32 build's on the calibration samples under which the
# build warns (the accuracy the quantization issue asks of every zoo model). Keeping more layers in float until it is
# reached was tried: in a 50-layer residual CNN (random weights, batch norms calibrated) every layer's own error was
# 0.018-0.03, 0.986 compounded, and keeping the largest errors' layers in float an eighth at a time reached 0.993
# only with nearly all of them in float, which an int8-only build then ran in float32, 10x the fp16 engine's time.
NETWORK_COSINE = 0.99
# 2: a convolution whose ReLU is quantized (`quantized_relus`) keeps the ReLU's amax as its output's
# 3: any ReLU (or clamp from 0) alone reading a convolution is quantized (`quantized_relus`), not only one that
#    convolutions read
CACHE_FORMAT = "torchkiln-calibration-3"


@dataclasses.dataclass(frozen=True)
class QuantizedLayer:
    """A layer calibration looked at: its activation range and its own error when quantized; `kept` says why it
    stays in float ("" where it is quantized)."""

    name: str
    kind: str
    amax: float
    error: float
    kept: str = ""
    output_amax: float | None = None  # where its output is quantized too


def _sources(network: Network, candidates: dict[str, Candidate]) -> dict[str, Any]:
    """Each candidate's activation tensor (by layer name)."""
    layers = {layer.name: layer for layer in network.layers}
    return {name: layers[name].inputs[c.activation] for name, c in candidates.items()}


def _run(executor: ReferenceExecutor, network: Network, sample: Sequence[torch.Tensor],
         kept: Container[int] = frozenset(),
         visit: Callable[[dict[int, torch.Tensor], L.Layer, list[torch.Tensor]], None] | None = None
         ) -> list[torch.Tensor]:
    """Run `network` on the reference meanings (`executor`: made once for it, which placed its weights on its
    device), calling visit(the values of the tensors in `kept` so far, by id, layer, its outputs) where given; the
    network's outputs."""
    args = [x.to(device=executor.device, dtype=t.dtype) for x, t in zip(sample, network.inputs)]
    values = {id(t): x for t, x in zip(network.inputs, args) if id(t) in kept}

    def record(layer: L.Layer, outs: list[torch.Tensor]) -> None:
        visit(values, layer, outs)
        values.update((id(t), x) for t, x in zip(layer.outputs, outs) if id(t) in kept)

    with torch.no_grad():
        return executor.run(args, record if visit is not None else None)


def _own_error(layer: L.Layer, found: Candidate, inputs: list[torch.Tensor], weights: dict[str, torch.Tensor],
               out: torch.Tensor, amax: float, output_amax: float | None, quant_type: torch.dtype,
               device: torch.device, relu: L.Layer | None = None, weight_max: int = FULL_WEIGHT_MAX) -> float:
    """The relative error of `layer`'s output (of the ReLU after it, `relu`: `quantized_relus`) when its
    activation, weight and output (with `output_amax`) are quantized, on its fp32 inputs and `weights` (on the
    device: its kernel, or matrix operand, is quantized there per output channel)."""
    inputs = list(inputs)
    inputs[found.activation] = fake_quantized(inputs[found.activation], amax, quant_type)
    conv = isinstance(layer, L.ConvolutionLayer)
    q, scale = quantize_weight(weights["kernel"] if conv else inputs[1], found.axis, quant_type, weight_max)
    shaped = scale.reshape([-1 if d == found.axis % q.dim() else 1 for d in range(q.dim())])
    weight = dequantize(q, shaped, None)
    if conv:
        weights = {**weights, "kernel": weight}
    else:
        inputs[1] = weight
    low = run_layer(layer, inputs, weights, device)[0]
    if relu is not None:
        out, low = (run_layer(relu, [v], {}, device)[0] for v in (out, low))
    if output_amax is not None:
        low = fake_quantized(low, output_amax, quant_type, unsigned=relu is not None)
    return relative_rms(out, low)


def relative_rms(ref: torch.Tensor, low: torch.Tensor) -> float:
    """||low - ref|| / ||ref|| over the finite values of ref (0 where both are zero, inf where only ref is)."""
    ref64, low64 = ref.detach().double().flatten(), low.detach().double().flatten()
    finite = torch.isfinite(ref64)
    norm, diff = float(ref64[finite].norm()), float((low64[finite] - ref64[finite]).norm())
    return diff / norm if norm > 0 else (0.0 if diff == 0 else float("inf"))


def calibrate(network: Network, samples: Sequence[Sequence[torch.Tensor]], algo: CalibrationAlgo,
              quant_type: torch.dtype, device: torch.device, weight_max: int = FULL_WEIGHT_MAX
              ) -> list[QuantizedLayer]:
    """Each candidate layer of the fp32 `network` with its calibrated range and own quantization error (int8 weights
    in [-weight_max, weight_max])."""
    candidates = {layer.name: c for layer in network.layers if (c := candidate(layer)) is not None}
    relus = quantized_relus(network, candidates, quant_type)
    sources = _sources(network, candidates)
    hists = {name: Histogram() for name in candidates}
    out_hists = {name: Histogram() for name, c in candidates.items() if quantizes_output(c)}
    kept = {id(t) for layer in network.layers if layer.name in candidates for t in layer.inputs}

    def observe(method: str) -> Callable[[dict[int, torch.Tensor], L.Layer, list[torch.Tensor]], None]:
        def visit(values: dict[int, torch.Tensor], layer: L.Layer, outs: list[torch.Tensor]) -> None:
            if layer.name in candidates:
                getattr(hists[layer.name], method)(values[id(sources[layer.name])])
            if layer.name in out_hists:
                getattr(out_hists[layer.name], method)(
                    run_layer(relus[layer.name], outs, {}, device)[0] if layer.name in relus else outs[0])
        return visit

    executor = ReferenceExecutor(network, device)  # the weights placed on the device once, not per sample
    for method in ("observe_max", "observe"):
        for sample in samples:
            _run(executor, network, sample, kept, observe(method))
    amax = {name: choose_amax(h, algo, quant_type) for name, h in hists.items()}
    out_amax = {name: choose_amax(h, algo, quant_type) for name, h in out_hists.items()}
    errors = dict.fromkeys(candidates, 0.0)

    def measure(values: dict[int, torch.Tensor], layer: L.Layer, outs: list[torch.Tensor]) -> None:
        if layer.name in candidates:
            inputs = [values[id(t)] for t in layer.inputs]
            error = _own_error(layer, candidates[layer.name], inputs, executor.weights(layer), outs[0],
                               amax[layer.name], out_amax.get(layer.name), quant_type, device,
                               relus.get(layer.name), weight_max)
            errors[layer.name] = max(errors[layer.name], error)

    for sample in samples:
        _run(executor, network, sample, kept, measure)
    tolerance = TOLERANCE[quant_type]
    kinds = {layer.name: layer.KIND for layer in network.layers}

    def why_kept(name: str) -> str:
        if not (amax[name] > 0 and out_amax.get(name, 1.0) > 0):
            return (f"its {'input' if not amax[name] > 0 else 'output'} was 0 (or not finite) everywhere on the "
                    f"calibration samples: no range to quantize it to")
        if not errors[name] <= tolerance:
            return f"quantized output error {errors[name]:.3g} (relative RMS) is past the tolerance {tolerance:g}"
        return ""

    return [QuantizedLayer(name, kinds[name], amax[name], errors[name], why_kept(name), out_amax.get(name))
            for name in candidates]


def without_kernels(layers: list[QuantizedLayer], backend: str, network: Network) -> list[QuantizedLayer]:
    """`layers` (of `network`), those `backend` has no quantized kernel for kept in float (quantized, such a layer
    runs as a float layer over dequantized values: slower than in float, and less exact)."""
    refusal = BACKENDS[backend].quantized
    by_name = {layer.name: layer for layer in network.layers}
    out = []
    for q in layers:
        why = None if q.kept else refusal(by_name[q.name])
        out.append(q if why is None else dataclasses.replace(
            q, kept=f"the {backend} backend has no quantized {q.kind.replace('_', ' ')} kernel of its form: {why}"))
    return out


def _read_cache(path: str | None, name: str, quant_type: torch.dtype, algo: CalibrationAlgo,
                names: set[str], weight_max: int) -> list[QuantizedLayer] | None:
    """The cache's layers for engine `name`, or None (logged) where the file has no usable entry: missing,
    damaged, or made for another type, algorithm, weight range (the layers' errors depend on it) or network."""
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        entry = data["engines"][name] if data.get("format") == CACHE_FORMAT else None
        same = entry is not None and entry.get("quant_type") == str(quant_type) \
            and entry.get("algorithm") == algo.value and entry.get("weight_max", FULL_WEIGHT_MAX) == weight_max \
            and {row["name"] for row in entry["layers"]} == names
        layers = [QuantizedLayer(**row) for row in entry["layers"]] if same else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        layers, same = None, False
    if layers is not None and all(_is_range(q.amax) and (q.output_amax is None or _is_range(q.output_amax))
                                  and isinstance(q.kept, str) for q in layers):
        return layers
    logger.warning("calibration cache %s has no usable entry for engine %s (missing, damaged, or made for another "
                   "type, algorithm, weight range or network); calibrating", path, name)
    return None


def _is_range(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def _write_cache(path: str, name: str, quant_type: torch.dtype, algo: CalibrationAlgo,
                 layers: list[QuantizedLayer], weight_max: int) -> None:
    data: dict[str, Any] = {"format": CACHE_FORMAT, "engines": {}}
    if os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                old = json.load(f)
            if old.get("format") == CACHE_FORMAT and isinstance(old.get("engines"), dict):
                data = old
        except (OSError, ValueError):
            pass
    data["engines"][name] = {"quant_type": str(quant_type), "algorithm": algo.value, "weight_max": weight_max,
                             "layers": [dataclasses.asdict(row) for row in layers]}
    try:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
    except OSError as e:  # calibration itself succeeded: the build goes on without its cache
        logger.warning("engine %s: the calibration cache %s could not be written: %s", name, path, e)


@dataclasses.dataclass(frozen=True)
class QuantizeRequest:
    """What post-training quantization of a compile asks for."""

    quant_type: torch.dtype
    algorithm: CalibrationAlgo
    cache_file: str | None = None
    read_cache: bool = True  # False: the cache file is written, never read (a calibrator without use_cache)


def quantized_build(convert: Callable[[], Network], bindings: Sequence[InputBinding], settings: BuildSettings,
                    name: str, samples: Callable[[], Sequence[Sequence[torch.Tensor]]], request: QuantizeRequest,
                    safety: bool = False) -> tuple[Engine, list[QuantizedLayer], float | None, dict[str, str]]:
    """Build an engine with its convolutions and matrix multiplies quantized where their own error allows; the
    engine, every layer calibration looked at, the least cosine of its outputs against its float32 build's on
    the calibration samples (None where it was not measured: calibration ranges from the cache, or nothing
    quantized), and the float layers kept in float32 (name -> why). `samples` is called only where the cache has no
    entry, or for `safety`: in a half-precision build, the float layers are then checked on the samples as a float
    build's are (`calibrated_build`, against the quantized network in float32): those that overflow or lose
    precision in the half type stay in float32."""
    reference = build_engine(convert(), bindings, dataclasses.replace(settings, compute_dtype=torch.float32),
                             f"{name}_fp32", plan=False).network
    names = {layer.name for layer in reference.layers if candidate(layer) is not None}
    top = weight_max(settings.device) if request.quant_type == torch.int8 else FULL_WEIGHT_MAX
    if top < FULL_WEIGHT_MAX and names:
        logger.info("engine %s: int8 weights in [-%d, %d] (7 bits): this CPU's integer kernels would saturate wider "
                    "ones (no VNNI)", name, top, top)
    cached = _read_cache(request.cache_file, name, request.quant_type, request.algorithm, names, top) \
        if request.read_cache else None
    chosen: Sequence[Sequence[torch.Tensor]] = []
    if cached is not None:
        logger.info("engine %s: calibration ranges read from %s", name, request.cache_file)
    elif names:
        chosen = samples()
        logger.info("engine %s: calibrating %d layers on %d samples (%s)", name, len(names), len(chosen),
                    request.algorithm.value)
        start = time.perf_counter()
        cached = calibrate(reference, chosen, request.algorithm, request.quant_type, settings.device, top)
        logger.info("engine %s: calibrated in %.1f s", name, time.perf_counter() - start)
        if request.cache_file:
            _write_cache(request.cache_file, name, request.quant_type, request.algorithm, cached, top)
    layers = without_kernels(cached or [], settings.backend, reference)
    quantized = _quantized(settings, request, layers, top)
    fp32: dict[str, str] = {}
    checked = _half_samples(chosen, samples, name, settings.compute_dtype) \
        if safety and settings.compute_dtype != torch.float32 else None
    if checked:
        engine, fp32 = calibrated_build(convert, bindings, quantized, name, checked)  # shipped by it
    else:
        engine = build_engine(convert(), bindings, quantized, name, plan=False)
    cosine = network_cosine(engine, reference, chosen, settings.device) \
        if chosen and any(not q.kept for q in layers) else None
    if not checked:
        ship(engine, settings.device)
    return engine, layers, cosine, fp32


def _half_samples(chosen: Sequence[Sequence[torch.Tensor]], samples: Callable[[], Sequence[Sequence[torch.Tensor]]],
                  name: str, dtype: torch.dtype) -> Sequence[Sequence[torch.Tensor]] | None:
    """The samples a half-precision quantized build checks its float layers on: calibration's, else asked for; None
    where there are none of tensors (a CacheCalibrator's ranges come from its cache: it has no data; logged)."""
    try:
        found = chosen or samples()
    except ValueError as e:
        logger.warning("engine %s: its %s layers are not checked for overflow or lost precision: %s", name,
                       str(dtype).removeprefix("torch."), e)
        return None
    return found if tensor_samples(found) else None


def _quantized(settings: BuildSettings, request: QuantizeRequest, layers: Sequence[QuantizedLayer],
               weight_max: int) -> BuildSettings:
    """`settings` quantizing the layers not kept in float."""
    return dataclasses.replace(settings, quantization=QuantizationPlan(
        request.quant_type, tuple((q.name, q.amax) for q in layers if not q.kept),
        tuple((q.name, q.output_amax) for q in layers if not q.kept and q.output_amax is not None), weight_max))


def network_cosine(engine: Engine, reference: Network, samples: Sequence[Sequence[torch.Tensor]],
                   device: torch.device) -> float:
    """The least cosine of the quantized engine's outputs against `reference`'s on the samples (each layer within
    its own tolerance, their errors compounded)."""
    ours, theirs = ReferenceExecutor(engine.network, device), ReferenceExecutor(reference, device)
    return min((_cosine(a, b) for sample in samples for a, b in zip(_run(theirs, reference, sample),
                                                                    _run(ours, engine.network, sample))),
               default=1.0)


def log_network_cosine(name: str, cosine: float, request: QuantizeRequest, kept: bool) -> None:
    """Log engine `name`'s `network_cosine`: a warning under `NETWORK_COSINE` where the quantized engine is `kept`
    (an info line otherwise, and where it is not: the build kept its float one)."""
    what = str(request.quant_type).removeprefix("torch.")
    if cosine < NETWORK_COSINE and kept:
        logger.warning("engine %s: its %s outputs' cosine against float32 on the calibration samples is %.4f, under "
                       "%g: its quantized layers' errors (each within the tolerance) add up; another "
                       "calibration_algorithm (%s now), calibration data of the model's real inputs, or leaving "
                       "%s out of enabled_precisions may do better", name, what, cosine, NETWORK_COSINE,
                       request.algorithm.value, what)
    else:
        logger.info("engine %s: its %s outputs' cosine against float32 on the calibration samples is %.4f%s", name,
                    what, cosine, "" if kept else " (not kept: its float build ran faster)")


def _cosine(ref: torch.Tensor, low: torch.Tensor) -> float:
    """`compare_values`' cosine, 0 where `low` overflowed (NaN)."""
    cosine = compare_values(ref.float(), low.float()).cosine
    return 0.0 if math.isnan(cosine) else cosine
