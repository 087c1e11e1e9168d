"""`pomt export`: scheduled deit_tiny models written as ONNX / OpenVINO IR and run in those runtimes.

The weights come from a checkpoint the tests write, so each test builds its own PyTorch reference
(create, load, apply the schedule) independently of the export's own check.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch

from pomt.deploy.apply import UnverifiedScheduleWarning, apply_schedule
from pomt.deploy.export import ExportOptions, default_output, export_schedule
from pomt.device import Fingerprint
from pomt.errors import ExportError
from pomt.formats.schedule import BlockRemoval, Schedule, save_schedule
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.runtimes import onnxruntime_session

from conftest import ROOT, assert_one_line_error, run_cli, run_in_process

try:
    import openvino
except ImportError:  # without the deploy extra only the OpenVINO tests skip; `make test` installs it
    openvino = None
needs_openvino = pytest.mark.skipif(openvino is None, reason="openvino is not installed: pip install 'pomt[deploy]'")

MODEL = "deit_tiny"
GOAL = 1e-4  # float32 max abs difference the brief asks of an export


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """Seeded deit_tiny weights saved as a state dict (what a deployment exports instead of random init)."""
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("weights") / "deit_tiny.pth"
    torch.save(create_model(MODEL).state_dict(), path)
    return path


def _schedule(folder, method: str, batch: int = 1, remove: int = 56, kind: str = "cpu"):
    geometry = model_geometry(create_model(MODEL))
    prune = (BlockRemoval(3, 8), BlockRemoval(4, 8)) if method == "tome" else (BlockRemoval(3, remove),)
    schedule = Schedule(
        model=geometry.model, input_size=geometry.input_size, batch_size=batch, num_tokens=geometry.num_tokens,
        prefix_tokens=geometry.prefix_tokens, depth=geometry.depth, method=method, prune=prune,
        device=Fingerprint(kind=kind),
    )
    return save_schedule(schedule, folder / f"{MODEL}_{method}_bs{batch}_{kind}.schedule.json")


def _reference(schedule_path, checkpoint, x: torch.Tensor) -> np.ndarray:
    with warnings.catch_warnings():  # the test's schedules are written by hand, never verified
        warnings.simplefilter("ignore", UnverifiedScheduleWarning)
        model = apply_schedule(create_model(MODEL, checkpoint=checkpoint), schedule_path)
    with torch.no_grad():
        return model(x).numpy()


def _inputs(batch: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1234)
    return [torch.randn(batch, 3, 224, 224, generator=generator) for _ in range(2)]


@pytest.mark.slow
@needs_openvino
@pytest.mark.parametrize("method", ["pomt", "topk", "l2norm", "tome"])
def test_exported_onnx_matches_pytorch_in_onnxruntime_and_openvino(tmp_path, checkpoint, method):
    schedule_path = _schedule(tmp_path, method, batch=2)
    result = export_schedule(schedule_path, ExportOptions(checkpoint=checkpoint))
    assert result.path == default_output(schedule_path, "onnx") == tmp_path / f"{MODEL}_{method}_bs2_cpu.onnx"
    assert result.passed and result.max_abs_diff <= GOAL
    session = onnxruntime_session(result.path, "cpu", 1)
    compiled = openvino.Core().compile_model(str(result.path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    assert [d.dim_value for d in _onnx_input_dims(result.path)] == [2, 3, 224, 224]  # static shapes
    for x in _inputs(2):
        expected = _reference(schedule_path, checkpoint, x)
        from_ort = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
        from_ov = compiled(x.numpy())[0]
        assert np.abs(from_ort - expected).max() <= GOAL
        assert np.abs(from_ov - expected).max() <= GOAL


def _onnx_input_dims(path):
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    return graph.input[0].type.tensor_type.shape.dim


@pytest.mark.slow
@needs_openvino
@pytest.mark.filterwarnings("ignore:schedule was made for batch size 1")
def test_cli_writes_openvino_ir_and_a_card(tmp_path, checkpoint):
    schedule_path = _schedule(tmp_path, "pomt", batch=1)
    output = tmp_path / "out" / "pruned.xml"
    result = run_cli("export", str(schedule_path), "--format", "openvino", "--output", str(output),
                     "--checkpoint", str(checkpoint), "--batch-size", "2")
    assert result.returncode == 0, result.stderr
    assert "max abs diff" in result.stdout
    assert output.is_file() and output.with_suffix(".bin").is_file()
    card = json.loads((tmp_path / "out" / "pruned.xml.json").read_text())
    assert card["format"] == "openvino" and card["files"] == ["pruned.bin", "pruned.xml"]
    assert card["schedule_sha256"] == hashlib.sha256(schedule_path.read_bytes()).hexdigest()
    assert card["input_shape"] == [2, 3, 224, 224] and card["dtype"] == "float32"
    assert card["attention_chunked_for"] == "cpu" and "attention chunked for cpu" in result.stdout
    assert card["weights"].startswith("checkpoint deit_tiny.pth")
    assert card["backend"]["name"] == "openvino" and card["backend"]["version"] == openvino.__version__.split("-")[0]
    assert card["check"]["passed"] and card["check"]["max_abs_diff"] <= GOAL
    assert not [p.name for p in output.parent.iterdir() if p.name.startswith(".")]  # no staging left over
    compiled = openvino.Core().compile_model(str(output), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    x = _inputs(2)[0]
    assert np.abs(compiled(x.numpy())[0] - _reference(schedule_path, checkpoint, x)).max() <= GOAL


def _softmaxes(path) -> int:
    import onnx

    return sum(node.op_type == "Softmax" for node in onnx.load(str(path), load_external_data=False).graph.node)


@pytest.mark.slow
def test_attention_is_chunked_for_the_device_the_schedule_was_measured_on(tmp_path, checkpoint):
    """deit_tiny at batch 40: the CPU's 16 MB hold 177 query rows of a pomt block's 197, the GPU's budget (the
    MLP activation's bytes) all of them. A schedule measured on cuda exports one chunk there, traced on this
    CPU; `--target-device cpu` two; both match PyTorch, and the card says which."""
    schedule_path = _schedule(tmp_path, "pomt", batch=40, kind="cuda")
    for_gpu = export_schedule(schedule_path, ExportOptions(checkpoint=checkpoint))
    for_cpu = export_schedule(schedule_path, ExportOptions(checkpoint=checkpoint, output=tmp_path / "cpu.onnx",
                                                           target="cpu"))
    assert for_gpu.card["attention_chunked_for"] == "cuda" and for_cpu.card["attention_chunked_for"] == "cpu"
    assert for_gpu.passed and for_cpu.passed
    assert _softmaxes(for_cpu.path) == _softmaxes(for_gpu.path) + 1


def test_unknown_target_device_is_one_line_exit_2(tmp_path):
    schedule_path = _schedule(tmp_path, "pomt")
    assert_one_line_error(run_in_process("export", str(schedule_path), "--target-device", "tpu"),
                          "unknown target device 'tpu'", "cpu, cuda, mps")
    assert not default_output(schedule_path, "onnx").exists()


def test_bad_format_is_one_line_exit_2(tmp_path):
    schedule_path = _schedule(tmp_path, "pomt")
    assert_one_line_error(run_in_process("export", str(schedule_path), "--format", "tflite"), "unknown export format",
                          "onnx, openvino")


def test_output_suffix_must_match_the_format(tmp_path):
    schedule_path = _schedule(tmp_path, "pomt")
    with pytest.raises(ExportError, match="must end in .onnx"):
        export_schedule(schedule_path, ExportOptions(output=tmp_path / "m.xml", pretrained=False))


def test_missing_package_is_one_line_exit_2(tmp_path):
    """onnxruntime made unimportable in a fresh interpreter: the error names the extra to install."""
    schedule_path = _schedule(tmp_path, "pomt")
    preamble = "import sys; sys.modules['onnxruntime'] = None; from pomt.cli import main; main(sys.argv[1:])"
    result = subprocess.run([sys.executable, "-c", preamble, "export", str(schedule_path), "--no-pretrained"],
                            capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert_one_line_error(result, "onnxruntime", "pomt[deploy]")
    assert not default_output(schedule_path, "onnx").exists()


@pytest.mark.slow
def test_unexportable_method_names_the_operation(tmp_path):
    """`random` draws from a torch.Generator inside the graph, which torch's exporter cannot carry."""
    schedule_path = _schedule(tmp_path, "random")
    result = run_in_process("export", str(schedule_path), "--no-pretrained")
    assert_one_line_error(result, "random schedule cannot be exported", "aten.rand")
    assert not default_output(schedule_path, "onnx").exists()
