"""Evaluators (values known at build time) through the whole pipeline: each feeds a tensor op, so the
engine's output depends on what the evaluator computed."""
import logging
import math
import warnings
from typing import Dict, List, Optional, Union

import pytest
import torch
from harness import check_compiled, check_fn

from torchkiln.analysis.registry import find_evaluator
from torchkiln.conversion import load_all
from torchkiln.analysis.resolve import Resolver
from torchkiln.torchscript import TensorMeta, value_key


def int_float_bool(x):
    n = int(x.size(0) * 1.5)  # aten::Int.float
    f = float(x.size(1))  # aten::Float.int
    b = bool(x.size(0) - 2)  # aten::Bool.int
    return x.view(n - 1, -1) * f + float(b) + int("3") + float("0.5")


def arithmetic(x):
    a, b = x.size(0), x.size(1)
    n = (a + b - 1) * 2 // 3 + a % 2 + len(x) + x.dim() + int(a ** 2) + int(b / 2) + (-a)
    flags = int(a < b) + int(a <= b) + int(a > b) + int(a >= b) + int(a == b) + int(a != b)
    return x * n + flags


def logic(x):
    a, b = x.size(0), x.size(1)
    flag = (a == 2) & (b == 3) | ((a ^ 1) == 3) ^ (not (b == 3))
    return x * (a & 3) + (a | 4) - (b ^ 5) + float(flag)


def loop_helpers(x):
    i = torch.ops.aten.__derive_index(x.size(0), 1, 2)
    n = torch.ops.aten.__range_length(x.size(1), 0, -2) + torch.ops.aten.__range_length(0, x.size(1), 2)
    q = torch.ops.aten.__round_to_zero_floordiv(-x.size(1), 2)
    return x + i * 10 + n * 100 + q


def getitem_list_tuple_dict_str(x):
    s = x.size()
    t = (x.size(0), x.size(1))
    d: Dict[str, int] = {"rows": x.size(0), "cols": x.size(1)}
    digit = int("{}{}".format(x.size(0), x.size(1))[1])
    return x.view(s[-1], t[0]) * d["rows"] + d["cols"] + digit


def is_isnot(x):
    n: Optional[int] = None
    if x.size(0) > 1:
        n = x.size(0)
    if n is not None:  # aten::__isnot__, then prim::unchecked_cast of the refined Optional
        y = x.view(n, -1)
    else:
        y = x
    if n is None:  # aten::__is__
        y = y + 1
    return y


def append_extend_list(x):
    parts: List[torch.Tensor] = [x]
    n = len(parts)  # read before the append: still one element
    parts.append(x * 2)
    parts.append(x + n)
    dims = list(x.size())
    dims.append(len(parts))
    dims.extend([1, 1])
    more = [x.size(0)]
    more.extend(dims)
    return torch.cat(parts, 0).view(dims[0] * dims[2], -1, dims[3]), torch.ones(more)


def format_and_warn(x):
    y = x + 1
    warnings.warn("rows: {}, scale {}".format(x.size(0), 0.5))
    return y * 2


def metadata(x):
    y = torch.zeros(x.numel(), dtype=x.dtype, device=x.device)
    return y + float(x.is_floating_point()) + x.view(-1)


def max_min(x):
    a, b = x.size(0), x.size(1)
    return x * max(a, b) + min(a, b) + max([a, b, 1]) + min(float(a), 0.5) + max(a, 2.5)


def uninitialized(x):
    if x.size(0) == 2:  # the other branch raises: TorchScript puts prim::Uninitialized there
        n = 3
    else:
        raise ValueError("expected 2 rows")
    return x.view(n, -1)


R = torch.randn
CASES = [
    (int_float_bool, [R(2, 3)]),
    (arithmetic, [R(2, 3)]),
    (logic, [R(2, 3)]),
    (loop_helpers, [R(2, 5)]),
    (getitem_list_tuple_dict_str, [R(2, 3)]),
    (is_isnot, [R(2, 3)]),
    (append_extend_list, [R(2, 3)]),
    (format_and_warn, [R(2, 3)]),
    (metadata, [R(2, 3)]),
    (max_min, [R(2, 3)]),
    (uninitialized, [R(2, 3)]),
]


@pytest.mark.parametrize("fn, example", CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_evaluator(fn, example):
    check_fn(fn, *example)


def test_metadata_of_int64_input_is_eager_dtype_with_truncation():
    check_fn(metadata, torch.randint(0, 5, (2, 3)), truncate_long_and_double=True)


def test_warning_is_logged_at_build_time(caplog):
    with caplog.at_level(logging.WARNING, logger="torchkiln"):
        check_fn(format_and_warn, R(4, 3))
    assert any("rows: 4, scale 0.5" in r.getMessage() for r in caplog.records)


def test_format_matches_torchscript_float_printing():
    @torch.jit.script
    def scripted(a: float, b: float, c: float, d: float) -> str:
        return "{} {} {} {}".format(a, b, c, d)

    from torchkiln.conversion.evaluators.strings import _script_str

    values = (3.0, 0.1, 1e20, -5e18)
    assert scripted(*values) == " ".join(_script_str(v) for v in values)


class TracedView(torch.nn.Module):
    def forward(self, x):
        return x.view(x.size(0), -1) + x.shape[1], torch.arange(x.size(0)) + x[0, 0, 0], torch.full((2,), x.shape[1])


def test_traced_num_to_tensor_chains():
    # tracing records sizes as prim::NumToTensor -> aten::Int / aten::ScalarImplicit
    x = R(3, 2, 2)
    traced = torch.jit.trace(TracedView(), x)
    kinds = {n.kind() for n in traced.graph.nodes()}
    assert {"prim::NumToTensor", "aten::Int", "aten::ScalarImplicit"} <= kinds
    check_compiled(traced, [x], min_block_size=1)


def test_appended_list_keeps_its_earlier_value_for_earlier_readers():
    # `len(parts)` before the appends is 1, `torch.cat(parts)` after them sees 3 pieces
    _, report = check_fn(append_extend_list, R(2, 3))
    assert report.num_engine_blocks == 1


def appended_in_a_loop(x):
    parts: List[torch.Tensor] = []
    for i in range(x.size(0)):
        parts.append(x[i] * i)
    return torch.stack(parts, 0) + 1


def test_list_appended_in_a_loop_is_not_static():
    # the loop (too long to unroll) mutates the list: its value after the loop is only known at run time
    _, report = check_fn(appended_in_a_loop, R(40, 2), engines=None, torch_blocks=None)
    reasons = {f.op: f.detail for b in report.blocks for f in b.fallback}
    assert "read after aten::append" in reasons["prim::ListConstruct"], reasons
    assert "aten::stack" in reasons, reasons  # its list input is only known at run time


def test_extend_is_lowered_to_a_new_list():
    graph = torch.jit.script(append_extend_list).graph
    assert any(n.kind() == "aten::extend" for n in graph.nodes())
    check_fn(append_extend_list, R(3, 2))


_ZERO_D = "%a : {} = prim::Constant[value={}]()\n %c : Tensor = prim::NumToTensor(%a)\n "  # a static 0-d tensor


@pytest.mark.parametrize("ir, expected", [
    # lowering folds these in scripted and traced graphs; the evaluators cover what is left
    (_ZERO_D.format("int", 2) + "%r : int = aten::Int(%c)", 2),
    (_ZERO_D.format("float", 2.5) + "%r : float = aten::Float(%c)", 2.5),
    (_ZERO_D.format("int", 0) + "%r : bool = aten::Bool(%c)", False),
    (_ZERO_D.format("int", 3) + "%r : Scalar = aten::ScalarImplicit(%c)", 3),
    ('%k : str = prim::Constant[value="a"]()\n %v : int = prim::Constant[value=4]()\n'
     ' %d : Dict(str, int) = prim::DictConstruct(%k, %v)\n %r : int = aten::__getitem__(%d, %k)', 4),
    ("%k : int = prim::Constant[value=-1]()\n %v : float = prim::Constant[value=0.5]()\n"
     " %d : Dict(int, float) = prim::DictConstruct(%k, %v)\n %r : float = aten::__getitem__(%d, %k)", 0.5),
    ("%a : int = prim::Constant[value=2]()\n %b : int = prim::Constant[value=3]()\n"
     " %l : int[] = prim::ListConstruct(%a, %b)\n %r : int = aten::sum(%l)", 5),
    ("%a : float = prim::Constant[value=2.5]()\n %r : int = aten::ceil(%a)", 3),
    ("%a : float = prim::Constant[value=-2.5]()\n %r : int = aten::floor(%a)", -3),
    ("%a : int = prim::Constant[value=196]()\n %r : float = aten::sqrt(%a)", 14.0),
    ("%a : float = prim::Constant[value=2.25]()\n %r : float = aten::sqrt(%a)", 1.5),
    ("%a : int = prim::Constant[value=2]()\n %r : bool = prim::isinstance[types=[float, int]](%a)", True),
    ("%a : int = prim::Constant[value=2]()\n %l : int[] = prim::ListConstruct(%a)\n"
     " %r : bool = prim::isinstance[types=[int, str]](%l)", False),
    ('%a : int = prim::Constant[value=2]()\n %r : str = aten::str(%a)', "2"),
    ('%a : str = prim::Constant[value="ab"]()\n %b : str = prim::Constant[value="b"]()\n'
     ' %s : int = prim::Constant[value=0]()\n %e : int = prim::Constant[value=-1]()\n'
     ' %r : int = aten::find(%a, %b, %s, %e)', -1),
    ('%k : str = prim::Constant[value="a"]()\n %v : int = prim::Constant[value=1]()\n'
     ' %e : Dict(str, int) = prim::DictConstruct(%k, %v)\n %d : Dict(str, int) = aten::dict(%e)\n'
     ' %r : int = aten::__getitem__(%d, %k)', 1),
    ('%k : str = prim::Constant[value="a"]()\n %v : int = prim::Constant[value=1]()\n'
     ' %d : Dict(str, int) = prim::DictConstruct()\n aten::_set_item(%d, %k, %v)\n'
     ' %r : int = prim::Constant[value=0]()', 0),
    ("%a : int = prim::Constant[value=1]()\n %l : int[] = prim::ListConstruct(%a)\n"
     " %m : int[] = prim::ListConstruct(%a, %a)\n aten::extend(%l, %m)\n %r : int = prim::Constant[value=0]()", 0),
])
def test_evaluators_of_ops_lowering_folds(ir, expected):
    load_all()
    graph = torch._C.parse_ir(f"graph():\n {ir}\n return (%r)")
    for node in graph.nodes():
        assert find_evaluator(node) is not None, node.kind()
    resolver = Resolver({})
    for node in graph.nodes():  # in order, as the block converter walks them
        if node.outputsSize() == 0:
            find_evaluator(node).fn(resolver.args(node))
    assert resolver.resolve(next(graph.outputs())) == expected


def test_prim_shape_and_uninitialized_evaluate():
    # prim::shape is not emitted by scripting or tracing: check its evaluator on a parsed graph
    load_all()
    graph = torch._C.parse_ir("""
        graph(%x : Tensor):
            %s : int[] = prim::shape(%x)
            %u : int = prim::Uninitialized()
            return (%s, %u)""")
    x = next(iter(graph.inputs()))
    s_node, u_node = list(graph.nodes())
    assert find_evaluator(s_node) is not None and find_evaluator(u_node) is not None
    resolver = Resolver({value_key(x): TensorMeta((2, 5), torch.float32, torch.device("cpu"))})
    assert resolver.resolve(s_node.output()) == [2, 5]
    assert repr(resolver.resolve(u_node.output())) == "<uninitialized>"


# Static values in real module patterns: each evaluator lets the op that uses its value run in the engine.
class SwinShift(torch.nn.Module):
    """Swin's cyclic window shift: `if sum(self.shift_size) > 0` (aten::sum.int), then torch.roll."""

    def __init__(self, shift_size: List[int]) -> None:
        super().__init__()
        self.shift_size = shift_size

    def forward(self, x):
        shift_size = [self.shift_size[0] % x.size(1), self.shift_size[1] % x.size(2)]  # no shift past the window
        if sum(shift_size) > 0:
            x = torch.roll(x, shifts=(-shift_size[0], -shift_size[1]), dims=(1, 2))
        return x * 2


class ResizeLike(torch.nn.Module):
    """FPN / segmentation heads: `F.interpolate(x, size=y.shape[-2:])` (aten::slice.t)."""

    def forward(self, x, y):
        return torch.nn.functional.interpolate(x, size=y.shape[-2:], mode="bilinear", align_corners=False) + y


class TFSameConv(torch.nn.Module):
    """TF-"same" padding (EfficientNet ports): math.ceil (aten::ceil.float), a copied list written by index
    (aten::copy.t, aten::_set_item.t), then F.pad."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=2)
        self.stride = [2, 2]
        self.kernel = [3, 3]

    def forward(self, x):
        ih, iw = x.shape[-2:]
        oh, ow = math.ceil(ih / self.stride[0]), math.ceil(iw / self.stride[1])
        pad_h = max((oh - 1) * self.stride[0] + self.kernel[0] - ih, 0)
        pad_w = max((ow - 1) * self.stride[1] + self.kernel[1] - iw, 0)
        pad = [0, 0, 0, 0].copy()
        n = len(pad)  # read before the item sets
        pad[0] = pad_w // 2
        pad[1] = pad_w - pad_w // 2
        pad[2] = pad_h // 2
        pad[3] = pad_h - pad_h // 2
        return self.conv(torch.nn.functional.pad(x, pad)) + n


class ConfigDict(torch.nn.Module):
    """Configs in dicts keyed by str (aten::dict, aten::_set_item.str, aten::__getitem__.Dict_str,
    aten::__contains__.str, aten::str), e.g. a per-device cache key."""

    def __init__(self) -> None:
        super().__init__()
        self.scales = {"narrow": 2, "wide": 3}

    def forward(self, x):
        cfg: Dict[str, int] = dict()
        cfg["rows"] = x.size(0)
        cfg["cols"] = x.size(1)
        key = "wide" if "cols" in cfg and str(x.device) == "cpu" else "narrow"
        scale = self.scales[key] if "3" in str(x.size(1)) else 1
        return x.view(cfg["cols"], cfg["rows"]) * scale


class Pool(torch.nn.Module):
    """A size that may be an int or a pair (prim::isinstance on a Union attribute)."""

    size: Union[int, List[int]]

    def __init__(self, size: Union[int, List[int]]) -> None:
        super().__init__()
        self.size = size

    def forward(self, x):
        size = self.size
        if isinstance(size, int):
            k = [size, size]
        else:
            k = size
        return torch.nn.functional.avg_pool2d(x, k)


@pytest.mark.parametrize("model, example, op", [
    (SwinShift([1, 2]), [R(1, 4, 5, 3)], "aten::roll"),
    (SwinShift([4, 5]), [R(1, 4, 5, 3)], "aten::mul.Scalar"),
    (ResizeLike(), [R(1, 2, 3, 3), R(1, 2, 6, 5)], "aten::upsample_bilinear2d.vec"),
    (TFSameConv(), [R(1, 3, 7, 9)], "aten::pad"),
    (ConfigDict(), [R(2, 3)], "aten::reshape"),
    (Pool(2), [R(1, 2, 4, 4)], "aten::avg_pool2d"),
    (Pool([2, 1]), [R(1, 2, 4, 4)], "aten::avg_pool2d"),
], ids=["swin_shift", "swin_no_shift", "resize_like", "tf_same_pad", "config_dict", "pool_int", "pool_pair"])
def test_static_values_of_real_module_patterns(model, example, op):
    check_compiled(torch.jit.script(model), example, min_block_size=1, op=op)


def dict_written_in_a_branch(x):
    cfg: Dict[str, int] = {"scale": 1}
    if bool(x.sum() > 0):
        cfg["scale"] = 2
    return x * cfg["scale"]


def test_dict_written_after_a_read_is_not_static():
    # the item set in a branch changes the dict at run time: reading it must not use the constructed value
    for sign in (1.0, -1.0):
        _, report = check_fn(dict_written_in_a_branch, sign * torch.rand(2, 3) + sign, engines=None, torch_blocks=None)
    reasons = {f.op: f.detail for b in report.blocks for f in b.fallback}
    assert "read after aten::_set_item" in reasons["prim::DictConstruct"], reasons


def test_nested_static_ifs_fold_in_one_round():
    """An If inside a folded If's taken branch is tried in the same round (nn.MultiheadAttention's chain of
    fast-path checks is seven deep: one shape analysis per level made vit_b_16's build 2x slower)."""
    from torchkiln.lowering.static_control_flow import fold_static_control_flow

    load_all()
    graph = torch._C.parse_ir("""
        graph(%x : Tensor):
            %four : int = prim::Constant[value=4]()
            %three : int = prim::Constant[value=3]()
            %one : int = prim::Constant[value=1]()
            %d : int = aten::dim(%x)
            %c : bool = aten::eq(%d, %four)
            %r : Tensor = prim::If(%c)
              block0():
                %s : int = aten::size(%x, %one)
                %c2 : bool = aten::eq(%s, %three)
                %inner : Tensor = prim::If(%c2)
                  block0():
                    %y : Tensor = aten::relu(%x)
                    -> (%y)
                  block1():
                    -> (%x)
                -> (%inner)
              block1():
                -> (%x)
            return (%r)""")
    x = next(iter(graph.inputs()))
    resolver = Resolver({value_key(x): TensorMeta((2, 3, 8, 8), torch.float32, torch.device("cpu"))})
    assert fold_static_control_flow(graph, resolver)
    assert [n.kind() for n in graph.nodes() if n.kind() == "prim::If"] == []
    assert next(graph.outputs()).node().kind() == "aten::relu"
