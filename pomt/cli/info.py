"""`pomt model` and `pomt device`: what pomt knows about a model and the machine."""

from __future__ import annotations

import json

import typer

from pomt.cli.app import app
from pomt.device import device_fingerprint, resolve_device
from pomt.geometry import model_geometry
from pomt.models import create_model, resolve_model_name


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
    threads: int = typer.Option(None, "--threads", help="CPU threads to report (default: torch's)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the device fingerprint and clock state that measurements record."""
    info = device_fingerprint(resolve_device(device), threads)
    if as_json:
        typer.echo(json.dumps(info, indent=2, default=str))
        return
    for key, value in info.items():
        typer.echo(f"{key:18s} {value}")
