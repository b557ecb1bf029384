"""Every compile setting, declared once: its name, type, default, one-line doc, check, command-line flag and the
backend option it feeds. `CompileSettings` (its fields and `create`), `BackendOptions`, the `compile` command's
flags and docs/settings.md are all derived from `SETTINGS`; adding a setting is adding one row.

This module imports nothing but the standard library, so the command line can build its parser before torch is
imported: as `torchkiln.settings_table` where `torchkiln/__init__` does not import torch, or by file path
(importlib.util.spec_from_file_location, the module put in sys.modules before it runs, as dataclasses need).
A check runs when settings are made, and imports what it needs (torch, torchkiln.settings) then.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import re
import types
from collections.abc import Callable, Iterable, Mapping
from typing import Any

MAX_ORT_THREADS = 1024
MAX_TIMING_ITERATIONS = 10_000  # also bounds what an engine's bytes may ask for

# A check takes the setting's name, the value given (or the default) and the settings checked before it in table
# order (with the method's `inputs` and the `default_device`); it returns the value to store, or raises a
# ValueError naming the setting.
Check = Callable[[str, Any, Mapping[str, Any]], Any]


@dataclasses.dataclass(frozen=True)
class EngineBackend:
    """A value of the `backend` setting that names a backend of the registry (runtime/backends/__init__.py)."""

    devices: tuple[str, ...]  # the device kinds it runs on
    where: str  # where it runs, for an error: "runs on {where}, not on cuda:0"
    doc: str


# The registry's backends, by name, in the order they are documented; the registry checks that it has exactly these.
ENGINE_BACKENDS: dict[str, EngineBackend] = {
    "reference": EngineBackend(("cpu", "cuda"), "any device", "ATen, layer by layer, on any device"),
    "onnxruntime": EngineBackend(("cpu",), "the CPU", "ONNX Runtime sessions on the CPU; layers ONNX cannot express "
                                                     "run on the reference"),
    "cuda": EngineBackend(("cuda",), "a CUDA device", "fused kernels from cuDNN, cuBLAS and Triton, one CUDA graph per "
                                                     "input shape, on a CUDA device"),
}
AUTO_BACKEND = {"cpu": "onnxruntime", "cuda": "cuda"}  # what backend="auto" means on each device kind


BACKEND_CHOICES = ("auto", *ENGINE_BACKENDS)


def _auto_doc() -> str:
    return ", ".join(f"{b} on {ENGINE_BACKENDS[b].where}" for b in AUTO_BACKEND.values())


@dataclasses.dataclass(frozen=True)
class Flag:
    """The `compile` command's flag for a setting. A flag with a metavar takes a value (`type` converts it as
    argparse does; `parse`, given, converts it when the command runs and may import torch); one without is a
    switch (`--x`, or `--x/--no-x` where the setting defaults to True)."""

    options: tuple[str, ...]
    metavar: str | None = None
    repeat: bool = False  # one value per flag, collected in a list
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None
    parse: Callable[[str], Any] | None = None


@dataclasses.dataclass(frozen=True)
class BackendField:
    """The BackendOptions field a setting feeds (stored in engines' bytes), and how its value becomes the field's."""

    name: str
    convert: Callable[[Any], Any] = lambda value: value
    doc: str | None = None  # the field's doc where the setting's does not say it


@dataclasses.dataclass(frozen=True)
class Setting:
    """One compile setting."""

    name: str
    type: str  # the stored value's annotation
    default: Any  # what create() checks when the setting is not given (torch-free: the check turns it into a value)
    doc: str
    check: Check
    flag: Flag | None = None
    backend: BackendField | None = None
    no_effect: bool = False  # Torch-TensorRT's, accepted; a value other than the default is logged as without effect
    shown_default: str | None = None  # the default as the docs show it, where repr(default) does not say it
    compare: bool = True  # part of the settings' equality and repr
    example: Any = None  # a value other than the default where one exists here, for the tests derived from the table
    example_args: tuple[str, ...] = ()  # the flag and value(s) giving `example` on the command line

    def default_text(self) -> str:
        return self.shown_default if self.shown_default is not None else repr(self.default)


# ---- checks -------------------------------------------------------------------------------------------------------

def boolean(name: str, value: Any, context: Mapping[str, Any]) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _optional_boolean(name: str, value: Any, context: Mapping[str, Any]) -> bool | None:
    return None if value is None else boolean(name, value, context)


def truthy(name: str, value: Any, context: Mapping[str, Any]) -> bool:
    """Any value, as a bool (Torch-TensorRT's switches take any truthy value)."""
    return bool(value)


@dataclasses.dataclass(frozen=True)
class IntRange:
    """An int (not a bool) in [low, high]."""

    low: int
    high: int | None = None
    note: str = ""

    def __call__(self, name: str, value: Any, context: Mapping[str, Any]) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < self.low \
                or (self.high is not None and value > self.high):
            bound = f" and <= {self.high}" if self.high is not None else ""
            note = f" ({self.note})" if self.note else ""
            raise ValueError(f"{name} must be an int >= {self.low}{bound}{note}, got {value!r}")
        return value


def _precisions(name: str, value: Any, context: Mapping[str, Any]) -> frozenset[Any]:
    import torch

    from torchkiln.settings import engine_precision

    if value is None:
        value = {torch.float32}
    if isinstance(value, (torch.dtype, str)):
        value = {value}
    if not isinstance(value, Iterable):
        raise ValueError(f"{name} must be a set of precisions such as {{torch.float32}}, got {value!r}")
    precisions = frozenset(engine_precision(p) for p in value)
    if not precisions:
        raise ValueError(f"{name} must name at least one precision")
    return precisions


def _device(name: str, value: Any, context: Mapping[str, Any]) -> Any:
    from torchkiln.settings import as_device

    return as_device(value if value is not None else (context.get("default_device") or "cpu"))


def _names(name: str, value: Any, context: Mapping[str, Any]) -> frozenset[str]:
    try:
        items = tuple(value) if not isinstance(value, str) else None
    except TypeError:
        items = None
    if items is None or not all(isinstance(n, str) for n in items):
        raise ValueError(f"{name} must be a collection of strings, got {value!r}")
    return frozenset(items)


_OP_NAME = re.compile(r"\w+::\w+(\.\w+)?")


def _op_names(name: str, value: Any, context: Mapping[str, Any]) -> frozenset[str]:
    ops = _names(name, value, context)
    for op in sorted(ops):
        if not _OP_NAME.fullmatch(op):
            raise ValueError(f"{name}: {op!r} is not an op name; use 'namespace::op' for every overload (e.g. "
                             f"'aten::add') or 'namespace::op.overload' (e.g. 'aten::add.Tensor')")
    return ops


def _backend(name: str, value: Any, context: Mapping[str, Any]) -> str:
    if value not in BACKEND_CHOICES:
        raise ValueError(f"{name} must be one of {list(BACKEND_CHOICES)}, got {value!r}")
    device = context.get("device")
    if value != "auto" and device is not None and device.type not in ENGINE_BACKENDS[value].devices:
        raise ValueError(f"{name}: {value!r} runs on {ENGINE_BACKENDS[value].where}, not on {device}; use 'auto' or "
                         f"'reference'")
    return value


def _member(cls: type, name: str, value: Any, expected: str) -> Any:
    """The member of enum `cls` that `value` is or names (a string in any case); ValueError saying `expected`."""
    try:
        return cls(value.lower() if isinstance(value, str) else value)
    except ValueError:
        raise ValueError(f"{name} must be {expected}, got {value!r}") from None


def _capability(name: str, value: Any, context: Mapping[str, Any]) -> Any:
    from torchkiln.enums import EngineCapability

    return _member(EngineCapability, name, value, f"a torchkiln.EngineCapability (or its value: "
                                                  f"{[c.value for c in EngineCapability]})")


def _calibration_inputs(name: str, value: Any, context: Mapping[str, Any]) -> tuple[tuple[Any, ...], ...] | str | None:
    """The samples, or a file's path (settings.load_calibration_samples reads it when the compile calibrates)."""
    if isinstance(value, (str, os.PathLike)):
        return _optional_path(name, value, context)
    from torchkiln.settings import calibration_samples

    return calibration_samples(value, len(context.get("inputs", ())))


def _calibrator(name: str, value: Any, context: Mapping[str, Any]) -> Any:
    if value is not None and not (callable(getattr(value, "samples", None)) and hasattr(value, "algo_type")
                                  and hasattr(value, "cache_file")):
        raise ValueError(f"{name} must be a torchkiln.ptq.DataLoaderCalibrator or CacheCalibrator, got {value!r}")
    return value


def _algorithm(name: str, value: Any, context: Mapping[str, Any]) -> Any:
    from torchkiln.enums import CalibrationAlgo

    return _member(CalibrationAlgo, name, value, "a torchkiln.ptq.CalibrationAlgo or one of max, percentile, entropy, "
                                                 "mse")


def _optional_path(name: str, value: Any, context: Mapping[str, Any]) -> str | None:
    if value is not None and not isinstance(value, (str, bytes)) and not hasattr(value, "__fspath__"):
        raise ValueError(f"{name} must be a file path or None, got {value!r}")
    if value is not None and value != "" and os.path.isdir(value):
        raise ValueError(f"{name} must be a file path, got the folder {str(value)!r}")
    return None if value is None or value == "" else str(value)


def _dtype(text: str) -> Any:
    from torchkiln.input_spec import parse_dtype

    return parse_dtype(text)


# ---- the table ----------------------------------------------------------------------------------------------------

_CUDA_ONLY = "cuda backend: "
SETTINGS: tuple[Setting, ...] = (
    Setting("enabled_precisions", "frozenset[torch.dtype]", None,
            "precisions engine layers may run in: float32, float16, bfloat16, int8, float8_e4m3fn (torch dtypes, or "
            "names such as f16, int8, fp8); float layers run in the lowest float one enabled (on the onnxruntime "
            "backend float32, but bfloat16 on the reference backend where the CPU has it and it times faster: "
            "docs/backends.md); with int8 (else fp8) "
            "convolutions and matrix multiplies are quantized after calibration (docs/quantization.md)", _precisions,
            Flag(("-p", "--enabled-precision"), "P", repeat=True, parse=_dtype),
            shown_default="{torch.float32}", example={"float16", "float32"}, example_args=("-p", "f16", "-p", "f32")),
    Setting("device", "torch.device", None,
            "where the engines run: cpu, cuda:N or gpu:N; from Python also a torch.device or torchkiln.Device",
            _device,
            Flag(("--device",), "DEVICE"), shown_default="the module's device, else cpu", example="cpu",
            example_args=("--device", "cpu")),
    Setting("min_block_size", "int", 3, "the fewest ops an engine block may have", IntRange(1),
            Flag(("--min-block-size",), "N", type=int), example=1, example_args=("--min-block-size", "1")),
    Setting("torch_executed_ops", "frozenset[str]", (),
            "ops kept in PyTorch: 'namespace::op' (every overload) or 'namespace::op.overload'", _op_names,
            Flag(("--torch-executed-op",), "OP", repeat=True), example=("aten::relu",),
            example_args=("--torch-executed-op", "aten::relu")),
    Setting("torch_executed_modules", "frozenset[str]", (), "submodule types kept in PyTorch, by qualified name",
            _names, Flag(("--torch-executed-module",), "MODULE", repeat=True), example=("mymodels.Block",),
            example_args=("--torch-executed-module", "mymodels.Block")),
    Setting("require_full_compilation", "bool", False,
            "fail unless the method compiles to one engine with nothing left in PyTorch", truthy,
            Flag(("--require-full-compilation",)), example=True, example_args=("--require-full-compilation",)),
    Setting("truncate_long_and_double", "bool", False, "run int64 and float64 values in 32 bits inside engines",
            truthy, Flag(("--truncate-long-double",)), example=True, example_args=("--truncate-long-double",)),
    Setting("debug", "bool", False,
            "log at DEBUG: the graph after each phase, the partition report, each network", truthy,
            Flag(("--debug",)), example=True, example_args=("--debug",)),
    Setting("backend", "str", "auto",
            "what runs the engines: " + ", ".join(f"{n} ({b.doc})" for n, b in ENGINE_BACKENDS.items())
            + "; or auto: " + _auto_doc(), _backend,
            Flag(("--backend",), "BACKEND", choices=BACKEND_CHOICES), example="reference",
            example_args=("--backend", "reference")),
    Setting("ort_threads", "int", 0, "onnxruntime backend: intra-op threads; 0: torch.get_num_threads() where the "
            "engine runs, or one where the build measured one faster", IntRange(0, MAX_ORT_THREADS, "0: torch.get_num_threads()"),
            Flag(("--ort-threads",), "N", type=int), BackendField("ort_threads"), example=2,
            example_args=("--ort-threads", "2")),
    Setting("disable_tf32", "bool", True, _CUDA_ONLY + "float32 convolutions and matrix multiplies stay true fp32 "
            "(False: they may use TF32, Torch-TensorRT's default)", boolean, Flag(("--disable-tf32",)),
            BackendField("allow_tf32", lambda disable: not disable,
                         _CUDA_ONLY + "float32 convolutions and matrix multiplies may use TF32 (10-bit mantissa)"),
            example=False, example_args=("--no-disable-tf32",)),
    Setting("num_avg_timing_iters", "int", 10, _CUDA_ONLY + "runs averaged per kernel candidate when the build "
            "times them; 0: no timing (on the onnxruntime backend too: its session settings are then not measured)", IntRange(0, MAX_TIMING_ITERATIONS),
            Flag(("--num-avg-timing-iters",), "N", type=int), BackendField("timing_iterations"), example=4,
            example_args=("--num-avg-timing-iters", "4")),
    Setting("workspace_size", "int", 0, "no effect: engines allocate what their layers need, there is no builder "
            "workspace", IntRange(0), no_effect=True, example=1 << 22),
    Setting("sparse_weights", "bool", False, "no effect: there are no structured-sparsity kernels", boolean,
            no_effect=True, example=True),
    Setting("capability", "EngineCapability", "standard", "EngineCapability.STANDARD (or its value); SAFETY and "
            "DLA_STANDALONE have no effect", _capability, no_effect=True, shown_default="EngineCapability.STANDARD",
            example="safety"),
    Setting("refit", "bool", False, "no effect: engines are built the same either way", boolean, no_effect=True,
            example=True),
    Setting("dla_sram_size", "int", 1048576, "no effect: no DLA", IntRange(0), no_effect=True, example=1 << 10),
    Setting("dla_local_dram_size", "int", 1073741824, "no effect: no DLA", IntRange(0), no_effect=True,
            example=1 << 10),
    Setting("dla_global_dram_size", "int", 536870912, "no effect: no DLA", IntRange(0), no_effect=True,
            example=1 << 10),
    Setting("allow_shape_tensors", "bool", False, "no effect: shape arithmetic is symbolic dims of the network",
            boolean, no_effect=True, example=True),
    Setting("precision_safety", "bool", True, "fp16/bf16: keep in fp32 the layers that overflow or lose precision "
            "on the calibration inputs", truthy, Flag(("--precision-safety",)), example=False,
            example_args=("--no-precision-safety",)),
    Setting("calibration_inputs", "tuple[tuple[Any, ...], ...] | str", None, "the samples precision_safety and "
            "quantization calibrate on: a list of argument tuples (a tensor alone for one argument), or the path of "
            "such a list saved by torch.save; none: the calibrator's, else random inputs at the opt shapes",
            _calibration_inputs, Flag(("--calibration-inputs",), "PATH"), shown_default="None", compare=False,
            example="calib.pt", example_args=("--calibration-inputs", "calib.pt")),
    Setting("calibrator", "Any", None, "quantization: a torchkiln.ptq.DataLoaderCalibrator (samples from a data "
            "loader, its algorithm and cache file) or CacheCalibrator (a calibration cache only); Torch-TensorRT's "
            "ptq names", _calibrator, shown_default="None", compare=False,
            example=types.SimpleNamespace(samples=list, algo_type="max", cache_file=None)),
    Setting("calibration_algorithm", "CalibrationAlgo", "max", "quantization: how an activation's range is "
            "chosen: max (the largest |value|, ModelOpt's default), percentile (99.99th), entropy (least KL "
            "divergence over int8's levels, TensorRT's) or mse (least squared error of the type's own rounding)",
            _algorithm, Flag(("--calibration-algorithm",), "ALGO", choices=("max", "percentile", "entropy", "mse")),
            shown_default="CalibrationAlgo.MAX", example="mse", example_args=("--calibration-algorithm", "mse")),
    Setting("calibration_cache_file", "str | None", None, "quantization: a JSON file of calibrated ranges, read "
            "instead of calibrating where it has the engine's entry, written after calibrating", _optional_path,
            Flag(("--calibration-cache-file",), "PATH"), example="calib.json",
            example_args=("--calibration-cache-file", "calib.json")),
    Setting("cache_built_engines", "bool", False, "store the compiled module and each built engine in the "
            "engine cache ($TORCHKILN_CACHE_DIR, docs/engine_cache.md)", boolean, Flag(("--cache-built-engines",)),
            example=True, example_args=("--cache-built-engines",)),
    Setting("native_tape", "bool | None", None, "record each engine's planned run as a tape for the C++ runtime "
            "(docs/tape_format.md); None: on the cuda backend, where it runs the plan's kernels without Python",
            _optional_boolean, Flag(("--native-tape",), "on|off", choices=("on", "off"), parse=lambda v: v == "on"),
            example=True, example_args=("--native-tape", "on")),
    Setting("native_tape_shapes", "int", 8, "the most extra shapes a dynamic engine's tapes are recorded at, "
            "besides its optimization, smallest and largest: every shape its ranges allow where there are at most "
            "this many, else the powers of two of its dynamic dims where those combinations are; 0: none "
            "(docs/tape_format.md)", IntRange(0, 256), Flag(("--native-tape-shapes",), "N", type=int), example=32,
            example_args=("--native-tape-shapes", "32")),
    Setting("reuse_cached_engines", "bool", False, "load the compiled module, or else each engine, from the "
            "engine cache instead of compiling or building it when its key matches", boolean,
            Flag(("--reuse-cached-engines",)), example=True, example_args=("--reuse-cached-engines",)),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}


def with_fields(rows: Iterable[Setting], after: tuple[str, ...] = ()) -> Callable[[type], type]:
    """A class decorator (applied before dataclasses.dataclass) that adds a field for each row, with its checked
    default and its doc (field metadata), after the class's own fields named in `after` and before its others."""
    def add(cls: type) -> type:
        own = dict(cls.__dict__.get("__annotations__", {}))
        annotations = {name: own.pop(name) for name in after}
        for row in rows:
            annotations[row.name] = row.type
            setattr(cls, row.name, dataclasses.field(default=row.check(row.name, row.default, {}), compare=row.compare,
                                                     repr=row.compare, metadata={"doc": row.doc}))
        cls.__annotations__ = {**annotations, **own}
        return cls

    return add


def backend_fields() -> list[Setting]:
    """The BackendOptions fields settings feed, as rows named for the field (default and doc converted)."""
    return [dataclasses.replace(s, name=s.backend.name, default=s.backend.convert(s.default),
                                doc=s.backend.doc or s.doc, flag=None, backend=None)
            for s in SETTINGS if s.backend is not None]


def backend_values(settings: Any) -> dict[str, Any]:
    """The BackendOptions fields' values for these compile settings (an object with a setting's attributes)."""
    return {s.backend.name: s.backend.convert(getattr(settings, s.name)) for s in SETTINGS if s.backend is not None}


# ---- the command line ---------------------------------------------------------------------------------------------

def _help(s: Setting) -> str:
    repeat = "; repeatable" if s.flag is not None and s.flag.repeat else ""
    return f"{s.doc} (default: {s.default_text()}{repeat})".replace("%", "%%")


def add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """Add a flag for each setting that has one; a flag not given leaves its setting to compile's default."""
    for s in SETTINGS:
        flag = s.flag
        if flag is None:
            continue
        if flag.metavar is None:
            action = argparse.BooleanOptionalAction if s.default is True else "store_true"
            parser.add_argument(*flag.options, dest=s.name, action=action, default=None, help=_help(s))
            continue
        parser.add_argument(*flag.options, dest=s.name, action="append" if flag.repeat else "store", default=None,
                            metavar=flag.metavar, type=flag.type, choices=flag.choices, help=_help(s))


def settings_from_args(namespace: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags of `add_setting_arguments` gave, by name; a ValueError beginning with the flag for
    a value its `parse` refuses."""
    given = {}
    for s in SETTINGS:
        value = getattr(namespace, s.name, None)
        if s.flag is None or value is None:
            continue
        if s.flag.parse is not None:
            try:
                value = [s.flag.parse(v) for v in value] if s.flag.repeat else s.flag.parse(value)
            except ValueError as e:
                raise ValueError(f"{s.flag.options[0]}: {e}") from None
        given[s.name] = value
    return given


# ---- docs/settings.md ---------------------------------------------------------------------------------------------

def _flags(s: Setting) -> str:
    if s.flag is None:
        return ""
    if s.flag.metavar is None:
        options = [*s.flag.options, *(f"--no-{o[2:]}" for o in s.flag.options if s.default is True)]
        return ", ".join(f"`{o}`" for o in options)
    return ", ".join(f"`{o} {s.flag.metavar}`" for o in s.flag.options) + (" (repeatable)" if s.flag.repeat else "")


def render_markdown() -> str:
    """docs/settings.md: every setting, its type, default, flag, backend option and doc."""
    lines = [
        "# Compile settings",
        "",
        "Generated from `src/torchkiln/settings_table.py` by `python scripts/render_settings.py`; "
        "`tests/test_settings_table.py` checks that this file is what the table renders.",
        "",
        "Every setting is a keyword of `torchkiln.compile` (and of `CompileSettings.create`); the `compile` command "
        "takes those with a flag. A setting marked *no effect* is Torch-TensorRT's, accepted so its scripts run "
        "unchanged; a value other than its default is named in one logged warning. The backend option is the "
        "field of the engine's `BackendOptions` (stored in its bytes) the setting feeds.",
        "",
        "| setting | type | default | flag | backend option | description |",
        "|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        backend = f"`{s.backend.name}`" if s.backend is not None else ""
        default = s.default_text() if " " in s.default_text() else f"`{s.default_text()}`"  # words, or a value
        lines.append(f"| `{s.name}` | `{s.type}` | {default} | {_flags(s)} | {backend} | {s.doc} |")
    lines += ["", "## Backends", "", "| `backend` | runs on | what runs the engines |", "|---|---|---|"]
    lines += [f"| `{name}` | {', '.join(b.devices)} | {b.doc} |" for name, b in ENGINE_BACKENDS.items()]
    lines.append(f"| `auto` (default) | any | {_auto_doc()} |")
    return "\n".join(lines) + "\n"

