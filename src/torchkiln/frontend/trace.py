"""Tracing a module that cannot be scripted, checked: a trace records one run, so Python code that reads
tensor values (numpy calls, branches on data, `.item()`) becomes constants. Tracing's warnings are passed on
as TracingWarning, and the trace is run against the module on a second, different input; if they differ,
TracingError refuses the trace instead of compiling a module that silently returns constants."""
from __future__ import annotations

import logging
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from torchkiln.errors import TracingError, TracingWarning, cause_line
from torchkiln.module_mode import eval_mode

logger = logging.getLogger("torchkiln.frontend")

RTOL = 1e-4  # the trace and the module run the same ops; this only absorbs fusion's rounding
# A trace may also take another, equal path (transformers materialises its causal mask when traced, and on CUDA its
# attention then runs another kernel), so a half-precision model's outputs may differ by a few units of its
# rounding: the tolerance is at least this many units of the coarsest precision the values were computed in
# (float16: 1e-2, bfloat16: 8e-2 of the largest output); a trace that baked in data is off by the outputs' size.
ULPS = 10


def _tensors(tree: Any) -> list[Any]:
    """The leaves of nested tuples, lists and dicts, in order."""
    if isinstance(tree, (tuple, list)):
        return [leaf for item in tree for leaf in _tensors(item)]
    if isinstance(tree, dict):
        return [leaf for item in tree.values() for leaf in _tensors(item)]
    return [tree]


def _resample(tree: Any) -> Any:
    """Another input of the same structure, shapes and dtypes: new random floats and bools; integers drawn
    between the example's smallest and largest value (so indices stay valid)."""
    if isinstance(tree, (tuple, list)):
        return type(tree)(_resample(item) for item in tree)
    if isinstance(tree, dict):
        return {k: _resample(v) for k, v in tree.items()}
    if not isinstance(tree, torch.Tensor):
        return tree
    if tree.dtype.is_floating_point:
        return torch.randn(tree.shape, device=tree.device).to(tree.dtype)
    if tree.dtype == torch.bool:
        return torch.rand(tree.shape, device=tree.device) > 0.5
    if tree.numel() == 0 or tree.dtype.is_complex:
        return tree.clone()
    lo, hi = int(tree.min()), int(tree.max())
    return torch.randint(lo, hi + 1, tree.shape, device=tree.device, dtype=tree.dtype)


def _rtol(dtypes: Iterable[torch.dtype]) -> float:
    """The check's tolerance, relative to the largest output, for values computed in `dtypes`."""
    return max([RTOL] + [ULPS * torch.finfo(d).eps for d in dtypes if d.is_floating_point])


def _difference(got: Any, expected: Any, computed_in: Iterable[torch.dtype] = ()) -> str | None:
    """How the trace's outputs differ from the module's, or None if they agree; an output's tolerance follows its
    dtype and `computed_in` (the dtypes of the module's weights and inputs)."""
    got_leaves, expected_leaves = _tensors(got), _tensors(expected)
    if len(got_leaves) != len(expected_leaves):
        return f"{len(got_leaves)} outputs instead of {len(expected_leaves)}"
    for i, (g, e) in enumerate(zip(got_leaves, expected_leaves)):
        if not isinstance(e, torch.Tensor):
            if g != e:
                return f"output {i} is {g!r} instead of {e!r}"
            continue
        if not isinstance(g, torch.Tensor) or g.shape != e.shape or g.dtype != e.dtype:
            return f"output {i} has another shape or dtype"
        if not e.dtype.is_floating_point:
            if not torch.equal(g, e):
                return f"output {i} has other values"
            continue
        finite, inf = e.isfinite(), e.isinf()
        if not torch.equal(g.isfinite(), finite) or not torch.equal(g[inf], e[inf]):
            return f"output {i} has inf or NaN in other places"
        if not finite.any():
            continue
        err = (g[finite].double() - e[finite].double()).abs().max().item()
        scale = e[finite].double().abs().max().item()
        rtol = _rtol([e.dtype, *computed_in])
        if err > rtol * scale + 1e-6:
            return f"output {i} differs by up to {err:.3g} (max |output| {scale:.3g}, tolerance {rtol:g} of it)"
    return None


def _causes(caught: list[warnings.WarningMessage]) -> list[str]:
    """Tracing's warnings, each as its first sentence and where it was raised; other warnings re-raised."""
    causes: dict[str, None] = {}
    for w in caught:
        if issubclass(w.category, torch.jit.TracerWarning):
            first = str(w.message).split(". ")[0].strip()
            causes[f"{first} ({w.filename}:{w.lineno})"] = None
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return list(causes)


def _failure(error: Exception, width: int = 240) -> str:
    """A tracer error as its type, first line and (where the message has more) last line, each cut to `width`
    characters: the tracer's messages print the values they could not hold, and name their type last."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()] or [""]
    cut = [line if len(line) <= width else line[:width] + "..." for line in (lines[0], lines[-1])]
    return f"{type(error).__name__}: " + (cut[0] if len(lines) == 1 else f"{cut[0]} {cut[1].lstrip(':')}")


def trace_checked(module: torch.nn.Module, example_inputs: Sequence[Any],
                  unscriptable: str = "") -> torch.jit.ScriptModule:
    """torch.jit.trace of `module` (in eval mode) on the examples, refused if it bakes in data-dependent values, or
    with TracingError where tracing itself fails (`unscriptable`: why scripting failed, for that message)."""
    name = type(module).__name__
    with eval_mode(module):
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", torch.jit.TracerWarning)
            try:
                traced = torch.jit.trace(module, tuple(example_inputs), strict=False, check_trace=False)
            except Exception as e:  # the tracer's own errors: outputs it cannot hold, a forward that fails traced
                why = f" ({unscriptable})" if unscriptable else ""
                raise TracingError(
                    f"{name} could not be scripted{why}, and tracing it with the example inputs failed: "
                    f"{_failure(e)}. Make {name} scriptable (torch.jit.script), or give compile a module whose "
                    f"forward takes and returns tensors (or tuples, lists and dicts of them) and runs as traced."
                ) from e
        causes = _causes(caught)
        for cause in causes:
            message = f"{name} could not be scripted and was traced; tracing warned: {cause}"
            logger.warning("%s", message)
            warnings.warn(message, TracingWarning, stacklevel=2)
        second = _resample(tuple(example_inputs))
        with torch.no_grad():
            try:
                expected = module(*second)
            except Exception as e:  # the module itself rejects the second input: nothing to compare
                logger.warning("could not check the trace of %s on a second input: %s", name, e)
                return traced
            computed_in = {t.dtype for t in [*module.parameters(), *module.buffers(), *_tensors(second)]
                           if isinstance(t, torch.Tensor)}
            try:
                difference = _difference(traced(*second), expected, computed_in)
            except Exception as e:  # e.g. a shape baked into the trace
                difference = f"the trace failed: {cause_line(e)}"
    if difference is not None:
        why = "; ".join(causes) if causes else "no tracer warning named the cause"
        raise TracingError(
            f"{name} could not be scripted, so it was traced, and the trace does not match the module on a second, "
            f"random input ({difference}): tracing baked in data-dependent values ({why}). Make {name} scriptable "
            f"(torch.jit.script) or keep values that depend on the data in tensor operations.")
    return traced
