"""The full OpInfo conformance sweep (torchkiln.coverage.opinfo_sweep): every op of PyTorch's op_db with float32
samples, each variant, each backend, each op in a process of its own. Writes the stored table
(src/torchkiln/coverage/opinfo_table.tsv, read by `python -m torchkiln coverage`) and the table section of
docs/coverage.md.

    python scripts/opinfo_sweep.py [--ops add sum ...] [--limit 10] [--time-cap 60] [--backends reference onnxruntime]
                                   [--jobs N] [--shard I/N] [--deadline SECONDS] [--table FILE] [--no-doc]

The cuda backend on a GPU machine (1 GPU, 16 cores), in two shards of at most 9 minutes each, each writing its own
table (the samples made on the GPU and compared with GPU eager, TF32 off; op_db needs expecttest, carried as a
wheel: `python -m pip download --no-deps -d .whl expecttest==0.3.0` here):

    python3 -m pip install -q --no-index --no-deps --target .site .whl/expecttest-*.whl
    export PYTHONPATH=$PWD/src:$PWD/.site
    python3 scripts/opinfo_sweep.py --backends cuda --limit 2 --time-cap 15 --jobs 16 --shard 0/2 --deadline 450 \
        --table $OUT/opinfo_cuda_0.tsv --no-doc
    python3 scripts/opinfo_sweep.py --backends cuda --limit 2 --time-cap 15 --jobs 16 --shard 1/2 --deadline 450 \
        --table $OUT/opinfo_cuda_1.tsv --no-doc

then, back here, merge their cuda cells into the stored table and docs/coverage.md's table (a cuda column per
variant; the reference and onnxruntime cells are kept; the ops WRONG, ERROR and not run are logged):

    python scripts/opinfo_sweep.py --merge opinfo_cuda_0.tsv opinfo_cuda_1.tsv
"""
import logging
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from torchkiln.coverage.opinfo_sweep import main  # noqa: E402

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    warnings.filterwarnings("ignore")
    sys.exit(main())
