"""lowering/walk.py: all_nodes visits every node, nested blocks included, in pre-order."""
import torch

from torchkiln.lowering.walk import all_nodes


def _reference(block):
    """Pre-order by recursion, asking every node for its blocks."""
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _reference(inner)


def _nested(x: torch.Tensor, n: int) -> torch.Tensor:
    for i in range(n):
        if bool(x.sum() > i):
            x = x + 1
            for _ in range(2):
                x = x * 2 if i % 2 else x - 1
        else:
            x = torch.relu(x)
    return x


def test_all_nodes_is_pre_order_with_nested_blocks():
    graph = torch.jit.script(_nested).graph
    expected = list(_reference(graph.block()))
    assert list(all_nodes(graph.block())) == expected
    assert sum(n.kind() in ("prim::If", "prim::Loop") for n in expected) >= 4


def test_all_nodes_is_a_snapshot_safe_to_edit():
    """Nodes inserted during the walk are not visited; every node there before is, once."""
    graph = torch.jit.script(_nested).graph
    before = list(_reference(graph.block()))
    seen = []
    for node in all_nodes(graph.block()):
        seen.append(node)
        if node.kind() == "aten::relu":
            with graph.insert_point_guard(node):
                graph.insert("aten::neg", [node.inputsAt(0)])
    assert seen == before
    assert sum(n.kind() == "aten::neg" for n in all_nodes(graph.block())) == 1


def test_node_blocks_are_the_nodes_blocks():
    from torchkiln.torchscript import node_blocks

    graph = torch.jit.script(_nested).graph
    nodes = list(_reference(graph.block()))
    assert all([b for b in node_blocks(n)] == list(n.blocks()) for n in nodes)
    assert sum(bool(node_blocks(n)) for n in nodes) >= 4


def test_prims_taken_as_blockless_hold_no_blocks_in_real_graphs():
    """The prims node_blocks does not ask are ones that hold no block, in the graphs of scripted control flow."""
    from torchkiln.torchscript import _BLOCKLESS_PRIMS

    graph = torch.jit.script(_nested).graph
    for node in _reference(graph.block()):
        if node.kind() in _BLOCKLESS_PRIMS or node.kind().startswith("aten::"):
            assert not list(node.blocks())


def _no_else(x: torch.Tensor) -> torch.Tensor:
    if bool(x.sum() > 0):
        x = _nested(x, 2)
    return x


def test_block_nodes_read_back_from_the_return_node():
    from torchkiln.lowering.walk import _block_nodes

    graph = torch.jit.script(_no_else).graph
    torch._C._jit_pass_inline(graph)
    blocks = [graph.block()] + [b for n in _reference(graph.block()) for b in n.blocks()]
    assert len(blocks) >= 5
    for block in blocks:
        assert _block_nodes(block) == list(block.nodes())
    assert any(not list(b.nodes()) for b in blocks)  # the missing else: a block that only returns
