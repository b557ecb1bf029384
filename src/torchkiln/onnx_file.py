"""export_onnx: an engine's network (or a compiled module made of one engine) as a standard .onnx file."""
from __future__ import annotations

import logging
import os

import torch

from torchkiln.runtime.engine import Engine
from torchkiln.runtime.execute_op import engine_from_blob
from torchkiln.runtime.serialization import MAGIC
from torchkiln.stitching.stitch import ENGINE_ATTR, engine_attrs

logger = logging.getLogger(__name__)

# What a module made of one engine holds besides the engine call: attribute reads, constants, packing.
_PLUMBING = frozenset({"prim::GetAttr", "prim::Constant", "prim::ListConstruct", "prim::ListUnpack",
                       "prim::TupleConstruct", "prim::TupleUnpack", "prim::TupleIndex", "prim::DictConstruct",
                       "aten::__getitem__", "torchkiln::execute_engine"})


def _engine_of_module(module: torch.jit.ScriptModule) -> Engine:
    """The one engine of a compiled module; ValueError if it has none, several, or ops outside the engine."""
    count = len(engine_attrs(module))
    if count != 1:
        raise ValueError(f"export_onnx takes a compiled module made of one engine; this one has {count} engines")
    outside = sorted({n.kind() for n in module.graph.nodes() if n.kind() not in _PLUMBING})
    if outside:
        raise ValueError(f"export_onnx takes a compiled module made of one engine; this one also runs {outside} "
                         f"in PyTorch (compile with require_full_compilation=True, or export its engine bytes)")
    return engine_from_blob(getattr(module, ENGINE_ATTR.format(0)))


def as_engine(source: torch.jit.ScriptModule | Engine | bytes | bytearray | str | os.PathLike) -> Engine:
    """An Engine from engine bytes, an Engine, a compiled module, or a file holding engine bytes or a saved module."""
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as f:
            data = f.read()
        if not data.startswith(MAGIC):
            return _engine_of_module(torch.jit.load(source, map_location="cpu"))
        source = data
    if isinstance(source, Engine):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Engine.deserialize(bytes(source))
    if isinstance(source, torch.jit.ScriptModule):
        return _engine_of_module(source)
    raise TypeError(f"export_onnx takes engine bytes, an Engine, a compiled module or a file of either, got "
                    f"{type(source).__name__}")


def export_onnx(source: torch.jit.ScriptModule | Engine | bytes | str | os.PathLike, path: str | os.PathLike,
                opset: int | None = None) -> None:
    """Write the engine's network to `path` as an ONNX model (inputs and outputs named as the engine's) that
    onnx.checker accepts and ONNX Runtime runs. A layer ONNX cannot express raises OnnxExportError naming it."""
    import onnx

    from torchkiln.onnx_export import DEFAULT_OPSET, network_to_onnx

    engine = as_engine(source)
    model = network_to_onnx(engine.network, DEFAULT_OPSET if opset is None else opset)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, os.fspath(path))
    logger.info("wrote engine %s to %s: %d ONNX nodes, opset %d", engine.name, os.fspath(path),
                len(model.graph.node), model.opset_import[0].version)
