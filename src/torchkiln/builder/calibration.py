"""Layer-wise comparison of a network built in fp16/bf16 with its fp32 build, and precision calibration.

Both builds come from one conversion of the same block, so the layers they share keep their names (the
passes before the low-precision pass run alike on both; that pass only adds casts and narrowed constants,
under fresh names). Running both layer by layer on the reference meanings, every shared layer's output in
the fp32 build is what eager fp32 computes for it, and its output in the low build is what the engine
computes: their difference is that layer's error.

Calibration uses it to keep layers in fp32: a layer whose output overflows (inf or nan where fp32 is finite,
or a value beyond the low type's largest) while its inputs did not, or whose relative error passes the
tolerance and is more than `GROWTH` times its inputs' (the layer itself lost the precision: a cancellation,
not error carried in), is named in `BuildSettings.keep_fp32`, and the build runs again until no layer is. A
layer whose value only sums read (a residual branch) is judged against the sums' magnitudes: a branch scaled by
a layer-scale of 1e-6 has a large error of its own, and none in what the network computes with it.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Container, Iterable, Sequence

import torch

from torchkiln.builder.builder import build_engine, ship
from torchkiln.builder.settings import BuildSettings
from torchkiln.errors import EngineInputError
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.engine import Engine, InputBinding
from torchkiln.runtime.executor import ReferenceExecutor

logger = logging.getLogger("torchkiln.builder")

# The relative error (max abs error / max |fp32 value|) past which a layer has lost precision, by precision.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 5e-2, torch.float32: 1e-4}
GROWTH = 4.0  # a layer loses precision itself when its error is this many times its inputs' error
MAX_ROUNDS = 8  # calibration builds at most this many times


@dataclasses.dataclass(frozen=True)
class LayerError:
    """One layer's outputs in the low-precision build against the fp32 build (the worst output of several)."""

    name: str
    kind: str
    dtype: torch.dtype  # the dtype of its (first) output in the low-precision build
    max_abs: float  # inf where the low build has inf/nan and fp32 a finite value
    max_ref: float  # max |fp32 value|
    cosine: float
    overflow: str  # why the value does not fit the low precision ("" when it does)

    @property
    def relative(self) -> float:
        return self.max_abs / self.max_ref if self.max_ref > 0 else (0.0 if self.max_abs == 0 else math.inf)


def compare_values(ref: torch.Tensor, low: torch.Tensor, name: str = "", kind: str = "") -> LayerError:
    """`low` against `ref`: max abs error, max |ref|, cosine, and whether `low` overflowed."""
    ref64, low64 = ref.detach().double().flatten(), low.detach().double().flatten()  # on the device: no copies
    finite = torch.isfinite(ref64)
    overflow = ""
    if bool((finite & ~torch.isfinite(low64)).any()):
        overflow = f"{'inf' if bool(torch.isinf(low64[finite]).any()) else 'nan'} where float32 is finite"
    elif low.dtype in (torch.float16, torch.bfloat16) and finite.any():
        biggest = float(ref64[finite].abs().max())
        if biggest > torch.finfo(low.dtype).max:
            overflow = f"|value| up to {biggest:.3g}, beyond {str(low.dtype).removeprefix('torch.')}'s largest"
    both = finite & torch.isfinite(low64)
    diff = (ref64[both] - low64[both]).abs()
    max_abs = math.inf if overflow.startswith(("inf", "nan")) else (float(diff.max()) if diff.numel() else 0.0)
    max_ref = float(ref64[finite].abs().max()) if finite.any() else 0.0
    a, b = ref64[both], low64[both]
    norms = float(a.norm() * b.norm())
    cosine = float(a @ b) / norms if norms > 0 else (1.0 if float(a.abs().sum() + b.abs().sum()) == 0 else 0.0)
    if overflow.startswith(("inf", "nan")):
        cosine = float("nan")
    return LayerError(name, kind, low.dtype, max_abs, max_ref, cosine, overflow)


def _worst(errors: Sequence[LayerError]) -> LayerError:
    return max(errors, key=lambda e: (bool(e.overflow), e.relative))


def _run(network: Network, inputs: Sequence[torch.Tensor], device: torch.device,
         visit: Callable[[L.Layer, list[torch.Tensor]], None]) -> None:
    """Run `network` on the reference meanings (inputs cast to its inputs' dtypes), visiting each layer."""
    args = [x.to(device=device, dtype=t.dtype) for x, t in zip(inputs, network.inputs)]
    with torch.no_grad():
        ReferenceExecutor(network, device).run(args, visit)


def compare_networks(reference: Network, low: Network, inputs: Sequence[torch.Tensor],
                     device: torch.device) -> list[LayerError]:
    """The error of every layer of `low` that `reference` also has, in `low`'s order. The reference's values
    are all kept; the low network's are compared as they are made and freed as it runs."""
    ref_values: dict[str, list[torch.Tensor]] = {}
    _run(reference, inputs, device, lambda layer, outs: ref_values.__setitem__(layer.name, outs))
    errors = []

    def compare(layer: L.Layer, outs: list[torch.Tensor]) -> None:
        if layer.name not in ref_values or isinstance(layer, L.ConstantLayer):
            return
        pairs = [(r, x) for r, x in zip(ref_values[layer.name], outs) if x.numel()]
        if pairs:
            errors.append(_worst([compare_values(r, x, layer.name, layer.KIND) for r, x in pairs]))

    _run(low, inputs, device, compare)
    return errors


def _sources(layer: L.Layer, compared: Container[str]) -> list[L.Layer]:
    """The compared layers `layer` reads, looking through the casts the low-precision pass added (a value
    narrowed for this layer counts as part of this layer's computation)."""
    sources = []
    for t in layer.inputs:
        producer = t.producer
        while producer is not None and producer.name not in compared and isinstance(producer, L.CastLayer):
            producer = producer.inputs[0].producer
        if producer is not None and producer.name in compared:
            sources.append(producer)
    return sources


def _readers(layer: L.Layer, returned: Container[int], consumers: dict[int, list[L.Layer]],
             compared: Container[str]) -> list[L.Layer]:
    """The compared layers that compute with `layer`'s outputs, looking through casts and shuffles (which move
    values and keep their absolute error); none where the value, or a cast or shuffle of it, is a network output
    (`returned`: their ids; returned on its own scale)."""
    found, stack = [], [t for t in layer.outputs]
    while stack:
        t = stack.pop()
        if id(t) in returned:
            return []
        for reader in consumers.get(id(t), []):
            if isinstance(reader, (L.CastLayer, L.ShuffleLayer)):
                stack.extend(reader.outputs)
            elif reader.name in compared:
                found.append(reader)
            else:
                return []  # read by a layer whose error is not known: judged on its own scale
    return found


_ADDITIVE = (L.ElementWiseOperation.SUM, L.ElementWiseOperation.SUB)


def _absorbing_scale(layer: L.Layer, returned: Container[int], consumers: dict[int, list[L.Layer]],
                     found: dict[str, LayerError]) -> float:
    """The scale at which `layer`'s error lands: where every reader adds or subtracts its value (a residual
    branch, a layer-scaled branch: x + 1e-6 * f(x)), the smallest of those sums' magnitudes; else 0. An absolute
    error there is what the sums carry on, so it is judged against their scale, not the branch's own."""
    readers = _readers(layer, returned, consumers, found)
    if not readers or not all(isinstance(r, L.ElementWiseLayer) and r.op in _ADDITIVE for r in readers):
        return 0.0
    return min(found[r.name].max_ref for r in readers)


def unsafe_layers(low: Network, errors: Iterable[LayerError], tolerance: float) -> dict[str, str]:
    """Layers (name -> why) where the low precision goes wrong first: an overflow its inputs did not have, or a
    relative error past `tolerance` and `GROWTH` times its inputs'. A layer that only sums read is judged by its
    absolute error against those sums' magnitudes (`_absorbing_scale`). Layers of integer or bool output are left
    out (they have no fp32 to be kept in)."""
    found = {e.name: e for e in errors}
    consumers, returned = low.consumers(), {id(t) for t in low.outputs}
    unsafe = {}
    for layer in low.layers:
        e = found.get(layer.name)
        if e is None or not all(t.dtype.is_floating_point for t in layer.outputs):
            continue
        sources = [found[p.name] for p in _sources(layer, found)]
        if any(s.overflow for s in sources):
            continue
        carried = max((s.relative for s in sources), default=0.0)
        if e.overflow:
            unsafe[layer.name] = f"overflows: {e.overflow}"
        elif e.relative > tolerance and e.relative > GROWTH * carried \
                and e.max_abs > tolerance * _absorbing_scale(layer, returned, consumers, found):
            unsafe[layer.name] = (f"loses precision: relative error {e.relative:.2e} (tolerance {tolerance:.0e}; "
                                  f"its inputs' {carried:.2e})")
    return unsafe


def tensor_samples(samples: Sequence[Sequence[object]] | None) -> bool:
    """Whether there are calibration samples and every value of them is a tensor (an engine block's samples hold
    what its inputs held when the method ran: other values where an input is not a tensor)."""
    return bool(samples) and all(isinstance(x, torch.Tensor) for sample in samples for x in sample)


def check_samples(name: str, bindings: Sequence[InputBinding], samples: Sequence[Sequence[torch.Tensor]]) -> None:
    """EngineInputError (naming the sample, the input and the dim) where a calibration sample (of tensors) does not
    fit the engine's inputs in number or shape (dtype and device are converted when it runs); a warning where a
    float input is constant or holds NaN or infinity: ranges calibrated on it fit no real input."""
    for k, sample in enumerate(samples):
        if len(sample) != len(bindings):
            raise EngineInputError(f"engine {name!r}: calibration sample {k} has {len(sample)} inputs, the engine "
                                   f"takes {len(bindings)} ({', '.join(repr(b.name) for b in bindings)})")
        for i, (binding, value) in enumerate(zip(bindings, sample)):
            try:
                binding.check(i, torch.empty(value.shape, dtype=binding.dtype, device="meta"), "meta")
            except EngineInputError as e:
                raise EngineInputError(f"engine {name!r}: calibration sample {k}: {e}") from None
            if value.is_floating_point() and value.numel():
                finite = torch.isfinite(value)
                if not bool(finite.all()):
                    logger.warning("engine %s: calibration sample %d, input %d (%r) holds %d NaN or infinite values: "
                                   "calibration counts only the finite ones", name, k, i, binding.name,
                                   int((~finite).sum()))
                elif bool((value == value.flatten()[0]).all()):
                    logger.warning("engine %s: calibration sample %d, input %d (%r) is constant (every value %g): "
                                   "ranges calibrated on it fit no other input", name, k, i, binding.name,
                                   float(value.flatten()[0]))


def calibrated_build(convert: Callable[[], Network], bindings: Sequence[InputBinding], settings: BuildSettings,
                     name: str, samples: Sequence[Sequence[torch.Tensor]]) -> tuple[Engine, dict[str, str]]:
    """Build an engine in `settings.compute_dtype`, keeping in fp32 every layer that overflows or loses
    precision on the sample inputs; the engine and the kept layers (name -> why).

    `convert` makes a fresh network of the block (each build changes its network in place)."""
    reference = build_engine(convert(), bindings, dataclasses.replace(settings, compute_dtype=torch.float32),
                             f"{name}_fp32", plan=False).network
    tolerance = TOLERANCE[settings.compute_dtype]
    kept: dict[str, str] = {}
    for round_ in range(MAX_ROUNDS):
        engine = build_engine(convert(), bindings, dataclasses.replace(settings, keep_fp32=frozenset(kept)), name,
                              plan=False)
        new: dict[str, str] = {}
        for k, sample in enumerate(samples):
            try:
                errors = compare_networks(reference, engine.network, sample, settings.device)
            except EngineInputError as e:  # (a while loop past its iteration guard on random inputs, say)
                logger.warning("engine %s: calibration sample %d is skipped: the network refuses it (%s); give "
                               "calibration_inputs it runs on to check its precision there", name, k, e)
                continue
            for layer, why in unsafe_layers(engine.network, errors, tolerance).items():
                if layer not in kept:
                    new.setdefault(layer, why)
                    continue
                # Kept in fp32 and still wrong: its inputs were computed too coarsely for it (a cancellation
                # after a low-precision sum); keep the float layers it reads in fp32 too. Only those: walking on
                # past layers kept already spread fp32 over ResNeSt's split attention (3 layers -> 32 in 8 rounds).
                reader = next(x for x in engine.network.layers if x.name == layer)
                for source in _sources(reader, {e.name for e in errors}):
                    if source.name not in kept and not isinstance(source, L.ConstantLayer):
                        new.setdefault(source.name, f"its value is read by {layer!r}, which {why}")
        if not new:
            ship(engine, settings.device)  # checked against the loader's ceilings, then planned
            return engine, kept
        logger.debug("calibration round %d of engine %s: keeping %s in float32", round_ + 1, name, sorted(new))
        kept.update(new)
    engine = build_engine(convert(), bindings, dataclasses.replace(settings, keep_fp32=frozenset(kept)), name)
    logger.warning("engine %s: precision calibration stopped after %d rounds; %d layers kept in float32", name,
                   MAX_ROUNDS, len(kept))
    return engine, kept
