"""Shape analysis: run the lowered graph once on example inputs and record every top-level
tensor's shape, dtype and device, so each block boundary is known before conversion.

Lowering's passes run again on what it finds (compiler._prepare), and partitioning reads it. The examples mirror
the method's arguments (tensors, or tuples, lists and dicts of them): `example_args`. Only top-level values are
recorded: values inside If/Loop bodies never cross an engine boundary, since those bodies run in PyTorch."""
from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Sequence
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from torchkiln.errors import cause_line
from torchkiln.settings import Input
from torchkiln.torchscript import Graph, TensorMeta, is_tensor_type, value_key

logger = logging.getLogger("torchkiln.analysis")


def example_args(signature: tuple[Any, ...], device: torch.device, which: str = "opt") -> list[Any]:
    """Random arguments of the signature's structure, each tensor at its Input's min, opt or max shape."""
    def build(spec: Any) -> Any:
        if isinstance(spec, Input):
            return spec.example(device, which)
        if isinstance(spec, dict):
            return {k: build(s) for k, s in spec.items()}
        return type(spec)(build(s) for s in spec)

    return [build(spec) for spec in signature]


def _holds_shapes(t: torch._C.JitType) -> bool:
    return is_tensor_type(t) or (isinstance(t, torch._C.ListType) and is_tensor_type(t.getElementType()))


def _may_be_uninitialized(v: torch._C.Value) -> bool:
    """A value TorchScript may leave uninitialized (a variable set on one path only); it cannot be returned."""
    node = v.node()
    if node.kind() == "prim::Uninitialized":
        return True
    if node.kind() in ("prim::If", "prim::Loop"):
        index = list(node.outputs()).index(v)
        return any(_may_be_uninitialized(list(b.outputs())[index + (1 if node.kind() == "prim::Loop" else 0)])
                   for b in node.blocks())
    return False


def _length_varies(v: torch._C.Value) -> bool:
    """A list of tensors whose length the example run does not settle: one read from a module attribute (what
    freezing leaves as an attribute is written in the method, maybe by a loop of run-time length) or made by a
    loop or branch that stayed (its trip count or condition is known only at run time)."""
    return isinstance(v.type(), torch._C.ListType) and v.node().kind() in ("prim::GetAttr", "prim::Loop", "prim::If")


def describe_examples(examples: Any) -> str:
    """Example inputs as their shapes and dtypes, e.g. `(1, 3, 8, 8) float16, [(2, 4) int64]`."""
    if isinstance(examples, torch.Tensor):
        return f"{tuple(examples.shape)} {str(examples.dtype).removeprefix('torch.')}"
    if isinstance(examples, dict):
        return "{" + ", ".join(f"{k!r}: {describe_examples(v)}" for k, v in examples.items()) + "}"
    if isinstance(examples, (tuple, list)):
        inner = ", ".join(describe_examples(v) for v in examples)
        return f"[{inner}]" if isinstance(examples, list) else f"({inner})"
    return repr(examples)


def probe_values(graph: Graph, module: torch.jit.ScriptModule | None, example_inputs: Sequence[Any],
                 values: Sequence[torch._C.Value], fake: bool = False) -> list[Any]:
    """Run the graph on example inputs and return what each of `values` (top-level values of the graph) holds
    (with `fake`, under FakeTensorMode: shapes, dtypes and devices only, whatever the inputs' values).

    Raises ValueError when the graph cannot run on these inputs."""
    originals = list(graph.inputs()) + [o for n in graph.nodes() for o in n.outputs()]
    probe = graph.copy()
    copies = list(probe.inputs()) + [o for n in probe.nodes() for o in n.outputs()]
    copy_of = {value_key(orig): copy for orig, copy in zip(originals, copies)}
    for i in reversed(range(len(list(probe.outputs())))):
        probe.eraseOutput(i)
    for v in values:
        probe.registerOutput(copy_of[value_key(v)])
    probe.makeMultiOutputIntoTuple()
    _bound_loops(probe, probe.block())
    takes_self = len(list(graph.inputs())) == len(example_inputs) + 1
    fn = torch._C._create_function_from_graph("torchkiln_shape_probe", probe)
    # a copy: a forward that updates the module's own state (a buffer written in place, a counter) must not have
    # run once more in the compiled module than in eager
    args = ([copy.deepcopy(module)._c] if takes_self else []) + list(example_inputs)
    try:
        with torch.no_grad(), (FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()):
            results = fn(*args)
    except RuntimeError as e:
        given = ", ".join(describe_examples(x) for x in example_inputs)
        raise ValueError(f"inputs: running the method on random example inputs {given} failed ({cause_line(e)}); "
                         f"check that the Input shapes and dtypes are ones the model accepts, or give the Input a "
                         f"tensor_domain of values it accepts") from e
    return list(results) if isinstance(results, tuple) else [results]


PROBE_TRIPS = 1000  # iterations a loop of run-time length (a while loop) runs at most in a probe


def _bound_loops(graph: Graph, block: torch._C.Block) -> None:
    """Each loop of `block` (and of the blocks inside) whose trip count is not a constant within PROBE_TRIPS runs at
    most PROBE_TRIPS times: a while loop's end depends on its values, and on random example inputs it may never
    come (a halving loop with a random step ran without end). A probe records shapes, dtypes and devices; those a
    loop carries keep theirs each iteration (a loop whose shapes grow is of run-time length, and stays in PyTorch)."""
    for node in block.nodes():
        for inner in node.blocks():
            _bound_loops(graph, inner)
        if node.kind() != "prim::Loop":
            continue
        trips = node.inputsAt(0)
        if trips.node().kind() == "prim::Constant" and trips.toIValue() <= PROBE_TRIPS:
            continue
        with graph.insert_point_guard(node):
            bounded = graph.insert("prim::min", [trips, graph.insertConstant(PROBE_TRIPS)])
        node.replaceInput(0, bounded)


def analyze_shapes(graph: Graph, module: torch.jit.ScriptModule | None,
                   example_inputs: Sequence[Any]) -> dict[int, TensorMeta | list[TensorMeta]]:
    """TensorMeta for every tensor-typed value of the graph's top-level block (value_key -> meta), and a
    list of them for every Tensor[] value."""
    inputs = list(graph.inputs())
    originals = inputs + [o for n in graph.nodes() for o in n.outputs()]
    # Constants are known and unread values sit at no boundary (and may be undefined tensors): never probed. An
    # input the method never reads is still one of a whole-method engine's bindings.
    picked = [orig for orig in originals
              if _holds_shapes(orig.type()) and not _may_be_uninitialized(orig)
              and orig.node().kind() != "prim::Constant" and (bool(orig.uses()) or orig in inputs)
              and not _length_varies(orig)]
    try:
        results = probe_values(graph, module, example_inputs, picked)
    except ValueError as e:
        # Random values may fall outside an op's domain (cholesky of a matrix that is not positive definite,
        # binary_cross_entropy outside [0, 1]): shapes do not depend on them, so infer shapes only. A graph whose
        # shapes do depend on its values (nonzero, a tensor read as a number) fails this too: the first error.
        try:
            results = probe_values(graph, module, example_inputs, picked, fake=True)
        except Exception:  # noqa: BLE001 - any failure of the shape-only run: the real run's error says more
            raise e from None
        logger.debug("shape analysis inferred shapes only (meta kernels): %s", e)
    metas = {}
    for orig, value in zip(picked, results):
        if isinstance(value, torch.Tensor):
            metas[value_key(orig)] = TensorMeta.of(value)
        elif isinstance(value, list):  # Tensor[] (chunk, split, unbind...): one meta per element
            metas[value_key(orig)] = [TensorMeta.of(t) for t in value]
    logger.debug("shape analysis recorded %d tensors", len(metas))
    return metas
