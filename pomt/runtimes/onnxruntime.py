"""ONNX Runtime: a session on the program's ONNX file, run on the example (bound in place on CUDA)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from pomt.errors import BackendError
from pomt.runtimes.backend import first_line

_ONNX_TO_TORCH = {"tensor(float)": torch.float32, "tensor(float16)": torch.float16, "tensor(bfloat16)": torch.bfloat16}


def onnxruntime_session(path: Path, device: str, threads: int):
    """An ORT session at full graph optimisation, `threads` intra-op threads, sequential execution; on CUDA through
    the CUDA execution provider on torch's current stream. Its threads do not spin-wait after a run: pomt
    alternates programs, and a pool left spinning takes the cores from the next one."""
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
        raise BackendError(f"onnxruntime cannot load {path.name}: {first_line(exc)}") from exc


def onnxruntime_run(path: Path, example: torch.Tensor, device: str, threads: int) -> Callable[[], object]:
    """session.run on the example; on CUDA its input and outputs are torch tensors bound in place."""
    import numpy as np

    session = onnxruntime_session(path, device, threads)
    if not device.startswith("cuda"):
        feed = {session.get_inputs()[0].name: np.ascontiguousarray(example.numpy())}
        return lambda: session.run(None, feed)
    index = torch.device(device).index or 0
    binding, source = session.io_binding(), example.contiguous()
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
