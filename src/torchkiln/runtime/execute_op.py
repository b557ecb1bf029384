"""torch.ops.torchkiln.execute_engine: how a stitched TorchScript module calls an engine.

The engine travels as a uint8 tensor attribute of the module (so torch.jit.save/load carry it). It is
deserialized on first call and cached on that tensor object, keyed by the tensor's storage and version
counter, so writing other bytes into it (in place or by setattr) loads the new engine.

The call also carries the engine signature the module was compiled against (its inputs' and outputs'
dtypes and shapes, as text); an engine that does not match it is refused, and meta and fake tensors get
their outputs from it without running anything (a dynamic engine's output dims evaluated from the inputs' sizes).
"""
from __future__ import annotations

import ast
import dataclasses
import re
import reprlib
import threading
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from torchkiln.errors import EngineFormatError, EngineIndexError, EngineInputError, TorchkilnError
from torchkiln.ir.symbolic import DimSymbol
from torchkiln.runtime.engine import Engine
from torchkiln.runtime.native import host_library
from torchkiln.runtime.serialization import dtype_name, engine_digest, parse_dtype

def define_op(lib: torch.library.Library, schema: str, **options: str) -> None:
    """Define `schema` in torchkiln's namespace, unless the C++ runtime library (loaded first into this process)
    defined it: then it must be the same schema, and the kernels this package registers next (`impl_op`) override
    the library's (the package's backends run the engines in a Python process)."""
    name = schema.split("(", 1)[0]
    try:
        existing = getattr(torch.ops.torchkiln, name).default._schema
    except (AttributeError, RuntimeError):
        lib.define(schema, **options)
        return
    wanted = torch._C.parse_schema(f"torchkiln::{schema}")
    if str(existing) != str(wanted):
        raise RuntimeError(f"torchkiln::{name} is already defined as {existing}, not {wanted}: the C++ runtime "
                           f"library loaded into this process is of another torchkiln version (rebuild it, or set "
                           f"TORCHKILN_NATIVE_RUNTIME=0 to keep it out)")


def impl_op(lib: torch.library.Library, name: str, fn: Any, key: str) -> None:
    """Register `fn` as op `name`'s kernel for dispatch key `key`, quietly where it overrides the C++ runtime
    library's (`define_op`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*other operators may also be overridden")
        lib.impl(name, fn, key)


# A fragment: the C++ runtime library may hold the namespace's ops already (docs/deployment.md). Where it is built
# it does: its kernel runs the calls a tape fits and hands the others to the package's, execute_engine_python.
HOSTED = host_library()
_lib = torch.library.Library("torchkiln", "FRAGMENT")
_SCHEMA = "(Tensor[] inputs, Tensor engine, str signature='') -> Tensor[]"
define_op(_lib, f"execute_engine{_SCHEMA}")
if HOSTED:
    define_op(_lib, f"execute_engine_python{_SCHEMA}")
# A copy that TorchScript's constant propagation leaves to run time (CONSERVATIVE: it may have side effects), so
# that an output which would be a graph constant is a new tensor per call (stitching/fresh_outputs.py).
define_op(_lib, "fresh_copy(Tensor self) -> Tensor", alias_analysis="CONSERVATIVE")
_load_lock = threading.Lock()
# The errors the op raises on purpose; TorchScript's interpreter turns them into RuntimeErrors whose text
# names them, and `reraise_engine_error` turns them back.
ENGINE_ERRORS: tuple[type[TorchkilnError], ...] = (EngineIndexError, EngineInputError, EngineFormatError)
_META_LOAD = "was the module loaded with map_location='meta'?"


def engine_blob(data: bytes | Sequence[bytes | memoryview], engine: Engine | None = None) -> torch.Tensor:
    """Engine bytes (or the pieces they join: `Engine.serialized_pieces`) as the uint8 tensor a module holds,
    written there by one copy (a normal tensor even under inference_mode, so its version counter counts in-place
    writes). A 5 GB engine took 27 s when its joined bytes were copied again into the tensor's own memory.
    `engine`: the engine the pieces were just serialized from, which the blob's first load takes as it is (while its
    bytes stay as written) instead of deserializing it: 1.6 s of a 2.5 GB engine's first call."""
    pieces = [data] if isinstance(data, (bytes, bytearray, memoryview)) else data
    sizes = [memoryview(p).nbytes for p in pieces]
    with torch.inference_mode(False):
        blob = torch.empty(sum(sizes), dtype=torch.uint8)
    at = 0
    with warnings.catch_warnings():  # (a read-only buffer, only read here)
        warnings.filterwarnings("ignore", message=".*not writable")
        for piece, n in zip(pieces, sizes):
            if n:  # torch's copy: several threads fault in the new memory (a third of memoryview's time, cold)
                blob[at:at + n].copy_(torch.frombuffer(piece, dtype=torch.uint8))
            at += n
    if engine is not None:
        signature = engine_signature(engine)
        blob._torchkiln_engine = _Loaded(_blob_key(blob), engine, signature, legacy_signature(signature))
    return blob


def _spec(dtype: torch.dtype, shape: Sequence[Any]) -> str:
    return f"{dtype_name(dtype)}[{','.join(str(d) for d in shape)}]"


def engine_signature(engine: Engine) -> str:
    """What a module expects of an engine: `inputs: float32[2,64]; outputs: float32[2,10]`. A dynamic input dim
    is its symbol and range, `s0=1..8`, and an output dim over symbols their expression, `(s0//2) + 1`."""
    ins = []
    for b, t in zip(engine.bindings, engine.network.inputs):
        dims = []
        for d, lo, hi in zip(t.shape, b.min_shape, b.max_shape):
            text = str(lo) if lo == hi else f"{lo}..{hi}"
            dims.append(f"{d.name}={text}" if isinstance(d, DimSymbol) else text)
        ins.append(f"{dtype_name(b.dtype)}[{','.join(dims)}]")
    outs = [_spec(t.dtype, t.shape) for t in engine.network.outputs]
    return f"inputs: {', '.join(ins)}; outputs: {', '.join(outs)}"


_SYMBOL_NAME = re.compile(r"(?<=[\[,])[A-Za-z_]\w*=")


def legacy_signature(signature: str) -> str:
    """The signature as modules compiled before dynamic input dims named their symbols recorded it."""
    ins, sep, outs = signature.partition("; outputs: ")
    return _SYMBOL_NAME.sub("", ins) + sep + outs


_SPEC = re.compile(r"(\w+)\[([^\[\]]*)\]")
_INPUT_DIM = re.compile(r"(?:([A-Za-z_]\w*)=)?(\d{1,19})(?:\.\.(\d{1,19}))?\Z")
MAX_SIGNATURE = 1 << 16  # characters a signature may have; more is a malformed module
MAX_DIM_NODES = 256  # syntax nodes of one output dim's expression
MAX_DIM_BITS = 1024  # bits any value in an output dim's expression may need, input dims counted at 64 bits
MAX_SIZE = 1 << 63  # an output dim above this is no tensor size


def _specs(text: str, signature: str) -> list[tuple[str, list[str]]]:
    """(dtype, dim texts) of each `dtype[dims]` in a comma-separated list (dims split at top-level commas)."""
    found = _SPEC.findall(text)
    if sum(len(d) + len(ds) + 2 for d, ds in found) + 2 * max(len(found) - 1, 0) != len(text):
        raise EngineFormatError(f"malformed engine signature {signature!r}")
    specs = []
    for dtype, dims in found:
        parts, depth, start = [], 0, 0
        for i, c in enumerate(dims):
            depth += (c == "(") - (c == ")")
            if c == "," and depth == 0:
                parts.append(dims[start:i])
                start = i + 1
        parts.append(dims[start:])
        specs.append((dtype, [p.strip() for p in parts] if dims else []))
    return specs


def signature_outputs(signature: str, input_shapes: Sequence[Sequence[Any]] | None = None
                      ) -> list[tuple[torch.dtype, tuple[Any, ...]]]:
    """The outputs' dtypes and shapes an engine signature names; a dim over the inputs' symbols is evaluated
    from `input_shapes` (ints, or SymInts under a FakeTensorMode with symbolic shapes). EngineFormatError for a
    malformed signature or one whose output dims use symbols that no input dim names; EngineInputError for input
    shapes the signature does not take (their number, rank, or an int dim outside its range)."""
    ins, sep, outs = signature.partition("; outputs: ")
    if not sep or not ins.startswith("inputs: ") or len(signature) > MAX_SIGNATURE:
        raise EngineFormatError(f"malformed engine signature {reprlib.repr(signature)}")
    symbols: dict[str, Any] = {}
    specs = _specs(ins.removeprefix("inputs: "), signature)
    if input_shapes is not None and len(input_shapes) != len(specs):
        raise EngineInputError(f"the engine takes {len(specs)} inputs, got {len(input_shapes)} (its signature is "
                               f"{reprlib.repr(signature)})")
    for i, (_, dims) in enumerate(specs):
        if input_shapes is not None and len(input_shapes[i]) != len(dims):
            raise EngineInputError(f"engine input {i}: expected {len(dims)} dims, got shape "
                                   f"{tuple(input_shapes[i])} (the engine's signature is {reprlib.repr(signature)})")
        for d, text in enumerate(dims):
            found = _INPUT_DIM.match(text)
            if found is None:
                raise EngineFormatError(f"malformed engine signature {reprlib.repr(signature)}: input dim {text!r}")
            if input_shapes is None:
                continue
            size, lo = input_shapes[i][d], int(found.group(2))
            hi = lo if found.group(3) is None else int(found.group(3))
            if isinstance(size, int) and not lo <= size <= hi:
                raise EngineInputError(f"engine input {i}: dim {d} is {size}, outside [{lo}, {hi}] (shape "
                                       f"{tuple(input_shapes[i])}; the engine's signature is "
                                       f"{reprlib.repr(signature)})")
            if found.group(1):
                symbols.setdefault(found.group(1), size)
    return [(parse_dtype(dtype, "engine signature"), tuple(_output_dim(t, symbols, signature) for t in dims))
            for dtype, dims in _specs(outs, signature)]


def _output_dim(text: str, symbols: dict[str, Any], signature: str) -> Any:
    """An output dim's text evaluated: an int, or the expression over `symbols` (never Python's eval)."""
    if text.isascii() and text.isdigit() and len(text) < 19:
        return int(text)
    try:
        tree = ast.parse(text, mode="eval").body
        if sum(1 for _ in ast.walk(tree)) > MAX_DIM_NODES:
            raise ValueError(f"more than {MAX_DIM_NODES} syntax nodes")
        _bits(tree)
        num, den = _rational(tree, symbols)
    except _Unbound as e:
        raise EngineFormatError(f"engine signature {reprlib.repr(signature)}: output dim {text!r} uses symbol {e} "
                                f"that no input dim names (a module compiled before inputs named their symbols)"
                                ) from None
    except (SyntaxError, ValueError, TypeError, ZeroDivisionError, RecursionError, MemoryError) as e:
        raise EngineFormatError(f"engine signature {reprlib.repr(signature)}: output dim {text!r} is no "
                                f"expression of the input dims ({e})") from None
    value = num if den == 1 else num // den
    if isinstance(value, int) and not 0 <= value < MAX_SIZE:
        raise EngineFormatError(f"engine signature {reprlib.repr(signature)}: output dim {text!r} is {value} for "
                                f"these input sizes, not a tensor size")
    return value


class _Unbound(Exception):
    pass


_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
           ast.Mod: "mod"}
_CALLS = {"FloorDiv": "floordiv", "CleanDiv": "floordiv", "PythonMod": "mod", "Mod": "mod", "Max": "max",
          "Min": "min", "floor": "floor", "FloorToInt": "floor", "ceiling": "ceil", "CeilToInt": "ceil",
          "IntTrueDiv": "div"}


def _rational(node: ast.AST, symbols: dict[str, Any]) -> tuple[Any, int]:
    """(numerator, positive int denominator) of a dim expression as sympy prints it; the numerator may be a SymInt."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value, 1
    if isinstance(node, ast.Name):
        if node.id not in symbols:
            raise _Unbound(node.id)
        return symbols[node.id], 1
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        n, d = _rational(node.operand, symbols)
        return (-n if isinstance(node.op, ast.USub) else n), d
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):  # sympy's s0**2: a small constant power
        if not (isinstance(node.right, ast.Constant) and type(node.right.value) is int and 0 <= node.right.value <= 8):
            raise ValueError("only small constant powers")
        n, d = _rational(node.left, symbols)
        return n ** node.right.value, d ** node.right.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _apply(_BINARY[type(node.op)], [_rational(node.left, symbols), _rational(node.right, symbols)])
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS and \
            not node.keywords and node.args:
        return _apply(_CALLS[node.func.id], [_rational(a, symbols) for a in node.args])
    raise ValueError(f"unsupported {type(node).__name__}")


def _bits(node: ast.AST) -> tuple[int, int]:
    """(b, c): the numerator of `_rational`'s value for `node` is below 2**b and its denominator below 2**c, an
    input dim counted below 2**64 (a tensor size). ValueError where some value of the expression may need more
    than MAX_DIM_BITS bits: checked before evaluating, so that a huge power or a deep nesting of products is
    refused before it is computed, on ints and SymInts alike."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        found = abs(node.value).bit_length(), 1
    elif isinstance(node, ast.UnaryOp):
        found = _bits(node.operand)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
        k = node.right.value if isinstance(node.right, ast.Constant) and type(node.right.value) is int else 1
        n, d = _bits(node.left)
        found = (n * k, d * k) if k > 0 else (1, 1)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        found = _op_bits(_BINARY[type(node.op)], [_bits(node.left), _bits(node.right)])
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _CALLS and node.args:
        found = _op_bits(_CALLS[node.func.id], [_bits(a) for a in node.args])
    else:  # a symbol (anything else, _rational refuses)
        found = 64, 1
    if max(found) > MAX_DIM_BITS:
        raise ValueError(f"too large: its values may need more than {MAX_DIM_BITS} bits")
    return found


def _op_bits(op: str, parts: list[tuple[int, int]]) -> tuple[int, int]:
    """`_bits` of `_apply(op, ...)` on values of these bits."""
    (an, ad), (bn, bd) = parts[0], parts[-1]
    if op in ("floor", "ceil"):
        return an + 1, 1
    if op in ("max", "min"):
        return max(n for n, _ in parts), 1
    if op in ("add", "sub"):
        return max(an + bd, bn + ad) + 1, ad + bd
    if op == "mul":
        return an + bn, ad + bd
    if op == "div":
        return an + bd, ad + bn
    return an + bd + bn + 1, 1  # floordiv and mod: |floor(a / b)| <= |a| + 1, |a mod b| < |b|


def _apply(op: str, args: list[tuple[Any, int]]) -> tuple[Any, int]:
    (an, ad), *rest = args
    if op in ("floor", "ceil"):
        return (an // ad if op == "floor" else -((-an) // ad)), 1
    if op in ("max", "min"):
        if any(d != 1 for _, d in args):
            raise ValueError("max/min of a fraction")
        pick = torch.sym_max if op == "max" else torch.sym_min
        value = an
        for n, _ in rest:
            value = pick(value, n)
        return value, 1
    if len(rest) != 1:
        raise ValueError(f"{op} takes two arguments")
    bn, bd = rest[0]
    if op == "add":
        return an * bd + bn * ad, ad * bd
    if op == "sub":
        return an * bd - bn * ad, ad * bd
    if op == "mul":
        return an * bn, ad * bd
    if op == "div":  # by a constant (sympy's rationals): the denominator stays an int
        if not isinstance(bn, int) or bn == 0:
            raise ValueError("division by a symbol")
        return (an * bd, ad * bn) if bn > 0 else (-an * bd, -ad * bn)
    if op == "floordiv":
        return (an * bd) // (ad * bn), 1
    if ad != 1 or bd != 1:  # mod
        raise ValueError("modulus of a fraction")
    return an % bn, 1


@dataclasses.dataclass(frozen=True)
class _Loaded:
    key: tuple[int, int, int]
    engine: Engine
    signature: str
    legacy: str  # the signature in the form modules compiled before symbols were named record


SESSION_MODELS = "_torchkiln_session_models"  # a blob's attribute: the `SessionModels` stored with its engine


def _blob_key(blob: torch.Tensor) -> tuple[int, int, int, torch.dtype]:
    """Changes whenever the bytes may have (another storage, or an in-place write: the version counter), and with
    the dtype: a blob whose key is still its engine's is as `check_blob` passed it (setting `.data` keeps the kind
    of tensor, so only the dtype can change with the same storage)."""
    version = -1 if blob.is_inference() else blob._version  # inference tensors cannot be written outside it
    return blob.data_ptr(), version, blob.numel(), blob.dtype


def check_blob(blob: Any, holds_bytes: bool = True) -> None:
    """EngineFormatError naming what a module's engine attribute holds, unless it is a uint8 tensor (of bytes, not
    on the meta device, where `holds_bytes`)."""
    if not isinstance(blob, torch.Tensor):
        got = "None" if blob is None else type(blob).__name__
    elif blob.is_quantized:
        got = f"a quantized tensor ({blob.dtype})"
    elif blob.layout != torch.strided or blob.is_nested:
        got = f"a {'nested' if blob.is_nested else blob.layout} tensor"
    elif blob.dtype != torch.uint8:
        got = f"a {blob.dtype} tensor"
    elif holds_bytes and blob.device.type == "meta":
        got = f"a tensor on the meta device, which holds no bytes ({_META_LOAD})"
    else:
        return
    raise EngineFormatError(f"an engine attribute must be a uint8 tensor of engine bytes, got {got}")


def engine_from_blob(blob: torch.Tensor, expected: str = "") -> Engine:
    """The Engine a module's blob holds, deserialized when the bytes are new; refused (EngineFormatError)
    if `expected` names another engine signature or the blob is no uint8 tensor (`check_blob`, where the blob's key
    is not its engine's)."""
    loaded = getattr(blob, "_torchkiln_engine", None)
    if loaded is None or loaded.key != _blob_key(blob):
        check_blob(blob)
        key = _blob_key(blob)
        with _load_lock:
            loaded = getattr(blob, "_torchkiln_engine", None)
            if loaded is None or loaded.key != key:
                data = memoryview(blob.detach().cpu().contiguous().numpy())  # read in place, not copied
                engine = Engine.deserialize(data)
                models = getattr(blob, SESSION_MODELS, None)  # set by the module cache: for these bytes only
                if models is not None and models.engine_digest == engine_digest(data):
                    engine.session_models = models
                signature = engine_signature(engine)
                loaded = _Loaded(key, engine, signature, legacy_signature(signature))
                blob._torchkiln_engine = loaded
    if expected and expected not in (loaded.signature, loaded.legacy):
        raise EngineFormatError(f"engine {loaded.engine.name!r} does not fit this module: the module expects "
                                f"{expected!r}, the engine has {loaded.signature!r}")
    return loaded.engine


def plain_tensors(tensors: Sequence[Any]) -> bool:
    """Whether these are all plain tensors that hold data (no subclass such as fake tensors, not on meta)."""
    for x in tensors:  # a loop, not all() of a generator: this runs at every call of a compiled module
        if type(x) is not torch.Tensor or x.is_meta:
            return False
    return True


def execute_engine(inputs: list[torch.Tensor], engine: torch.Tensor, signature: str = "") -> list[torch.Tensor]:
    """What the op does on real tensors: run the engine the blob holds (if it fits `signature`) on `inputs`."""
    return engine_from_blob(engine, signature).execute(inputs)


def _below_autograd(inputs: list[torch.Tensor], engine: torch.Tensor,
                    signature: str = "") -> list[torch.Tensor]:
    """Engines are inference-only: under autograd the engine runs as is and its outputs do not require grad (the
    engine runs under no_grad). Plain tensors run here, one Python call less; meta, fake and other tensor
    subclasses go below autograd to their own kernels."""
    if plain_tensors([engine, *inputs]):
        return execute_engine(inputs, engine, signature)
    with torch._C._AutoDispatchBelowADInplaceOrView():
        return torch.ops.torchkiln.execute_engine.default(inputs, engine, signature)


def _fake_execute_engine(inputs: list[torch.Tensor], engine: torch.Tensor,
                         signature: str = "") -> list[torch.Tensor]:
    """Meta and fake tensors: empty outputs of the engine's dtypes and shapes, on the inputs' device; a dynamic
    engine's output dims are its expressions of the inputs' sizes (SymInts under symbolic shapes)."""
    from torch._subclasses.fake_tensor import is_fake

    check_blob(engine, holds_bytes=False)
    real = not (engine.device.type == "meta" or is_fake(engine))
    live = sorted({str(x.device) for x in inputs if not (x.device.type == "meta" or is_fake(x))})
    if live and not real:
        raise EngineFormatError(f"the engine attribute is on the meta device and holds no bytes ({_META_LOAD}), "
                                f"so the engine cannot run on inputs on {', '.join(live)}: load the module with "
                                f"map_location='cpu' (or call it on meta tensors, for shapes only)")
    if live:
        raise EngineInputError(f"all engine inputs must be on one device, got meta and {', '.join(live)}")
    if not signature:  # a module saved before signatures were recorded: read the engine itself
        if not real:
            raise EngineFormatError("this module records no engine signature, so its engine's output shapes "
                                    "are unknown without the engine's bytes (a real tensor attribute)")
        signature = engine_signature(engine_from_blob(engine))
    shapes = [x.shape for x in inputs]
    try:
        outputs = signature_outputs(signature, shapes)
    except EngineFormatError:
        if not real or legacy_signature(signature) != signature:
            raise
        outputs = signature_outputs(engine_signature(engine_from_blob(engine, signature)), shapes)
    device = inputs[0].device if inputs else engine.device
    return [torch.empty(shape, dtype=dtype, device=device) for dtype, shape in outputs]


# Every backend key, so that an engine attribute of another layout (sparse, quantized...) reaches check_blob.
if HOSTED:  # (the library's kernels below autograd and above run the calls it can, and call this for the others)
    impl_op(_lib, "execute_engine_python", execute_engine, "CompositeExplicitAutograd")
else:
    impl_op(_lib, "execute_engine", execute_engine, "CompositeExplicitAutograd")
    impl_op(_lib, "execute_engine", _below_autograd, "Autograd")
impl_op(_lib, "fresh_copy", torch.clone, "CompositeExplicitAutograd")
torch.library.register_fake("torchkiln::execute_engine", _fake_execute_engine, lib=_lib)


_FROM_INTERPRETER = re.compile(r"^(?:\w+\.)*(" + "|".join(e.__name__ for e in ENGINE_ERRORS) + r"): (.*?)"
                               r"(?:\n\nAt:\n.*)?\Z", re.DOTALL | re.MULTILINE)
# After the TorchScript traceback: the original type and text ("builtins.RuntimeError" where a graph's own
# prim::RaiseException raised it, as the guard of a compiled module's static argument does).
_AFTER_TRACEBACK = re.compile(r"\n(?:builtins\.)?RuntimeError: ")


def reraise_engine_error(error: Exception) -> None:
    """If `error` is TorchScript's RuntimeError for an error the engine op raised, raise that torchkiln error
    type (from it) instead; otherwise return."""
    if isinstance(error, ENGINE_ERRORS):
        return
    text = str(error)
    marker = _AFTER_TRACEBACK.search(text)
    found = _FROM_INTERPRETER.match(text[marker.end():]) if marker is not None else None
    if found is None:
        return
    kind = next(e for e in ENGINE_ERRORS if e.__name__ == found.group(1))
    raise kind(found.group(2).rstrip()) from error
