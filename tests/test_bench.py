"""`python -m torchkiln bench`: the trtexec-style run of a saved module and the zoo comparison, on the CPU.
Timings are only checked to be positive numbers; what is fast is not a test's business."""
import json
import os
import subprocess
import sys

import pytest
import torch

import torchkiln
from torchkiln.cli import main
from torchkiln.examples import MLP

LATENCY_KEYS = {"p25", "p75", "p50", "p90", "p99", "mean", "min", "max"}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A torchkiln-compiled MLP and the same MLP scripted, saved with torch.jit.save."""
    folder = tmp_path_factory.mktemp("bench")
    torch.manual_seed(0)
    model = MLP().eval()
    compiled = torchkiln.compile(model, inputs=[torchkiln.Input((4, 64))])
    torch.jit.save(compiled, str(folder / "mlp.ts"))
    torch.jit.save(torch.jit.script(model), str(folder / "plain.ts"))
    return folder


def test_saved_module_through_the_command_line(saved):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [os.path.dirname(os.path.dirname(torchkiln.__file__)),
                                                                    os.environ.get("PYTHONPATH")] if p))
    out = saved / "out.json"
    result = subprocess.run([sys.executable, "-m", "torchkiln", "bench", str(saved / "mlp.ts"), "--shape", "(4,64)@f32",
                             "--iters", "5", "--warmup", "2", "--device", "cpu", "--profile", "--profile-sort", "time",
                             "--json", str(out)],
                            capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert "p99" in result.stdout and "throughput" in result.stdout
    assert "torchkiln::execute_engine" in result.stdout  # the profile table names the engine op
    data = json.loads(out.read_text())
    assert data["engines"] == 1 and data["compiled_by_bench"] is False and data["build_s"] is None
    assert set(data["latency_ms"]) == LATENCY_KEYS and all(v > 0 for v in data["latency_ms"].values())
    lat = data["latency_ms"]
    assert lat["min"] <= lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert data["throughput_qps"] > 0 and data["throughput_items_per_s"] == pytest.approx(4 * data["throughput_qps"])
    assert data["batch"] == 4 and data["iters"] == 5 and data["load_s"] > 0
    rows = data["profile"]
    assert rows and {"name", "calls", "total_ms", "ms_per_iter", "percent"} <= set(rows[0])
    assert all(r["total_ms"] > 0 and 0 < r["percent"] <= 100 for r in rows)
    from torchkiln.runtime.profile import format_profile

    [engine] = data["step_profile"]  # the engine's steps (tests/test_runtime_profile.py), printed as in the JSON
    assert engine["backend"] == "onnxruntime" and engine["calls"] == 10 and engine["steps"]
    assert format_profile(engine, "time") in result.stdout


def test_plain_module_is_compiled_first_and_its_build_time_reported(saved, capsys):
    out = saved / "plain.json"
    assert main(["bench", str(saved / "plain.ts"), "--shape", "[(1,64);(4,64);(8,64)]@f32", "--iters", "3",
                 "--device", "cpu", "--json", str(out)]) == 0
    assert "compiled here" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["compiled_by_bench"] is True and data["build_s"] > 0 and data["engines"] == 1
    assert data["batch"] == 4  # timed at the opt shape


@pytest.mark.parametrize("args, message", [
    (["no_such_file.ts", "--shape", "(4,64)"], "no_such_file.ts: no such file"),
    (["{saved}/mlp.ts", "--shape", "(4,x)"], "'(4,x)' is not a shape"),
    (["{saved}/mlp.ts"], "--shape"),
    (["{saved}/mlp.ts", "--shape", "(4,64)", "--device", "tpu"], "device"),
    (["--zoo", "{saved}/mlp.ts"], "either"),
    (["--zoo", "wid"], "not one of the zoo sets"),
    (["--blocks", "--zoo"], "either"),
    (["--zoo", "wide", "--chunk", "3/2"], "--chunk '3/2': need K/N"),
    (["--merge", "{saved}/no_such.json"], "no_such.json cannot be read"),
])
def test_bad_input_is_one_line_and_exit_2(saved, capsys, args, message):
    assert main(["bench"] + [a.format(saved=saved) for a in args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_a_file_that_is_not_a_module_is_exit_2(tmp_path, capsys):
    bad = tmp_path / "junk.ts"
    bad.write_bytes(b"not a zip archive")
    assert main(["bench", str(bad), "--shape", "(4,64)"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "cannot be loaded" in err


def test_zoo_on_the_cpu_reports_failed_peers_and_skipped_models(tmp_path, capsys):
    out = tmp_path / "zoo.json"
    assert main(["bench", "--zoo", "--models", "mlp,no_such_model", "--batch", "2", "--device", "cpu", "--iters", "3",
                 "--warmup", "1", "--peers", "eager,eager+cudagraph,torchkiln", "--sources", "bundled",
                 "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "geomean" in table and "CUDA graphs need a CUDA device" in table
    data = json.loads(out.read_text())
    assert data["config"]["precision"] == "float32" and data["environment"]["torch"] == torch.__version__
    mlp, missing = data["cases"]
    assert missing["model"] == "no_such_model" and "no model 'no_such_model'" in missing["skipped"]
    assert mlp["model"] == "mlp" and mlp["batch"] == 2 and mlp["source"] == "bundled"
    peers = mlp["peers"]
    assert peers["eager+cudagraph"]["status"] == "failed" and "CUDA" in peers["eager+cudagraph"]["reason"]
    for name in ("eager", "torchkiln"):
        row = peers[name]
        assert row["status"] == "ok", row
        assert row["ms"] > 0 and row["items_per_s"] == pytest.approx(2e3 / row["ms"]) and row["build_s"] >= 0
        assert row["cosine"] > 0.9999 and row["max_abs_error"] <= 1e-4 * row["max_abs_reference"]
    assert mlp["torchkiln_ms"] == peers["torchkiln"]["ms"]
    assert peers["torchkiln"]["blocks"] == {"engine": 1, "torch": 0}  # the partition, for a split to be seen
    assert "ratio" not in mlp and data["geomean_ratio"] is None  # no best-peer candidate ran on the CPU


def test_outputs_in_named_tuples_and_dicts_are_compared_as_their_tensors():
    """A scripted Inception3 returns its logits in a named tuple beside None where eager returns the logits alone: the
    accuracy is over the tensors a model returns, in order."""
    from collections import namedtuple

    from torchkiln.bench.compare import flat_output

    Outputs = namedtuple("Outputs", "logits aux")
    logits, other = torch.randn(2, 5), torch.randn(3)
    assert flat_output(Outputs(logits, None)) is logits
    assert torch.equal(flat_output({"a": logits, "b": [other, None]}), torch.cat([logits.flatten(), other]))
    with pytest.raises(TypeError, match="holding no tensor"):
        flat_output((None,))
    with pytest.raises(TypeError, match="returned str, not tensors"):
        flat_output("logits")


def test_kernel_classes_of_a_profile():
    """Kernel names as torch.profiler gives them on an H100: cuBLAS and cuDNN are library calls, Triton kernels
    torchkiln generated, ATen's own, copies; idle is what the kernels leave of the wall time."""
    from torchkiln.bench.kernel_classes import by_class, classify_kernel

    names = {"nvjet_sm90_hsh_192x192_64x4_1x2_h_bz_coopB_TNN": "library",
             "sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc": "library",
             "pointwise_kernel": "generated", "rows_kernel_looped": "generated",
             "void at::native::(anonymous namespace)::conv_depthwise2d_forward_kernel_generic<c10::Half, int>": "aten",
             "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::"
             "direct_copy_kernel_cuda": "copies",
             "Memcpy DtoD (Device -> Device)": "copies"}
    assert {n: classify_kernel(n) for n in names} == names
    rows = [{"name": n, "total_ms": 1.0} for n in names]  # over 10 calls: 0.1 ms a call each
    classes = by_class(rows, 10, 1.0)
    assert classes["library"] == pytest.approx(0.2) and classes["generated"] == pytest.approx(0.2)
    assert classes["aten"] == pytest.approx(0.1) and classes["copies"] == pytest.approx(0.2)
    assert classes["idle"] == pytest.approx(0.3)
    assert by_class(rows, 10, 0.5)["idle"] == 0.0


def test_zoo_sets_chunks_and_batch_caps():
    from torchkiln.bench.compare import DEFAULT_MODELS, model_batches, zoo_models
    from torchkiln.cli import build_parser
    from torchkiln.examples.zoo import HOLDOUT, UNSEEN, UNSEEN2, WIDE, ZOO

    def models(*argv):
        args = build_parser().parse_args(["bench", *argv])
        return zoo_models(args.zoo, args.models, args.chunk)
    assert models("--zoo") == list(DEFAULT_MODELS) and models("--zoo", "wide") == list(WIDE)
    assert models("--zoo", "holdout") == list(HOLDOUT) and not set(HOLDOUT) & set(WIDE)
    assert models("--zoo", "unseen") == list(UNSEEN) and not set(UNSEEN) & (set(WIDE) | set(HOLDOUT))
    assert models("--zoo", "unseen2") == list(UNSEEN2) and not set(UNSEEN2) & (set(WIDE) | set(HOLDOUT) | set(UNSEEN))
    assert all(any(name in source for source in ZOO.values()) for name in HOLDOUT + UNSEEN + UNSEEN2)  # by source
    assert models("--zoo", "wide", "--models", "mlp,gpt2") == ["mlp", "gpt2"]
    chunks = [models("--zoo", "wide", "--chunk", f"{k}/5") for k in range(1, 6)]
    assert sum(chunks, []) == list(WIDE) and {len(c) for c in chunks} == {len(WIDE) // 5, len(WIDE) // 5 + 1}
    for bad in ("0/5", "6/5", f"1/{len(WIDE) + 1}", "a/b", "2"):
        with pytest.raises(ValueError, match="--chunk"):
            zoo_models("wide", chunk=bad)
    assert model_batches((1, 32), 8) == [1, 8] and model_batches((1, 32), None) == [1, 32]
    assert model_batches((16, 32), 8) == [8]


def test_chunks_merge_into_one_table(tmp_path, capsys):
    run = ["--batch", "2", "--device", "cpu", "--iters", "2", "--warmup", "0", "--peers", "eager", "--sources",
           "bundled"]
    paths = [str(tmp_path / f"{k}.json") for k in (1, 2)]
    for k, path in enumerate(paths, 1):
        assert main(["bench", "--zoo", "--models", "mlp,small_mobilenet", "--chunk", f"{k}/2", "--json", path,
                     *run]) == 0
    parts = [json.loads(open(path).read()) for path in paths]
    assert [[c["model"] for c in part["cases"]] for part in parts] == [["mlp"], ["small_mobilenet"]]
    for path, part, ratio in zip(paths, parts, (0.5, 2.0)):  # the ratios a GPU run would have recorded
        part["cases"][0]["ratio"] = ratio
        open(path, "w").write(json.dumps(part))
    capsys.readouterr()
    merged = str(tmp_path / "merged.json")
    assert main(["bench", "--merge", *paths, "--json", merged]) == 0
    table = capsys.readouterr().out
    assert sum(line.startswith("small_mobilenet") for line in table.splitlines()) == 2
    assert "geomean ratio torchkiln / best peer: 1.000 over 2 case(s)" in table
    data = json.loads(open(merged).read())
    assert [c["model"] for c in data["cases"]] == data["config"]["models"] == ["mlp", "small_mobilenet"]
    assert data["geomean_ratio"] == pytest.approx(1.0) and data["config"]["merged_from"] == paths

    assert main(["bench", "--merge", paths[0], paths[0]]) == 2
    assert "mlp batch 2 is in both" in capsys.readouterr().err
    parts[1]["config"]["precision"] = "float16"
    open(paths[1], "w").write(json.dumps(parts[1]))
    assert main(["bench", "--merge", *paths]) == 2
    assert "differ in precision: 'float16' and 'float32'" in capsys.readouterr().err


def test_kernel_launches_per_call_are_counted_and_tabled(tmp_path):
    """A profile's kernel rows give launches per call; a GPU run with --profile records them for every peer, and the
    table lists them per case (here a CPU run's result with the counts a GPU run would have recorded)."""
    from torchkiln.bench.compare import format_table
    from torchkiln.bench.kernel_classes import launches

    assert launches([{"calls": 30}, {"calls": 12}, {"calls": 8}], 10) == 5.0
    path = str(tmp_path / "run.json")
    assert main(["bench", "--zoo", "--models", "mlp", "--batch", "2", "--device", "cpu", "--iters", "2", "--warmup",
                 "0", "--peers", "eager,torchkiln", "--sources", "bundled", "--json", path]) == 0
    result = json.loads(open(path).read())
    assert "kernel launches" not in format_table(result)  # none counted on the CPU
    result["cases"][0]["peers"]["eager"]["kernels_per_call"] = 7.0
    result["cases"][0]["peers"]["torchkiln"]["kernels_per_call"] = 3.0
    lines = format_table(result).splitlines()
    at = lines.index("kernel launches per call (memcpy and memset included)")
    assert lines[at + 1].split()[2:] == ["eager", "torchkiln"]
    assert lines[at + 2].split() == ["mlp", "2", "7", "3"]


def test_every_generated_kernel_is_classed_generated():
    """Each kernel function a generator's source defines (a group norm's has the split reduction's two) is counted as
    generated time, not library time."""
    import re

    from torchkiln.bench.kernel_classes import classify_kernel
    from torchkiln.ir import layers as L
    from torchkiln.ir.network import Network
    from torchkiln.runtime.backends.cuda.codegen import pointwise, reduction

    net = Network("gn")
    x = net.add_input("x", torch.float16, (2, 8, 4, 4))
    norm = net.add_normalization(x, L.NormalizationKind.GROUP, 1e-5, num_groups=2).get_output()
    net.mark_output(net.add_activation(norm, L.ActivationType.SIGMOID).get_output())
    sources = [reduction.generate(net.layers, net.inputs, net.outputs).source,
               pointwise.generate(net.layers[1:], [norm], net.outputs).source]
    names = [n for source in sources for n in re.findall(r"@triton\.jit\ndef (\w+)\(", source) if not n.startswith("_")]
    assert "rows_split_apply_kernel" in names
    assert {n: classify_kernel(n) for n in names} == {n: "generated" for n in names}


def test_peers_are_timed_interleaved_in_rotating_rounds():
    """Every round runs each peer's share of calls in turn, the order rotated, after each peer's warm-up; on the CPU
    each share starts with an untimed call."""
    from torchkiln.bench.timing import time_interleaved

    calls = []
    runners = {name: (lambda name=name: calls.append(name)) for name in "abc"}
    times = time_interleaved(runners, torch.device("cpu"), iters=6, warmup=1, rounds=3, settle_s=0)
    assert calls == ["a", "b", "c"] + ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["b"] * 3 + ["c"] * 3 + ["a"] * 3 + \
        ["c"] * 3 + ["a"] * 3 + ["b"] * 3
    assert {n: len(t) for n, t in times.items()} == {"a": 6, "b": 6, "c": 6}


def test_a_busy_process_beside_the_benchmark_is_seen_as_load():
    """A process spinning on one core while the benchmark waits is other processes' load; the warning says so."""
    import time

    from torchkiln.bench.timing import load_warning
    from torchkiln.runtime.cpu_load import LoadMeter

    spin = "import time\nend = time.time() + 5\nwhile time.time() < end: pass"
    spinner = subprocess.Popen([sys.executable, "-c", spin])
    try:
        time.sleep(0.2)
        load = LoadMeter().start().stop()
    finally:
        spinner.kill()
        spinner.wait()
    assert 0.25 < load <= 1.0
    assert "other processes used" in load_warning(load) and load_warning(0.0) is None
    assert "interquartile range is 40%" in load_warning(0.0, spread=0.4)


def test_zoo_on_the_cpu_pins_threads_and_compares_with_onnx_runtime_direct(tmp_path, capsys):
    """On the CPU the peers are eager, ONNX Runtime on torch.onnx.export's graph, torchkiln's own session run alone and
    torchkiln, on the threads given (torch's own number restored after), each row with its spread; the ratio is
    torchkiln / ort-direct, and the call's overhead is torchkiln against its own session."""
    out = tmp_path / "zoo.json"
    threads = torch.get_num_threads()
    assert main(["bench", "--zoo", "cpu", "--models", "mlp", "--batch", "2", "--device", "cpu", "--iters", "4",
                 "--rounds", "2", "--warmup", "1", "--threads", "1", "--sources", "bundled", "--json", str(out)]) == 0
    assert torch.get_num_threads() == threads
    table = capsys.readouterr().out
    assert "1 threads" in table and "ort-direct" in table and "geomean speedup of torchkiln over eager" in table
    data = json.loads(out.read_text())
    assert data["config"]["threads"] == 1
    assert data["config"]["peers"] == ["eager", "ort-direct", "torchkiln-session", "torchkiln"]
    case, = data["cases"]
    for row in case["peers"].values():
        assert row["status"] == "ok", row
        assert row["latency_ms"]["p25"] <= row["ms"] <= row["latency_ms"]["p75"] and row["spread"] >= 0
        assert row["max_abs_error"] <= 1e-4 * row["max_abs_reference"]
    assert case["best_peer"] == "ort-direct" and case["ratio"] == pytest.approx(
        case["peers"]["torchkiln"]["ms"] / case["peers"]["ort-direct"]["ms"])
    assert 0.0 <= case["other_load"] <= 1.0 and "call_overhead_us" in case and "call over its" in table
    assert main(["bench", "--zoo", "cpu", "--models", "mlp", "--device", "cpu", "--threads", "999"]) == 2
    assert "threads must be in [1, " in capsys.readouterr().err


def test_the_cpu_zoo_has_a_dozen_model_families():
    from torchkiln.examples.zoo import CPU

    assert len(CPU) >= 12 and {"mlp-mixer-64", "regnet_y_400mf-96", "bert-mini", "gpt2-mini", "wav2vec2-mini"} <= \
        set(CPU)


def test_cold_builds_build_each_peer_in_processes_of_their_own_on_empty_caches(tmp_path, capsys):
    """`bench --zoo --cold-builds`: each peer's build of each case, fresh and then warm, in processes of their own;
    a peer that cannot build and a model that is missing are rows with their reasons."""
    out = tmp_path / "cold.json"
    assert main(["bench", "--zoo", "--cold-builds", "--models", "mlp,no_such_model", "--batch", "2", "--device", "cpu",
                 "--peers", "torchkiln,eager,eager+cudagraph", "--sources", "bundled", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "torchkiln fresh / warm s" in table and "geomean torchkiln / eager" in table
    data = json.loads(out.read_text())
    assert data["config"]["mode"] == "cold-builds"
    mlp, missing = data["cases"]
    assert "no model 'no_such_model'" in missing["skipped"]
    peers = mlp["peers"]
    for name in ("torchkiln", "eager"):
        row = peers[name]
        assert row["status"] == "ok" and row["fresh_s"] > 0 and row["warm_s"] > 0 and row["cosine"] > 0.9999, row
    assert peers["eager"]["ratio_fresh"] == pytest.approx(peers["torchkiln"]["fresh_s"] / peers["eager"]["fresh_s"])
    assert peers["eager+cudagraph"]["status"] == "failed" and "CUDA" in peers["eager+cudagraph"]["reason"]
    assert main(["bench", "--cold-builds", "--merge", str(out)]) == 2
    assert "--cold-builds goes with --zoo" in capsys.readouterr().err


def test_a_split_names_what_it_left_to_pytorch():
    """The torchkiln peer's row says which ops a split left in PyTorch and why, so a bench run shows the cause."""
    from torchkiln.bench import peers

    class Split(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.b(torch.relu(self.a(x))) + torch.histc(x, bins=4).sum()

    run = peers.torchkiln(Split().eval(), [torch.randn(2, 8)], torch.float32)
    assert run.blocks["torch"] >= 1
    assert any(line.startswith("aten::histc x1 (no converter or evaluator") for line in run.blocks["in_pytorch"])
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)).eval()
    whole = peers.torchkiln(mlp, [torch.randn(2, 8)], torch.float32)
    assert "in_pytorch" not in whole.blocks
