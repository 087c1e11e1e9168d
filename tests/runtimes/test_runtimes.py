"""pomt.runtimes: timed forwards through eager, torch.compile, ONNX Runtime and OpenVINO on this CPU.

A tiny curve (timm's test_vit cut to 2 blocks, 101 tokens at 160 px) is measured through every backend with
pomt.measurement.timing; the per-count programs must appear in the cache once and be reused by a second process.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import timm
import torch

from pomt.errors import BackendError
from pomt.measurement.timing import measure_point
from pomt.models.tokens import truncate_tokens
from pomt.patching import patch
from pomt.runtimes import (
    Backend,
    backend_info,
    build_forward,
    check_backend,
    key_name,
    onnxruntime_session,
    program_key,
    resolve_dtype,
)

from conftest import ROOT, assert_one_line_error, run_cli

COUNTS = (101, 51, 11)
SIZE = 160
DEPTH = 2  # a short model keeps torch.compile's share of the test small


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model("test_vit", depth=DEPTH).eval()


def _example() -> torch.Tensor:
    return torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))


def _first_output(out) -> torch.Tensor:
    """The first output of any backend's forward as a torch tensor."""
    if isinstance(out, torch.Tensor):
        return out
    first = out[0] if isinstance(out, list | tuple) else out.to_tuple()[0]
    return torch.as_tensor(first)


def test_dtypes_resolve_or_fail_in_one_line():
    assert resolve_dtype("float32", "cpu") is torch.float32
    assert resolve_dtype("bfloat16", "cpu") is torch.bfloat16
    with pytest.raises(BackendError, match="unknown dtype 'float8'"):
        resolve_dtype("float8", "cpu")


def test_backends_check_their_device_and_name():
    with pytest.raises(BackendError, match="unknown backend 'tflite'"):
        check_backend("tflite", "cpu")
    with pytest.raises(BackendError, match="NVIDIA GPU"):
        check_backend("tensorrt", "cpu")
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
    assert_one_line_error(run_cli("backend", "tflite"), "unknown backend 'tflite'")
    preamble = "import sys; sys.modules['onnxruntime'] = None; from pomt.cli import main; main(sys.argv[1:])"
    result = subprocess.run([sys.executable, "-c", preamble, "backend", "onnxruntime"], capture_output=True,
                            text=True, cwd=ROOT, timeout=300)
    assert_one_line_error(result, "onnxruntime package", "pomt[deploy]")


def test_bfloat16_curve_through_eager():
    dtype = resolve_dtype("bfloat16", "cpu")
    model, x = _model().to(dtype), _example().to(dtype)
    block = model.blocks[0]
    for n in (101, 31):
        with build_forward(model, x, backend="eager", device="cpu", tokens=n) as forward:
            point = measure_point(forward, n, min_run_s=0.01, warmup=1)
            out = forward()
            assert len(block._forward_pre_hooks) == (0 if n == 101 else 1)
        assert out.dtype == torch.bfloat16 and point.tokens == n and point.median_ms > 0
    assert not block._forward_pre_hooks  # closing the Forward removed the token hook


def test_model_and_example_must_share_a_dtype():
    with pytest.raises(ValueError, match="cast both"):
        build_forward(_model(), _example().to(torch.bfloat16), backend="eager", device="cpu")


def test_patched_model_runs_untruncated_and_its_patch_keys_the_program(tmp_path):
    model, x = _model(), _example()
    plain = key_name(program_key(model, x, None))
    patch(model, "pomt", {1: 40})
    assert key_name(program_key(model, x, None)) != plain and "_pomt-1r40_" in key_name(program_key(model, x, None))
    with torch.no_grad():
        expected = model(x)
    with build_forward(model, x, backend="onnxruntime", device="cpu", cache_dir=tmp_path) as forward:
        got = _first_output(forward())
    assert (got - expected).abs().max() <= 1e-4
    assert [p.name for p in (tmp_path / "onnx").glob("*.onnx")] == [forward.artifact.name]


SECOND_RUN = """
import json, sys, timm, torch
from pomt.runtimes import build_forward
torch.set_num_threads(1)
torch.manual_seed(0)
model = timm.create_model("test_vit", depth={depth}).eval()
x = torch.randn(1, 3, {size}, {size}, generator=torch.Generator().manual_seed(0))
hits = {{}}
for backend in {backends}:
    for n in {counts}:
        with build_forward(model, x, backend=backend, device="cpu", tokens=n, cache_dir=sys.argv[1]) as forward:
            forward()
            hits[f"{{backend}}/{{n}}"] = forward.cache_hit
print(json.dumps(hits))
"""


@pytest.mark.slow
def test_curve_through_each_backend_exports_once_per_count_and_reuses_the_cache(tmp_path):
    backends = ["onnxruntime", "openvino", "compile"]
    model, x = _model(), _example()
    hits, latency = {}, {}
    for backend in ["eager", *backends]:
        for n in COUNTS:
            with build_forward(model, x, backend=backend, device="cpu", tokens=n, cache_dir=tmp_path) as forward:
                point = measure_point(forward, n, min_run_s=0.01, warmup=1, retries=0)
                with truncate_tokens(model, n), torch.no_grad():
                    expected = model(x)
                assert (_first_output(forward()) - expected).abs().max() <= 1e-4, (backend, n)
            hits[f"{backend}/{n}"], latency[f"{backend}/{n}"] = forward.cache_hit, point.median_ms
    assert all(ms > 0 for ms in latency.values())
    # One ONNX export per count: onnxruntime exported, openvino found the same programs in the cache.
    assert [hits[f"onnxruntime/{n}"] for n in COUNTS] == [False] * 3
    assert [hits[f"openvino/{n}"] for n in COUNTS] == [True] * 3
    onnx_files = sorted((tmp_path / "onnx").glob("*.onnx"))
    assert len(onnx_files) == len(COUNTS)
    assert sorted(f"n{n}_" in f.name for n in COUNTS for f in onnx_files).count(True) == len(COUNTS)
    assert any((tmp_path / "inductor").rglob("*")), "torch.compile's caches were not pointed into cache_dir"
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "onnx").rglob("*")}

    script = SECOND_RUN.format(size=SIZE, depth=DEPTH, backends=backends, counts=list(COUNTS))
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                            cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    second = json.loads(result.stdout.strip().splitlines()[-1])
    assert second == {key: True for key in second} and len(second) == len(backends) * len(COUNTS)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "onnx").rglob("*")} == before  # nothing rewritten


def test_onnxruntime_sessions_do_not_spin_between_runs(tmp_path):
    """pomt alternates programs; a session whose threads spin-wait after a run would slow the next one."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    path = tmp_path / "relu.onnx"
    # an opset and IR version every onnxruntime pomt supports reads, whatever onnx writes by default
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    session = onnxruntime_session(path, "cpu", threads=2)
    options = session.get_session_options()
    assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert options.intra_op_num_threads == 2
    assert session.run(None, {"x": np.array([-1.0, 2.0], dtype=np.float32)})[0].tolist() == [0.0, 2.0]
