"""The CUDA backend's runner: a plan bound to one GPU, replayed as one CUDA graph per input shape.

- Made once per engine and device: weights moved to the GPU once, convolution kernels in channels-last where
  the plan says so (cuDNN then keeps activations channels-last through the stack); a 4-D input such a
  convolution reads is taken channels-last (`channels_last_inputs`): the graph's first work converts it, from the
  buffer a call copies the input into as it comes.
- Per input-shape signature (every shape for a static engine; a bounded least-recently-used set of
  `MAX_GRAPHS` for a dynamic one): symbolic layer parameters are evaluated, a step whose layers depend on the
  input shapes alone becomes its values, computed then (`runtime/fold_shapes.py`), every step's callable is made,
  a dry run compiles the generated kernels side by side (`_Bound.compile_ahead`), the steps run once eagerly, then
  are captured as one CUDA graph on a private memory pool. Later calls copy the inputs into the graph's input
  buffers and replay it.
- Outputs (`_Tail`): a call hands out memory no later call overwrites while the caller can still reach it. Where
  the outputs are large (`DIRECT_BYTES`) and made by the last few steps (`TAIL_STEPS`), those steps are captured
  apart, as up to `TAILS` tail graphs, each on a memory pool of its own: a call replays the main graph, then a tail
  whose outputs no caller holds any more (the storages' use counts), and hands its outputs out without a copy.
  Where every tail's outputs are still held (a caller keeping each call's outputs), the tail's steps run uncaptured
  into fresh memory. Elsewhere the outputs are copied out of the one graph (a small copy, against a second graph
  launch). An output sharing memory with an input, a weight or the main graph's buffers is always copied. A
  tail replayed on another stream than the one its outputs were last handed out on first waits for that stream's
  work so far (what the caller queued there before letting them go).
- A call runs on the caller's current stream and never waits for the host. Calls from several threads are
  serialized by a lock around the few launches a call makes; a call on another stream than the last call's first
  waits (on the GPU, through an event recorded on that stream) for the previous call's work to finish with the
  shared buffers.
- Where capture fails (a step synchronizes with the host), the runner logs a warning once and runs that
  engine's steps eagerly from then on; the values are the same.
- Control flow (control_flow.py: branches and bodies run by their own plans): a conditional or loop layer whose
  course the input shapes decide (`ir/shape_only.py`: a predicate on dims, a for loop's trip count) is decided when
  the shapes are bound, so its step reads nothing on the host and the graph captured for a shape holds the branch
  (or the iterations) that shape takes. An engine holding a conditional or loop whose condition is computed from
  data is never captured: the layer reads its condition on the host (`captures_graphs`).
"""
from __future__ import annotations

import contextlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch

from torchkiln.errors import cause_line
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.ir.symbolic import DimSymbol
from torchkiln.runtime.backends.base import BackendOptions, BackendUnavailable
from torchkiln.runtime.backends.cuda import control_flow, quant_kernels  # noqa: F401  (quant_kernels registers makers)
from torchkiln.runtime.backends.cuda.capture import ONE_CAPTURE, graph_capture
from torchkiln.runtime.backends.cuda.codegen import chained, chains_steps, compiling_ahead
from torchkiln.runtime.backends.cuda.kernels import (StepFn, StepLayers, channels_last_input, make_step,
                                                    takes_channels_last)
from torchkiln.runtime.executor import may_alias_storage
from torchkiln.runtime.fold_shapes import ShapeFolding, precomputed
from torchkiln.runtime.plan import Plan, slots
from torchkiln.runtime.symbols import SymbolBinder

logger = logging.getLogger(__name__)

MAX_GRAPHS = 16  # input-shape signatures kept captured per engine and device
MAX_DRY_RUNS = 1024  # input-shape signatures whose first call runs a dry run first (`_Bound.compile_ahead`)
DIRECT_BYTES = 4 << 20  # outputs at least this large are handed out of tail graphs, not copied (a copy of 32 MiB
# took 23 us on an H100; a tail costs a second graph launch: a threshold chosen, not a measured crossover)
TAIL_STEPS = 4  # steps from the first one making an output to the end that a tail may hold (each tail's pool keeps
# their memory: a short tail keeps that near the outputs' own size)
TAILS = 2  # tail graphs per input shape: a caller keeping the last call's outputs while it calls again gets the other


class _Bound:
    """The steps for one input-shape signature, and (once captured) their CUDA graph and tails."""

    def __init__(self, fns: list[tuple[StepFn, list[int], list[int], list[int]]], num_slots: int,
                 num_inputs: int, output_slots: list[int], capturable: bool = True,
                 persistent: frozenset[int] = frozenset(), links: frozenset[int] = frozenset(),
                 generated: bool = False) -> None:
        self.fns = fns
        self.compiles = generated  # a step launches generated kernels, compiled at its first run (`compile_ahead`)
        self.links = links  # steps whose generated kernels are launched chained to the step before (`codegen.chained`)
        self.persistent = persistent  # storages (data pointers) of the weights and folded values the steps read
        self.capturable = capturable  # False where a decided loop runs too many iterations to hold in a graph
        self.num_slots = num_slots
        self.num_inputs = num_inputs
        self.output_slots = output_slots
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: list[torch.Tensor] = []
        self.static_outputs: list[torch.Tensor] = []
        made = [k for k, (_, _, outs, _) in enumerate(fns) if set(outs) & set(output_slots)]
        self.tail_start = made[0] if made else len(fns)  # the first step making an output
        self.handoff: list[torch.Tensor | None] | None = None  # the main graph's live values, where tails run
        self.tails: list[_Tail] = []
        self.tail_limit = TAILS  # fewer where capturing one failed
        self.channels_last: tuple[int, ...] = ()  # inputs the first step converts to channels-last (in the graph)

    def run_eagerly(self, inputs: Sequence[torch.Tensor],
                    visit: Callable[[int], None] | None = None) -> list[torch.Tensor]:
        """The steps launched one by one; `visit(k)` after step k's launch (per-step timing: runtime/profile.py)."""
        values: list[torch.Tensor | None] = [None] * self.num_slots
        values[: self.num_inputs] = inputs
        return self._run(values, 0, visit)

    def compile_ahead(self, inputs: Sequence[torch.Tensor]) -> None:
        """A dry run of the steps in which generated kernels run nothing but are compiled side by side
        (`codegen.compiling_ahead`), so that the first run finds them compiled rather than compiling them one by one.
        Each value a step makes is zeroed after it (a generated step's is never written), so that no later step reads
        garbage as an index or a loop count. Memory of an input, a weight or a folded value is never written. Where
        the dry run fails, the first run does its work and raises its error."""
        owned = self.persistent | {x.untyped_storage().data_ptr() for x in inputs}
        values: list[torch.Tensor | None] = [None] * self.num_slots
        values[: self.num_inputs] = inputs

        def zero_made(k: int) -> None:
            for slot in self.fns[k][2]:
                value = values[slot]
                if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() not in owned:
                    value.untyped_storage().fill_(0)

        try:
            with compiling_ahead():
                self._run(values, 0, zero_made)
        except Exception as e:  # noqa: BLE001 - the first run raises it again, with the steps' own errors
            logger.debug("a dry run to compile generated kernels ahead stopped: %s: %s", type(e).__name__, e)
        self.compiles = False

    def _run(self, values: list[torch.Tensor | None], start: int, visit: Callable[[int], None] | None = None,
             stop: int | None = None) -> list[torch.Tensor]:
        """Steps `start` to `stop` (the end) on `values` (changed in place); the outputs where run to the end. Run
        from the first step, the `channels_last` inputs are converted first (inside the graph where captured)."""
        if start == 0:
            for i in self.channels_last:
                values[i] = channels_last_input(values[i])
        for k in range(start, len(self.fns) if stop is None else stop):
            fn, ins, outs, frees = self.fns[k]
            if k in self.links and k != start:
                with chained(True):
                    made = fn([values[i] for i in ins])
            else:
                made = fn([values[i] for i in ins])
            for slot, value in zip(outs, made):
                values[slot] = value
            for slot in frees:
                values[slot] = None
            if visit is not None:
                visit(k)
        return [values[s] for s in self.output_slots] if stop is None else []

    def capture(self, inputs: Sequence[torch.Tensor], pool: object, tails: bool) -> None:
        """Capture the steps as one graph, or (`tails`) those before the tail as the main graph and the tail as its
        first tail graph. The eager call just before it did the lazy work (cuDNN's algorithm choice, Triton's
        compiles, weight casts), so it is not warmed up again. Its buffers are normal tensors, whatever the call's
        mode: a first call under torch.inference_mode would make them inference tensors, which a later call outside
        it could not copy its inputs into, nor use the outputs a tail hands out in place."""
        with _normal_tensors():
            self.static_inputs = [x.clone() for x in inputs]
        values: list[torch.Tensor | None] = [None] * self.num_slots
        values[: self.num_inputs] = self.static_inputs
        if tails and self.tail_start == 0:  # nothing before the tail: no main graph
            self.handoff = values
            self.add_tail()
            return
        graph = torch.cuda.CUDAGraph()
        with _normal_tensors(), graph_capture(graph, pool):
            if tails:
                self._run(values, 0, stop=self.tail_start)
            else:
                self.static_outputs = self._run(values, 0)
        self.graph = graph
        if tails:
            self.handoff = values
            self.add_tail()

    @property
    def captured(self) -> bool:
        return self.graph is not None or self.handoff is not None

    def add_tail(self) -> _Tail:
        """A new tail graph on a pool of its own, captured from the main graph's live values."""
        graph = torch.cuda.CUDAGraph()
        with _normal_tensors(), graph_capture(graph, torch.cuda.graph_pool_handle()):
            outputs = self._run(list(self.handoff), self.tail_start)  # (the list dies here: no temporary holds)
        # an output in memory that outlives the call (the main graph's, a weight's, a folded value's) is copied
        kept = {v.untyped_storage().data_ptr() for v in self.handoff if v is not None} | self.persistent
        tail = _Tail(graph, outputs, [o.untyped_storage().data_ptr() in kept for o in outputs])
        self.tails.append(tail)
        return tail

    def free_tail(self) -> _Tail | None:
        """A tail whose outputs no caller holds, captured anew while there are fewer than `TAILS`."""
        tail = next((t for t in self.tails if not t.held()), None)
        if tail is None and len(self.tails) < self.tail_limit:
            try:
                tail = self.add_tail()
            except RuntimeError as e:  # (out of memory): the tail runs uncaptured, as where every tail is held
                self.tail_limit = len(self.tails)
                logger.warning("a tail graph could not be captured, so held outputs' calls run their last steps "
                               "uncaptured: %s", cause_line(e))
        return tail

    def run_tail_eagerly(self) -> list[torch.Tensor]:
        """The tail's steps, uncaptured, on the main graph's live values: outputs in fresh memory (those sharing
        the main graph's buffers copied)."""
        outputs = self._run(list(self.handoff), self.tail_start)
        return [o.clone() if shared else o for o, shared in zip(outputs, self.tails[0].shared)]


@contextlib.contextmanager
def _normal_tensors() -> Iterator[None]:
    """Tensors made inside are normal ones (not inference tensors), without autograd history."""
    with torch.inference_mode(False), torch.no_grad():
        yield


def _use_count(t: torch.Tensor) -> int:
    """How many tensors (views included) hold `t`'s storage."""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _Tail:
    """A tail graph: the last steps, captured on a pool of their own, and their outputs, handed out to callers."""

    def __init__(self, graph: torch.cuda.CUDAGraph, outputs: list[torch.Tensor], shared: list[bool]) -> None:
        self.graph = graph
        self.outputs = outputs
        self.shared = shared  # per output: its storage is one of the main graph's (always copied out)
        self.baseline = [_use_count(o) for o in outputs]  # the tail's own holds (its outputs' only holders now)
        self.memory = [o.data_ptr() for o in outputs]  # where the graph writes them
        self.stream: torch.cuda.Stream | None = None  # the stream of the call its outputs were last handed out by

    def held(self) -> bool:
        """Whether a caller still holds an output (or a view of one) a call handed out; always, once a caller resized
        an output's storage (`resize_` through its alias moves the memory, and the graph writes the old one)."""
        return any(not shared and (_use_count(o) > base or o.data_ptr() != at)
                   for o, shared, base, at in zip(self.outputs, self.shared, self.baseline, self.memory))

    def replay(self, may_alias: Sequence[bool], stream: torch.cuda.Stream) -> list[torch.Tensor]:
        """Replay on `stream`, and hand the outputs out (an alias of each, so the use count sees the caller's hold).
        Outputs last handed out on another stream may still be read there by work the caller queued before letting
        them go, so `stream` first waits for that stream's work so far (as the caching allocator reuses a tensor's
        memory freed on its own stream only)."""
        if self.stream is not None and self.stream != stream:
            done = torch.cuda.Event()
            done.record(self.stream)
            stream.wait_event(done)
        self.stream = stream
        self.graph.replay()
        return [o.clone() if shared or alias else o.detach()
                for o, shared, alias in zip(self.outputs, self.shared, may_alias)]


def captures_graphs(network: Network, plan: Plan) -> bool:
    """Whether the network's steps may be captured as a CUDA graph: not where a conditional or loop layer reads its
    condition on the host (control_flow.py); such an engine runs its steps one by one. A layer whose course the
    input shapes decide (in its own step, its sub-networks the same all the way down) reads nothing there."""
    decided = control_flow.decided_layers(network, plan.steps)
    return control_flow.decided_only(network) and all(
        k in decided for k, step in enumerate(plan.steps) if any(network.layers[j].SUBNETWORKS for j in step.layers))


def place_weights(network: Network, plan: Plan, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Every layer's weights on `device`, convolution kernels channels-last where the plan says so."""
    channels_last = {j for step in plan.steps if plan.kernels[step.kernel].option("channels_last")
                     for j in step.layers}
    return [{k: placed_weight(w, device, j in channels_last and k == "kernel") for k, w in layer.weights.items()}
            for j, layer in enumerate(network.layers)]


def bind_steps(network: Network, plan: Plan, weights: list[dict[str, torch.Tensor]], binder: SymbolBinder | None,
               shapes: Sequence[tuple[int, ...]], device: torch.device, allow_tf32: bool,
               bindings: Mapping[DimSymbol, int] | None = None, chain: bool = False) -> _Bound:
    """The plan's steps as callables for these input shapes (symbolic parameters evaluated; a step of
    shape-only layers replaced by its values, computed now: runtime/fold_shapes.py; a control-flow layer whose
    course the shapes decide given that course: control_flow.py). The symbols' values are `binder`'s for the
    shapes, else `bindings` (a sub-network's: its outer network's). With `chain`, a generated step right after
    another launches its kernels chained to that step's (`codegen.chained`)."""
    bindings = binder.bind(shapes) if binder is not None else dict(bindings or {})
    slot_of = slots(network)
    tensor_at = {s: tid for tid, s in slot_of.items()}
    io = plan.io(network)

    def specialize(layer: L.Layer) -> L.Layer:
        return binder.specialize(layer, bindings) if binder is not None else layer

    folding = ShapeFolding(network, plan.steps)
    folded = folding.fold(io, tensor_at, bindings, specialize, weights, device)
    decisions = control_flow.decisions(network, plan.steps,
                                       lambda tensors: folding.values(tensors, bindings, specialize, weights, device))
    decided = {k: d for k, d in decisions.items() if k not in folded and control_flow.capturable(d)}
    returned = {slot_of[id(t)] for t in network.outputs}
    fns = []
    for k, (step, sio) in enumerate(zip(plan.steps, io)):
        if k in folded:
            fns.append((precomputed(folded[k], [s in returned for s in sio.outputs]), [], list(sio.outputs),
                        list(sio.frees)))
            continue
        layers = [specialize(network.layers[j]) for j in step.layers]
        # specialized layers (dataclasses.replace) share their tensors with the originals, so ids agree
        own = StepLayers(layers, [weights[j] for j in step.layers], [tensor_at[s] for s in sio.inputs],
                         [tensor_at[s] for s in sio.outputs], device)
        fn = control_flow.layer_step(own, decided.get(k), bindings, allow_tf32) if len(layers) == 1 and \
            layers[0].SUBNETWORKS else make_step(own, plan.kernels[step.kernel], allow_tf32)
        fns.append((fn, list(sio.inputs), list(sio.outputs), list(sio.frees)))
    persistent = frozenset(t.untyped_storage().data_ptr() for t in
                           [*(w for ws in weights for w in ws.values()), *(v for vs in folded.values() for v in vs)]
                           if isinstance(t, torch.Tensor))
    generated = [k not in folded and plan.kernels[step.kernel].kind == "generated" for k, step in enumerate(plan.steps)]
    links = frozenset(k for k in range(1, len(fns)) if chain and generated[k] and generated[k - 1])
    return _Bound(fns, len(slot_of), len(network.inputs), [slot_of[id(t)] for t in network.outputs],
                  capturable=all(k in decided or k in folded for k in decisions), persistent=persistent, links=links,
                  generated=any(generated))


class CudaRunner:
    """A network's CUDA plan bound to one GPU."""

    def __init__(self, network: Network, plan: Plan, device: torch.device, options: BackendOptions) -> None:
        if device.type != "cuda" or not torch.cuda.is_available():
            raise BackendUnavailable(f"the cuda backend needs a CUDA device, not {device}")
        self.network = network
        self.plan = plan
        self.device = device
        self.options = options
        with torch.cuda.device(device):
            self.weights = place_weights(network, plan, device)
        self.binder = SymbolBinder.for_network(network)
        self.may_alias = [may_alias_storage(t) for t in network.outputs]
        self.channels_last = channels_last_inputs(network, plan)
        self._bound: OrderedDict[tuple, _Bound] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = None
        self._last_stream: torch.cuda.Stream | None = None  # the stream the last call queued its work on
        # A dry run (`compile_ahead`) only where no step reads a value on the host: a loop whose condition a generated
        # kernel computes would run on the condition's uninitialized memory, for as long as that says
        self._dry_runs = captures_graphs(network, plan)
        self._graphs = options.cuda_graphs and self._dry_runs
        self._compiled: set[tuple] = set()  # input shapes whose steps' kernels a dry run compiled (`compile_ahead`)

    def bind(self, inputs: Sequence[torch.Tensor]) -> _Bound:
        """The plan's steps for these inputs' shapes, converting the channels-last inputs first."""
        bound = bind_steps(self.network, self.plan, self.weights, self.binder, [tuple(x.shape) for x in inputs],
                           self.device, self.options.allow_tf32, chain=chains_steps(self.device, self._graphs))
        bound.channels_last = tuple(i for i, last in enumerate(self.channels_last) if last)
        return bound

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        key = tuple(tuple(x.shape) for x in inputs)  # dtypes are the bindings' (checked by the engine)
        with self._lock:
            bound = self._bound.get(key)
            if bound is None:
                bound = self._bound[key] = self.bind(inputs)
                if not self._dry_runs or key in self._compiled or len(self._compiled) >= MAX_DRY_RUNS:
                    bound.compiles = False  # (or bound again after it left the cache: its kernels are compiled)
                else:
                    self._compiled.add(key)
                while len(self._bound) > MAX_GRAPHS:
                    self._bound.popitem(last=False)
            else:
                self._bound.move_to_end(key)
            stream = torch.cuda.current_stream(self.device)
            if self._last_stream is not None and stream != self._last_stream:
                # the previous call's work, queued on another stream, is done with the buffers first (on one stream
                # the order does it: an event's record and wait cost 10-16 us of host time a call)
                done = torch.cuda.Event()
                done.record(self._last_stream)
                stream.wait_event(done)
            self._last_stream = stream
            if not bound.captured and self._graphs and bound.capturable:
                outputs = self._first_call(bound, inputs)
            elif not bound.captured:
                if bound.compiles:
                    bound.compile_ahead(inputs)
                outputs = self._fresh(bound.run_eagerly(inputs))
            else:
                if len(inputs) > 1:  # one launch for all
                    torch._foreach_copy_(bound.static_inputs, inputs)
                elif inputs:
                    bound.static_inputs[0].copy_(inputs[0])
                if bound.graph is not None:
                    bound.graph.replay()
                outputs = self._outputs(bound, stream)
        return outputs

    def _first_call(self, bound: _Bound, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run eagerly, then capture the graph for later calls (or, where capture fails, stop using graphs); while
        no other thread captures (capture.py)."""
        with ONE_CAPTURE:
            if bound.compiles:
                bound.compile_ahead(inputs)
            outputs = bound.run_eagerly(inputs)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            big = sum(o.nbytes for o, alias in zip(outputs, self.may_alias) if not alias) >= DIRECT_BYTES
            try:
                bound.capture(inputs, self._pool, big and len(bound.fns) - bound.tail_start <= TAIL_STEPS)
            except RuntimeError as e:
                bound.graph, bound.handoff, bound.tails = None, None, []
                self._graphs = False
                logger.warning("engine %s: CUDA graph capture failed, so its steps run one by one from now on: %s",
                               self.network.name, cause_line(e))
        return self._fresh(outputs)

    def _outputs(self, bound: _Bound, stream: torch.cuda.Stream) -> list[torch.Tensor]:
        """A replayed main graph's outputs: its copied outputs, a free tail's outputs, else the tail run uncaptured."""
        if bound.handoff is None:
            return [o.clone() for o in bound.static_outputs]
        tail = bound.free_tail()
        return tail.replay(self.may_alias, stream) if tail is not None else self._fresh(bound.run_tail_eagerly())

    def _fresh(self, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Outputs that may share memory with an input or a weight, copied (as the reference executor does)."""
        return [o.clone() if copy else o for o, copy in zip(outputs, self.may_alias)]


def channels_last_inputs(network: Network, plan: Plan) -> list[bool]:
    """Per network input: whether the runner takes it channels-last (planner rule 7): it is 4-D, a channels-last
    convolution reads it, and every other step reading it is one too or a generated kernel (which reads any
    layout). It is converted once, where the convolution would have, as the first work of the CUDA graph: a call
    only copies it as it comes into the graph's buffer (a converting copy launched from Python, the generated kernel
    of codegen/layout.py, held a depthwise-separable block's [32,128,56,56] fp16 call on the host at 133 us a call
    against 94 us of GPU work, H100). An input no convolution reads stays as it comes (a layout-changing copy of a
    squeeze-excitation's [32,240,28,28] fp16 input took 42 us of its 87 on an H100, the block's own kernels 27)."""
    takes, others = set(), set()
    for step in plan.steps:
        kernel = plan.kernels[step.kernel]
        lead = network.layers[step.layers[0]]
        made = {id(t) for j in step.layers for t in network.layers[j].outputs}
        reads = {id(t) for j in step.layers for t in network.layers[j].inputs if id(t) not in made}
        if takes_channels_last(kernel, lead):
            takes.add(id(lead.inputs[0]))
            others |= reads - {id(lead.inputs[0])} if kernel.op not in ("conv_epilogue", "gemm", "depthwise") \
                else set()
        elif kernel.kind != "generated":
            others |= reads
    return [t.rank == 4 and id(t) in takes and id(t) not in others for t in network.inputs]


def placed_weight(w: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    """A weight on `device`, channels-last if asked and 4-D (a 2-D convolution's kernel)."""
    w = w.to(device)
    return w.contiguous(memory_format=torch.channels_last) if channels_last and w.dim() == 4 else w
