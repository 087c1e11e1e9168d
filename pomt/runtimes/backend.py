"""The runtimes and dtypes pomt measures in: their names, whether they run here, their versions, and eager.

A latency curve holds for one runtime and one precision only, so both are named once here and checked before any
model is built; their versions go into the schedule and the device fingerprint. Eager runs the model itself, its
kept-token count a hook on the model (`pomt.models.tokens.truncate_tokens`).
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import warnings
from collections.abc import Callable
from enum import Enum

import torch
from torch import nn

from pomt.errors import BackendError
from pomt.models.tokens import truncate_tokens

DEPLOY_EXTRA = "pip install 'pomt[deploy]'"


class Backend(str, Enum):
    """The runtimes pomt measures on and exports for."""

    EAGER = "eager"
    COMPILE = "compile"
    CUDAGRAPH = "cudagraph"
    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"
    TENSORRT = "tensorrt"


BACKENDS = tuple(b.value for b in Backend)
# The runtimes that run the live model in this process as it stands (eager, and its forward replayed as a CUDA
# graph): a schedule measured there is served there, and the reducers' own costs are measured there; the others run
# a static program exported per token count.
IN_PROCESS = (Backend.EAGER.value, Backend.CUDAGRAPH.value)
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# The Python packages each backend imports (the first is the runtime itself).
PACKAGES: dict[Backend, tuple[str, ...]] = {
    Backend.EAGER: (), Backend.COMPILE: (), Backend.CUDAGRAPH: (),
    Backend.ONNXRUNTIME: ("onnxruntime", "onnx", "onnxscript"),
    Backend.OPENVINO: ("openvino", "onnx", "onnxscript"),
    Backend.TENSORRT: ("tensorrt", "onnx", "onnxscript"),
}
DISTRIBUTIONS = {"tensorrt": ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11")}


def settles_every_visit(device: str, backend: str) -> bool:
    """Whether a timed visit begins with an untimed forward every time (True), or only at its shape's first visit in
    the process (False: eager on the CPU, where the process keeps what a new shape's first forward sets up)."""
    return not (device == "cpu" and backend == Backend.EAGER.value)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (at most 300 characters), for a one-line error."""
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def parse_backend(name: str | Backend) -> Backend:
    """The Backend called `name`, or BackendError listing the valid ones."""
    try:
        return Backend(name)
    except ValueError:
        raise BackendError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}") from None


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
    if dtype == torch.float16 and device.split(":")[0] == "cpu":
        warnings.warn("float16 on the CPU: torch runs it there, but slowly and rarely as it is served; the CPU's "
                      "half precision is bfloat16 (float16 is for CUDA)", stacklevel=2)
    if device.startswith("cuda") and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise BackendError(f"this GPU ({torch.cuda.get_device_name(device)}) does not run bfloat16")
    try:
        _probe(dtype, device)
    except (RuntimeError, TypeError, NotImplementedError) as exc:
        raise BackendError(f"torch {torch.__version__} cannot run {name} on {device}: {first_line(exc)}") from None
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
        hint = ("NVIDIA's tensorrt package (pip install tensorrt-cu12 or tensorrt-cu13, matching your CUDA)"
                if package == "tensorrt" else f"the {package} package: {DEPLOY_EXTRA}")
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
    if backend in (Backend.TENSORRT, Backend.CUDAGRAPH) and kind != "cuda":
        raise BackendError(f"the {backend.value} backend runs on an NVIDIA GPU (--device cuda), not on {device}")
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
    if backend in (Backend.EAGER, Backend.COMPILE, Backend.CUDAGRAPH):
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


def inference(model: nn.Module | Callable, example: torch.Tensor) -> Callable[[], object]:
    """model(example) without autograd, the same way for every torch backend."""

    def run() -> object:
        with torch.inference_mode():
            return model(example)

    return run


def eager_run(model: nn.Module, example: torch.Tensor, tokens: int | None
              ) -> tuple[Callable[[], object], Callable[[], None]]:
    """(run, release): one forward of `model` keeping `tokens` tokens (None: all), and what removes its hook."""
    stack = contextlib.ExitStack()
    if tokens is not None:
        stack.enter_context(truncate_tokens(model, tokens))
    return inference(model, example), stack.close
