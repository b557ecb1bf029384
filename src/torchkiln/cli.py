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
    from torchkiln.coverage import (floor_coverage, floor_overloads, format_overload_report, format_report,
                                    overload_coverage, read_floor, read_seen)

    floor = read_floor(args.floor) if args.floor else None
    rows = floor_coverage(floor)
    print(format_report(rows, missing_only=args.missing))
    seen = read_seen()
    print(format_overload_report(overload_coverage(floor_overloads(floor)), overload_coverage(seen), seen,
                                 missing_only=args.missing))
    return 1 if args.require_full and not all(r.covered for r in rows) else 0


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
    args = parser.parse_args(argv)
    if args.verbose:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    return args.fn(args)


if __name__ == "__main__":
    sys.exit(main())
