"""Containers of tensors built in forward (torchvision's IntermediateLayerGetter and FPN, timm's attention bias
cache) become one engine: lowering reads their elements where they are stored (resolve_static_containers,
resolve_attribute_caches). Where the structure is not known at build time the container stays in PyTorch."""
from collections import OrderedDict
from typing import Dict, List

import pytest
import torch
import torch.nn.functional as F
from harness import assert_matches_eager, check_compiled
from torch import nn

import torchkiln
from torchkiln.compiler import compile_with_report
from torchkiln.lowering import lower
from torchkiln.lowering.walk import all_nodes
from torchkiln.settings import CompileSettings


class LayerGetter(nn.ModuleDict):
    """torchvision's IntermediateLayerGetter: runs its children in order, returns some outputs in a dict."""

    def __init__(self, return_layers: Dict[str, str]) -> None:
        super().__init__(OrderedDict([("stem", nn.Conv2d(3, 8, 3, padding=1)), ("act", nn.ReLU()),
                                      ("down", nn.Conv2d(8, 8, 3, stride=2, padding=1)), ("act2", nn.Sigmoid())]))
        self.return_layers = return_layers

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        out = OrderedDict()
        for name, module in self.items():
            x = module(x)
            if name in self.return_layers:
                out[self.return_layers[name]] = x
        return out


class Segmentation(nn.Module):
    """torchvision's segmentation models: a dict of features in, `result["out"] = ...` out (a Dict)."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = LayerGetter({"act": "low", "act2": "high"})
        self.low = nn.Conv2d(8, 2, 1)
        self.high = nn.Conv2d(8, 2, 1)

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        features = self.backbone(x)
        low, high = features["low"], features["high"]
        y = self.high(high)
        y = F.interpolate(y, size=low.shape[-2:], mode="bilinear", align_corners=False) + self.low(low)
        result = OrderedDict()
        result["out"] = F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)
        if "aux" in features:
            result["aux"] = features["aux"]
        return result


def test_intermediate_layer_getter_and_a_dict_result_are_one_engine():
    _, report = check_compiled(Segmentation(), [torch.randn(1, 3, 16, 16)], engines=1, torch_blocks=0)
    assert report.fallback_ops == {}


class Pyramid(nn.Module):
    """torchvision's FeaturePyramidNetwork: dict in, list built by insert(0, ...), extra level appended, then an
    OrderedDict zipped from names and results; the caller returns `list(d.values())`."""

    def __init__(self, channels: List[int]) -> None:
        super().__init__()
        self.inner = nn.ModuleList([nn.Conv2d(c, 4, 1) for c in channels])
        self.layer = nn.ModuleList([nn.Conv2d(4, 4, 3, padding=1) for _ in channels])

    def inner_at(self, x: torch.Tensor, idx: int) -> torch.Tensor:
        out = x
        for i, module in enumerate(self.inner):
            if i == idx % len(self.inner):
                out = module(x)
        return out

    def layer_at(self, x: torch.Tensor, idx: int) -> torch.Tensor:
        out = x
        for i, module in enumerate(self.layer):
            if i == idx % len(self.layer):
                out = module(x)
        return out

    def forward(self, x: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        names = list(x.keys())
        x = list(x.values())
        last = self.inner_at(x[-1], -1)
        results = []
        results.append(self.layer_at(last, -1))
        for idx in range(len(x) - 2, -1, -1):
            lateral = self.inner_at(x[idx], idx)
            last = lateral + F.interpolate(last, size=lateral.shape[-2:], mode="nearest")
            results.insert(0, self.layer_at(last, idx))
        names.append("pool")
        results.append(F.max_pool2d(results[-1], 1, 2, 0))
        return OrderedDict([(k, v) for k, v in zip(names, results)])


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = LayerGetter({"stem": "0", "act": "1", "down": "2"})
        self.fpn = Pyramid([8, 8, 8])

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        return list(self.fpn(self.body(x)).values())


def test_feature_pyramid_lists_are_one_engine():
    _, report = check_compiled(Backbone(), [torch.randn(1, 3, 16, 16)], engines=1, torch_blocks=0)
    assert report.fallback_ops == {}


class DynamicKey(nn.Module):
    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        d: Dict[str, torch.Tensor] = {}
        d["a"] = x + 1
        d["b"] = x * 2
        return d["a" if bool(i > 0) else "b"] * 3


def test_a_key_known_only_at_run_time_keeps_the_dict():
    x = torch.randn(3)
    specs = [torchkiln.Input.from_tensor(x), torchkiln.Input((), dtype=torch.int64)]
    graph = lower(torch.jit.script(DynamicKey()), CompileSettings.create(specs)).graph
    assert "aten::__getitem__" in str(graph)
    compiled = torchkiln.compile(DynamicKey().eval(), specs, min_block_size=1)
    for i in (0, 1):
        torch.testing.assert_close(compiled(x, torch.tensor(i)), DynamicKey()(x, torch.tensor(i)))


class ReadAfterEscape(nn.Module):
    """The list goes into a tuple (kept elsewhere) before it is read: the read is not rewritten."""

    def forward(self, x: torch.Tensor) -> List[torch.Tensor]:
        xs = [x]
        held = (xs, 1)
        held[0].append(x * 2)
        return [xs[-1] + 1, xs[0]]


class ReadInLoop(nn.Module):
    def forward(self, x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        xs = [x, x * 2]
        for _ in range(int(n)):
            xs.append(xs[-1] + 1)
        return xs[-1] * 1.5


def test_containers_that_escape_stay_correct():
    x = torch.randn(4)
    model = ReadAfterEscape().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input.from_tensor(x)], min_block_size=1)
    for out, ref in zip(compiled(x), model(x)):
        torch.testing.assert_close(out, ref)
    loop = ReadInLoop().eval()
    compiled = torchkiln.compile(loop, [torchkiln.Input.from_tensor(x), torchkiln.Input((), dtype=torch.int64)],
                                 min_block_size=1)
    for n in (0, 3):
        torch.testing.assert_close(compiled(x, torch.tensor(n)), loop(x, torch.tensor(n)))


class ListEdits(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        xs = [x]
        xs.insert(0, y)
        xs.extend([x + y])
        xs[1] = xs[1] * 2.0
        a, b, c = xs
        return torch.cat(xs[1:] + [a, b, c], 0) + float(len(xs))


def test_list_reads_become_elements():
    example = [torch.randn(2), torch.randn(2)]
    specs = [torchkiln.Input.from_tensor(x) for x in example]
    ops = {n.kind() for n in lower(torch.jit.script(ListEdits()), CompileSettings.create(specs)).graph.nodes()}
    assert not {"aten::insert", "aten::extend", "aten::_set_item", "aten::__getitem__", "prim::ListUnpack",
                "aten::len"} & ops
    check_compiled(ListEdits(), example, engines=1, torch_blocks=0, min_block_size=1)


class BiasCache(nn.Module):
    """timm's LeViT / EfficientFormer attention: a per-device cache of the gathered attention biases."""

    attention_bias_cache: Dict[str, torch.Tensor]

    def __init__(self) -> None:
        super().__init__()
        self.attention_biases = nn.Parameter(torch.randn(2, 5))
        self.register_buffer("attention_bias_idxs", torch.randint(0, 5, (4, 4)), persistent=False)
        self.attention_bias_cache = {}
        self.proj = nn.Linear(4, 4)

    def get_attention_biases(self, device: torch.device) -> torch.Tensor:
        if torch.jit.is_tracing() or self.training:
            return self.attention_biases[:, self.attention_bias_idxs]
        device_key = str(device)
        if device_key not in self.attention_bias_cache:
            self.attention_bias_cache[device_key] = self.attention_biases[:, self.attention_bias_idxs]
        return self.attention_bias_cache[device_key]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.proj(x)
        attn = q @ q.transpose(-2, -1) + self.get_attention_biases(x.device)
        return attn.softmax(-1) @ q


class TwoCaches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.Sequential(BiasCache(), nn.ReLU(), BiasCache())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(x)


@pytest.mark.parametrize("filled", [False, True], ids=["empty", "filled"])
def test_attention_bias_cache_is_one_engine(filled):
    model, x = TwoCaches().eval(), torch.randn(2, 4, 4)
    if filled:  # an eager call before compiling fills the caches: the compiled module reads what they hold
        with torch.no_grad():
            model(x)
    compiled, report = compile_with_report(model, [torchkiln.Input.from_tensor(x)])
    assert (report.num_engine_blocks, report.num_torch_blocks) == (1, 0), str(report)
    for _ in range(2):  # the second eager call reads the cache its first call filled
        with torch.no_grad():
            assert_matches_eager(compiled(x), model(x))


class CacheOfInputs(BiasCache):
    """Filled from the input: the first call's value is what later calls read, so it is not a constant."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "x" not in self.attention_bias_cache:
            self.attention_bias_cache["x"] = x * 2.0
        return self.attention_bias_cache["x"] + self.proj(x)


class ConstantKeyCache(BiasCache):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "k" not in self.attention_bias_cache:
            self.attention_bias_cache["k"] = self.attention_biases[:, self.attention_bias_idxs]
        return self.proj(x) + self.attention_bias_cache["k"]


class CacheLength(BiasCache):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if "k" not in self.attention_bias_cache:
            self.attention_bias_cache["k"] = self.attention_biases[:, self.attention_bias_idxs]
        return self.attention_bias_cache["k"] * float(len(self.attention_bias_cache))


def _ops_after_cache_pass(model: nn.Module, x: torch.Tensor) -> set:
    graph = lower(torch.jit.script(model.eval()), CompileSettings.create([torchkiln.Input.from_tensor(x)]),
                  passes=("resolve_attribute_caches",)).graph
    return {n.kind() for n in all_nodes(graph.block())}


def test_caches_outside_the_pattern_stay_in_pytorch():
    x, y = torch.randn(2, 4, 4), torch.randn(2, 4, 4)
    model = CacheOfInputs().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input.from_tensor(x)], min_block_size=1)
    with torch.no_grad():
        for inputs in (x, y):  # eager's second call reads what its first call left in the cache
            assert_matches_eager(compiled(inputs), model(inputs))
    assert "aten::_set_item" in _ops_after_cache_pass(CacheOfInputs(), x)
    assert "aten::_set_item" not in _ops_after_cache_pass(ConstantKeyCache(), x)
    assert {"aten::len", "aten::__contains__", "aten::_set_item"} <= _ops_after_cache_pass(CacheLength(), x)


class Pyramid2(nn.Module):
    """torchvision's RAFT CorrBlock: `self.pyramid = [x]` then appends, read by a loop that stays a loop."""

    def __init__(self) -> None:
        super().__init__()
        self.pyramid: List[torch.Tensor] = [torch.tensor(0)]

    def build(self, x: torch.Tensor) -> None:
        self.pyramid = [x]
        for _ in range(2):
            x = F.avg_pool2d(x, 2, 2)
            self.pyramid.append(x)

    def forward(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        self.build(torch.relu(x * 2.0))
        out = x.mean()
        for _ in range(int(steps)):  # known only at run time: a loop in PyTorch
            for level in self.pyramid:
                out = out + level.mean()
        return out * 1.5


def test_an_assigned_attribute_list_is_read_from_its_elements():
    x = torch.randn(1, 2, 8, 8)
    model = Pyramid2().eval()
    specs = [torchkiln.Input.from_tensor(x), torchkiln.Input((), dtype=torch.int64)]
    compiled, report = compile_with_report(model, specs, min_block_size=1)
    assert not {"prim::GetAttr", "aten::append.t", "prim::SetAttr"} & set(report.fallback_ops), str(report)
    for steps in (0, 2):
        assert_matches_eager(compiled(x, torch.tensor(steps)), model(x, torch.tensor(steps)))


class PyramidGrownInALoop(Pyramid2):
    def forward(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        self.build(torch.relu(x * 2.0))
        for _ in range(int(steps)):  # changes the list through the attribute: later reads see the new levels
            self.pyramid.append(self.pyramid[-1] * 0.5)
        return torch.stack([level.mean() for level in self.pyramid]).sum() + float(len(self.pyramid))


def test_an_attribute_list_changed_in_a_loop_stays_correct():
    x = torch.randn(1, 2, 8, 8)
    model = PyramidGrownInALoop().eval()
    specs = [torchkiln.Input.from_tensor(x), torchkiln.Input((), dtype=torch.int64)]
    lowered = lower(torch.jit.script(model), CompileSettings.create(specs))
    assert "prim::SetAttr" in {n.kind() for n in lowered.graph.nodes()}
    for steps in (0, 3):  # the lowered graph runs in its frozen module
        torch.testing.assert_close(lowered.module(x, torch.tensor(steps)), model(x, torch.tensor(steps)))


class PyramidSummedAfterALoop(Pyramid2):
    def forward(self, x: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
        self.build(torch.relu(x * 2.0))
        for _ in range(int(steps)):  # the attribute list's length is known only at run time
            self.pyramid.append(self.pyramid[-1] * 0.5)
        out = x.mean()
        for level in self.pyramid:  # so this loop must not be unrolled to the length the example run saw
            out = out + level.mean()
        return out * 1.5


def test_a_list_whose_length_depends_on_data_is_not_taken_from_the_example_run():
    x = torch.randn(1, 2, 8, 8)
    model = PyramidSummedAfterALoop().eval()
    compiled = torchkiln.compile(model, [torchkiln.Input.from_tensor(x), torchkiln.Input((), dtype=torch.int64)],
                                 min_block_size=1)
    for steps in (0, 1, 3, 5):
        assert_matches_eager(compiled(x, torch.tensor(steps)), model(x, torch.tensor(steps)))
