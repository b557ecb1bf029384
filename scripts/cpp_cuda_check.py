"""The Python half of scripts/cpp_cuda_check.sh: compile and save fp16 ResNet-50 and BERT-base, time the Python
runtime (`compile`), then compare the C++ program's outputs and times with it (`report`).

`--dry-run` compiles small stand-ins with backend="reference" in fp32 on the CPU, to check the steps without a GPU."""
import argparse
import json
import logging
import pathlib
import statistics
import time

import torch

import torchkiln
from torchkiln.runtime.engine import Engine

LOG = logging.getLogger("cpp_cuda_check")
MODELS = ("resnet50", "bert")


class _LastHiddenState(torch.nn.Module):
    def __init__(self, bert: torch.nn.Module):
        super().__init__()
        self.bert = bert

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids).last_hidden_state


def _calibrated(model: torch.nn.Module, make_batch) -> torch.nn.Module:
    """Batch-norm statistics from random data, so random weights give outputs of a sensible scale."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # a running mean over the calibration batches
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(make_batch())
    return model.eval()


def _resnet(dry: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    try:
        import torchvision

        model = torchvision.models.resnet18() if dry else torchvision.models.resnet50()
    except ImportError:
        if not dry:
            raise
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                    torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))
    shape = (2, 3, 64, 64) if dry else (8, 3, 224, 224)
    return _calibrated(model, lambda: torch.randn(*shape)), torch.randn(*shape)


def _bert(dry: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    import transformers

    torch.manual_seed(0)
    size = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128) if dry else \
        dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
    config = transformers.BertConfig(vocab_size=30522, max_position_embeddings=512, **size)
    batch, seq = (2, 16) if dry else (8, 128)
    return _LastHiddenState(transformers.BertModel(config)).eval(), torch.randint(0, 30522, (batch, seq))


def _median_ms(fn, device: str, runs: int = 50) -> float:
    times = []
    for _ in range(runs):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _event_ms(fn, runs: int = 50) -> float:
    """The median time between CUDA events recorded on the current stream before and after each call."""
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        before.record()
        fn()
        after.record()
        torch.cuda.synchronize()
        times.append(before.elapsed_time(after))
    return statistics.median(times)


def compile_models(work: pathlib.Path, dry: bool) -> None:
    """Save model_<name>.pt, inputs_<name>.pt, python_<name>.pt and python_ms.json under `work`."""
    device, backend = ("cpu", "reference") if dry else ("cuda", "cuda")
    precisions = {torch.float} if dry else {torch.half}
    times = {}
    for name, make in (("resnet50", _resnet), ("bert", _bert)):
        start = time.perf_counter()
        model, x = make(dry)
        model, x = model.to(device), x.to(device)
        if not dry:
            model = model.half()
            x = x.half() if x.is_floating_point() else x
        spec = torchkiln.Input(tuple(x.shape), dtype=x.dtype)
        # (the cuda backend records a tape by default; the dry run asks for a CPU one, to exercise the same path)
        compiled = torchkiln.compile(model, inputs=[spec], backend=backend, enabled_precisions=precisions,
                                     native_tape=True if dry else None)
        LOG.info("%s compiled in %.1f s; its engine holds %d tape(s)", name, time.perf_counter() - start,
                 len(_engine(compiled).tapes))
        with torch.no_grad():
            out = compiled(x)
            eager = model(x)
            times[name] = _median_ms(lambda: compiled(x), device)
        LOG.info("%s: Python runtime %.3f ms per call; cosine vs eager %.5f", name, times[name], _cosine(out, eager))
        torch.jit.save(compiled, str(work / f"model_{name}.pt"))
        torch.save((x.cpu(),), work / f"inputs_{name}.pt")
        torch.save(out.cpu(), work / f"python_{name}.pt")
    (work / "python_ms.json").write_text(json.dumps(times))


def _engine(compiled: torch.jit.ScriptModule) -> Engine:
    return Engine.deserialize(bytes(compiled._c.getattr("_torchkiln_engine_0").cpu().numpy()))


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(a.double().flatten(), b.double().flatten(), dim=0).item()


def report(work: pathlib.Path) -> str:
    """The table: C++ vs Python outputs, per-call latency medians, the C++ process's wall time."""
    python_ms = json.loads((work / "python_ms.json").read_text())
    lines = ["model     identical  max_abs_diff  cosine    cpp_ms_median  python_ms_median  cpp_process_wall_s"]
    for name in MODELS:
        want = torch.load(work / f"python_{name}.pt")
        got = torch.load(work / f"cpp_{name}.pt", weights_only=False)
        got = got[0] if isinstance(got, (list, tuple)) else got
        assert got.shape == want.shape and got.dtype == want.dtype, f"{name}: {got.dtype}{list(got.shape)}"
        log = (work / f"cpp_{name}.log").read_text().split()
        cpp_ms = float(log[log.index("latency_ms_median") + 1])
        wall = float((work / f"cpp_{name}.wall").read_text())
        diff = (got.double() - want.double()).abs().max().item()
        lines.append(f"{name:<9} {str(torch.equal(got, want)):<10} {diff:<13.4g} {_cosine(got, want):<9.6f} "
                     f"{cpp_ms:<14.3f} {python_ms[name]:<17.3f} "
                     f"{wall:.2f}")
    return "\n".join(lines)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("step", choices=("compile", "report"))
    parser.add_argument("work", type=pathlib.Path)
    parser.add_argument("--dry-run", action="store_true", help="small fp32 models, backend='reference', on the CPU")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    if args.step == "compile":
        compile_models(args.work, args.dry_run)
    else:
        print(report(args.work))


if __name__ == "__main__":
    main()
