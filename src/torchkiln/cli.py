"""Command line: `python -m torchkiln <command>`."""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence


def _demo(args: argparse.Namespace) -> int:
    from torchkiln.demo import run_demo

    r = run_demo(args.model, args.device, args.iters)
    print(f"torchkiln demo: {r.model} on {r.device}, compiled in {r.compile_seconds:.2f}s")
    print(f"  eager PyTorch : {r.eager_ms:8.3f} ms (median of {args.iters})")
    print(f"  torchkiln     : {r.engine_ms:8.3f} ms   speedup x{r.speedup:.2f}")
    print(f"  max abs error : {r.max_abs_error:.3e}  (max |eager| {r.max_abs_reference:.3e}, "
          f"relative {r.max_abs_error / max(r.max_abs_reference, 1e-30):.1e})")
    return 0


def _info(args: argparse.Namespace) -> int:
    import torch

    import torchkiln
    from torchkiln.runtime.execute_op import engine_from_blob
    from torchkiln.stitching.stitch import ENGINE_ATTR

    if args.path.endswith((".ts", ".pt")):
        module = torch.jit.load(args.path)
        k = 0
        while hasattr(module, ENGINE_ATTR.format(k)):
            engine = engine_from_blob(getattr(module, ENGINE_ATTR.format(k)))
            print(f"engine {k}: {engine}")
            _print_io(engine)
            if args.layers:
                print(engine.network)
            k += 1
        print(f"{k} engine(s) in {args.path}")
        return 0
    with open(args.path, "rb") as f:
        engine = torchkiln.Engine.deserialize(f.read())
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
    from torchkiln.errors import TorchkilnError
    from torchkiln.onnx_file import export_onnx

    try:
        export_onnx(args.input, args.output, args.opset)
    except (TorchkilnError, ValueError, OSError) as e:
        print(f"torchkiln export-onnx: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {args.output}")
    return 0


def _coverage(args: argparse.Namespace) -> int:
    from torchkiln.coverage import floor_coverage, format_report, read_floor

    rows = floor_coverage(read_floor(args.floor) if args.floor else None)
    print(format_report(rows, missing_only=args.missing))
    return 1 if args.require_full and not all(r.covered for r in rows) else 0


_PRECISIONS = {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}


def _debug_precision(args: argparse.Namespace) -> int:
    import torch

    import torchkiln
    from torchkiln.errors import TorchkilnError

    try:
        shapes = [tuple(int(d) for d in spec.strip("()[] ").split(",") if d.strip()) for spec in args.input]
        dtype = getattr(torch, _PRECISIONS.get(args.dtype, args.dtype))
        module = torch.jit.load(args.model)
        report = torchkiln.debug_precision(
            module, [torchkiln.Input(shape, dtype=dtype) for shape in shapes],
            enabled_precisions={getattr(torch, _PRECISIONS[args.precision])}, tolerance=args.tolerance,
            plot=args.plot, backend=args.backend, precision_safety=not args.no_precision_safety)
    except (TorchkilnError, ValueError, TypeError, AttributeError, OSError, RuntimeError) as e:
        print(f"torchkiln debug-precision: {type(e).__name__}: {str(e).strip().splitlines()[0]}", file=sys.stderr)
        return 1
    print(report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torchkiln", description="torchkiln: an ahead-of-time inference compiler "
                                     "for PyTorch TorchScript modules.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress (INFO)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile a bundled model and compare it with eager PyTorch")
    demo.add_argument("--model", choices=["resnet", "mlp"], default="resnet")
    demo.add_argument("--device", default="cpu")
    demo.add_argument("--iters", type=int, default=20)
    demo.set_defaults(fn=_demo)
    info = sub.add_parser("info", help="describe an engine file or the engines in a saved compiled module")
    info.add_argument("path")
    info.add_argument("--layers", action="store_true", help="print every layer")
    info.set_defaults(fn=_info)
    export = sub.add_parser("export-onnx", help="write the engine of an engine file, or of a saved compiled module "
                            "made of one engine, as an ONNX model")
    export.add_argument("input", metavar="IN", help="engine bytes, or a saved module (torch.jit.save)")
    export.add_argument("output", metavar="OUT", help="the .onnx file to write")
    export.add_argument("--opset", type=int, default=None, help="ONNX opset (default: onnx_export.DEFAULT_OPSET)")
    export.set_defaults(fn=_export_onnx)
    coverage = sub.add_parser("coverage", help="which ops of a floor list have converters or evaluators")
    coverage.add_argument("--floor", metavar="FILE", help="one op name a line (default: the bundled ts_ops_floor.txt)")
    coverage.add_argument("--missing", action="store_true", help="list only the ops not covered")
    coverage.add_argument("--require-full", action="store_true", help="exit with status 1 unless every op is covered")
    coverage.set_defaults(fn=_coverage)
    debug = sub.add_parser("debug-precision", help="layer-wise error of a saved TorchScript module's engines "
                           "against eager float32, and the first layer past the tolerance")
    debug.add_argument("model", metavar="MODEL.ts", help="a module saved with torch.jit.save")
    debug.add_argument("--input", action="append", required=True, metavar="SHAPE",
                       help="one input's shape, e.g. 1,3,224,224 (repeat for each input, in order)")
    debug.add_argument("--dtype", default="f32", help="the inputs' dtype: f32, f16, bf16 or a torch dtype name "
                       "such as int64 (default f32)")
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
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
