"""`pomt export`: write a schedule's pruned model for ONNX Runtime or OpenVINO, checked against PyTorch."""

from __future__ import annotations

from pathlib import Path

import typer

from pomt.cli.app import app, interrupted_means
from pomt.deploy.export import FORMATS, TARGET_DEVICES, export_schedule
from pomt.options import SEED_MAX


@app.command("export")
def export_command(
    schedule: Path = typer.Argument(..., help="Schedule JSON whose pruned model to export."),
    fmt: str = typer.Option("onnx", "--format", help=f"{' or '.join(FORMATS)} (OpenVINO IR: .xml + .bin)."),
    output: Path = typer.Option(None, "--output", help="Model file (default: beside the schedule, named "
                                "from its stem, .onnx or .xml)."),
    checkpoint: Path = typer.Option(None, "--checkpoint", help="Local weights (state dict or timm checkpoint)."),
    pretrained: bool = typer.Option(True, "--pretrained/--no-pretrained", help="timm's pretrained weights "
                                    "(random init with a warning when they cannot be had)."),
    batch_size: int = typer.Option(None, "--batch-size", help="Static batch size (default: the schedule's).",
                                   min=1),
    seed: int = typer.Option(0, "--seed", help="Seed of the random inputs used to trace and check.", min=0,
                             max=SEED_MAX),
    target: str = typer.Option(None, "--target-device", help=f"{', '.join(TARGET_DEVICES)}: the device the "
                               "exported model will run on, which sets how pomt's explicit attention is chunked "
                               "(default: the device the schedule was measured on)."),
) -> None:
    """Export the scheduled model at static shapes and check its outputs against the patched PyTorch model."""
    with interrupted_means("interrupted; nothing was exported (an earlier export there is as it was)"):
        result = export_schedule(schedule, fmt=fmt, output=output, checkpoint=checkpoint, pretrained=pretrained,
                                 batch_size=batch_size, seed=seed, target=target)
    card, check = result.card, result.card["check"]
    shape = "x".join(str(s) for s in card["input_shape"])
    typer.echo(f"wrote      {', '.join(str(result.path.with_name(f)) for f in card['files'])}")
    typer.echo(f"model      {card['model']}  {card['method']} {card['prune']}  input {shape} {card['dtype']}  "
               f"weights: {card['weights']}  attention chunked for {card['attention_chunked_for']}")
    typer.echo(f"check      {check['runtime']} {card['backend']['version']} vs PyTorch on {check['inputs']} "
               f"random inputs: max abs diff {check['max_abs_diff']:.2e} <= {check['tolerance']:.0e}")
    typer.echo(f"card       {result.card_path}")
