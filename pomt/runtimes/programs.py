"""The on-disk cache of exported programs, keyed by everything that changes the program.

A key names the model, input shape, dtype, kept tokens, patch, exporter versions, pomt's own code that
shapes the trace, and the weights (a fingerprint, or a caller's fixed string in its place where only
latency matters), so a resumed run finds its programs again and never runs a stale one. ONNX weights
go to content-addressed files shared by every program exported from the same weights.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

import pomt.models.tokens
import pomt.patching
from pomt.io import atomic_write_bytes, atomic_write_json
from pomt.models.geometry import model_geometry
from pomt.models.tokens import truncate_tokens
from pomt.patching.api import patch_state
from pomt.runtimes.backend import dtype_name, package_version
from pomt.runtimes.export import onnx_program

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
    """Everything that changes the exported program: model, input, dtype, tokens, patches, exporter, and
    the weights (their fingerprint, or the caller's `weights` string in its place)."""
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
    patched = ""
    if patch is not None:
        patched = f"_{patch['method']}" + "".join(f"-{blk}r{r}" for blk, r in patch["removal"].items())
    return f"{key['model']}_bs{b}_is{h}x{w}_{key['dtype']}_{tokens}{patched}_{digest}"


def externalise_weights(proto, folder: Path, blobs: str = "blobs") -> None:
    """Move large initializers into content-addressed files under folder/blobs, shared by every program
    exported from the same weights (a curve's programs differ in graph, not in weights)."""
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


def cached_onnx(
    model: nn.Module, example: torch.Tensor, tokens: int | None, cache: Path, key: dict
) -> tuple[Path, bool]:
    """The ONNX file of the program `key` names under cache/onnx, exported only when absent."""
    folder = cache / "onnx"
    path = folder / f"{key_name(key)}.onnx"
    if path.is_file():
        return path, True
    with contextlib.ExitStack() as stack:
        if tokens is not None:
            stack.enter_context(truncate_tokens(model, tokens))
        proto = onnx_program(model, example).model_proto
    externalise_weights(proto, folder)
    atomic_write_json(path.with_suffix(".json"), key)
    atomic_write_bytes(path, proto.SerializeToString())
    return path, False
