"""TensorRT on an NVIDIA GPU: a static-shape engine built from the program's ONNX, cached per GPU.

Strongly typed: the ONNX types decide the precision, so a float32 model builds a float32 engine (TF32 off, as
torch's default matmul) and a float16 model a float16 one. Engines are GPU-specific: their key adds the GPU's name
and TensorRT's version. Written for TensorRT 10+; pomt's CI has no GPU, so its tests do not run this path.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from pomt.errors import BackendError
from pomt.io import atomic_write_bytes, atomic_write_json
from pomt.runtimes.programs import cached_onnx, key_name


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
