"""A custom autograd Function's forward as a TorchScript function, for inference: its autograd bookkeeping removed.

At inference a `torch.autograd.Function`'s `apply(*args)` returns what `forward(ctx, *args)` returns; `ctx` only
carries what backward needs. So where the forward's only uses of `ctx` are statements that record for backward,
`ctx.save_for_backward(...)`, `ctx.save_for_forward(...)`, `ctx.mark_non_differentiable(...)`,
`ctx.set_materialize_grads(...)` and `ctx.NAME = value`, each with arguments that call nothing (so dropping them
drops no side effect), the forward without them and without `ctx` computes what `apply` does. It is scripted, not
traced, so a branch or loop on the data stays one. Each parameter not annotated gets the type the call passes.

Refused, with the reason: the forward's source is unavailable, it has a decorator (`custom_fwd` casts its inputs),
`*args`/`**kwargs`, a closure, any other use of `ctx` (`ctx.needs_input_grad`, `ctx.mark_dirty`), it reads or sets
the grad mode (apply runs forward with gradients off), or it does not script.
"""
from __future__ import annotations

import ast
import inspect
import itertools
import linecache
import textwrap
import types

import torch

_RECORDS = frozenset({"save_for_backward", "save_for_forward", "mark_non_differentiable", "set_materialize_grads"})
_GRAD_MODE = frozenset({"is_grad_enabled", "enable_grad", "no_grad", "set_grad_enabled", "inference_mode",
                        "is_inference_mode_enabled"})
_TENSOR = "_torchkiln_Tensor"  # the name the annotations give torch.Tensor in the scripted function's globals
_names = itertools.count()


class NotInlinable(Exception):
    """Why a Function's forward cannot stand in for its apply."""


def _calls_nothing(node: ast.AST, ctx: str) -> bool:
    return not any(isinstance(n, (ast.Call, ast.NamedExpr, ast.Lambda, ast.Await, ast.Yield, ast.YieldFrom))
                   or (isinstance(n, ast.Name) and n.id == ctx) for n in ast.walk(node))


def _is_record(stmt: ast.stmt, ctx: str) -> bool:
    """Whether `stmt` only records something on `ctx` for backward."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        f = stmt.value.func
        return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == ctx
                and f.attr in _RECORDS and all(_calls_nothing(a, ctx) for a in stmt.value.args)
                and all(_calls_nothing(k.value, ctx) for k in stmt.value.keywords))
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return (all(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == ctx
                    for t in targets) and (stmt.value is None or _calls_nothing(stmt.value, ctx)))
    return False


class _DropRecords(ast.NodeTransformer):
    def __init__(self, ctx: str) -> None:
        self.ctx = ctx

    def generic_visit(self, node: ast.AST) -> ast.AST:
        super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field, None)
            if isinstance(stmts, list) and stmts and isinstance(stmts[0], ast.stmt):
                kept = [s for s in stmts if not _is_record(s, self.ctx)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" else []))
        return node


def _annotation(value: torch._C.Value) -> str:
    t = value.type()
    if isinstance(t, torch._C.TensorType):
        return _TENSOR
    for kind, name in ((torch._C.IntType, "int"), (torch._C.FloatType, "float"), (torch._C.BoolType, "bool"),
                       (torch._C.StringType, "str")):
        if isinstance(t, kind):
            return name
    raise NotInlinable(f"it is called with an argument of type {t}")


def _definition(forward: types.FunctionType, takes_ctx: bool, arguments: list[torch._C.Value]) -> ast.FunctionDef:
    try:
        source = textwrap.dedent(inspect.getsource(forward))
    except (OSError, TypeError) as e:
        raise NotInlinable(f"its forward's source is not available ({e})") from e
    definition = ast.parse(source).body[0]
    if not isinstance(definition, ast.FunctionDef):
        raise NotInlinable("its forward is not a plain function")
    if any(not (isinstance(d, ast.Name) and d.id == "staticmethod") for d in definition.decorator_list):
        raise NotInlinable(f"its forward has a decorator ({ast.unparse(definition.decorator_list[0])})")
    args = definition.args
    if args.vararg or args.kwarg or args.kwonlyargs or args.posonlyargs:
        raise NotInlinable("its forward takes *args, **kwargs or keyword-only arguments")
    definition.decorator_list = []
    if takes_ctx:
        if not args.args:
            raise NotInlinable("its forward takes no ctx")
        ctx = args.args.pop(0).arg
        if args.defaults and len(args.defaults) > len(args.args):
            raise NotInlinable("its forward's ctx has a default")
        definition = _DropRecords(ctx).visit(definition)
        used = sorted({ast.unparse(n) for n in ast.walk(definition) if isinstance(n, ast.Attribute)
                       and isinstance(n.value, ast.Name) and n.value.id == ctx})
        if used or any(isinstance(n, ast.Name) and n.id == ctx for n in ast.walk(definition)):
            raise NotInlinable(f"its forward reads {used[0] if used else ctx}")
    grad_mode = sorted({n.attr for n in ast.walk(definition) if isinstance(n, ast.Attribute) and n.attr in _GRAD_MODE})
    if grad_mode:  # apply runs forward with gradients off; the inlined code runs in the caller's mode
        raise NotInlinable(f"its forward reads or sets the grad mode ({grad_mode[0]})")
    if not len(args.args) - len(args.defaults) <= len(arguments) <= len(args.args):
        raise NotInlinable(f"its forward takes {len(args.args)} arguments; apply is called with {len(arguments)}")
    for arg, value in zip(args.args, arguments):
        if arg.annotation is None:
            arg.annotation = ast.Name(_annotation(value), ast.Load())
    return definition


def script_forward(function: type, arguments: list[torch._C.Value]) -> torch.jit.ScriptFunction:
    """`function`'s forward, without its autograd bookkeeping, scripted for a call with `arguments`; raises
    NotInlinable saying why not."""
    forward = inspect.getattr_static(function, "forward")
    forward = getattr(forward, "__func__", forward)
    if not isinstance(forward, types.FunctionType):
        raise NotInlinable("its forward is not a Python function")
    if forward.__code__.co_freevars:
        raise NotInlinable("its forward reads variables of an enclosing function")
    takes_ctx = getattr(function, "setup_context", None) is torch.autograd.Function.setup_context
    definition = _definition(forward, takes_ctx, arguments)
    definition.name = f"{function.__name__}_forward_{next(_names)}"
    source = ast.unparse(ast.Module([definition], type_ignores=[])) + "\n"
    filename = f"<torchkiln: {function.__module__}.{function.__qualname__}.forward as {definition.name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # TorchScript reads it
    namespace = {**forward.__globals__, _TENSOR: torch.Tensor}  # the forward's module's names, as they are now
    exec(compile(source, filename, "exec"), namespace)
    try:
        return torch.jit.script(namespace[definition.name])
    except Exception as e:  # TorchScript's compiler raises many kinds of errors
        raise NotInlinable(f"its forward does not script: {str(e).strip().splitlines()[0]}") from e
