"""Timed forwards on the runtime that deploys: eager, CUDA graphs, torch.compile, ONNX Runtime, OpenVINO, TensorRT.

A latency curve measured in one runtime does not transfer to another, so pomt measures in the runtime that
deploys: `build_forward` gives one closable callable per (model, input, runtime, kept tokens), timed as an eager
forward is. Modules: `backend` (names, dtypes, checks, versions, eager), `forward` (the callable and the forwards
kept open), `programs` (the static program, torch.compile of it, its cache), `cudagraph`, and `exported` (the
runtimes that run an exported file).
"""

from pomt.runtimes.backend import (
    BACKENDS,
    DTYPES,
    IN_PROCESS,
    Backend,
    backend_info,
    check_backend,
    package_version,
    parse_backend,
    resolve_dtype,
    settles_every_visit,
)
from pomt.runtimes.cudagraph import GraphedForward, cuda_graph
from pomt.runtimes.exported import onnxruntime_session, openvino_compiled, openvino_tensor
from pomt.runtimes.forward import Forward, ProgramCache, ProgramFiles, build_forward, parameter_dtype
from pomt.runtimes.programs import onnx_program

__all__ = [
    "BACKENDS", "DTYPES", "IN_PROCESS", "Backend", "Forward", "GraphedForward", "ProgramCache", "ProgramFiles",
    "backend_info", "build_forward", "check_backend", "cuda_graph", "onnx_program", "onnxruntime_session",
    "openvino_compiled", "openvino_tensor", "package_version", "parameter_dtype", "parse_backend", "resolve_dtype",
    "settles_every_visit",
]
