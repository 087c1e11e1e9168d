"""The smaller commands: `pomt model`, `pomt device` and `pomt backend` (what pomt knows about a model, the
machine and its runtimes), `pomt record` (a dense latency trace of one workload, for the curve bank and
`--replay`) and `pomt export` (a schedule's pruned model for ONNX Runtime or OpenVINO, checked against PyTorch)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from pomt.checks import check_threads
from pomt.cli.app import app, interrupted_means
from pomt.cli.options import config_command
from pomt.deploy.export import FORMATS, TARGET_DEVICES, ExportOptions, export_schedule
from pomt.device import device_fingerprint, resolve_device
from pomt.errors import BackendError
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model, resolve_model_name
from pomt.options import SEED_MAX
from pomt.runtimes import Backend, backend_info, check_backend
from pomt.workload.prepare import Workload
from pomt.workload.record import RecordSettings, record


@app.command("model")
def model_command(
    name: str = typer.Argument(..., help="timm model name or alias (deit_small, dinov2_small, ...)."),
    input_size: int = typer.Option(None, "--input-size", help="Input size in pixels (default: the model's)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the resolved timm name and the token geometry of a model."""
    resolved = resolve_model_name(name)
    geometry = model_geometry(create_model(resolved, input_size=input_size))
    info = {"name": name, "resolved": resolved, **geometry.to_dict()}
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    typer.echo(f"{name} -> {resolved}")
    for key, value in geometry.to_dict().items():
        if key != "model":
            typer.echo(f"  {key:14s} {value}")


@app.command("device")
def device_command(
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda, cuda:N or mps."),
    threads: int = typer.Option(None, "--threads", help="CPU threads to report (default: torch's).", min=1),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the device fingerprint and clock state that measurements record."""
    info = device_fingerprint(resolve_device(device), check_threads(threads)).to_dict()
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    for key, value in info.items():
        typer.echo(f"{key:18s} {value}")


@app.command("backend")
def backend_command(
    name: str = typer.Argument(None, help="eager, compile, onnxruntime, openvino or tensorrt (default: all)."),
    device: str = typer.Option("cpu", "--device", help="Device the backend would run on."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print a runtime backend's package versions, or whether each backend can run here."""
    device = resolve_device(device)
    if name is not None:
        info = backend_info(check_backend(name, device))
        typer.echo(json.dumps(info, indent=2) if as_json else "  ".join(f"{k}={v}" for k, v in info.items()))
        return
    table = {}
    for backend in Backend:
        try:
            table[backend.value] = backend_info(check_backend(backend, device))
        except BackendError as exc:
            table[backend.value] = {"name": backend.value, "unavailable": str(exc)}
    if as_json:
        typer.echo(json.dumps(table, indent=2))
        return
    for key, info in table.items():
        typer.echo(f"{key:12s} {info.get('unavailable') or info.get('version')}")


@app.command("record")
@config_command(Workload, RecordSettings)
def record_command(workload: Workload, settings: RecordSettings) -> None:
    """Record every timed forward of every kept-token count in shuffled passes, with the device fingerprint."""
    done, echo = record(workload, settings), typer.echo
    echo(f"recorded   {done.visits} visits ({done.measured} measured now, {done.samples} timed forwards) in "
         f"{done.seconds:.0f} s; noise {100 * done.noise:.1f}% a visit")
    if done.drift is not None:
        echo(f"drift      reference {done.drift.reference_tokens} tokens: max/min {done.drift.max_over_min:.2f} "
             f"over {len(done.drift.reference_ms)} passes{done.drift.one_pass_words()}")
    echo(f"steps      {len(done.steps)} confirmed by paired visits within passes (>= {100 * settings.min_step:.0f}%)")
    for s in done.steps:
        echo(f"  {s.upper_tokens:>5d} -> {s.tokens:<5d} {s.kind}: {-s.paired_pct:+.1f}% beyond the trend, "
             f"p={s.p_value:.2g}")
    for kind, path in done.paths.items():
        echo(f"wrote      {kind:8s} {path}")


@app.command("export")
def export_command(
    schedule: Path = typer.Argument(..., help="Schedule JSON whose pruned model to export."),
    fmt: str = typer.Option("onnx", "--format", help=f"{' or '.join(FORMATS)} (OpenVINO IR: .xml + .bin)."),
    output: Path = typer.Option(None, "--output",
                                help="Model file (default: beside the schedule, named from its stem, .onnx or .xml)."),
    checkpoint: Path = typer.Option(None, "--checkpoint", help="Local weights (state dict or timm checkpoint)."),
    pretrained: bool = typer.Option(True, "--pretrained/--no-pretrained", help="timm's pretrained weights "
                                    "(random init with a warning when they cannot be had)."),
    batch_size: int = typer.Option(None, "--batch-size", help="Static batch size (default: the schedule's).", min=1),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs used to trace and check.", min=0,
                             max=SEED_MAX),
    target: str = typer.Option(None, "--target-device", help=f"{', '.join(TARGET_DEVICES)}: the device the "
                               "exported model will run on, which sets how pomt's explicit attention is chunked "
                               "(default: the device the schedule was measured on)."),
) -> None:
    """Export the scheduled model at static shapes and check its outputs against the patched PyTorch model."""
    with interrupted_means("interrupted; nothing was exported (an earlier export there is as it was)"):
        result = export_schedule(schedule, ExportOptions(fmt, output, checkpoint, pretrained, batch_size, seed, target))
    card, check = result.card, result.card["check"]
    shape = "x".join(str(s) for s in card["input_shape"])
    typer.echo(f"wrote      {', '.join(str(result.path.with_name(f)) for f in card['files'])}")
    typer.echo(f"model      {card['model']}  {card['method']} {card['prune']}  input {shape} {card['dtype']}  "
               f"weights: {card['weights']}  attention chunked for {card['attention_chunked_for']}")
    typer.echo(f"check      {check['runtime']} {card['backend']['version']} vs PyTorch on {check['inputs']} "
               f"random inputs: max abs diff {check['max_abs_diff']:.2e} <= {check['tolerance']:.0e}")
    typer.echo(f"card       {result.card_path}")
