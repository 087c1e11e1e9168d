"""`pomt export`: write a schedule's pruned model for a deployment runtime, checked against PyTorch.

The schedule's model is created with the weights asked for, patched, and exported at static shapes with torch's
ONNX exporter (OpenVINO IR converted from that ONNX), traced on the CPU with pomt's explicit attention chunked for
the device it will run on. The written file is run through its runtime on seeded random inputs and compared with
the patched model; a JSON card beside it records what was exported and how closely it matched.
"""

from __future__ import annotations

import hashlib
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from pomt.checks import check_output_file
from pomt.deploy.apply import UnverifiedScheduleWarning, apply_schedule
from pomt.errors import ExportError
from pomt.formats.schedule import Schedule, load_schedule, utc_now
from pomt.io import atomic_write_json, clear_stale, staged_set
from pomt.models.registry import PomtWarning, create_model
from pomt.patching.attention import chunked_for
from pomt.runtimes import (
    Backend,
    backend_info,
    check_backend,
    onnx_program,
    onnxruntime_session,
    openvino_compiled,
    openvino_tensor,
    package_version,
    resolve_dtype,
)

FORMATS: dict[str, tuple[Backend, str]] = {"onnx": (Backend.ONNXRUNTIME, ".onnx"),
                                           "openvino": (Backend.OPENVINO, ".xml")}
# Largest max-abs difference from PyTorch an export may show: float32 round-off across a ViT is ~1e-6;
# half precision keeps about 3 (float16) or 2 (bfloat16) significant digits.
TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 5e-2}
CHECK_INPUTS = 2
TARGET_DEVICES = ("cpu", "cuda", "mps")  # device types an export's attention may be chunked for


@dataclass(frozen=True)
class ExportResult:
    """The written model file, its card (a JSON file beside it) and the card's content."""

    path: Path
    card_path: Path
    card: dict

    @property
    def max_abs_diff(self) -> float:
        return self.card["check"]["max_abs_diff"]

    @property
    def passed(self) -> bool:
        return self.card["check"]["passed"]


def check_format(name: str) -> tuple[Backend, str]:
    """(backend that runs it, file suffix) of an export format, or ExportError listing the valid ones."""
    if name not in FORMATS:
        raise ExportError(f"unknown export format {name!r}; choose one of {', '.join(FORMATS)}")
    return FORMATS[name]


def target_device(schedule: Schedule, asked: str | None) -> str:
    """The device type the export's attention is chunked for: `asked`, else the one the schedule was measured on
    (cpu for a schedule that does not say)."""
    target = asked if asked is not None else (schedule.device.kind or "cpu")
    if target not in TARGET_DEVICES:
        raise ExportError(f"unknown target device {target!r}; choose one of {', '.join(TARGET_DEVICES)}")
    return target


def default_output(schedule_path: Path, fmt: str) -> Path:
    """Beside the schedule, named from its stem: bin/x.schedule.json -> bin/x.onnx (or x.xml)."""
    _, suffix = check_format(fmt)
    stem = schedule_path.name.removesuffix(".json").removesuffix(".schedule")
    return schedule_path.with_name(stem + suffix)


def card_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


@dataclass(frozen=True)
class ExportOptions:
    """How to export a schedule: the format, the model file (None: beside the schedule), the weights, the static
    batch size (None: the schedule's), the seed of the inputs that trace and check it, and the device type its
    attention is chunked for (None: the schedule's)."""

    fmt: str = "onnx"
    output: str | Path | None = None
    checkpoint: str | Path | None = None
    pretrained: bool = True
    batch_size: int | None = None
    seed: int = 0
    target: str | None = None


@dataclass(frozen=True)
class _Export:
    """An export resolved from its options: the schedule, the runtime its format runs on, batch, seed, target."""

    schedule_path: Path
    schedule: Schedule
    fmt: str
    backend: Backend
    batch: int
    seed: int
    target: str


def export_schedule(schedule_path: str | Path, options: ExportOptions | None = None) -> ExportResult:
    """Export the schedule's pruned model as `options` say, check it against PyTorch, write its card. Raises
    ExportError when the check fails (after writing the file and its card), and before writing anything when an
    operation of the patched model cannot be exported."""
    options = options or ExportOptions()
    backend, suffix = check_format(options.fmt)
    check_backend(backend, "cpu")
    schedule_path = Path(schedule_path)
    schedule = load_schedule(schedule_path)
    target = target_device(schedule, options.target)
    path = Path(options.output) if options.output is not None else default_output(schedule_path, options.fmt)
    if path.suffix != suffix:
        raise ExportError(f"--output for format {options.fmt} must end in {suffix}, got {path.name}")
    for file in (*_files_of(path), card_path(path)):
        check_output_file(file, "--output" if file == path else "output file")
    batch = schedule.batch_size if options.batch_size is None else options.batch_size
    if batch < 1:
        raise ExportError(f"batch size must be >= 1, got {batch}")
    job = _Export(schedule_path, schedule, options.fmt, backend, batch, options.seed, target)
    dtype = resolve_dtype(schedule.dtype, "cpu")
    model, weights = _model(schedule, options.checkpoint, options.pretrained)
    with warnings.catch_warnings():  # exported for a deployment target, not timed here: the card says it
        warnings.simplefilter("ignore", UnverifiedScheduleWarning)
        warnings.filterwarnings("ignore", "schedule was made on")  # traced here for its target, on purpose
        model = apply_schedule(model.to(dtype), schedule, batch_size=batch)
    example = _inputs(job, dtype, job.seed, 1)[0]
    try:
        with chunked_for(target):
            program = onnx_program(model, example)
    except ExportError as exc:
        raise ExportError(f"the {schedule.method} schedule cannot be exported: {exc}") from exc
    inputs = _inputs(job, dtype, job.seed + 1, CHECK_INPUTS)
    clear_stale(path.parent, path.name)
    with staged_set(path.parent, path.name, last=[path.name, card_path(path).name]) as staging:
        staged = staging / path.name
        _write(program, staged, job.fmt)
        diff = _max_abs_diff(model, staged, backend, inputs)
        card = _card(job, staged, weights, program, diff)
        atomic_write_json(card_path(staged), card)
    for stale in _files_of(path):  # a weight file of an earlier export this one has no more
        if stale.name not in card["files"]:
            stale.unlink(missing_ok=True)
    result = ExportResult(path, card_path(path), card)
    if not result.passed:
        raise ExportError(f"{path.name} differs from the PyTorch model by {diff:.2e} (max abs) > "
                          f"{card['check']['tolerance']:.0e}; see {result.card_path}")
    return result


def _card(job: _Export, path: Path, weights: str, program, diff: float) -> dict:
    """What was exported (the model file `path` and its weights), with which packages, how closely it matched."""
    schedule, tolerance = job.schedule, TOLERANCE[job.schedule.dtype]
    return {
        "format": job.fmt, "file": path.name, "files": sorted(p.name for p in _files_of(path) if p.exists()),
        "schedule": job.schedule_path.name,
        "schedule_sha256": hashlib.sha256(job.schedule_path.read_bytes()).hexdigest(),
        "model": schedule.model, "method": schedule.method,
        "prune": [{"block": step.block, "remove": step.remove} for step in schedule.prune],
        "kept_tokens": schedule.kept_tokens,
        "verified": None if schedule.verified is None else {
            "speedup": schedule.verified.speedup, "speedup_ci": list(schedule.verified.speedup_ci),
            "device_fingerprint_hash": schedule.verified.device_fingerprint_hash,
        },
        "input_shape": [job.batch, 3, *schedule.input_size], "dtype": schedule.dtype,
        "attention_chunked_for": job.target, "weights": weights, "opset": _opset(program),
        "backend": backend_info(job.backend), "torch": torch.__version__, "timm": package_version("timm"),
        "check": {"runtime": job.backend.value, "inputs": CHECK_INPUTS, "seed": job.seed + 1, "max_abs_diff": diff,
                  "tolerance": tolerance, "passed": diff <= tolerance},
        "created": utc_now(),
    }


def _model(schedule: Schedule, checkpoint, pretrained: bool) -> tuple[torch.nn.Module, str]:
    """The schedule's model with the weights asked for, and a word on where they came from."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", PomtWarning)
        model = create_model(schedule.model, input_size=schedule.input_size, pretrained=pretrained,
                             checkpoint=checkpoint)
    fell_back = False
    for warning in caught:
        fell_back |= issubclass(warning.category, PomtWarning)
        warnings.warn_explicit(warning.message, warning.category, warning.filename, warning.lineno)
    if checkpoint is not None:
        digest = hashlib.sha256(Path(checkpoint).read_bytes()).hexdigest()
        return model, f"checkpoint {Path(checkpoint).name} sha256:{digest}"
    if pretrained and not fell_back:
        return model, "pretrained (timm)"
    return model, "random init" + (" (pretrained weights unavailable)" if pretrained else "")


def _inputs(job: _Export, dtype: torch.dtype, seed: int, count: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (job.batch, 3, *job.schedule.input_size)
    return [torch.randn(shape, generator=generator).to(dtype) for _ in range(count)]


def _files_of(path: Path) -> list[Path]:
    """The model file and the weight file that may travel with it (IR .bin; ONNX .data above 2 GB)."""
    return [path, path.with_suffix(".bin") if path.suffix == ".xml" else path.with_name(path.name + ".data")]


def _write(program, path: Path, fmt: str) -> None:
    """Write the model (and its weight file) at `path`."""
    if fmt == "onnx":
        program.save(str(path))
        return
    import openvino

    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".onnx.") as scratch:
        onnx = Path(scratch) / "model.onnx"
        program.save(str(onnx))
        openvino.save_model(openvino.convert_model(str(onnx)), str(path), compress_to_fp16=False)


def _max_abs_diff(model: torch.nn.Module, path: Path, backend: Backend, inputs: list[torch.Tensor]) -> float:
    """Largest |runtime - PyTorch| over the outputs of the written file on `inputs`."""
    threads = torch.get_num_threads()
    if backend == Backend.ONNXRUNTIME:
        program = onnxruntime_session(path, "cpu", threads)
        name = program.get_inputs()[0].name

        def run(x: torch.Tensor) -> np.ndarray:
            return program.run(None, {name: x.numpy()})[0]
    else:
        compiled = openvino_compiled(path, inputs[0].dtype, threads)

        def run(x: torch.Tensor) -> np.ndarray:
            return compiled(openvino_tensor(x.contiguous()))[0]

    worst = 0.0
    with torch.no_grad():
        for x in inputs:
            reference = model(x).float().numpy()
            worst = max(worst, float(np.abs(np.asarray(run(x), dtype=np.float32) - reference).max()))
    return worst


def _opset(program) -> int | None:
    """The default-domain ONNX opset of an exported program."""
    return None if (version := program.model.opset_imports.get("")) is None else int(version)
