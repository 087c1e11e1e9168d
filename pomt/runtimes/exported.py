"""The runtimes that run an exported program file: ONNX Runtime (a session on the ONNX file, bound in place on
CUDA), OpenVINO on the CPU (the ONNX or IR compiled at the model's own precision) and TensorRT (an engine built from
the ONNX file)."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
from torch import nn

from pomt.errors import BackendError
from pomt.io import atomic_write_bytes, atomic_write_json
from pomt.runtimes.backend import first_line
from pomt.runtimes.programs import cached_onnx, key_name

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

def tensorrt_run(model: nn.Module, example: torch.Tensor, tokens: int | None, cache: Path, key: dict, device: str
                 ) -> tuple[Callable[[], object], Path, bool]:
    """(run, engine file, cache hit): the engine of the program `key` names (built only when absent) with torch
    CUDA tensors bound as its input and outputs."""
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

    def run() -> list[torch.Tensor]:  # on torch's current stream: CUDA events time it as they time torch
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
