"""A readable text form of a network, one line per layer."""
from __future__ import annotations

import enum

import torch

from torchkiln.ir.layers import Layer


def _fmt(value: object) -> str:
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, tuple):
        return "(" + ", ".join(_fmt(v) for v in value) + ")"
    return repr(value)


def describe(layer: Layer) -> str:
    """`%out = kind[params](%in, ...) {weights}` for one layer."""
    outs = ", ".join(repr(t) for t in layer.outputs)
    params = ", ".join(f"{k}={_fmt(v)}" for k, v in layer.params().items())
    ins = ", ".join(f"%{t.name}" for t in layer.inputs)
    weights = ", ".join(f"{k}:{str(w.dtype).removeprefix('torch.')}{list(w.shape)}" for k, w in layer.weights.items())
    text = f"{outs} = {layer.KIND}[{params}]({ins})"
    return text + (f" {{{weights}}}" if weights else "") + f"  # {layer.name}"


def dump(network, indent: str = "") -> str:
    """The network's inputs, one line per layer (a control-flow layer's sub-networks below it), its outputs."""
    lines = [f"{indent}network {network.name}(" + ", ".join(repr(t) for t in network.inputs) + "):"]
    for layer in network.layers:
        lines.append(f"{indent}  " + describe(layer))
        lines += [f"{indent}    {field}: " + dump(getattr(layer, field), indent + "    ").lstrip()
                  for field in layer.SUBNETWORKS]
    lines.append(f"{indent}  return (" + ", ".join(f"%{t.name}" for t in network.outputs) + ")")
    return "\n".join(lines)
