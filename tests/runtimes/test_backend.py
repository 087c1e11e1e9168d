"""pomt.runtimes.backend: backend and dtype names, whether a backend runs here, its versions."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from pomt.errors import BackendError
from pomt.runtimes.backend import BACKENDS, DTYPES, Backend, backend_info, check_backend, dtype_name, resolve_dtype

from conftest import ROOT, assert_one_line_error, run_in_process


def test_dtypes_resolve_or_fail_in_one_line():
    assert resolve_dtype("float32", "cpu") is torch.float32
    assert resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    with pytest.raises(BackendError, match="unknown dtype 'float8'"):
        resolve_dtype("float8", "cpu")


def test_names_are_defined_once():
    assert tuple(b.value for b in Backend) == BACKENDS
    assert all(dtype_name(dtype) == name for name, dtype in DTYPES.items())
    with pytest.raises(BackendError, match="float64"):
        dtype_name(torch.float64)


def test_backends_check_their_device_and_name():
    with pytest.raises(BackendError, match="unknown backend 'tflite'"):
        check_backend("tflite", "cpu")
    with pytest.raises(BackendError, match="NVIDIA GPU"):
        check_backend("tensorrt", "cpu")
    with pytest.raises(BackendError, match="the cudagraph backend runs on an NVIDIA GPU"):
        check_backend("cudagraph", "cpu")
    assert backend_info("cudagraph") == {"name": "cudagraph", "version": torch.__version__}
    with pytest.raises(BackendError, match="CPU"):
        check_backend("openvino", "cuda")
    info = backend_info("onnxruntime")
    import onnxruntime

    assert info["name"] == "onnxruntime" and info["version"] == onnxruntime.__version__
    assert "CPUExecutionProvider" in info["providers"]


def test_missing_package_is_a_backend_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)  # a real ImportError on `import openvino`
    with pytest.raises(BackendError, match=r"openvino package: pip install 'pomt\[deploy\]'"):
        check_backend(Backend.OPENVINO, "cpu")


@pytest.mark.slow
def test_cli_backend_errors_are_one_line_exit_2():
    assert_one_line_error(run_in_process("backend", "tflite"), "unknown backend 'tflite'")
    preamble = "import sys; sys.modules['onnxruntime'] = None; from pomt.cli import main; main(sys.argv[1:])"
    result = subprocess.run([sys.executable, "-c", preamble, "backend", "onnxruntime"], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert_one_line_error(result, "onnxruntime package", "pomt[deploy]")


def test_a_cuda_graph_is_captured_on_a_gpu_only():
    import pomt
    from pomt.models.registry import create_model

    model = create_model("test_vit", input_size=96)
    with pytest.raises(BackendError, match="runs on an NVIDIA GPU .* not on cpu"):
        pomt.cuda_graph(model, torch.randn(2, 3, 96, 96))
