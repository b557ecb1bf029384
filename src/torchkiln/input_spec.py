"""Input specs as strings, as torchtrtc takes them: `(1,3,224,224)@f16%contiguous` (static) or
`[(1,3,224,224);(8,3,224,224);(32,3,224,224)]@f32%channels_last` (min;opt;max)."""
from __future__ import annotations

import re

import torch

from torchkiln.settings import Input

DTYPE_NAMES: dict[str, torch.dtype] = {
    "f32": torch.float32, "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "f16": torch.float16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "f64": torch.float64, "fp64": torch.float64, "float64": torch.float64, "double": torch.float64,
    "i64": torch.int64, "int64": torch.int64, "long": torch.int64,
    "i32": torch.int32, "int32": torch.int32, "int": torch.int32,
    "i8": torch.int8, "int8": torch.int8, "char": torch.int8, "u8": torch.uint8, "uint8": torch.uint8,
    "b": torch.bool, "bool": torch.bool,
}
FORMAT_NAMES: dict[str, torch.memory_format] = {
    "contiguous": torch.contiguous_format, "linear": torch.contiguous_format, "nchw": torch.contiguous_format,
    "chw": torch.contiguous_format, "channels_last": torch.channels_last, "nhwc": torch.channels_last,
    "hwc": torch.channels_last,
}
_SHAPE = re.compile(r"\(\s*(\d+(?:\s*,\s*\d+)*)?\s*,?\s*\)")


def parse_dtype(text: str) -> torch.dtype:
    """A dtype by its short or long name (f16, half, float16, ...); ValueError naming it otherwise."""
    key = text.strip().lower()
    if key not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {text!r}; use one of {', '.join(DTYPE_NAMES)}")
    return DTYPE_NAMES[key]


def _shape(text: str, what: str, spec: str) -> tuple[int, ...]:
    match = _SHAPE.fullmatch(text.strip())
    if not match:
        raise ValueError(f"input spec {spec!r}: {what} {text.strip()!r} is not a shape such as (1,3,224,224)")
    return tuple(int(d) for d in match.group(1).split(",")) if match.group(1) else ()


def parse_input_spec(text: str) -> Input:
    """The torchkiln.Input a torchtrtc-style spec string means; ValueError naming the bad part.

    `SHAPE[@DTYPE][%FORMAT]` where SHAPE is `(d0,d1,...)` or `[(min);(opt);(max)]`, DTYPE a name of
    DTYPE_NAMES (none: the model's, as for an Input without a dtype) and FORMAT one of FORMAT_NAMES (default
    contiguous); `@` and `%` in either order.
    """
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"input spec must be a non-empty string such as '(1,3,224,224)@f32', got {text!r}")
    spec = text.strip()
    match = re.fullmatch(r"(\[[^\]]*\]|\([^)]*\))\s*((?:[@%][^@%]*)*)", spec)
    if not match:
        raise ValueError(f"input spec {spec!r}: expected (d0,d1,...) or [(min);(opt);(max)], optionally followed "
                         f"by @dtype and %format")
    shape_text, suffixes = match.group(1), match.group(2)
    dtype, fmt = None, torch.contiguous_format
    seen = set()
    for part in re.findall(r"[@%][^@%]*", suffixes):
        mark, value = part[0], part[1:].strip()
        if mark in seen:
            raise ValueError(f"input spec {spec!r}: {'dtype' if mark == '@' else 'format'} given twice")
        seen.add(mark)
        if mark == "@":
            try:
                dtype = parse_dtype(value)
            except ValueError as e:
                raise ValueError(f"input spec {spec!r}: {e}") from None
        elif value.lower() in FORMAT_NAMES:
            fmt = FORMAT_NAMES[value.lower()]
        else:
            raise ValueError(f"input spec {spec!r}: unknown format {value!r}; use one of {', '.join(FORMAT_NAMES)}")
    try:
        if shape_text.startswith("["):
            parts = shape_text[1:-1].split(";")
            if len(parts) != 3:
                raise ValueError(f"input spec {spec!r}: a range needs three shapes [(min);(opt);(max)], got "
                                 f"{len(parts)}")
            lo, mid, hi = (_shape(p, what, spec) for p, what in zip(parts, ("min shape", "opt shape", "max shape")))
            return Input(min_shape=lo, opt_shape=mid, max_shape=hi, dtype=dtype, format=fmt)
        return Input(_shape(shape_text, "shape", spec), dtype=dtype, format=fmt)
    except ValueError as e:
        message = str(e)
        raise ValueError(message if message.startswith("input spec") else f"input spec {spec!r}: {message}") from None
