"""Command line: `python -m torchkiln <command>` (or the `torchkiln` script).

The arguments are parsed before torch is imported (torchkiln/__init__.py imports the API later while the command
line starts), so `--help` and `--version` answer at once; each command imports what it needs. Errors are one
`torchkiln COMMAND: error: ...` line on stderr with exit status 2; warnings are logged, -v adds INFO, -v -v DEBUG.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import logging
import os
import platform
import sys
import time
import warnings
import zipfile
from collections.abc import Collection, Iterator, Sequence
from typing import Any, NoReturn

import torchkiln
from torchkiln import compile_command
from torchkiln._version import __version__
from torchkiln.compile_command import CommandError, load_saved
from torchkiln.log import logging_at


class _Parser(argparse.ArgumentParser):
    """argparse's parser, its errors one line (`torchkiln compile: error: ...`, exit status 2) like the commands'."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Version(argparse.Action):
    """--version: torchkiln's version, and torch's and Python's (read from the installed metadata, not imported)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        try:
            torch = f"torch {importlib.metadata.version('torch')}"
        except importlib.metadata.PackageNotFoundError:
            torch = "torch not installed"
        print(f"torchkiln {__version__} ({torch}, Python {platform.python_version()})")
        parser.exit()


def _verbosity() -> argparse.ArgumentParser:
    """-v and -q, which every command takes after its name (as torchtrtc takes them); a new parser for each
    command, so that compile may add torchtrtc's spellings to them."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("-v", "--verbose", action="count", default=0,
                   help="log progress (INFO); twice (-vv): debugging (DEBUG). Default: warnings and errors")
    p.add_argument("-q", "--quiet", action="store_true", help="log errors only")
    return p


def _log_level(args: argparse.Namespace) -> int:
    """WARNING, INFO with -v, DEBUG with -vv or compile's --debug, ERROR with -q."""
    verbose = args.verbose + args.verbose_before
    if args.quiet:
        return logging.ERROR
    if verbose >= 2 or getattr(args, "debug", False):
        return logging.DEBUG
    return logging.INFO if verbose else logging.WARNING


def _demo(args: argparse.Namespace) -> int:
    from torchkiln.demo import run_demo

    r = run_demo(args.model, args.device, args.iters, threads=args.threads)
    print(f"torchkiln demo: {r.model} on {r.device} ({r.threads} threads), compiled in {r.compile_seconds:.2f}s")
    print(f"  eager PyTorch : {r.eager_ms:8.3f} ms ±{r.eager_spread / 2:.0%} (median of {args.iters}, ± half the "
          f"interquartile range; interleaved with torchkiln's calls)")
    print(f"  torchkiln     : {r.engine_ms:8.3f} ms ±{r.engine_spread / 2:.0%}   speedup x{r.speedup:.2f}")
    print(f"  max abs error : {r.max_abs_error:.3e}  (max |eager| {r.max_abs_reference:.3e}, "
          f"relative {r.max_abs_error / max(r.max_abs_reference, 1e-30):.1e})")
    if r.warning:
        print(f"  warning       : {r.warning}; the speedup may not hold on a quiet machine")
    return 0


def _info(args: argparse.Namespace) -> int:
    import torch

    import torchkiln
    from torchkiln.errors import EngineFormatError
    from torchkiln.runtime.execute_op import engine_from_blob
    from torchkiln.stitching.stitch import engine_attrs

    if not os.path.isfile(args.path):
        raise CommandError(f"{args.path}: no such file")
    if zipfile.is_zipfile(args.path):
        try:
            module = torch.jit.load(args.path)
        except RuntimeError as e:
            raise CommandError(f"{args.path} is a zip file but not a saved TorchScript module "
                               f"({str(e).strip().splitlines()[0]})") from None
        attrs = engine_attrs(module)
        for k, attr in enumerate(attrs):
            engine = engine_from_blob(getattr(module, attr))
            print(f"engine {k}: {engine}")
            _print_io(engine)
            if args.layers:
                print(engine.network)
        print(f"{len(attrs)} engine(s) in {args.path}")
        return 0
    with open(args.path, "rb") as f:
        data = f.read()
    try:
        engine = torchkiln.Engine.deserialize(data)
    except EngineFormatError as e:
        raise CommandError(f"{args.path} is neither a torchkiln engine nor a saved module: {e}") from None
    print(engine)
    _print_io(engine)
    if args.layers:
        print(engine.network)
    return 0


def _print_io(engine) -> None:
    """Input and output shapes (symbolic dims by name) and the ranges of the dynamic dims."""
    from torchkiln.ir.symbolic import ranges_str

    print("  inputs:  " + ", ".join(repr(t) for t in engine.network.inputs))
    print("  outputs: " + ", ".join(repr(t) for t in engine.network.outputs))
    symbols = engine.network.symbols()
    if symbols:
        print("  dynamic dims: " + ranges_str(symbols))


def _export_onnx(args: argparse.Namespace) -> int:
    from torchkiln.onnx_file import export_onnx

    if not os.path.isfile(args.input):
        raise CommandError(f"{args.input}: no such file")
    export_onnx(args.input, args.output, args.opset)
    print(f"wrote {args.output}")
    return 0


def _coverage(args: argparse.Namespace) -> int:
    from torchkiln.coverage import (floor_coverage, floor_overloads, format_overload_report, format_report,
                                    overload_coverage, read_floor, read_seen)
    from torchkiln.coverage.opinfo import format_fraction, read_table

    floor = read_floor(args.floor) if args.floor else None
    rows = floor_coverage(floor)
    print(format_report(rows, missing_only=args.missing))
    seen = read_seen()
    print(format_overload_report(overload_coverage(floor_overloads(floor)), overload_coverage(seen), seen,
                                 missing_only=args.missing))
    print(format_fraction(read_table(args.opinfo)))
    return 1 if args.require_full and not all(r.covered for r in rows) else 0


_PRECISIONS = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _debug_precision(args: argparse.Namespace) -> int:
    import torch

    if args.input and args.specs:
        raise CommandError("give the input specs after MODEL.ts or with --input, not both")
    specs = args.input or args.specs
    if not specs:
        raise CommandError("give each input of forward: a spec as compile takes them, e.g. '(1,3,224,224)@f32', "
                           "or --input 1,3,224,224 (with --dtype)")
    # compile's specs; a shape without parentheses (1,3,224,224) and a spec without @dtype take --dtype
    specs = [s if s.lstrip().startswith(("(", "[")) else f"({s})" for s in specs]
    inputs = compile_command.parse_specs([s if "@" in s else f"{s}@{args.dtype}" for s in specs])
    report = torchkiln.debug_precision(
        load_saved(args.model), inputs, enabled_precisions={getattr(torch, _PRECISIONS[args.precision])},
        tolerance=args.tolerance, plot=args.plot, backend=args.backend,
        precision_safety=not args.no_precision_safety)
    print(report)
    return 0


def _bench(args: argparse.Namespace) -> int:
    """The zoo comparison (--zoo [SET] or --blocks; --merge: of several runs' results) or the trtexec-style run of
    one saved module."""
    import json

    from torchkiln.bench import chart, cold, compare, options, saved
    from torchkiln.errors import TorchkilnError

    def fail(message: str) -> int:
        print(f"torchkiln bench: error: {message}", file=sys.stderr)
        return 2

    if args.zoo not in (None, *compare.ZOO_SETS):  # a set's name, or MODEL.ts given after --zoo
        return fail(f"--zoo {args.zoo!r} is not one of the zoo sets {list(compare.ZOO_SETS)}: give either a saved "
                    "module (MODEL.ts), --zoo [SET], --blocks or --merge FILE...")
    if [bool(args.model), args.zoo is not None, args.blocks, bool(args.merge)].count(True) != 1:
        return fail("give either a saved module (MODEL.ts), --zoo [SET], --blocks or --merge FILE...")
    if args.cold_builds and args.zoo is None and not args.blocks:
        return fail("--cold-builds goes with --zoo [SET] or --blocks")
    try:
        device = options.bench_device(args.device)
        if args.model:
            result = saved.run_saved(args.model, args.shape, device, args.iters, args.warmup,
                                     options.bench_precision(args.precision or "fp32", device), args.profile)
            print(saved.format_report(result, args.profile_sort))
        else:
            if args.merge:
                result = compare.merge_results(compare.load_results(args.merge))
            else:
                models = compare.zoo_models("blocks" if args.blocks else args.zoo, args.models, args.chunk)
                batches = [int(b) for b in args.batch.split(",")]
                precision = options.bench_precision(args.precision, device)
                peers = args.peers.split(",") if args.peers else None
                progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
                if args.cold_builds:
                    result = cold.run_cold_builds(models, batches, device, precision,
                                                  peers or cold.COLD_PEERS[device.type], args.sources.split(","),
                                                  progress)
                else:
                    result = compare.run_comparison(models, batches, device, precision, args.iters, args.warmup,
                                                    peers, args.sources.split(","), progress=progress,
                                                    profile=args.profile, threads=args.threads, rounds=args.rounds)
            if args.cold_builds:
                print(cold.format_table(result))
            else:
                print(compare.format_table(result))
                if args.png:
                    chart.write_png(result, args.png)
    except ValueError as e:  # what the user gave (saved.BenchInputError is one)
        return fail(str(e))
    except (TorchkilnError, RuntimeError) as e:
        return fail(f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


def _one_line(error: BaseException) -> str:
    """An error as one line: its lines joined (a TorchScript interpreter error: its cause line), after its type
    unless it is a CommandError."""
    from torchkiln.errors import cause_line

    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    joined = "".join(line + (" " if line.endswith(":") else "; ") for line in lines).rstrip("; ")
    text = cause_line(error) if len(lines) > 1 and cause_line(error) != lines[0] else joined
    return text if isinstance(error, CommandError) else f"{type(error).__name__}: {text}"


@contextlib.contextmanager
def _log_to_stderr(level: int) -> Iterator[None]:
    """Log torchkiln's messages at `level` and above to stderr, each with the seconds since the command began.
    torchkiln's warnings are logged (log.warn), so Python's copy of them is not shown again."""
    start = time.perf_counter()
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(lambda record: setattr(record, "elapsed", time.perf_counter() - start) or True)
    handler.setFormatter(logging.Formatter("[%(elapsed)6.2fs] %(levelname)s %(name)s: %(message)s"))
    with logging_at(level, handler), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torchkiln\.")
        yield


def build_parser(words: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command and flag with its help text.

    The flags of bench and export-onnx show values of modules that import torch (the zoo's sets, the peers, the
    exporter's opset): given `words` (the command line's), they are added only where their command is one of them,
    so that other commands, --help and --version start without torch."""
    parser = _Parser(prog="torchkiln", description="torchkiln: an ahead-of-time inference compiler for PyTorch "
                     "TorchScript modules. Errors are one line on stderr, exit status 2.")
    parser.add_argument("--version", action=_Version, help="print torchkiln's version (and torch's) and exit")
    parser.add_argument("-v", "--verbose", dest="verbose_before", action="count", default=0,
                        help="log progress (INFO); twice: DEBUG (also after the command)")
    parser.add_argument("--traceback", action="store_true",
                        help="on an error, show Python's traceback instead of one line")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", parents=[_verbosity()], help="compile a bundled model and compare it with eager "
                          "PyTorch")
    demo.add_argument("--model", choices=["resnet", "mlp"], default="resnet", help="which bundled model")
    demo.add_argument("--device", default="cpu", help="cpu or cuda")
    demo.add_argument("--iters", type=int, default=20, help="timed runs of each (the median is shown)")
    demo.add_argument("--threads", type=int, default=None, help="CPU threads of eager and the engine alike "
                      "(default: torch's number of threads)")
    demo.set_defaults(fn=_demo)
    compile_command.add_parser(sub, parents=[_verbosity()]).set_defaults(fn=_compile)
    info = sub.add_parser("info", parents=[_verbosity()], help="describe an engine file or the engines in a saved "
                          "compiled module")
    info.add_argument("path", help="engine bytes, or a saved module (torch.jit.save)")
    info.add_argument("--layers", action="store_true", help="print every layer")
    info.set_defaults(fn=_info)
    export = sub.add_parser("export-onnx", parents=[_verbosity()], help="write the engine of an engine file, or of a "
                            "saved compiled module made of one engine, as an ONNX model")
    export.add_argument("input", metavar="IN", help="engine bytes, or a saved module (torch.jit.save)")
    export.add_argument("output", metavar="OUT", help="the .onnx file to write")
    if words is None or "export-onnx" in words:
        from torchkiln.onnx_export import DEFAULT_OPSET

        export.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (default: %(default)s)")
    export.set_defaults(fn=_export_onnx)
    coverage = sub.add_parser("coverage", parents=[_verbosity()], help="which ops of a floor list have converters "
                              "or evaluators")
    coverage.add_argument("--floor", metavar="FILE", help="one op name a line (default: the bundled ts_ops_floor.txt)")
    coverage.add_argument("--opinfo", metavar="FILE", help="the OpInfo sweep's table (default: the bundled "
                          "opinfo_table.tsv that scripts/opinfo_sweep.py writes)")
    coverage.add_argument("--missing", action="store_true", help="list only the ops not covered")
    coverage.add_argument("--require-full", action="store_true", help="exit with status 1 unless every op is covered")
    coverage.set_defaults(fn=_coverage)
    _add_bench(sub, flags=words is None or "bench" in words)
    debug = sub.add_parser("debug-precision", parents=[_verbosity()], help="layer-wise error of a saved TorchScript "
                           "module's engines against eager float32, and the first layer past the tolerance")
    debug.add_argument("model", metavar="MODEL.ts", help="a module saved with torch.jit.save, not compiled yet")
    debug.add_argument("specs", nargs="*", default=[], metavar="SPEC",
                       help="one input of forward, in order, as compile takes them: '(1,3,224,224)@f16', "
                            "'[(1,3,224,224);(4,3,224,224);(8,3,224,224)]' (run at the opt shape)")
    debug.add_argument("-i", "--input", action="append", default=[], metavar="SHAPE",
                       help="one input's shape, e.g. 1,3,224,224 (with --dtype), or a SPEC (repeat for each input, in "
                            "order): another way to give them")
    debug.add_argument("--dtype", default="f32", help="the dtype of the inputs given without @dtype: f32, f16, bf16, "
                       "int64... (default f32)")
    debug.add_argument("-p", "--precision", choices=sorted(_PRECISIONS), default="f16",
                       help="the engine precision to debug (default f16)")
    debug.add_argument("--tolerance", type=float, default=None,
                       help="relative error past which a layer is flagged (default: 1e-2 f16, 5e-2 bf16, 1e-4 f32)")
    debug.add_argument("--backend", default="reference", choices=["reference", "onnxruntime", "auto"],
                       help="the backend to build for (default reference: on the CPU, onnxruntime builds in f32)")
    debug.add_argument("--no-precision-safety", action="store_true",
                       help="do not keep overflowing layers in f32 (see what the plain precision does)")
    debug.add_argument("--plot", metavar="FILE", help="also write a plot of the errors (needs matplotlib)")
    debug.set_defaults(fn=_debug_precision)
    return parser


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line's arguments; SystemExit after --help, --version or a usage error."""
    parser = build_parser(argv)
    args, extra = parser.parse_known_args(argv)
    command = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
    if args.command == "compile":
        compile_command.take_positionals(args, extra, command)
    elif extra:
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _compile(args: argparse.Namespace) -> int:
    return compile_command.run(args, sys.stdout, sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (`argv`: sys.argv[1:] by default); returns the exit status."""
    try:
        args = _parse(compile_command.normalize_argv(sys.argv[1:] if argv is None else argv))
    except SystemExit as done:  # --help, --version, or a usage error (already printed)
        return done.code if isinstance(done.code, int) else 2
    with _log_to_stderr(_log_level(args)):
        try:
            torchkiln._import_api()  # torch, and torchkiln's TorchScript ops (torch.jit.load of compiled modules)
            return args.fn(args)
        except Exception as error:  # noqa: BLE001  (a command line reports any error as one line)
            if args.traceback:
                raise
            print(f"torchkiln {args.command}: error: {_one_line(error)}", file=sys.stderr)
            return 2


def _add_bench(sub: argparse._SubParsersAction, flags: bool = True) -> None:
    """The bench command; its flags (which import torch for the zoo's sets, the peers and the model sources) only
    with `flags`."""
    bench = sub.add_parser(
        "bench", parents=[_verbosity()],
        help="latency of a saved module (trtexec-style), or torchkiln against its peers on the model zoo",
        description="Two modes. `bench MODEL.ts --shape SPEC [--shape SPEC ...]`: load a saved TorchScript module "
        "(compile it with torchkiln first if it is a plain one), time it on random inputs: latency p50/p90/p99, "
        "mean, throughput, build time; --profile adds each engine's steps with their time per call (trtexec "
        "--dumpProfile) and a per-op time table. `bench --zoo`: per model and batch, "
        "eager, eager in a CUDA graph, torch.compile (default, reduce-overhead, reduce-overhead + freezing) and "
        "torchkiln on the same inputs: median latency, build time, accuracy against fp32 eager, throughput, and "
        "the ratio torchkiln / best peer with its geomean; `bench --merge FILE...`: one table of several --zoo runs' "
        "--json results (the chunks of one model list, --chunk).")
    bench.set_defaults(fn=_bench)
    if not flags:
        return
    from torchkiln.bench.compare import ZOO_SETS
    from torchkiln.bench.peers import DEFAULT_PEERS, PEERS
    from torchkiln.examples.zoo import SOURCES

    bench.add_argument("model", nargs="?", metavar="MODEL.ts", help="a saved TorchScript module (torch.jit.save): "
                       "torchkiln-compiled, or plain (then compiled here for --shape)")
    bench.add_argument("--shape", action="append", default=[], metavar="SPEC",
                       help="one input of MODEL.ts, once per input in order: '(1,3,224,224)@f32', "
                       "'(1,3,224,224)@f16%%channels_last' or a range '[(1,3,224,224);(8,3,224,224);(32,3,224,224)]"
                       "@f32' (min;opt;max; timed at opt); dtypes f32 f16 bf16 f64 i32 i64 i8 u8 bool")
    bench.add_argument("--profile", action="store_true", help="print each engine's steps (a layer, an ONNX Runtime "
                       "node or a fused kernel, run one by one) with their time per call and share, like trtexec "
                       "--dumpProfile, on cuda with each pair of steps left apart and why; the time per op "
                       "(torch.profiler, self time, top entries); on a GPU the time per call by kernel class (library, "
                       "generated, ATen, copies, idle); with --zoo or --blocks, torchkiln's by kernel class and every "
                       "peer's kernel launches per call")
    bench.add_argument("--profile-sort", choices=("order", "time"), default="order",
                       help="--profile: order of the per-step table, the engine's or slowest first (default: "
                       "%(default)s)")
    bench.add_argument("--zoo", nargs="?", const="default", metavar="SET",
                       help="compare torchkiln with its peers on a set of zoo models: default (" +
                       ", ".join(ZOO_SETS["default"]) + "), wide (16 real models at their real sizes: CNNs with "
                       "depthwise, grouped and ConvNeXt convolutions, Swin, segmentation, an FPN backbone, DeiT, a "
                       "diffusion block, RoBERTa, T5's encoder, GPT-2, Llama and Qwen2 decoders; "
                       "torchkiln.examples.zoo.WIDE), holdout (14 more real models at real sizes that the cuda backend was "
                       "never tuned on: ShuffleNet V2, MaxViT, Swin V2, SqueezeNet, LR-ASPP, DeBERTa-v3, BART, CLIP's "
                       "vision tower, MobileViT, ConvNeXt V2, SegFormer, wav2vec2, Qwen3 and Phi-1.5 decoders; "
                       "torchkiln.examples.zoo.HOLDOUT), unseen (16 timm models at their published sizes, added "
                       "after all the tuning: DenseNet, Inception V3, ResNeSt, HRNet, Res2Net, GhostNet, MixNet, "
                       "MobileNetV4, PoolFormer, EdgeNeXt, PVT v2, Twins, CaiT, EVA-02, FocalNet, TinyViT; "
                       "torchkiln.examples.zoo.UNSEEN), unseen2 (the next 19 timm models, added after the "
                       "unseen set's changes: ReXNet, DPN, CSPDarknet, DLA, VoVNet, HGNetV2, NF-ResNet, StarNet, "
                       "RepViT, EfficientViT, LeViT, GC ViT, XCiT, CoaT, MobileViT V2, CrossViT, CAFormer, DaViT, "
                       "HaloNet; torchkiln.examples.zoo.UNSEEN2), cpu (13 real models at CPU sizes: ResNet, "
                       "RegNet, MobileNet V2/V3, ConvNeXt and MLP-Mixer built in code, BERT, ELECTRA, DistilBERT, "
                       "GPT-2, ViT, wav2vec2 and Whisper's encoder from transformers configs; "
                       "torchkiln.examples.zoo.CPU) or blocks "
                       "(= --blocks)")
    bench.add_argument("--blocks", action="store_true", help="--zoo on generic blocks of real models (RMSNorm + "
                       "SwiGLU, ConvNeXt, GroupNorm ResBlock, attention by hand, squeeze-excitation, LayerNorm and "
                       "tanh-GELU MLPs, FPN merge, RoPE attention, GQA attention, depthwise-separable conv: "
                       "torchkiln.examples.blocks); --batch scales their inputs")
    bench.add_argument("--models", default=None,
                       help="--zoo: comma-separated zoo models instead of the set's (torchvision: resnet50, "
                       "mobilenet_v2, vit_b_16, ...; transformers: bert-base, gpt2; bundled: resnet18, mobilenet_v2, "
                       "small_resnet, small_mobilenet, mlp)")
    bench.add_argument("--chunk", metavar="K/N", help="--zoo: run only the K-th (from 1) of N contiguous slices of "
                       "the models, e.g. to keep each call short; --merge joins the chunks' --json results")
    bench.add_argument("--cold-builds", action="store_true", help="--zoo or --blocks: build times only, each peer "
                       "building each case in a process of its own, with empty compile caches (torchkiln's, "
                       "Triton's, Inductor's) and again on the caches the first build filled (default peers: "
                       "torchkiln, compile-ro, compile-ro-freeze on cuda; torchkiln, compile on cpu)")
    bench.add_argument("--merge", nargs="+", metavar="FILE", help="print one table of the --json results of several "
                       "--zoo runs on one machine (with --json, write the merged result)")
    bench.add_argument("--batch", default="1,32", help="--zoo: comma-separated batch sizes, each capped at a model's "
                       "largest (the wide set's LLMs: 8) (default: %(default)s)")
    bench.add_argument("--peers", default=None, help=f"--zoo: comma-separated peers to run, of {', '.join(PEERS)} "
                       f"(default: {', '.join(DEFAULT_PEERS['cuda'])} on cuda; {', '.join(DEFAULT_PEERS['cpu'])} on "
                       "cpu)")
    bench.add_argument("--sources", default=",".join(SOURCES),
                       help="--zoo: where models come from, first that has the model and is installed wins "
                       "(default: %(default)s)")
    bench.add_argument("--precision", default=None, help="--zoo: fp32, fp16 or bf16 for every peer (default: fp16 "
                       "on cuda, fp32 on cpu); MODEL.ts: the precision a plain module is compiled in (default fp32)")
    bench.add_argument("--device", default=None, help="cpu or cuda (default: cuda where available, else cpu)")
    bench.add_argument("--iters", type=int, default=100, help="timed calls per measurement (default: %(default)s)")
    bench.add_argument("--warmup", type=int, default=10, help="untimed calls before timing (default: %(default)s)")
    bench.add_argument("--rounds", type=int, default=10, help="--zoo: the peers' calls are timed interleaved, in this "
                       "many rounds, the order rotated each round (default: %(default)s)")
    bench.add_argument("--threads", type=int, default=None, help="--zoo: CPU threads of every peer (torch's, "
                       "ONNX Runtime's) (default: torch's number of threads)")
    bench.add_argument("--json", metavar="FILE", help="write every result to this JSON file")
    bench.add_argument("--png", metavar="FILE", help="--zoo: write a bar chart of the latencies (needs matplotlib)")


if __name__ == "__main__":
    sys.exit(main())
