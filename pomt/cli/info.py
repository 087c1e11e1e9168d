"""`pomt model`, `pomt device` and `pomt backend`: what pomt knows about a model, the machine and its runtimes."""

from __future__ import annotations

import json

import typer

from pomt.checks import check_threads
from pomt.cli.app import app
from pomt.device import device_fingerprint, resolve_device
from pomt.errors import BackendError
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model, resolve_model_name
from pomt.runtimes import Backend, backend_info, check_backend


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
