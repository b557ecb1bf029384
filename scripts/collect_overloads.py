"""Write src/torchkiln/coverage/zoo_overloads.txt: the overloads in the lowered graphs of the CI zoo
(tests/test_zoo.py, which needs transformers) and of the bundled examples, with the models that show them.

    python scripts/collect_overloads.py [--out FILE]
"""
from __future__ import annotations

import argparse
import collections
import pathlib
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from torchkiln import examples  # noqa: E402
from torchkiln.coverage.overloads import SEEN_FILE, model_overloads, write_seen  # noqa: E402


def _models():
    import test_zoo  # the CI zoo's builders

    yield from ((f.__name__, f) for f in (test_zoo.bert, test_zoo.gpt2, test_zoo.distilbert, test_zoo.t5_encoder,
                                          test_zoo.vit, test_zoo.resnet, test_zoo.mobilenet, test_zoo.unet))
    yield "torchvision_vit", lambda: (torch.jit.script(test_zoo.VisionTransformer().eval()),
                                      [torch.randn(2, 3, 32, 32)])
    yield "resnet18", lambda: (examples.resnet18(), [torch.randn(1, 3, 224, 224)])
    yield "mobilenet_v2", lambda: (examples.mobilenet_v2(), [torch.randn(1, 3, 224, 224)])
    yield "mlp", lambda: (examples.MLP(), [torch.randn(4, 64)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "src" / "torchkiln" / "coverage" / SEEN_FILE))
    args = parser.parse_args()
    seen: dict[str, set[str]] = collections.defaultdict(set)
    for name, build in _models():
        model, example = build()
        with torch.no_grad():
            for key in model_overloads(model, example):
                seen[key].add(name)
        print(f"{name}: {sum(name in m for m in seen.values())} overloads")
    write_seen(seen, args.out)
    print(f"wrote {len(seen)} overloads to {args.out}")


if __name__ == "__main__":
    main()
