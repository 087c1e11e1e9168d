"""A model's static program: `torch.export` of one forward, its ONNX export, torch.compile of it, and the cache.

Non-eager runtimes run a static program, one per kept-token count, with the token hook and the pruning patches
traced through; an export failure is one ExportError naming the aten operation it failed on. A program's key names
everything that changes it (model, input, dtype, tokens, patch, exporter versions, pomt's tracing code, the
weights), so a resumed run finds it again and never runs a stale one; ONNX weights go to content-addressed files.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn

import pomt.models.tokens
import pomt.patching
from pomt.errors import BackendError, ExportError
from pomt.io import atomic_write_bytes, atomic_write_json
from pomt.models.geometry import model_geometry
from pomt.models.tokens import truncate_tokens
from pomt.patching.api import patch_state
from pomt.runtimes.backend import dtype_name, first_line, inference, package_version

_OP_PATTERNS = (
    re.compile(r"OpOverload\(op='([\w.]+)', overload='(\w+)'\)"),
    re.compile(r"target=torch\.ops\.([\w.]+)"),
    re.compile(r"\b(aten::\w+)"),
)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the exporters' progress prints and warnings off the user's terminal."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _failed_operation(exc: BaseException) -> str | None:
    """The aten operation an exporter failure names, if it names one."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    for pattern in _OP_PATTERNS:
        for text in texts:
            if match := pattern.search(text):
                return ".".join(part for part in match.groups() if part).replace("::", ".")
    return None


def _innermost(exc: BaseException) -> BaseException:
    seen = set()
    while (exc.__cause__ or exc.__context__) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return exc


def _export_failure(exc: BaseException, stage: str) -> ExportError:
    operation, reason = _failed_operation(exc), first_line(_innermost(exc))
    what = f"operation {operation} " if operation else ""
    return ExportError(f"{stage} failed (torch {torch.__version__}): {what}cannot be exported: {reason}")


def export_program(model: nn.Module, example: torch.Tensor) -> torch.export.ExportedProgram:
    """`torch.export` of `model(example)` at static shapes (token hooks and patches traced through)."""
    try:
        with _quiet(), torch.no_grad():
            return torch.export.export(model, (example,), strict=False)
    except Exception as exc:
        raise _export_failure(exc, "torch.export") from exc


def _translations() -> dict:
    """ONNX translations torch's exporter lacks. aten.sort.stable: TopK over the whole axis, which
    breaks ties by the lower index first, as a stable sort does."""
    from onnxscript import opset18 as op

    def sort_stable(self, *, stable=None, dim: int = -1, descending: bool = False):
        size = op.Reshape(op.Gather(op.Shape(self), dim, axis=0), op.Constant(value_ints=[1]))
        return op.TopK(self, size, axis=dim, largest=descending, sorted=True)

    return {torch.ops.aten.sort.stable: sort_stable}


def onnx_program(model: nn.Module, example: torch.Tensor):
    """torch's ONNX program (`torch.onnx.ONNXProgram`) of `model(example)` at static shapes."""
    program = export_program(model, example)
    try:
        with _quiet():
            return torch.onnx.export(program, (example,), dynamo=True, verbose=False, optimize=True,
                                     custom_translation_table=_translations())
    except Exception as exc:
        raise _export_failure(exc, "ONNX export") from exc


BLOB_MIN_BYTES = 1024  # initializers at least this large go to shared weight files in the cache


@contextlib.contextmanager
def program_folder(cache: Path | None) -> Iterator[Path]:
    """The cache folder, or a temporary one when there is no cache (removed once the program is loaded)."""
    if cache is not None:
        yield cache
        return
    with tempfile.TemporaryDirectory(prefix="pomt-runtime-") as folder:
        yield Path(folder)


def _source_digest() -> str:
    """Hash of the code that shapes the traced program (patches and token dropping)."""
    files = sorted(Path(pomt.patching.__file__).parent.glob("*.py")) + [Path(pomt.models.tokens.__file__)]
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def program_key(model: nn.Module, example: torch.Tensor, tokens: int | None, weights: str | None = None) -> dict:
    """Everything that changes the exported program, the weights as their fingerprint or the caller's `weights`."""
    geometry, state = model_geometry(model), patch_state(model)
    patch = None if state is None else {
        "method": state.method, "removal": {str(b): r for b, r in state.removal.items()},
        "prefix_tokens": state.prefix_tokens, "seed": state.seed,
    }
    return {
        "model": geometry.model, "input_shape": list(example.shape), "dtype": dtype_name(example.dtype),
        "device": example.device.type, "tokens": tokens, "patch": patch, "pomt_source": _source_digest(),
        "exporter": {name: package_version(name) for name in ("torch", "onnx", "onnxscript")},
        "weights": weights_fingerprint(model) if weights is None else weights,
    }


def weights_fingerprint(model: nn.Module) -> str:
    """A cheap identity of the weights: per tensor its name, shape, dtype, sum and 64 strided values."""
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            flat = tensor.detach().reshape(-1)
            sample = flat[:: max(1, flat.numel() // 64)].float().cpu()
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{flat.double().sum().item():.17g}".encode())
            digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def key_name(key: dict) -> str:
    """A readable, unique file stem for a program key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    b, _, h, w = key["input_shape"]
    tokens = "full" if key["tokens"] is None else f"n{key['tokens']}"
    patch = key["patch"]
    patched = "" if patch is None else f"_{patch['method']}" + "".join(f"-{b}r{r}" for b, r in patch["removal"].items())
    return f"{key['model']}_bs{b}_is{h}x{w}_{key['dtype']}_{tokens}{patched}_{digest}"


def externalise_weights(proto, folder: Path, blobs: str = "blobs") -> None:
    """Move large initializers into content-addressed files under folder/blobs, shared by every program exported
    from the same weights."""
    import onnx
    from onnx.external_data_helper import set_external_data

    for tensor in proto.graph.initializer:
        if not tensor.HasField("raw_data") or len(tensor.raw_data) < BLOB_MIN_BYTES:
            continue
        data = tensor.raw_data
        location = f"{blobs}/{hashlib.sha256(data).hexdigest()}.bin"
        if not (folder / location).exists():
            atomic_write_bytes(folder / location, data)
        set_external_data(tensor, location=location, offset=0, length=len(data))
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")


def cached_onnx(model: nn.Module, example: torch.Tensor, tokens: int | None, cache: Path, key: dict
                ) -> tuple[Path, bool]:
    """The ONNX file of the program `key` names under cache/onnx, exported only when absent."""
    folder = cache / "onnx"
    path = folder / f"{key_name(key)}.onnx"
    if path.is_file():
        return path, True
    with contextlib.nullcontext() if tokens is None else truncate_tokens(model, tokens):
        proto = onnx_program(model, example).model_proto
    externalise_weights(proto, folder)
    atomic_write_json(path.with_suffix(".json"), key)
    atomic_write_bytes(path, proto.SerializeToString())
    return path, False


def compile_run(model: nn.Module, example: torch.Tensor, tokens: int | None, cache: Path | None
                ) -> tuple[Callable[[], object], bool]:
    """(run, cache hit): the compiled program of `model(example)` at `tokens`, run once to compile it; a hit when
    inductor found every graph in cache/inductor."""
    from torch._dynamo.utils import counters

    with contextlib.nullcontext() if tokens is None else truncate_tokens(model, tokens):
        graph = export_program(model, example).module()
    run = inference(torch.compile(graph, dynamic=False), example)
    before = dict(counters["inductor"])
    with _inductor_cache(cache):
        try:
            run()
        except Exception as exc:
            raise BackendError(f"torch.compile cannot compile this model: {first_line(exc)}") from exc
    hits = counters["inductor"]["fxgraph_cache_hit"] - before.get("fxgraph_cache_hit", 0)
    misses = counters["inductor"]["fxgraph_cache_miss"] - before.get("fxgraph_cache_miss", 0)
    return run, hits > 0 and misses == 0


@contextlib.contextmanager
def _inductor_cache(cache: Path | None) -> Iterator[None]:
    """Point torch.compile's on-disk caches (FX graph, AOT autograd, kernels) into cache/inductor."""
    if cache is None:
        yield
        return
    folder = cache / "inductor"
    folder.mkdir(parents=True, exist_ok=True)
    with _environ(TRITON_CACHE_DIR=str(folder / "triton")):
        try:  # torch's own switch, which also clears its in-memory lookups of the old folder
            from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
        except ImportError:
            with _environ(TORCHINDUCTOR_CACHE_DIR=str(folder)):
                yield
        else:
            with temporary_cache_dir(str(folder)):
                yield


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    previous = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
