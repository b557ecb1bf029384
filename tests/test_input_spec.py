"""Input specs as text (torchkiln.input_spec): static shapes, min;opt;max ranges, dtypes, memory formats, errors."""
import pytest
import torch

from torchkiln import Input
from torchkiln.input_spec import parse_input_spec


@pytest.mark.parametrize("text, expected", [
    ("(1,3,224,224)", Input((1, 3, 224, 224))),
    (" (1, 3, 224, 224) @ f32 ", Input((1, 3, 224, 224))),
    ("(1,3,224,224)@f16%contiguous", Input((1, 3, 224, 224), dtype=torch.float16)),
    ("(1,3,224,224)@float16%channels_last", Input((1, 3, 224, 224), dtype=torch.float16,
                                                  format=torch.channels_last)),
    ("(1,3,8,8)%channels_last", Input((1, 3, 8, 8), format=torch.channels_last)),
    ("(2,128)@i64", Input((2, 128), dtype=torch.int64)),
    ("(2,128)@int32", Input((2, 128), dtype=torch.int32)),
    ("(4,)@bool", Input((4,), dtype=torch.bool)),
    ("(4)@BF16", Input((4,), dtype=torch.bfloat16)),
    ("()@float32", Input(())),
    ("[(1,3,224,224);(8,3,224,224);(32,3,224,224)]@f32",
     Input(min_shape=(1, 3, 224, 224), opt_shape=(8, 3, 224, 224), max_shape=(32, 3, 224, 224))),
    ("[(1,16); (4,16) ;(8,16)]@long", Input(min_shape=(1, 16), opt_shape=(4, 16), max_shape=(8, 16),
                                          dtype=torch.int64)),
])
def test_parses(text, expected):
    spec = parse_input_spec(text)
    assert spec == expected
    assert (spec.min_shape, spec.opt_shape, spec.max_shape, spec.dtype, spec.format) == \
        (expected.min_shape, expected.opt_shape, expected.max_shape, expected.dtype, expected.format)


@pytest.mark.parametrize("text, names", [
    ("", "empty"),
    ("1,3,224,224", "parentheses"),
    ("(1,3,x,224)", "dim 'x'"),
    ("(1,0,2)", "dim '0'"),
    ("(1,-3)", "dim '-3'"),
    ("(1,3)@f8", "dtype 'f8'"),
    ("(1,3)@f32%nhwc", "memory format 'nhwc'"),
    ("[(1,3);(2,3)]", "three shapes"),
    ("[(1,3);(2,3);(4,3)", "closing"),
    ("[(4,3);(2,3);(8,3)]", "min <= opt <= max"),
    ("[(1,3);(2,3,1);(4,3)]", "differ in rank"),
    ("(1,3)%channels_last", "4-d"),
])
def test_errors_name_the_bad_part(text, names):
    with pytest.raises(ValueError, match="input spec") as info:
        parse_input_spec(text)
    assert names in str(info.value)
