"""refit_module_weights: put a new model's weights into an existing compiled module's engines.

What it does, honestly: a torchkiln engine holds its weights after the builder's folds (batch norms folded into
convolution kernels, constants folded, weights narrowed to fp16/bf16), so new weights cannot be copied into
it one tensor at a time. Refit compiles the new model again with the settings the module was compiled with
(lowering, partitioning, conversion and the builder, which redoes every fold from the new parameters; in
fp16/bf16 precision calibration runs again on the new weights), checks that the result has the same
structure as the compiled module, and then writes the new engine bytes into the compiled module's engine
attributes in place. The module object, its code and its signature stay the same; callers holding it see the
new weights. It costs about as much as the compile did. Nothing is changed unless every check passes.

The checks: the new model's parameters and buffers have the names, shapes and dtypes of the compiled
model's (when the module was compiled in this process, which records them); the compiled graphs have the
same nodes; each engine has the same inputs and outputs and the same compute layers (kinds, parameters,
weight shapes); and the tensors the parts left in PyTorch hold as constants are unchanged (a weight used by
an op that runs in PyTorch is frozen into the module's code, which refit does not rewrite). A mismatch
raises RefitError naming the parameter, engine layer or node.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.compiler import CompileRecord, compile_with_report, parameter_signature
from torchkiln.errors import RefitError
from torchkiln.frontend import as_module
from torchkiln.ir import layers as L
from torchkiln.ir.network import Network
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.execute_op import engine_blob, engine_from_blob, engine_signature
from torchkiln.stitching.stitch import engine_attrs

logger = logging.getLogger("torchkiln")


def _check_parameters(old: dict[str, tuple[tuple[int, ...], torch.dtype]], module: torch.nn.Module) -> None:
    new = parameter_signature(module)
    for name in list(old) + [n for n in new if n not in old]:  # the module's order
        if name not in new:
            raise RefitError(f"parameter {name!r}: the compiled model has it (shape {list(old[name][0])}), "
                             f"the new model does not")
        if name not in old:
            raise RefitError(f"parameter {name!r}: the new model has it (shape {list(new[name][0])}), the "
                             f"compiled model does not")
        (old_shape, old_dtype), (new_shape, new_dtype) = old[name], new[name]
        if old_shape != new_shape:
            raise RefitError(f"parameter {name!r}: shape {list(new_shape)} in the new model, {list(old_shape)} in "
                             f"the compiled model")
        if old_dtype != new_dtype:
            raise RefitError(f"parameter {name!r}: dtype {new_dtype} in the new model, {old_dtype} in the compiled "
                             f"model")


def _engines(module: torch.jit.ScriptModule) -> list[tuple[str, Engine]]:
    return [(attr, engine_from_blob(getattr(module, attr))) for attr in engine_attrs(module)]


def _structure(network: Network) -> list[tuple[Any, ...]]:
    """The compute layers in order: name, kind, parameters, weight names and shapes. Casts and constants are
    left out: which layers run in fp16 and which in fp32 is the builder's choice, made again for new weights."""
    return [(layer.name, layer.KIND, repr(layer.params()),
             sorted((k, tuple(w.shape)) for k, w in layer.weights.items()))
            for layer in network.layers if not isinstance(layer, (L.CastLayer, L.ConstantLayer))]


def _check_engine(old: Engine, new: Engine) -> None:
    if engine_signature(old) != engine_signature(new):
        raise RefitError(f"engine {old.name!r}: the new model's engine has other inputs or outputs "
                         f"({engine_signature(new)!r}, compiled: {engine_signature(old)!r})")
    before, after = _structure(old.network), _structure(new.network)
    for a, b in zip(before, after):
        if a != b:
            raise RefitError(f"engine {old.name!r}: layer {a[0]!r} ({a[1]}, weights {a[3]}) of the compiled engine "
                             f"is {b[0]!r} ({b[1]}, weights {b[3]}) for the new model")
    if len(before) != len(after):
        raise RefitError(f"engine {old.name!r}: {len(before)} compute layers compiled, {len(after)} for the new "
                         f"model")


def _tensor_constants(graph: torch._C.Graph) -> list[torch.Tensor]:
    return [n.output().toIValue() for n in graph.nodes()
            if n.kind() == "prim::Constant" and n.output().type().isSubtypeOf(torch._C.TensorType.get())]


def _check_graphs(old: torch.jit.ScriptModule, new: torch.jit.ScriptModule) -> None:
    # Constants are left out of the comparison of nodes: saving and loading moves them.
    old_kinds, new_kinds = ([n.kind() for n in m.graph.nodes() if n.kind() != "prim::Constant"] for m in (old, new))
    if old_kinds != new_kinds:
        where = next((i for i, (a, b) in enumerate(zip(old_kinds, new_kinds)) if a != b),
                     min(len(old_kinds), len(new_kinds)))
        raise RefitError(f"the new model compiles to another graph: node {where} is "
                         f"{new_kinds[where] if where < len(new_kinds) else 'missing'} where the compiled module "
                         f"has {old_kinds[where] if where < len(old_kinds) else 'nothing'}")
    unmatched = _tensor_constants(old.graph)
    for b in _tensor_constants(new.graph):  # matched by value: saving and loading may reorder them
        match = next((i for i, a in enumerate(unmatched)
                      if a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)), None)
        if match is not None:
            del unmatched[match]
        else:
            raise RefitError(f"a weight of shape {list(b.shape)} is used by an op that runs in PyTorch (frozen into "
                             f"the compiled module's code), and it changed; refit swaps engine weights only: "
                             f"compile the new model instead")


def refit_module_weights(compiled: torch.jit.ScriptModule, new_model: torch.nn.Module,
                         inputs: Sequence[Any] | None = None, **options: Any) -> torch.jit.ScriptModule:
    """Write `new_model`'s weights into the engines of `compiled` in place (and return it), after checking that
    the new model has the compiled one's structure (RefitError names what differs).

    The new engines are built as `compile` builds them (see this module's doc: about the cost of a compile).
    `inputs` and settings are needed only for a module that was not compiled in this process (loaded from a
    file): give those that compile was given."""
    new_model = as_module(new_model)
    record: CompileRecord | None = getattr(compiled, "_torchkiln_compile", None)
    if record is None and inputs is None:
        raise ValueError("inputs: this compiled module records no compile settings (it was loaded from a file, or "
                         "not made by torchkiln.compile); pass the inputs and settings it was compiled with")
    if record is not None:
        _check_parameters(record.parameters, new_model)
    given = dict(record.options if record is not None and inputs is None else {}, **options)
    old_engines = _engines(compiled)
    if not old_engines:
        raise RefitError("the compiled module has no engines: there are no engine weights to refit")
    fresh, _ = compile_with_report(new_model, inputs if inputs is not None else record.inputs, **given)
    new_engines = _engines(fresh)
    if len(new_engines) != len(old_engines):
        raise RefitError(f"the new model compiles to {len(new_engines)} engines, the compiled module has "
                         f"{len(old_engines)}")
    for (_, old), (_, new) in zip(old_engines, new_engines):
        _check_engine(old, new)
    _check_graphs(compiled, fresh)
    for (attr, _), (new_attr, _) in zip(old_engines, new_engines):
        setattr(compiled, attr, engine_blob(getattr(fresh, new_attr).numpy().tobytes()))
    if record is not None:
        compiled._torchkiln_compile = CompileRecord(record.inputs, record.options, parameter_signature(new_model))
    logger.info("refit %d engines of the compiled module with the new weights", len(old_engines))
    return compiled
