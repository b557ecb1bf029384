"""Input specs as text, for the command line: `(1,3,224,224)@f16%contiguous` or, for a shape range,
`[(1,3,224,224);(8,3,224,224);(32,3,224,224)]@f32` (min;opt;max). The dtype (after `@`, default f32) and the
memory format (after `%`, default contiguous) are optional."""
from __future__ import annotations

import torch

from torchkiln.settings import Input

DTYPES: dict[str, torch.dtype] = {
    "f32": torch.float32, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "f16": torch.float16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "f64": torch.float64, "fp64": torch.float64, "float64": torch.float64, "double": torch.float64,
    "i64": torch.int64, "int64": torch.int64, "long": torch.int64,
    "i32": torch.int32, "int32": torch.int32, "int": torch.int32,
    "i8": torch.int8, "int8": torch.int8, "u8": torch.uint8, "uint8": torch.uint8,
    "bool": torch.bool,
}
FORMATS: dict[str, torch.memory_format] = {
    "contiguous": torch.contiguous_format, "channels_last": torch.channels_last,
}


def _shape(text: str, spec: str) -> tuple[int, ...]:
    """`(1,3,224,224)` -> (1, 3, 224, 224); `()` is a 0-d shape."""
    text = text.strip()
    if not (text.startswith("(") and text.endswith(")")):
        raise ValueError(f"input spec {spec!r}: shape {text!r} must be written in parentheses, e.g. (1,3,224,224)")
    body = text[1:-1].strip()
    if not body:
        return ()
    parts = [p.strip() for p in body.split(",")]
    if parts[-1] == "" and len(parts) > 1:  # a trailing comma, as in (5,)
        parts.pop()
    dims = []
    for p in parts:
        if not p.isdigit() or int(p) < 1:
            raise ValueError(f"input spec {spec!r}: dim {p!r} of shape {text} is not a positive integer")
        dims.append(int(p))
    return tuple(dims)


def parse_input_spec(text: str) -> Input:
    """A torchkiln.Input from its text form; a ValueError names the part that is wrong."""
    spec = text
    text = text.strip()
    if not text:
        raise ValueError("input spec is empty; write e.g. (1,3,224,224)@f32")
    fmt = torch.contiguous_format
    if "%" in text:
        text, fmt_name = text.rsplit("%", 1)
        fmt_name = fmt_name.strip()
        if fmt_name.lower() not in FORMATS:
            raise ValueError(f"input spec {spec!r}: unknown memory format {fmt_name!r}; use one of {sorted(FORMATS)}")
        fmt = FORMATS[fmt_name.lower()]
    dtype = torch.float32
    if "@" in text:
        text, dtype_name = text.rsplit("@", 1)
        dtype_name = dtype_name.strip()
        if dtype_name.lower() not in DTYPES:
            raise ValueError(f"input spec {spec!r}: unknown dtype {dtype_name!r}; use one of {sorted(DTYPES)}")
        dtype = DTYPES[dtype_name.lower()]
    text = text.strip()
    try:
        if text.startswith("["):
            if not text.endswith("]"):
                raise ValueError(f"input spec {spec!r}: shape range {text!r} has no closing ']'")
            shapes = [_shape(s, spec) for s in text[1:-1].split(";")]
            if len(shapes) != 3:
                raise ValueError(f"input spec {spec!r}: shape range {text!r} needs three shapes, min;opt;max, "
                                 f"got {len(shapes)}")
            return Input(min_shape=shapes[0], opt_shape=shapes[1], max_shape=shapes[2], dtype=dtype, format=fmt)
        return Input(_shape(text, spec), dtype=dtype, format=fmt)
    except ValueError as e:
        if str(e).startswith("input spec"):
            raise
        raise ValueError(f"input spec {spec!r}: {e}") from None
