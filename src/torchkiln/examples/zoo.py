"""Full-size ImageNet CNNs built in code as torchvision builds them (torchvision is not needed): ResNet-18 and
MobileNetV2, random weights with non-trivial batch-norm statistics. Used by scripts/bench_cpu.py."""
from __future__ import annotations

from torch import nn

from torchkiln.examples.models import BasicBlock, randomize_batch_norm


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
