"""`torchkiln compile IN OUT`: torchtrtc's command line over a saved TorchScript module.

Everything heavy is imported when the command runs, so `torchkiln --help` stays fast.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger("torchkiln.cli")

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-3


class CommandError(Exception):
    """A problem with the command's arguments or files, reported as one line with exit status 2."""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `compile` and its flags (each with its help text)."""
    p = sub.add_parser(
        "compile", help="compile a saved TorchScript module (torch.jit.save) into a saved torchkiln module",
        description="Compile IN, a module saved with torch.jit.save, and save the result to OUT (like torchtrtc). "
                    "Progress is logged to stderr at INFO.",
        epilog="input specs: SHAPE[@DTYPE][%FORMAT], SHAPE being (d0,d1,...) or [(min);(opt);(max)], e.g. "
               "'(1,3,224,224)@f16%contiguous' or '[(1,3,224,224);(8,3,224,224);(32,3,224,224)]@f32'. DTYPE: f32 "
               "(default), f16, bf16, f64, i64, i32, i8, u8, bool (or half, float, long...); FORMAT: contiguous "
               "(default) or channels_last. Exit status: 0 done, 1 --check-accuracy or --check-method-support "
               "failed, 2 an error (one line on stderr).")
    p.add_argument("input", metavar="IN", help="the saved TorchScript module (with --embed-engine: engine bytes)")
    p.add_argument("output", metavar="OUT", nargs="?",
                   help="where to save the compiled module (with --save-engine: the engine bytes)")
    p.add_argument("-i", "--input", dest="inputs", action="append", default=[], metavar="SPEC",
                   help="one input of forward, in order (repeat for each); see input specs below")
    p.add_argument("-p", "--enabled-precision", dest="precisions", action="append", default=[], metavar="P",
                   help="a precision engine layers may run in: f32, f16 or bf16 (repeatable; default f32)")
    p.add_argument("--torch-executed-op", dest="torch_executed_ops", action="append", default=[], metavar="OP",
                   help="an op to keep in PyTorch, e.g. aten::relu or aten::add.Tensor (repeatable)")
    p.add_argument("--torch-executed-module", dest="torch_executed_modules", action="append", default=[],
                   metavar="MODULE", help="a submodule type to keep in PyTorch, e.g. torchvision.models.resnet."
                                          "BasicBlock (repeatable)")
    p.add_argument("--min-block-size", type=int, default=3, metavar="N",
                   help="the fewest ops an engine block may have (default 3)")
    p.add_argument("--require-full-compilation", action="store_true",
                   help="fail unless forward compiles to one engine with nothing left in PyTorch")
    p.add_argument("--truncate-long-double", action="store_true",
                   help="run int64 and float64 values in 32 bits inside engines")
    p.add_argument("--device", default=None, metavar="DEVICE",
                   help="cpu, cuda:N or gpu:N (default: where the module's weights are)")
    p.add_argument("--backend", choices=["auto", "reference", "onnxruntime"], default="auto",
                   help="what runs the engines (default auto: onnxruntime on the CPU, reference elsewhere)")
    p.add_argument("--check-method-support", action="store_true",
                   help="only list the ops of forward that no converter or evaluator handles; exit 0 if there "
                        "are none, else 1 (OUT not needed)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--save-engine", action="store_true",
                      help="write the engine's bytes to OUT instead of a module (forward must compile to exactly "
                           "one engine)")
    mode.add_argument("--embed-engine", action="store_true",
                      help="IN is engine bytes: wrap them in a module whose forward runs them and save it to OUT")
    p.add_argument("--check-accuracy", action="store_true",
                   help="before saving, compare the result with IN on random inputs at each input's min, opt "
                        "and max shape; exit 1 with the errors (OUT not written) when |out - ref| > atol + "
                        "rtol * max|ref| anywhere")
    p.add_argument("--atol", type=float, default=DEFAULT_ATOL, help=f"--check-accuracy's absolute tolerance "
                                                                      f"(default {DEFAULT_ATOL:g})")
    p.add_argument("--rtol", type=float, default=DEFAULT_RTOL, help=f"--check-accuracy's tolerance relative to "
                                                                      f"max|ref| (default {DEFAULT_RTOL:g})")
    p.add_argument("--debug", action="store_true", help="log at DEBUG: the graph after each phase, the partition "
                                                        "report, each network")
    p.add_argument("-q", "--quiet", action="store_true", help="log warnings and errors only")
    p.set_defaults(fn=run, log_level=None)


def log_level(args: argparse.Namespace) -> int:
    """The level the compile command logs at: INFO (its progress), DEBUG with --debug, WARNING with --quiet."""
    return logging.DEBUG if args.debug else logging.WARNING if args.quiet else logging.INFO


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    from torchkiln.input_spec import parse_dtype

    try:
        precisions = {parse_dtype(p) for p in args.precisions} or None
    except ValueError as e:
        raise CommandError(f"-p: {e}") from None
    return dict(enabled_precisions=precisions, device=args.device, min_block_size=args.min_block_size,
                torch_executed_ops=args.torch_executed_ops, torch_executed_modules=args.torch_executed_modules,
                require_full_compilation=args.require_full_compilation,
                truncate_long_and_double=args.truncate_long_double, backend=args.backend, debug=args.debug)


def _map_location(device: str | None) -> Any:
    """The torch.device of --device (checked: CUDA must be here for cuda), or None."""
    from torchkiln.settings import as_device

    if device is None:
        return None
    try:
        return as_device(device)
    except ValueError as e:
        raise CommandError(f"--device {str(e).removeprefix('device: ')}") from None


def _load(path: str, device: str | None) -> Any:
    import torch

    if not os.path.isfile(path):
        raise CommandError(f"{path}: no such file")
    map_location = _map_location(device)
    try:
        return torch.jit.load(path, map_location=map_location)
    except (RuntimeError, ValueError) as e:
        raise CommandError(f"{path} is not a saved TorchScript module ({str(e).strip().splitlines()[0]})") from None


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise CommandError(f"{path}: no such file") from None


@dataclasses.dataclass(frozen=True)
class AccuracyRow:
    """The largest error of one output at one set of input shapes."""

    shapes: str
    output: str
    max_abs_error: float
    max_abs_reference: float
    limit: float

    @property
    def ok(self) -> bool:
        return self.max_abs_error <= self.limit

    def __str__(self) -> str:
        return (f"inputs {self.shapes} {self.output}: max abs error {self.max_abs_error:.3e}, max|ref| "
                f"{self.max_abs_reference:.3e}, limit {self.limit:.3e}: {'ok' if self.ok else 'FAILED'}")


def _tensors(value: Any, path: str = "output") -> list[tuple[str, Any]]:
    import torch

    if isinstance(value, torch.Tensor):
        return [(path, value)]
    if isinstance(value, (tuple, list)):
        return [leaf for i, v in enumerate(value) for leaf in _tensors(v, f"{path}[{i}]")]
    if isinstance(value, dict):
        return [leaf for k, v in value.items() for leaf in _tensors(v, f"{path}[{k!r}]")]
    return []


def _reference(module: Any, args: list[Any]) -> Any:
    """The original module's outputs; half-precision inputs a float32 model does not take are cast to float32
    first, as compile does."""
    import torch

    try:
        return module(*args)
    except RuntimeError:
        half = (torch.float16, torch.bfloat16)
        if not any(a.dtype in half for a in args):
            raise
        return module(*[a.float() if a.dtype in half else a for a in args])


def check_accuracy(original: Any, compiled: Any, inputs: Sequence[Any], device: Any, atol: float,
                   rtol: float) -> list[AccuracyRow]:
    """Compare `compiled` with `original` on random inputs (each Input's tensor_domain) at the min, opt and max
    shapes: one row per output and shape set; an output is within its limit when every element's
    |out - ref| <= atol + rtol * max|ref|."""
    import torch

    from torchkiln.frontend.input_dtypes import infer_input_dtypes

    inputs = infer_input_dtypes(list(inputs), original)  # the dtypes compile gave Inputs without one
    rows = []
    for which in ("min", "opt", "max") if any(spec.is_dynamic for spec in inputs) else ("opt",):
        args = [spec.example(device, which) for spec in inputs]
        shapes = ", ".join(str(tuple(a.shape)) for a in args)
        with torch.no_grad():
            ref = _reference(original, args)
            out = compiled(*args)
        outs = dict(_tensors(out))
        for path, r in _tensors(ref):
            o = outs.get(path)
            if o is None or tuple(o.shape) != tuple(r.shape):
                got = "nothing" if o is None else f"shape {tuple(o.shape)}"
                raise CommandError(f"--check-accuracy: {path} at inputs {shapes}: the compiled module returned {got}"
                                   f", the original shape {tuple(r.shape)}")
            r64, o64 = r.detach().double().cpu(), o.detach().double().cpu()
            finite, inf = torch.isfinite(r64), torch.isinf(r64)
            if not (torch.equal(finite, torch.isfinite(o64)) and torch.equal(r64.isnan(), o64.isnan())
                    and torch.equal(r64[inf], o64[inf])):
                rows.append(AccuracyRow(shapes, path + " (NaN or infinities differ)", math.inf, 0.0, 0.0))
                continue
            err = (o64[finite] - r64[finite]).abs().max().item() if finite.any() else 0.0
            scale = r64[finite].abs().max().item() if finite.any() else 0.0
            rows.append(AccuracyRow(shapes, path, err, scale, atol + rtol * scale))
    return rows


def _accuracy(original: Any, compiled: Any, inputs: Sequence[Any], device: Any, args: argparse.Namespace) -> bool:
    logger.info("checking accuracy against %s on random inputs", args.input)
    rows = check_accuracy(original, compiled, inputs, device, args.atol, args.rtol)
    for row in rows:
        print(f"accuracy: {row}")
    return all(row.ok for row in rows)


def _engine_count(module: Any) -> int:
    from torchkiln.stitching.stitch import ENGINE_ATTR

    k = 0
    while hasattr(module, ENGINE_ATTR.format(k)):
        k += 1
    return k


def _embed(args: argparse.Namespace) -> int:
    import torch

    from torchkiln.compiler import embed_engine_in_new_module

    if args.check_accuracy or args.inputs:
        raise CommandError("--embed-engine takes engine bytes only: no --input or --check-accuracy")
    module = embed_engine_in_new_module(_read(args.input), device=_map_location(args.device))
    torch.jit.save(module, args.output)
    logger.info("wrote %s: a module running the engine of %s", args.output, args.input)
    return 0


def _check_support(args: argparse.Namespace) -> int:
    from torchkiln.compiler import unsupported_ops

    missing = unsupported_ops(_load(args.input, args.device))
    for op, count in missing.items():
        print(f"unsupported: {op} x{count}")
    print(f"{args.input}: {'every op of forward is supported' if not missing else f'{len(missing)} ops unsupported'}")
    return 1 if missing else 0


def run(args: argparse.Namespace) -> int:
    """The compile command; returns the exit status."""
    import torch

    from torchkiln.compiler import compile_with_report, convert_method_to_engine, embed_engine_in_new_module
    from torchkiln.errors import UnsupportedOperatorError
    from torchkiln.input_spec import parse_input_spec

    _map_location(args.device)  # a device that cannot be used here is the first error, before any file is read
    if args.check_method_support:
        return _check_support(args)
    if args.output is None:
        raise CommandError("OUT is needed: where to save the result")
    if args.embed_engine:
        return _embed(args)
    if not (args.atol >= 0 and args.rtol >= 0):
        raise CommandError(f"--atol and --rtol must be >= 0, got {args.atol:g} and {args.rtol:g}")
    if not args.inputs:
        raise CommandError("give at least one --input SPEC, one per input of forward, e.g. --input '(1,3,224,224)'")
    try:
        inputs = [parse_input_spec(s) for s in args.inputs]
    except ValueError as e:
        raise CommandError(f"--input: {e}") from None
    settings = _settings(args)
    logger.info("loading %s", args.input)
    module = _load(args.input, args.device)
    logger.info("compiling %s for inputs %s", args.input, ", ".join(map(repr, inputs)))
    start = time.perf_counter()
    engine_bytes = None
    if args.save_engine:
        try:
            engine_bytes = convert_method_to_engine(module, "forward", inputs, **settings)
        except UnsupportedOperatorError as e:
            raise CommandError(f"--save-engine needs forward to compile to exactly one engine, but "
                               f"{str(e).removeprefix('require_full_compilation=True but ')}") from None
        compiled = embed_engine_in_new_module(engine_bytes)
        logger.info("built one engine of %d bytes in %.2fs", len(engine_bytes), time.perf_counter() - start)
    else:
        compiled, report = compile_with_report(module, inputs, **settings)
        logger.info("compiled in %.2fs: %d engines, %d blocks left in PyTorch", time.perf_counter() - start,
                    _engine_count(compiled), report.num_torch_blocks)
    if args.check_accuracy:
        weights = list(module.parameters()) + list(module.buffers())
        device = _map_location(args.device) or next((w.device for w in weights), torch.device("cpu"))
        if not _accuracy(_load(args.input, args.device), compiled, inputs, device, args):
            print(f"torchkiln compile: --check-accuracy failed (atol {args.atol:g}, rtol {args.rtol:g}); "
                  f"{args.output} not written", file=sys.stderr)
            return 1
    if engine_bytes is not None:
        with open(args.output, "wb") as f:
            f.write(engine_bytes)
    else:
        torch.jit.save(compiled, args.output)
    logger.info("wrote %s", args.output)
    return 0
