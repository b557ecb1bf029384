"""The CUDA runner's tail graphs on the CPU: whether a caller still holds an output a tail handed out, by its
storage's use count (`_Tail.held`), on this torch. The graphs themselves run on a GPU: tests/test_cuda_backend.py."""
import torch

from torchkiln.runtime.backends.cuda.runner import _Tail


def _tail(*outputs: torch.Tensor) -> _Tail:
    return _Tail(None, list(outputs), [False] * len(outputs))  # held() reads the outputs only, never the graph


def test_a_tail_is_held_while_a_caller_keeps_an_output_or_a_view():
    out = torch.randn(8, 4)
    tail = _tail(out)
    handed = out.detach()  # what a replay hands out
    assert tail.held()
    view = handed[:2].t()
    del handed
    assert tail.held()
    del view
    assert not tail.held()


def test_two_outputs_sharing_a_storage_are_held_while_either_is_kept():
    made = torch.randn(8, 6)
    tail = _tail(made[:, :3], made[:, 3:])  # a linear group's column views
    second = tail.outputs[1].detach()
    assert tail.held()
    del second
    assert not tail.held()


def test_a_tail_whose_output_a_caller_resized_is_never_free_again():
    """An output's storage resized through the caller's alias moves to new memory, which the tail's graph never
    writes: the tail must not be replayed (and handed out) again."""
    tail = _tail(torch.randn(8, 4))
    handed = tail.outputs[0].detach()
    handed.resize_(1000)
    del handed
    assert tail.held()
    emptied = tail.outputs[0].detach()
    emptied.untyped_storage().resize_(0)
    del emptied
    assert tail.held()
