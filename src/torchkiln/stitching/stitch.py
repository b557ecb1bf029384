"""Replace each engine block of a partitioned graph by one engine call; torch blocks stay as they are."""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from torchkiln.partitioning.segment import Partition
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.execute_op import engine_blob, engine_signature
from torchkiln.stitching.fresh_outputs import copy_constant_outputs
from torchkiln.stitching.module import as_compiled_module
from torchkiln.torchscript import Graph, Value

logger = logging.getLogger("torchkiln.stitching")

ENGINE_ATTR = "_torchkiln_engine_{}"


def engine_attrs(module: torch.nn.Module) -> list[str]:
    """The attributes holding a compiled module's engines, in order (ENGINE_ATTR 0, 1, ...); none for any other
    module."""
    found: list[str] = []
    while hasattr(module, ENGINE_ATTR.format(len(found))):
        found.append(ENGINE_ATTR.format(len(found)))
    return found


def insert_engine_call(graph: Graph, self_value: Value, attr: str, inputs: Sequence[Value],
                       num_outputs: int, signature: str) -> list[Value]:
    """Insert `execute_engine([inputs], self.<attr>, signature)` at the graph's insert point; return its outputs.

    `signature` (see `engine_signature`) is what this module expects of the engine; the op refuses another."""
    get = graph.create("prim::GetAttr", [self_value])
    get.s_("name", attr)
    get.output().setType(torch._C.TensorType.get())
    graph.insertNode(get)
    pack = graph.create("prim::ListConstruct", list(inputs))
    pack.output().setType(torch._C.ListType.ofTensors())
    graph.insertNode(pack)
    call = graph.create("torchkiln::execute_engine", [pack.output(), get.output(), graph.insertConstant(signature)])
    call.output().setType(torch._C.ListType.ofTensors())
    graph.insertNode(call)
    unpack = graph.create("prim::ListUnpack", [call.output()], num_outputs)
    for out in unpack.outputs():
        out.setType(torch._C.TensorType.get())
    graph.insertNode(unpack)
    return list(unpack.outputs())


def stitch(module: torch.jit.ScriptModule, partition: Partition, engines: Sequence[Engine]) -> torch.jit.ScriptModule:
    """Edit `module`'s lowered graph in place so engine blocks run through their engines, and outputs never share
    memory with a constant (`copy_constant_outputs`); return the module, which raises the engine's errors as
    torchkiln's types (see `as_compiled_module`)."""
    graph = partition.graph
    self_value = next(graph.inputs())
    engine_blocks = [b for b in partition.blocks if b.is_engine]
    if len(engine_blocks) != len(engines):
        raise ValueError(f"{len(engine_blocks)} engine blocks but {len(engines)} engines")
    # Last block first: a block reads values of earlier blocks, which must stay valid until it is stitched.
    for k, (block, engine) in reversed(list(enumerate(zip(engine_blocks, engines)))):
        attr = ENGINE_ATTR.format(k)
        blob = engine_blob(engine.serialized_pieces(), engine)
        module._c._register_attribute(attr, torch._C.TensorType.get(), blob)
        with graph.insert_point_guard(block.nodes[0]):
            outs = insert_engine_call(graph, self_value, attr, block.inputs, len(block.outputs),
                                      engine_signature(engine))
            for original, replacement in zip(block.outputs, outs):
                original.replaceAllUsesWith(replacement)
            for original, value in block.static_outputs:
                original.replaceAllUsesWith(graph.insertConstant(value))
        for node in reversed(block.nodes):
            node.destroy()
    copied = copy_constant_outputs(graph)
    if copied:
        logger.debug("%d constants an output may alias are copied per call", copied)
    torch._C._jit_pass_dce(graph)
    graph.lint()
    logger.debug("stitched graph:\n%s", graph)
    return as_compiled_module(module)
