"""CNN and MLP families built in code, at CPU sizes, for the CPU zoo (`bench --zoo cpu`): a RegNetY (grouped
bottlenecks with squeeze-excitation), a MobileNetV3 (depthwise, squeeze-excitation, hard-swish), a ConvNeXt
(7x7 depthwise, channels-last LayerNorm, GELU, layer scale) and an MLP-Mixer, each as its paper defines it."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchkiln.examples.models import randomize_batch_norm


def _conv_bn_act(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
                 act: type[nn.Module] | None = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    return nn.Sequential(*layers, *([act()] if act is not None else []))


class SqueezeExcitation(nn.Module):
    """Global average pool, a bottleneck of two 1x1 convolutions, a gate on the channels."""

    def __init__(self, channels: int, squeezed: int, gate: type[nn.Module] = nn.Sigmoid,
                 act: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.fc1, self.act = nn.Conv2d(channels, squeezed, 1), act()
        self.fc2, self.gate = nn.Conv2d(squeezed, channels, 1), gate()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class RegNetYBlock(nn.Module):
    """1x1, grouped 3x3 (stride), squeeze-excitation, 1x1; a projected shortcut where the shape changes."""

    def __init__(self, cin: int, cout: int, stride: int, group_width: int, se_ratio: float = 0.25) -> None:
        super().__init__()
        self.a = _conv_bn_act(cin, cout, 1)
        self.b = _conv_bn_act(cout, cout, 3, stride, groups=cout // group_width)
        self.se = SqueezeExcitation(cout, max(1, int(cin * se_ratio)))
        self.c = _conv_bn_act(cout, cout, 1, act=None)
        self.proj = _conv_bn_act(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else None
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = x if self.proj is None else self.proj(x)
        return self.relu(shortcut + self.c(self.se(self.b(self.a(x)))))


class RegNetY(nn.Module):
    """RegNetY-400MF's stages (depths 1, 3, 6, 6; widths 48, 104, 208, 440; group width 8)."""

    def __init__(self, depths: tuple[int, ...] = (1, 3, 6, 6), widths: tuple[int, ...] = (48, 104, 208, 440),
                 group_width: int = 8, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = _conv_bn_act(3, 32, 3, 2)
        blocks, cin = [], 32
        for depth, width in zip(depths, widths):
            for i in range(depth):
                blocks.append(RegNetYBlock(cin, width, 2 if i == 0 else 1, group_width))
                cin = width
        self.trunk = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)
        randomize_batch_norm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(nn.functional.adaptive_avg_pool2d(self.trunk(self.stem(x)), 1).flatten(1))


class InvertedResidualV3(nn.Module):
    """MobileNetV3's block: 1x1 expand, k x k depthwise, optional squeeze-excitation (hard-sigmoid), 1x1 project."""

    def __init__(self, cin: int, kernel: int, hidden: int, cout: int, se: bool, act: type[nn.Module],
                 stride: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [_conv_bn_act(cin, hidden, 1, act=act)] if hidden != cin else []
        layers.append(_conv_bn_act(hidden, hidden, kernel, stride, groups=hidden, act=act))
        if se:
            layers.append(SqueezeExcitation(hidden, _make_divisible(hidden // 4), nn.Hardsigmoid))
        layers.append(_conv_bn_act(hidden, cout, 1, act=None))
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x) if self.residual else self.block(x)


def _make_divisible(v: float, divisor: int = 8) -> int:
    return max(divisor, int(v + divisor / 2) // divisor * divisor)


class MobileNetV3Small(nn.Module):
    """torchvision's mobilenet_v3_small: 11 inverted residuals, 1024-wide hard-swish head."""

    SETTINGS = ((16, 3, 16, 16, True, "RE", 2), (16, 3, 72, 24, False, "RE", 2), (24, 3, 88, 24, False, "RE", 1),
                (24, 5, 96, 40, True, "HS", 2), (40, 5, 240, 40, True, "HS", 1), (40, 5, 240, 40, True, "HS", 1),
                (40, 5, 120, 48, True, "HS", 1), (48, 5, 144, 48, True, "HS", 1), (48, 5, 288, 96, True, "HS", 2),
                (96, 5, 576, 96, True, "HS", 1), (96, 5, 576, 96, True, "HS", 1))  # in, kernel, hidden, out, SE...

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        acts = {"RE": nn.ReLU, "HS": nn.Hardswish}
        layers: list[nn.Module] = [_conv_bn_act(3, 16, 3, 2, act=nn.Hardswish)]
        layers += [InvertedResidualV3(cin, k, hidden, cout, se, acts[act], stride)
                   for cin, k, hidden, cout, se, act, stride in self.SETTINGS]
        layers.append(_conv_bn_act(96, 576, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(1024, num_classes))
        randomize_batch_norm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(nn.functional.adaptive_avg_pool2d(self.features(x), 1).flatten(1))


class ConvNeXtBlock(nn.Module):
    """7x7 depthwise, LayerNorm over channels (channels-last), 4x linear, GELU, linear, layer scale, residual."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dwconv = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1, self.act, self.pwconv2 = nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm(self.dwconv(x).permute(0, 2, 3, 1))
        y = self.gamma * self.pwconv2(self.act(self.pwconv1(y)))
        return x + y.permute(0, 3, 1, 2)


class LayerNorm2d(nn.LayerNorm):
    """LayerNorm over the channels of an NCHW tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (TorchScript cannot script super().forward)
        y = F.layer_norm(x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps)
        return y.permute(0, 3, 1, 2)


class ConvNeXt(nn.Module):
    """ConvNeXt's design at a small width: 4x4/4 patchify stem, four stages with 2x2/2 downsampling between."""

    def __init__(self, depths: tuple[int, ...] = (2, 2, 6, 2), dims: tuple[int, ...] = (48, 96, 192, 384),
                 num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, dims[0], 4, 4), LayerNorm2d(dims[0], eps=1e-6)]
        for i, (depth, dim) in enumerate(zip(depths, dims)):
            if i:
                layers += [LayerNorm2d(dims[i - 1], eps=1e-6), nn.Conv2d(dims[i - 1], dim, 2, 2)]
            layers += [ConvNeXtBlock(dim) for _ in range(depth)]
        self.features = nn.Sequential(*layers)
        self.norm, self.head = nn.LayerNorm(dims[-1], eps=1e-6), nn.Linear(dims[-1], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.features(x).mean((2, 3))))


class MixerBlock(nn.Module):
    """Token mixing (an MLP across patches, on the transpose) and channel mixing, each pre-normed, residual."""

    def __init__(self, tokens: int, dim: int, token_hidden: int, channel_hidden: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.tokens = nn.Sequential(nn.Linear(tokens, token_hidden), nn.GELU(), nn.Linear(token_hidden, tokens))
        self.channels = nn.Sequential(nn.Linear(dim, channel_hidden), nn.GELU(), nn.Linear(channel_hidden, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.tokens(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        return x + self.channels(self.norm2(x))


class MLPMixer(nn.Module):
    """MLP-Mixer: patch embedding (a strided convolution), mixer blocks, LayerNorm, mean over tokens, linear."""

    def __init__(self, image: int = 64, patch: int = 8, dim: int = 256, depth: int = 8, token_hidden: int = 128,
                 channel_hidden: int = 1024, num_classes: int = 1000) -> None:
        super().__init__()
        tokens = (image // patch) ** 2
        self.stem = nn.Conv2d(3, dim, patch, patch)
        self.blocks = nn.Sequential(*(MixerBlock(tokens, dim, token_hidden, channel_hidden) for _ in range(depth)))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x).flatten(2).transpose(1, 2)
        return self.head(self.norm(self.blocks(x)).mean(1))
