"""The CUDA backend's runner: a plan bound to one GPU, replayed as one CUDA graph per input shape.

- Made once per engine and device: weights moved to the GPU once, convolution kernels in channels-last where
  the plan says so (cuDNN then keeps activations channels-last through the stack); a 4-D input such a
  convolution reads is taken channels-last (`channels_last_inputs`).
- Per input-shape signature (every shape for a static engine; a bounded least-recently-used set of
  `MAX_GRAPHS` for a dynamic one): symbolic layer parameters are evaluated, a step whose layers depend on the
  input shapes alone becomes its values, computed then (`runtime/fold_shapes.py`), every step's callable is made,
  the steps run once eagerly (which also compiles generated kernels), then are captured as one CUDA graph on
  a private memory pool. Later calls copy the inputs into the graph's input buffers, replay it, and copy its
  outputs out, so an output of one call is never overwritten by a later call. The last steps that make large
  outputs are not captured: they run after the replay into fresh memory, so those outputs need no copy
  (`output_tail`).
- A call runs on the caller's current stream and never waits for the host. Calls from several threads are
  serialized by a lock around the few launches a call makes; a call on another stream first waits (on the
  GPU, through an event) for the previous call's replay to finish with the shared buffers.
- Where capture fails (a step synchronizes with the host), the runner logs a warning once and runs that
  engine's steps eagerly from then on; the values are the same.
- An engine holding a conditional or loop layer is never captured: the layer reads its condition on the host
  (`captures_graphs`; its branches and body run by their own plans, control_flow.py).
"""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import torch

from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.backends.base import BackendOptions, BackendUnavailable
from torchkiln.runtime.backends.cuda import control_flow, quant_kernels  # noqa: F401  (register their kernels)
from torchkiln.runtime.backends.cuda.codegen.layout import copy_to_channels_last
from torchkiln.runtime.backends.cuda.kernels import (StepFn, StepLayers, channels_last_input, make_step,
                                                    takes_channels_last)
from torchkiln.runtime.executor import may_alias_storage
from torchkiln.runtime.fold_shapes import ShapeFolding, precomputed
from torchkiln.runtime.plan import Plan, slots
from torchkiln.runtime.symbols import SymbolBinder

logger = logging.getLogger(__name__)

MAX_GRAPHS = 16  # input-shape signatures kept captured per engine and device
MIN_TAIL_BYTES = 4 << 20  # a network output this large is made after the replay (`output_tail`)
MAX_TAIL = 4  # steps run after the replay at most


class _Bound:
    """The steps for one input-shape signature, and (once captured) their CUDA graph: every step but an output
    tail (`output_tail`), which runs after each replay and writes the outputs it makes into fresh memory."""

    def __init__(self, fns: list[tuple[StepFn, list[int], list[int], list[int]]], num_slots: int,
                 num_inputs: int, output_slots: list[int], fresh: Sequence[bool] = ()) -> None:
        self.fns = fns
        self.fresh = list(fresh) or [False] * len(fns)  # per step: its outputs are new memory (no view, no constant)
        self.num_slots = num_slots
        self.num_inputs = num_inputs
        self.output_slots = output_slots
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_inputs: list[torch.Tensor] = []
        self.static_values: list[torch.Tensor | None] = []
        self.tail = len(fns)  # the first step not captured
        self.static_storages: set[int] = set()

    def _run(self, values: list[torch.Tensor | None], start: int, stop: int,
             visit: Callable[[int], None] | None = None) -> None:
        for k in range(start, stop):
            fn, ins, outs, frees = self.fns[k]
            for slot, value in zip(outs, fn([values[i] for i in ins])):
                values[slot] = value
            for slot in frees:
                values[slot] = None
            if visit is not None:
                visit(k)

    def run_eagerly(self, inputs: Sequence[torch.Tensor],
                    visit: Callable[[int], None] | None = None) -> list[torch.Tensor]:
        """The steps launched one by one; `visit(k)` after step k's launch (per-step timing: runtime/profile.py)."""
        values: list[torch.Tensor | None] = [None] * self.num_slots
        values[: self.num_inputs] = inputs
        self._run(values, 0, len(self.fns), visit)
        return [values[s] for s in self.output_slots]

    def capture(self, inputs: Sequence[torch.Tensor], pool: object, outputs: Sequence[torch.Tensor]) -> None:
        """Capture the steps before the output tail as one graph. The eager call just before it (which made
        `outputs`) did the lazy work (cuDNN's algorithm choice, Triton's compiles, weight casts), so it is not
        warmed up again."""
        self.tail = output_tail(self.fns, self.fresh, self.output_slots, outputs)
        self.static_inputs = [x.clone() for x in inputs]
        values: list[torch.Tensor | None] = [None] * self.num_slots
        values[: self.num_inputs] = self.static_inputs
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self._run(values, 0, self.tail)
        self.static_values = values
        self.static_storages = {v.untyped_storage().data_ptr() for v in values if v is not None}
        self.graph = graph

    def replay(self) -> list[torch.Tensor]:
        """Replay the graph, run the output tail, and return the outputs: those the graph wrote copied out (a later
        replay overwrites them), those the tail made as they are unless they are views of the graph's memory."""
        self.graph.replay()
        values = list(self.static_values)
        self._run(values, self.tail, len(self.fns))
        outputs = [values[s] for s in self.output_slots]
        return [o.clone() if o.untyped_storage().data_ptr() in self.static_storages else o for o in outputs]


def output_tail(fns: Sequence[tuple[StepFn, list[int], list[int], list[int]]], fresh: Sequence[bool],
                output_slots: Sequence[int], outputs: Sequence[torch.Tensor]) -> int:
    """The first step of the output tail: the last steps (at most `MAX_TAIL`), each a kernel that writes new memory
    (generated or a library call) making a network output of at least `MIN_TAIL_BYTES`. Run after the replay,
    they write those outputs into fresh memory, where a captured step would write the graph's and the call would
    copy them out: a full extra read and write of every large output (23 us of a 0.6 ms call for a
    [16,512,1024] fp16 output on an H100), for one launch of host time that a replay's GPU work hides."""
    large = {s for s, o in zip(output_slots, outputs) if o.numel() * o.element_size() >= MIN_TAIL_BYTES}
    tail = len(fns)
    while tail > 0 and len(fns) - tail < MAX_TAIL and fresh[tail - 1] and large & set(fns[tail - 1][2]):
        tail -= 1
    return tail


def captures_graphs(network: Network) -> bool:
    """Whether the network's steps may be captured as a CUDA graph: not where a conditional or loop layer reads its
    condition on the host (control_flow.py); such an engine runs its steps one by one."""
    return not any(layer.SUBNETWORKS for layer in network.layers)


def place_weights(network: Network, plan: Plan, device: torch.device) -> list[dict[str, torch.Tensor]]:
    """Every layer's weights on `device`, convolution kernels channels-last where the plan says so."""
    channels_last = {j for step in plan.steps if plan.kernels[step.kernel].option("channels_last")
                     for j in step.layers}
    return [{k: placed_weight(w, device, j in channels_last and k == "kernel") for k, w in layer.weights.items()}
            for j, layer in enumerate(network.layers)]


def bind_steps(network: Network, plan: Plan, weights: list[dict[str, torch.Tensor]], binder: SymbolBinder | None,
               shapes: Sequence[tuple[int, ...]], device: torch.device, allow_tf32: bool) -> _Bound:
    """The plan's steps as callables for these input shapes (symbolic parameters evaluated; a step of
    shape-only layers replaced by its values, computed now: runtime/fold_shapes.py)."""
    bindings = binder.bind(shapes) if binder is not None else {}
    slot_of = slots(network)
    tensor_at = {s: tid for tid, s in slot_of.items()}
    io = plan.io(network)

    def specialize(layer: L.Layer) -> L.Layer:
        return binder.specialize(layer, bindings) if binder is not None else layer

    folded = ShapeFolding(network, plan.steps).fold(io, tensor_at, bindings, specialize, weights, device)
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
        fns.append((make_step(own, plan.kernels[step.kernel], allow_tf32), list(sio.inputs), list(sio.outputs),
                    list(sio.frees)))
    fresh = [k not in folded and plan.kernels[step.kernel].kind in ("generated", "library")
             for k, step in enumerate(plan.steps)]
    return _Bound(fns, len(slot_of), len(network.inputs), [slot_of[id(t)] for t in network.outputs], fresh)


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
        self._last_call = torch.cuda.Event()  # recorded at the end of every call (a wait before any record is a no-op)
        self._graphs = options.cuda_graphs and captures_graphs(network)

    def _bind(self, inputs: Sequence[torch.Tensor]) -> _Bound:
        return bind_steps(self.network, self.plan, self.weights, self.binder, [tuple(x.shape) for x in inputs],
                          self.device, self.options.allow_tf32)

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        key = tuple(tuple(x.shape) for x in inputs)  # dtypes are the bindings' (checked by the engine)
        with self._lock:
            bound = self._bound.get(key)
            if bound is None:
                bound = self._bound[key] = self._bind(inputs)
                while len(self._bound) > MAX_GRAPHS:
                    self._bound.popitem(last=False)
            else:
                self._bound.move_to_end(key)
            stream = torch.cuda.current_stream(self.device)
            stream.wait_event(self._last_call)  # the previous call, maybe on another stream, is done with the buffers
            if bound.graph is None:  # (a replay's copy into its channels-last input buffers converts them)
                inputs = [channels_last_input(x) if last else x for x, last in zip(inputs, self.channels_last)]
            if bound.graph is None and self._graphs:
                outputs = self._first_call(bound, inputs)
            elif bound.graph is None:
                outputs = self._fresh(bound.run_eagerly(inputs))
            else:
                for static, x, last in zip(bound.static_inputs, inputs, self.channels_last):
                    if last:
                        copy_to_channels_last(x, static)
                    else:
                        static.copy_(x)
                outputs = bound.replay()
            self._last_call.record(stream)  # one event, re-recorded: a wait takes the record made before it
        return outputs

    def _first_call(self, bound: _Bound, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Run eagerly, then capture the graph for later calls (or, where capture fails, stop using graphs)."""
        outputs = bound.run_eagerly(inputs)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        try:
            bound.capture(inputs, self._pool, outputs)
        except RuntimeError as e:
            bound.graph = None
            self._graphs = False
            logger.warning("engine %s: CUDA graph capture failed, so its steps run one by one from now on: %s",
                           self.network.name, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return self._fresh(outputs)

    def _fresh(self, outputs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Outputs that may share memory with an input or a weight, copied (as the reference executor does)."""
        return [o.clone() if copy else o for o, copy in zip(outputs, self.may_alias)]


def channels_last_inputs(network: Network, plan: Plan) -> list[bool]:
    """Per network input: whether the runner takes it channels-last (planner rule 7): it is 4-D, a channels-last
    convolution reads it, and every other step reading it is one too or a generated kernel (which reads any
    layout). The copy into the CUDA graph's input buffer then converts it, once, where the convolution would
    have; an input no convolution reads stays as it comes (a layout-changing copy of a squeeze-excitation's
    [32,240,28,28] fp16 input took 42 us of its 87 on an H100, the block's own kernels 27)."""
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
