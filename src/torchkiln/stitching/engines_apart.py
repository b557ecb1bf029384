"""A compiled module saved with its engines apart: the TorchScript archive with an empty tensor in place of each
engine's bytes, and those bytes by attribute.

The module cache stores them so: read back straight into tensors, engine bytes are copied once, where torch.jit.load
of an in-memory archive copies them three times (a large model's engines take longer to copy than the rest of a
warm compile)."""
from __future__ import annotations

import io
from collections.abc import Mapping

import torch

from torchkiln.stitching.module import load
from torchkiln.stitching.stitch import engine_attrs


def save_apart(module: torch.jit.ScriptModule) -> tuple[bytes, dict[str, torch.Tensor]]:
    """The saved archive of `module` without its engines' bytes, and those bytes (uint8 tensors) by attribute;
    `module` is left as it was."""
    blobs = {attr: module._c.getattr(attr) for attr in engine_attrs(module)}
    buffer = io.BytesIO()
    try:
        for attr in blobs:
            module._c.setattr(attr, torch.empty(0, dtype=torch.uint8))
        torch.jit.save(module, buffer)
    finally:
        for attr, blob in blobs.items():
            module._c.setattr(attr, blob)
    return buffer.getvalue(), blobs


def load_apart(archive: bytes, blobs: Mapping[str, torch.Tensor]) -> torch.jit.ScriptModule:
    """The compiled module `save_apart` gave `archive` and `blobs` of; ValueError if the archive's engine
    attributes are not the blobs'."""
    module = load(io.BytesIO(archive))
    attrs = engine_attrs(module)
    if attrs != list(blobs) or any(module._c.getattr(attr).numel() for attr in attrs):
        raise ValueError(f"the archive's engine attributes {attrs} are not the stored engines' {list(blobs)}")
    for attr, blob in blobs.items():
        module._c.setattr(attr, blob)
    return module
