"""`torchkiln compile IN OUT [SPEC ...]`: torchtrtc's command line over a saved TorchScript module.

Everything heavy is imported when the command runs, so `torchkiln --help` stays fast. torchtrtc's spellings of
flags torchkiln names otherwise, and its flags that do not apply, are one table: TORCHTRTC_FLAGS (docs/cli.md).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from torchkiln.settings_table import add_setting_arguments, settings_from_args

logger = logging.getLogger("torchkiln.cli")

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-3


class CommandError(Exception):
    """A problem with the command's arguments or files, reported as one line with exit status 2."""


def add_parser(sub: argparse._SubParsersAction, parents: Sequence[argparse.ArgumentParser] = ()
               ) -> argparse.ArgumentParser:
    """Register `compile` and its flags (each with its help text), torchtrtc's spellings included."""
    p = sub.add_parser(
        "compile", parents=parents,
        help="compile a saved TorchScript module (torch.jit.save) into a saved torchkiln module",
        description="Compile IN, a module saved with torch.jit.save, for the inputs SPEC... and save the result to "
                    "OUT, as torchtrtc does: `torchkiln compile model.ts model_kiln.ts '(1,3,224,224)@f32'`. "
                    "Warnings and errors are logged to stderr; -v adds the progress, -v -v (or --debug) debugging.",
        epilog="input specs: SHAPE[@DTYPE][%FORMAT], SHAPE being (d0,d1,...) or [(min);(opt);(max)], e.g. "
               "'(1,3,224,224)@f16%contiguous' or '[(1,3,224,224);(8,3,224,224);(32,3,224,224)]@f32'. DTYPE: f32 "
               "(default), f16, bf16, f64, i64, i32, i8, u8, bool (or half, float, long, char...); FORMAT: "
               "contiguous (default) or channels_last (or nchw, nhwc...). Exit status: 0 done, 1 --check-accuracy "
               "or --check-method-support failed, 2 an error (one line on stderr).")
    p.add_argument("input", metavar="IN", help="the saved TorchScript module (with --embed-engine: engine bytes)")
    p.add_argument("output", metavar="OUT", nargs="?",
                   help="where to save the compiled module (with --save-engine: the engine bytes)")
    p.add_argument("specs", metavar="SPEC", nargs="*", default=[],
                   help="one input of forward, in order, as torchtrtc takes them; see input specs below")
    p.add_argument("-i", "--input", dest="inputs", action="append", default=[], metavar="SPEC",
                   help="one input of forward, in order (repeat for each): another way to give the SPECs")
    add_setting_arguments(p)
    p.add_argument("--check-method-support", metavar="METHOD", default=None,
                   help="only check METHOD (alone: forward; OUT not needed): with the input specs, whether it "
                        "compiles to one engine with nothing left in PyTorch, as --require-full-compilation "
                        "needs (the ops left and why); without, the ops no converter or evaluator handles. Exit 0 "
                        "if it does (there are none), else 1")
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
    add_torchtrtc_flags(p)
    return p


# ---- torchtrtc's command line ----------------------------------------------------------------------------------
# torchtrtc's flags where torchkiln's differ: another spelling of a torchkiln flag, a compile setting no torchkiln
# flag names, or a flag that does not apply here (an error saying why). Its other flags are torchkiln's own.

_NO_DLA = "torchkiln has no DLA engines: they run on the CPU or a CUDA GPU (-d gpu, --gpu-id N, or --device)"


def _device_type(text: str) -> str:
    """torchtrtc's -d: gpu (or cuda) or cpu; dla is refused."""
    kind = text.strip().lower()
    if kind == "dla":
        raise argparse.ArgumentTypeError(_NO_DLA)
    if kind not in ("gpu", "cuda", "cpu"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device type; use gpu or cpu")
    return kind


@dataclasses.dataclass(frozen=True)
class TorchtrtcFlag:
    """One of torchtrtc's flags and what it means here: another spelling of the torchkiln flag `same_as`; or the
    compile setting `setting`, its value read by `value` (None: a switch, True when given); or, with `refused`, an
    error saying why it does not apply (`value`: str where the flag takes one)."""

    options: tuple[str, ...]
    same_as: str | None = None
    setting: str | None = None
    value: Callable[[str], Any] | None = None
    refused: str | None = None
    help: str = ""
    metavar: str = "VALUE"


TORCHTRTC_FLAGS = (
    TorchtrtcFlag(("--enable-precision",), same_as="--enabled-precision"),
    TorchtrtcFlag(("--teo",), same_as="--torch-executed-op"),
    TorchtrtcFlag(("--tem", "--torch-executed-mod"), same_as="--torch-executed-module"),
    TorchtrtcFlag(("--mbs",), same_as="--min-block-size"),
    TorchtrtcFlag(("--truncate", "--truncate-64bit"), same_as="--truncate-long-double"),
    TorchtrtcFlag(("--build-debuggable-engine",), same_as="--debug"),
    TorchtrtcFlag(("--i", "--info"), same_as="--verbose"),
    TorchtrtcFlag(("-w", "--warnings"), same_as="--quiet"),
    TorchtrtcFlag(("-d", "--device-type"), setting="device_type", value=_device_type, metavar="TYPE",
                  help="gpu (cuda:0, or --gpu-id's) or cpu: where the engines run; another way to give --device"),
    TorchtrtcFlag(("--gpu-id",), setting="gpu_id", value=int, metavar="N",
                  help="the GPU the engines run on: --device cuda:N"),
    TorchtrtcFlag(("--disable-tf32",), setting="disable_tf32",
                  help="float32 layers do not use TF32 (torchkiln's default already)"),
    TorchtrtcFlag(("--num-avg-timing-iters",), setting="num_avg_timing_iters", value=int, metavar="N",
                  help="cuda backend: runs averaged per kernel candidate when timing them at build (default 10)"),
    TorchtrtcFlag(("--workspace-size",), setting="workspace_size", value=int, metavar="BYTES",
                  help="accepted, no effect (logged): torchkiln's engines have no TensorRT workspace"),
    TorchtrtcFlag(("--sparse-weights",), setting="sparse_weights",
                  help="accepted, no effect (logged): there are no structured-sparsity kernels"),
    TorchtrtcFlag(("--engine-capability",), setting="capability", value=str,
                  help="standard (safety and dla_standalone: accepted, no effect, logged)"),
    TorchtrtcFlag(("--allow-shape-tensors",), setting="allow_shape_tensors",
                  help="accepted, no effect (logged): shape computations are symbolic dims of the network"),
    TorchtrtcFlag(("--no-threshold-check",), setting="no_threshold_check",
                  help="accepted: torchkiln checks accuracy only with --check-accuracy"),
    TorchtrtcFlag(("--allow-gpu-fallback",), refused=_NO_DLA),
    TorchtrtcFlag(("--dla-core", "--dla-sram-size", "--dla-local-dram-size", "--dla-global-dram-size"), value=str,
                  refused=_NO_DLA),
    TorchtrtcFlag(("--custom-torch-ops",), value=str, metavar="LIB",
                  refused="load the library in Python (torch.ops.load_library) and compile with torchkiln.compile"),
    TorchtrtcFlag(("--custom-converters",), value=str, metavar="LIB",
                  refused="TensorRT converter libraries do not apply: torchkiln's converters are Python "
                          "(torchkiln.conversion)"),
)
_DEVICE_FLAGS = ("device_type", "gpu_id")  # settings of TORCHTRTC_FLAGS that make --device
_NOT_SETTINGS = (*_DEVICE_FLAGS, "no_threshold_check")


class _TorchtrtcAction(argparse.Action):
    """Records a TorchtrtcFlag's setting in `namespace.torchtrtc` (setting -> value), or refuses the flag."""

    def __init__(self, option_strings: list[str], dest: str, flag: TorchtrtcFlag, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0 if flag.value is None else None, type=flag.value, **kwargs)
        self.flag = flag

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if self.flag.refused:
            parser.error(f"{option_string}: {self.flag.refused}")
        setattr(namespace, self.dest, {**(getattr(namespace, self.dest) or {}),
                                       self.flag.setting: True if self.flag.value is None else values})


def add_torchtrtc_flags(parser: argparse.ArgumentParser) -> None:
    """Add TORCHTRTC_FLAGS to compile's parser: a spelling of a torchkiln flag joins that flag (its help shows both);
    the others form the "torchtrtc's flags" group. A spelling the parser already has stays torchkiln's."""
    known = parser._option_string_actions  # argparse has no public lookup of an action by its flag
    group = parser.add_argument_group("torchtrtc's flags", "torchtrtc's flags that torchkiln has under no other "
                                      "name, or refuses (docs/cli.md)")
    for flag in TORCHTRTC_FLAGS:
        options = [o for o in flag.options if o not in known]
        if not options:
            continue
        if flag.same_as:
            if flag.same_as not in known:
                raise LookupError(f"TORCHTRTC_FLAGS: {flag.options} name {flag.same_as}, which compile does not have")
            action = known[flag.same_as]
            action.option_strings.extend(options)
            known.update(dict.fromkeys(options, action))
        else:
            group.add_argument(*options, dest="torchtrtc", action=_TorchtrtcAction, flag=flag, default=None,
                               metavar=flag.metavar,
                               help=flag.help or f"refused: {flag.refused}")


def normalize_argv(argv: Sequence[str]) -> list[str]:
    """`--check-method-support` alone is `--check-method-support=forward`: torchtrtc's takes a method, torchkiln's
    took none; a word after it that is not a method name (IN, a spec) is not its value."""
    flag = "--check-method-support"
    return [f"{a}=forward" if a == flag and (i + 1 == len(argv) or not argv[i + 1].isidentifier()) else a
            for i, a in enumerate(argv)]


def _looks_like_spec(text: str) -> bool:
    return text.lstrip().startswith(("(", "["))


def take_positionals(args: argparse.Namespace, extra: Sequence[str], parser: argparse.ArgumentParser) -> None:
    """IN OUT SPEC...: argparse leaves those given after a flag (`IN -p f16 OUT SPEC`) in `extra`; put them, in
    order, with the others. OUT is no spec: where the first after IN is one, OUT is missing."""
    unknown = [a for a in extra if a.startswith("-")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    rest = ([args.output] if args.output is not None else []) + list(args.specs) + list(extra)
    if rest and not _looks_like_spec(rest[0]):
        args.output, args.specs = rest[0], rest[1:]
    else:
        args.output, args.specs = None, rest


def _device(args: argparse.Namespace) -> str | None:
    """--device, or the device torchtrtc's -d and --gpu-id make."""
    given = {k: v for k, v in (args.torchtrtc or {}).items() if k in _DEVICE_FLAGS}
    if not given:
        return args.device
    if args.device is not None:
        raise CommandError("give --device, or torchtrtc's -d/--device-type and --gpu-id, not both")
    kind = given.get("device_type", "gpu")
    if kind == "cpu":
        if "gpu_id" in given:
            raise CommandError("--gpu-id goes with -d gpu, not -d cpu")
        return "cpu"
    return f"cuda:{given.get('gpu_id', 0)}"


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    try:
        given = settings_from_args(args)
    except ValueError as e:
        raise CommandError(str(e)) from None
    more = {k: v for k, v in (args.torchtrtc or {}).items() if k not in _NOT_SETTINGS}
    return {**given, **more}


def _map_location(device: str | None) -> Any:
    """The torch.device of --device (checked: CUDA must be here for cuda), or None."""
    from torchkiln.settings import as_device

    if device is None:
        return None
    try:
        return as_device(device)
    except ValueError as e:
        raise CommandError(f"--device {str(e).removeprefix('device: ')}") from None


def load_saved(path: str, device: str | None = None) -> Any:
    """The TorchScript module saved at `path` (torch.jit.load), on `device`; CommandError naming the problem."""
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


def _accuracy(original: Any, compiled: Any, inputs: Sequence[Any], device: Any, args: argparse.Namespace,
              out: TextIO) -> bool:
    logger.info("checking accuracy against %s on random inputs", args.input)
    rows = check_accuracy(original, compiled, inputs, device, args.atol, args.rtol)
    out.writelines(f"accuracy: {row}\n" for row in rows)
    return all(row.ok for row in rows)


def _embed(args: argparse.Namespace, specs: Sequence[str]) -> int:
    import torch

    from torchkiln.compiler import embed_engine_in_new_module

    if args.check_accuracy or specs:
        raise CommandError("--embed-engine takes engine bytes only: no input specs or --check-accuracy")
    module = embed_engine_in_new_module(_read(args.input), device=_map_location(args.device))
    torch.jit.save(module, args.output)
    logger.info("wrote %s: a module running the engine of %s", args.output, args.input)
    return 0


def parse_specs(specs: Sequence[str]) -> list[Any]:
    """The torchkiln.Input of each input spec; CommandError naming the bad one."""
    from torchkiln.input_spec import parse_input_spec

    try:
        return [parse_input_spec(s) for s in specs]
    except ValueError as e:
        raise CommandError(str(e)) from None


def _check_support(args: argparse.Namespace, specs: Sequence[str], out: TextIO) -> int:
    """--check-method-support: with input specs, what compile with --require-full-compilation does (a dry run: no
    engine is built); without, which ops of the method no converter or evaluator handles."""
    from torchkiln.compiler import check_full_compilation, unsupported_ops
    from torchkiln.errors import ConversionError, UnsupportedOperatorError

    method = args.check_method_support
    module = load_saved(args.input, args.device)
    if not specs:
        missing = unsupported_ops(module, method)
        out.writelines(f"unsupported: {op} x{count}\n" for op, count in missing.items())
        out.write(f"{args.input}: " + (f"{len(missing)} ops of {method} have no converter or evaluator" if missing
                                       else f"every op of {method} has a converter or evaluator; give the input "
                                       f"specs to check that it compiles to one engine (that depends on them)") + "\n")
        return 1 if missing else 0
    try:
        check_full_compilation(module, parse_specs(specs), method, **_settings(args))
    except (UnsupportedOperatorError, ConversionError) as e:
        out.write(f"{args.input}: {method} does not compile to one engine: "
                  f"{str(e).removeprefix('require_full_compilation=True but ')}\n")
        return 1
    out.write(f"{args.input}: {method} compiles to one engine, with nothing left in PyTorch\n")
    return 0


def run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """The compile command, its results written to `out` and a failed accuracy check to `err`; returns the exit
    status."""
    import torch

    from torchkiln.compiler import compile_with_report, convert_method_to_engine, embed_engine_in_new_module
    from torchkiln.errors import UnsupportedOperatorError
    from torchkiln.stitching.stitch import engine_attrs

    args.device = _device(args)
    _map_location(args.device)  # a device that cannot be used here is the first error, before any file is read
    if args.inputs and args.specs:
        raise CommandError("give the input specs after IN OUT or with -i, not both")
    specs = args.inputs or args.specs
    if args.check_method_support:
        return _check_support(args, specs, out)
    if args.output is None:
        raise CommandError("OUT is needed, where to save the result: compile IN OUT SPEC..., e.g. compile model.ts "
                           "model_kiln.ts '(1,3,224,224)@f32'")
    if args.embed_engine:
        return _embed(args, specs)
    if not (args.atol >= 0 and args.rtol >= 0):
        raise CommandError(f"--atol and --rtol must be >= 0, got {args.atol:g} and {args.rtol:g}")
    if not specs:
        raise CommandError("give the input specs after IN OUT, one per input of forward, e.g. '(1,3,224,224)@f32'")
    inputs = parse_specs(specs)
    settings = _settings(args)
    logger.info("loading %s", args.input)
    module = load_saved(args.input, args.device)
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
                    len(engine_attrs(compiled)), report.num_torch_blocks)
    if args.check_accuracy:
        weights = list(module.parameters()) + list(module.buffers())
        device = _map_location(args.device) or next((w.device for w in weights), torch.device("cpu"))
        if not _accuracy(load_saved(args.input, args.device), compiled, inputs, device, args, out):
            err.write(f"torchkiln compile: --check-accuracy failed (atol {args.atol:g}, rtol {args.rtol:g}); "
                      f"{args.output} not written\n")
            return 1
    if engine_bytes is not None:
        with open(args.output, "wb") as f:
            f.write(engine_bytes)
    else:
        torch.jit.save(compiled, args.output)
    logger.info("wrote %s", args.output)
    return 0
