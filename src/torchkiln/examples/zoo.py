"""The model zoo: full-size models with random weights, for the benchmarks and scripts/zoo.py.

Two parts: ImageNet CNNs built in code as torchvision builds them (torchvision is not needed): ResNet-18 and
MobileNetV2; and the registry of zoo models by source (torchvision, transformers, or bundled: built in code here),
with `load_zoo_model`, which gives each random-weight model meaningful outputs (no all-zero weight matrices,
batch-norm statistics calibrated on random inputs).
"""
from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable, Sequence

import torch
from torch import nn

from torchkiln.examples.models import MLP, BasicBlock, SmallMobileNet, SmallResNet, randomize_batch_norm


class ResNet(nn.Module):
    """torchvision's ResNet with BasicBlocks: 7x7/2 stem, max pool, four stages, average pool, linear."""

    def __init__(self, blocks: tuple[int, ...] = (2, 2, 2, 2), widths: tuple[int, ...] = (64, 128, 256, 512),
                 num_classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, widths[0], 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], widths[0]
        for i, (n, width) in enumerate(zip(blocks, widths)):
            stride = 1 if i == 0 else 2
            rest = [BasicBlock(width, width) for _ in range(n - 1)]
            stages.append(nn.Sequential(BasicBlock(cin, width, stride), *rest))
            cin = width
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        randomize_batch_norm(self)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet18(num_classes: int = 1000) -> ResNet:
    return ResNet((2, 2, 2, 2), (64, 128, 256, 512), num_classes)


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1, relu6: bool = True) -> list[nn.Module]:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return layers + [nn.ReLU6(inplace=True)] if relu6 else layers


class InvertedResidualV2(nn.Module):
    """torchvision's MobileNetV2 block: 1x1 expand (unless the ratio is 1), 3x3 depthwise, 1x1 linear project."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        self.use_res_connect = stride == 1 and cin == cout
        layers = _conv_bn(cin, hidden, 1) if expand != 1 else []
        layers += _conv_bn(hidden, hidden, 3, stride, groups=hidden) + _conv_bn(hidden, cout, 1, relu6=False)
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (width 1.0): 17 inverted residuals, 1280-channel head, dropout, linear."""

    SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))  # expand ratio, channels, repeats, first stride

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        layers, cin = _conv_bn(3, 32, 3, 2), 32
        for t, c, n, s in self.SETTINGS:
            for i in range(n):
                layers.append(InvertedResidualV2(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += _conv_bn(cin, 1280, 1)
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))
        randomize_batch_norm(self)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(x.flatten(1))


def mobilenet_v2(num_classes: int = 1000) -> MobileNetV2:
    return MobileNetV2(num_classes)


class LastHiddenState(nn.Module):
    """A transformers model returning its last hidden state as a tensor (what every peer can compile)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(*inputs).last_hidden_state


@dataclasses.dataclass(frozen=True)
class ZooModel:
    """One model of the zoo: what provides it, how to build it (random weights), its inputs at a batch size."""

    name: str
    source: str  # "torchvision", "transformers" or "bundled"
    build: Callable[[], nn.Module]
    inputs: Callable[[int], list[torch.Tensor]]  # batch -> random example inputs, on the CPU


SOURCES = ("torchvision", "transformers", "bundled")  # the default search order of `find_zoo_model`


def _images(size: int = 224) -> Callable[[int], list[torch.Tensor]]:
    return lambda batch: [torch.randn(batch, 3, size, size)]


def _torchvision(name: str) -> ZooModel:
    def build() -> nn.Module:
        import torchvision

        return getattr(torchvision.models, name)(weights=None)
    return ZooModel(name, "torchvision", build, _images())


def _token_inputs(vocab: int, seq: int) -> Callable[[int], list[torch.Tensor]]:
    """input_ids (int64, [batch, seq]) and an attention mask with the last quarter of every other row padded."""
    def inputs(batch: int) -> list[torch.Tensor]:
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[1::2, seq - seq // 4:] = 0
        return [torch.randint(0, vocab, (batch, seq)), mask]
    return inputs


def _bert_base() -> nn.Module:
    import transformers

    return LastHiddenState(transformers.BertModel(transformers.BertConfig()))  # bert-base's shape


def _gpt2() -> nn.Module:
    import transformers

    return LastHiddenState(transformers.GPT2Model(transformers.GPT2Config(use_cache=False)))  # gpt2 (124M)


ZOO: dict[str, dict[str, ZooModel]] = {
    "torchvision": {m.name: m for m in map(_torchvision, (
        "resnet50", "mobilenet_v2", "mobilenet_v3_large", "efficientnet_b0", "densenet121", "vit_b_16",
        "convnext_tiny"))},
    "transformers": {
        "bert-base": ZooModel("bert-base", "transformers", _bert_base, _token_inputs(30522, 128)),
        "gpt2": ZooModel("gpt2", "transformers", _gpt2, lambda batch: [torch.randint(0, 50257, (batch, 128))]),
    },
    "bundled": {
        "resnet18": ZooModel("resnet18", "bundled", resnet18, _images()),
        "mobilenet_v2": ZooModel("mobilenet_v2", "bundled", mobilenet_v2, _images()),
        "small_resnet": ZooModel("small_resnet", "bundled", SmallResNet, _images(64)),
        "small_mobilenet": ZooModel("small_mobilenet", "bundled", SmallMobileNet, _images(64)),
        "mlp": ZooModel("mlp", "bundled", MLP, lambda batch: [torch.randn(batch, 64)]),
    },
}
_REQUIRES = {"torchvision": "torchvision", "transformers": "transformers"}  # source -> the package it needs


def source_unavailable(source: str) -> str | None:
    """Why a source cannot provide models here (its package is not installed), or None."""
    if source not in ZOO:
        return f"unknown model source {source!r}; use one of {list(ZOO)}"
    package = _REQUIRES.get(source)
    if package and importlib.util.find_spec(package) is None:
        return f"{package} is not installed"
    return None


def find_zoo_model(name: str, sources: Sequence[str] = SOURCES) -> ZooModel:
    """The first of `sources` that provides `name` and is available here; LookupError saying why none is."""
    reasons = []
    for source in sources:
        if name not in ZOO.get(source, {}):
            continue
        why = source_unavailable(source)
        if why is None:
            return ZOO[source][name]
        reasons.append(f"{source}: {why}")
    if not reasons:
        known = sorted({n for s in sources for n in ZOO.get(s, {})})
        raise LookupError(f"no model {name!r} in sources {list(sources)}; known: {known}")
    raise LookupError(f"model {name!r} is unavailable ({'; '.join(reasons)})")


def reinit_zero_weights(model: nn.Module) -> None:
    """Give all-zero weight matrices (torchvision's ViT head) and all-zero batch-norm gammas random values, so
    a random-weight model's output is not constant."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.weight is not None and not m.weight.any():
                m.weight.uniform_(0.5, 1.5)
        for p in model.parameters():
            if p.dim() >= 2 and not p.any():
                p.normal_(0, 0.02)


def calibrate_batch_norm(model: nn.Module, inputs: Callable[[], list[torch.Tensor]], passes: int = 4) -> None:
    """Set every batch norm's running statistics to the cumulative average over `passes` forward passes on
    `inputs()` in train mode, as after training (activations stay normalized through deep random networks);
    the model is left in eval mode."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if norms:
        momenta = [m.momentum for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # cumulative moving average
        model.train()
        with torch.no_grad():
            for _ in range(passes):
                model(*inputs())
        for m, momentum in zip(norms, momenta):
            m.momentum = momentum
    model.eval()


def load_zoo_model(model: ZooModel, device: torch.device | str = "cpu", calibration_batch: int = 8) -> nn.Module:
    """The model built with random weights, made meaningful (`reinit_zero_weights`, `calibrate_batch_norm`),
    in eval mode on `device`."""
    module = model.build()
    reinit_zero_weights(module)
    module = module.to(device)
    calibrate_batch_norm(module, lambda: [x.to(device) for x in model.inputs(calibration_batch)])
    return module
