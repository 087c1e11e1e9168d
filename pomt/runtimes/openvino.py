"""OpenVINO on the CPU: the program's ONNX (or IR) compiled at the model's own precision."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch

from pomt.errors import BackendError
from pomt.runtimes.backend import first_line

OPENVINO_PRECISION = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


@cache
def _openvino_core():
    import openvino

    return openvino.Core()


def openvino_compiled(path: Path, dtype: torch.dtype, threads: int):
    """An OpenVINO CPU model (ONNX or IR) compiled at `dtype` (OpenVINO would otherwise pick bf16 on CPUs
    that have it), latency hint, `threads` inference threads."""
    core = _openvino_core()
    config = {"INFERENCE_PRECISION_HINT": OPENVINO_PRECISION[dtype], "PERFORMANCE_HINT": "LATENCY",
              "INFERENCE_NUM_THREADS": threads}
    try:
        return core.compile_model(core.read_model(str(path)), "CPU", config)
    except Exception as exc:
        raise BackendError(f"openvino cannot compile {path.name}: {first_line(exc)}") from exc


def openvino_tensor(x: torch.Tensor):
    """An OpenVINO tensor on the memory of a contiguous CPU tensor (bfloat16 passed through as bits)."""
    import openvino

    if x.dtype == torch.bfloat16:
        return openvino.Tensor(x.view(torch.int16).numpy(), list(x.shape), openvino.Type.bf16)
    return openvino.Tensor(x.numpy(), shared_memory=True)


def openvino_run(path: Path, example: torch.Tensor, device: str, threads: int) -> Callable[[], object]:
    """A synchronous `infer()` of one request bound to the example."""
    request = openvino_compiled(path, example.dtype, threads).create_infer_request()
    request.set_input_tensor(openvino_tensor(example.contiguous()))
    return request.infer
