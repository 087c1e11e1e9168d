"""Timed forwards on the runtime that deploys: eager, torch.compile, ONNX Runtime, OpenVINO, TensorRT.

A latency curve measured in eager float32 does not transfer to another runtime (kernels, fusion and
tile sizes differ), so `build_forward` gives one zero-argument callable per (model, input, runtime, kept
tokens) that the caller times with `pomt.measurement.timing`, exactly as it times an eager forward.

Non-eager runtimes run a static program: one `torch.export` per kept-token count (tokens dropped right
after patch + position embedding by `pomt.models.tokens.truncate_tokens`, which export traces through), then
`torch.compile` on it, or ONNX (torch's exporter) for ONNX Runtime, OpenVINO and TensorRT. With a
`cache_dir`, the ONNX files, TensorRT engines and torch.compile's own caches are kept there, keyed by
what changes the program, so a resumed search does not export again. The weights are in that key as a
fingerprint, unless the caller puts a fixed `cache_key` in their place (latency does not depend on
them: a search on fresh random weights can reuse its earlier programs that way). Precision is the
dtype of the model and example the caller passes (`resolve_dtype`, then `.to(device, dtype)`);
OpenVINO and TensorRT are told to keep it.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import io
import json
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterator
from enum import Enum
from functools import cache
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

DEPLOY_EXTRA = "pip install 'pomt[deploy]'"
BLOB_MIN_BYTES = 1024  # initializers at least this large go to shared weight files in the cache


class Backend(str, Enum):
    """The runtimes pomt measures on and exports for."""

    EAGER = "eager"
    COMPILE = "compile"
    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"
    TENSORRT = "tensorrt"


DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ONNX_BACKENDS = (Backend.ONNXRUNTIME, Backend.OPENVINO, Backend.TENSORRT)
# The Python packages each backend imports (the first is the runtime itself).
PACKAGES: dict[Backend, tuple[str, ...]] = {
    Backend.EAGER: (),
    Backend.COMPILE: (),
    Backend.ONNXRUNTIME: ("onnxruntime", "onnx", "onnxscript"),
    Backend.OPENVINO: ("openvino", "onnx", "onnxscript"),
    Backend.TENSORRT: ("tensorrt", "onnx", "onnxscript"),
}
DISTRIBUTIONS = {"tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11")}


def parse_backend(name: str | Backend) -> Backend:
    """The Backend called `name`, or BackendError listing the valid ones."""
    try:
        return Backend(name)
    except ValueError:
        valid = ", ".join(b.value for b in Backend)
        raise BackendError(f"unknown backend {name!r}; choose one of {valid}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """float32 / float16 / bfloat16 for a torch dtype pomt runs."""
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    raise BackendError(f"dtype {dtype} is not one of {', '.join(DTYPES)}")


def resolve_dtype(name: str, device: str) -> torch.dtype:
    """The torch dtype called `name`, after checking that torch runs a ViT's ops in it on `device`."""
    dtype = DTYPES.get(name)
    if dtype is None:
        raise BackendError(f"unknown dtype {name!r}; choose one of {', '.join(DTYPES)}")
    if dtype == torch.float32:
        return dtype
    if device.startswith("cuda") and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise BackendError(f"this GPU ({torch.cuda.get_device_name(device)}) does not run bfloat16")
    try:
        _probe(dtype, device)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise BackendError(f"torch {torch.__version__} cannot run {name} on {device}: {first}") from None
    return dtype


def _probe(dtype: torch.dtype, device: str) -> None:
    """One of each op a ViT block runs, in `dtype` on `device` (raises where torch has no kernel)."""
    x = torch.randn(1, 2, 4, 8, device=device).to(dtype)
    weight = torch.randn(8, 8, device=device).to(dtype)
    y = nn.functional.layer_norm(torch.nn.functional.linear(x, weight), (8,))
    y = nn.functional.scaled_dot_product_attention(y, y, y).softmax(dim=-1)
    nn.functional.gelu(y).topk(2, dim=-1)


def _import(package: str, backend: Backend):
    try:
        return importlib.import_module(package)
    except ImportError:
        if package == "tensorrt":
            hint = "NVIDIA's tensorrt package (pip install tensorrt-cu12 or tensorrt-cu13, matching your CUDA)"
        else:
            hint = f"the {package} package: {DEPLOY_EXTRA}"
        raise BackendError(f"the {backend.value} backend needs {hint}") from None


def package_version(package: str) -> str | None:
    """Installed version of a package (TensorRT under any of its CUDA-specific names), or None."""
    for distribution in DISTRIBUTIONS.get(package, (package,)):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return importlib.metadata.version(distribution)
    return None


def check_backend(backend: Backend | str, device: str) -> Backend:
    """Raise BackendError unless `backend` can run on `device` here (its packages import, the device fits)."""
    backend = parse_backend(backend)
    kind = device.split(":")[0]
    if backend == Backend.TENSORRT and kind != "cuda":
        raise BackendError(f"the tensorrt backend runs on an NVIDIA GPU (--device cuda), not on {device}")
    if backend == Backend.OPENVINO and kind != "cpu":
        raise BackendError(f"the openvino backend runs on the CPU here, not on {device}")
    if backend == Backend.COMPILE and kind == "mps":
        raise BackendError("the compile backend is not supported on mps by pomt; use eager")
    for package in PACKAGES[backend]:
        _import(package, backend)
    if backend == Backend.ONNXRUNTIME and kind == "cuda":
        import onnxruntime

        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise BackendError("this onnxruntime has no CUDA execution provider; install onnxruntime-gpu")
    return backend


def backend_info(backend: Backend | str) -> dict:
    """Name and versions of the packages a backend runs on (for the schedule and the device fingerprint)."""
    backend = parse_backend(backend)
    for package in PACKAGES[backend]:
        _import(package, backend)
    info: dict = {"name": backend.value}
    if backend in (Backend.EAGER, Backend.COMPILE):
        info["version"] = torch.__version__
        if backend == Backend.COMPILE:
            info["triton"] = package_version("triton")
        return info
    runtime, *exporters = PACKAGES[backend]
    info["version"] = package_version(runtime)
    info["torch"] = torch.__version__
    for package in exporters:
        info[package] = package_version(package)
    if backend == Backend.ONNXRUNTIME:
        import onnxruntime

        info["providers"] = list(onnxruntime.get_available_providers())
    return info


class Forward:
    """One forward of a model in one runtime: call it to run it; `close()` (or a with block) releases it.

    `cache_hit` says whether the program came from the cache (no export or compile this time);
    `artifact` is the cached file it runs, when there is one.
    """

    def __init__(
        self,
        run: Callable[[], object],
        backend: Backend,
        tokens: int | None,
        *,
        cache_hit: bool = False,
        artifact: Path | None = None,
        release: Callable[[], None] | None = None,
    ) -> None:
        self._run, self.backend, self.tokens = run, backend, tokens
        self.cache_hit, self.artifact, self._release = cache_hit, artifact, release

    def __call__(self) -> object:
        return self._run()

    def close(self) -> None:
        """Remove the token hook (eager) and drop the runtime's session so its memory can go."""
        release, self._release = self._release, None
        self._run = _closed
        if release is not None:
            release()

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _closed() -> object:
    raise RuntimeError("this Forward is closed")


def build_forward(
    model: nn.Module,
    example: torch.Tensor,
    *,
    backend: Backend | str,
    device: str,
    tokens: int | None = None,
    cache_dir: str | Path | None = None,
    cache_key: str | None = None,
    threads: int | None = None,
) -> Forward:
    """A callable that runs ONE forward of `model` on `example` in `backend` (synchronous; warm-up is yours).

    `tokens`: keep that many tokens right after patch + position embedding (static for non-eager
    backends: one export per count), or None to run the model as it is (e.g. patched with a schedule).
    Model and example must already be on `device` in the dtype to measure. `cache_dir` keeps exported
    programs between runs. `cache_key` stands for the weights in their key: by default a fingerprint
    of the parameters, so a cached program computes this model's outputs; a fixed string (e.g.
    "latency") reuses programs across models that differ only in weights, for timing alone (a resumed
    search on fresh random weights). `threads`: the runtime's intra-op threads (default torch's current
    count). Eager leaves the token hook on `model` until the Forward is closed.
    """
    backend = check_backend(backend, device)
    _check_inputs(model, example, device)
    if backend == Backend.ONNXRUNTIME and example.dtype == torch.bfloat16 and not device.startswith("cuda"):
        raise BackendError("onnxruntime on the CPU takes numpy inputs and numpy has no bfloat16; use openvino")
    if tokens is not None:
        model_geometry(model).check_tokens(tokens)
    threads = threads or torch.get_num_threads()
    if backend == Backend.EAGER:
        stack = contextlib.ExitStack()
        if tokens is not None:
            stack.enter_context(truncate_tokens(model, tokens))
        return Forward(_inference(model, example), backend, tokens, release=stack.close)
    cache = Path(cache_dir) if cache_dir is not None else None
    if backend == Backend.COMPILE:
        return _compile_forward(model, example, tokens, cache)
    key = program_key(model, example, tokens, cache_key)
    with _scratch(cache) as folder:
        if backend == Backend.TENSORRT:
            run, artifact, hit = _tensorrt_run(model, example, tokens, folder, key, device)
        else:
            artifact, hit = cached_onnx(model, example, tokens, folder, key)
            runner = _onnxruntime_run if backend == Backend.ONNXRUNTIME else _openvino_run
            run = runner(artifact, example, device, threads)
        forward = Forward(run, backend, tokens, cache_hit=hit, artifact=artifact if cache else None)
        try:
            forward()
        except Exception as exc:
            forward.close()
            raise BackendError(f"{backend.value} cannot run this model: {_first_line(exc)}") from exc
    return forward


def _inference(model: nn.Module | Callable, example: torch.Tensor) -> Callable[[], object]:
    """model(example) without autograd, the same way for every torch backend."""

    def run() -> object:
        with torch.inference_mode():
            return model(example)

    return run


def parameter_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the model's weights, which its inputs must match; None for a model without any."""
    parameter = next(model.parameters(), None)
    return None if parameter is None else parameter.dtype


def _check_inputs(model: nn.Module, example: torch.Tensor, device: str) -> None:
    dtype = parameter_dtype(model)
    if dtype is not None and dtype != example.dtype:
        raise ValueError(f"model parameters are {dtype} but the example is {example.dtype}; cast both")
    if example.device.type != torch.device(device).type:
        raise ValueError(f"the example is on {example.device}, not on {device}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


@contextlib.contextmanager
def _scratch(cache: Path | None) -> Iterator[Path]:
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


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Keep the exporters' progress prints and warnings off the user's terminal."""
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


_OP_PATTERNS = (
    re.compile(r"OpOverload\(op='([\w.]+)', overload='(\w+)'\)"),
    re.compile(r"target=torch\.ops\.([\w.]+)"),
    re.compile(r"\b(aten::\w+)"),
)


def _failed_operation(exc: BaseException) -> str | None:
    """The aten operation an exporter failure names, if it names one."""
    texts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    for pattern in _OP_PATTERNS:
        for text in texts:
            match = pattern.search(text)
            if match:
                return ".".join(part for part in match.groups() if part).replace("::", ".")
    return None


def _innermost(exc: BaseException) -> BaseException:
    seen = set()
    while (exc.__cause__ or exc.__context__) is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return exc


def _export_failure(exc: BaseException, stage: str) -> ExportError:
    operation = _failed_operation(exc)
    reason = _first_line(_innermost(exc))
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
            return torch.onnx.export(
                program, (example,), dynamo=True, verbose=False, optimize=True,
                custom_translation_table=_translations(),
            )
    except Exception as exc:
        raise _export_failure(exc, "ONNX export") from exc


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


def onnxruntime_session(path: Path, device: str, threads: int):
    """An ORT session at full graph optimisation, `threads` intra-op threads, sequential execution; on CUDA
    through the CUDA execution provider on torch's current stream.

    Its threads do not spin-wait after a run: pomt alternates programs (one session per token count,
    unpruned and pruned, other runtimes), and a pool left spinning takes the cores from the next one. On
    2 cores, interleaved with eager PyTorch at deit_small batch 4, spinning widened ORT's IQR from about
    2 ms to 25 ms and cut the measured pruned speedup from 1.24x to 1.07x.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    providers: list = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        stream = torch.cuda.current_stream(index).cuda_stream
        providers = [("CUDAExecutionProvider", {"device_id": index, "user_compute_stream": str(stream)})]
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=providers)
    except Exception as exc:
        raise BackendError(f"onnxruntime cannot load {path.name}: {_first_line(exc)}") from exc


def _onnxruntime_run(path: Path, example: torch.Tensor, device: str, threads: int) -> Callable[[], object]:
    """session.run on the example; on CUDA its input and outputs are torch tensors bound in place."""
    import numpy as np

    session = onnxruntime_session(path, device, threads)
    if not device.startswith("cuda"):
        feed = {session.get_inputs()[0].name: np.ascontiguousarray(example.numpy())}
        return lambda: session.run(None, feed)
    index = torch.device(device).index or 0
    binding = session.io_binding()
    source = example.contiguous()
    _bind(binding.bind_input, session.get_inputs()[0].name, source, index)
    outputs = []
    for meta in session.get_outputs():
        output = torch.empty(meta.shape, dtype=_ONNX_TO_TORCH[meta.type], device=device)
        _bind(binding.bind_output, meta.name, output, index)
        outputs.append(output)

    def run() -> list[torch.Tensor]:
        session.run_with_iobinding(binding)
        return outputs

    return run


def _bind(bind: Callable, name: str, tensor: torch.Tensor, index: int) -> None:
    import numpy as np

    dtype = {torch.float32: np.float32, torch.float16: np.float16}.get(tensor.dtype)
    if dtype is None:
        raise BackendError(f"onnxruntime cannot bind a {tensor.dtype} tensor; use float32 or float16")
    bind(name, "cuda", index, dtype, list(tensor.shape), tensor.data_ptr())


_ONNX_TO_TORCH = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16}


@cache
def _openvino_core():
    import openvino

    return openvino.Core()


OPENVINO_PRECISION = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def openvino_compiled(path: Path, dtype: torch.dtype, threads: int):
    """An OpenVINO CPU model (ONNX or IR) compiled at `dtype` (OpenVINO would otherwise pick bf16 on CPUs
    that have it), latency hint, `threads` inference threads."""
    core = _openvino_core()
    config = {
        "INFERENCE_PRECISION_HINT": OPENVINO_PRECISION[dtype],
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": threads,
    }
    try:
        return core.compile_model(core.read_model(str(path)), "CPU", config)
    except Exception as exc:
        raise BackendError(f"openvino cannot compile {path.name}: {_first_line(exc)}") from exc


def openvino_tensor(x: torch.Tensor):
    """An OpenVINO tensor on the memory of a contiguous CPU tensor (bfloat16 passed through as bits)."""
    import openvino

    if x.dtype == torch.bfloat16:
        return openvino.Tensor(x.view(torch.int16).numpy(), list(x.shape), openvino.Type.bf16)
    return openvino.Tensor(x.numpy(), shared_memory=True)


def _openvino_run(path: Path, example: torch.Tensor, device: str, threads: int) -> Callable[[], object]:
    """A synchronous `infer()` of one request bound to the example."""
    request = openvino_compiled(path, example.dtype, threads).create_infer_request()
    source = example.contiguous()
    request.set_input_tensor(openvino_tensor(source))

    def run() -> object:
        return request.infer()

    return run


def _tensorrt_run(
    model: nn.Module, example: torch.Tensor, tokens: int | None, cache: Path, key: dict, device: str
) -> tuple[Callable[[], object], Path, bool]:
    """Build (or load) a static-shape TensorRT engine from the program's ONNX and bind torch CUDA tensors.

    Strongly typed: the ONNX types decide the precision, so a float32 model builds a float32 engine
    (TF32 off, as torch's default matmul) and a float16 model a float16 one. Engines are GPU-specific:
    their key adds the GPU's name and TensorRT's version. Written for TensorRT 10+; pomt's CI has no
    GPU, so this path is not run by its tests.
    """
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.ERROR)
    index = torch.device(device).index or 0
    engine_key = {**key, "tensorrt": trt.__version__, "gpu": torch.cuda.get_device_name(index)}
    engine_path = cache / "tensorrt" / f"{key_name(engine_key)}.engine"
    hit = engine_path.is_file()
    if not hit:
        onnx_path, _ = cached_onnx(model, example, tokens, cache, key)
        atomic_write_json(engine_path.with_suffix(".json"), engine_key)
        atomic_write_bytes(engine_path, _build_engine(trt, logger, onnx_path, example.dtype))
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_path.read_bytes())
    if engine is None:
        raise BackendError(f"TensorRT cannot load {engine_path.name}; delete it to rebuild")
    context = engine.create_execution_context()
    dtypes = {trt.float32: torch.float32, trt.float16: torch.float16, trt.bfloat16: torch.bfloat16}
    source, outputs = example.contiguous(), []
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT:
            context.set_tensor_address(name, source.data_ptr())
            continue
        shape, dtype = tuple(engine.get_tensor_shape(name)), dtypes[engine.get_tensor_dtype(name)]
        output = torch.empty(shape, dtype=dtype, device=device)
        context.set_tensor_address(name, output.data_ptr())
        outputs.append(output)
    stream = torch.cuda.current_stream(index)

    def run() -> list[torch.Tensor]:
        # Enqueued on torch's current stream, so CUDA events and synchronize time it as they time torch.
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        return outputs

    return run, engine_path, hit


def _build_engine(trt, logger, onnx_path: Path, dtype: torch.dtype) -> bytes:
    builder = trt.Builder(logger)
    flags = 0
    if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)] or ["unknown error"]
        raise BackendError(f"TensorRT cannot parse {onnx_path.name}: {errors[0].splitlines()[0]}")
    config = builder.create_builder_config()
    if hasattr(trt.BuilderFlag, "TF32"):
        config.clear_flag(trt.BuilderFlag.TF32)
    if not flags and dtype != torch.float32:  # weakly typed TensorRT: allow the reduced precision
        config.set_flag(trt.BuilderFlag.FP16 if dtype == torch.float16 else trt.BuilderFlag.BF16)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise BackendError(f"TensorRT could not build an engine from {onnx_path.name}")
    return bytes(serialized)


def _compile_forward(model: nn.Module, example: torch.Tensor, tokens: int | None, cache: Path | None) -> Forward:
    """torch.compile of the exported static program; inductor's own caches point into cache/inductor.

    Compiling the exported graph module (one per token count, each with its own code) rather than the
    live model keeps the counts from piling up recompilations on the model's forward.
    """
    from torch._dynamo.utils import counters

    with contextlib.ExitStack() as stack:
        if tokens is not None:
            stack.enter_context(truncate_tokens(model, tokens))
        graph = export_program(model, example).module()
    run = _inference(torch.compile(graph, dynamic=False), example)

    before = dict(counters["inductor"])
    with _inductor_cache(cache):
        try:
            run()
        except Exception as exc:
            raise BackendError(f"torch.compile cannot compile this model: {_first_line(exc)}") from exc
    hits = counters["inductor"]["fxgraph_cache_hit"] - before.get("fxgraph_cache_hit", 0)
    misses = counters["inductor"]["fxgraph_cache_miss"] - before.get("fxgraph_cache_miss", 0)
    return Forward(run, Backend.COMPILE, tokens, cache_hit=hits > 0 and misses == 0)


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
