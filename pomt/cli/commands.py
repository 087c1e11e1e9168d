"""The smaller commands: `pomt model`, `pomt models`, `pomt device` and `pomt backend` (what pomt knows about a
model, which families it can prune with which reducer, the machine and its runtimes), `pomt record` (a dense latency
trace of one workload, for the curve bank and `--replay`) and `pomt export` (a schedule's pruned model for ONNX
Runtime or OpenVINO, checked against PyTorch)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import typer

from pomt.bench.config import BenchConfig
from pomt.bench.report import format_sweep, format_table, write_benchmark, write_sweep
from pomt.bench.run import run_benchmark, run_sweep
from pomt.checks import check_output_dir, check_threads
from pomt.cli.app import app, interrupted_means
from pomt.cli.options import config_command
from pomt.deploy.export import FORMATS, TARGET_DEVICES, ExportOptions, export_schedule
from pomt.device import device_fingerprint, resolve_device
from pomt.errors import BackendError, BatchSizeError, InputSizeError, SettingError
from pomt.models.registry import geometry_of, resolve_model_name
from pomt.options import OUTPUTS, SEED_MAX, WORKLOAD, option
from pomt.patching import METHODS
from pomt.patching.api import FAMILIES, PROBE_SIZE, Row, model_support, support_table
from pomt.runtimes import Backend, backend_info, check_backend
from pomt.workload.prepare import Workload
from pomt.workload.record import RecordSettings, record


@app.command("model")
def model_command(
    name: str = typer.Argument(..., help="timm model name or alias (deit_small, dinov2_small, ...)."),
    input_size: int = typer.Option(None, "--input-size", help="Input size in pixels (default: the model's)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the resolved timm name, the token geometry of a model and the reducers that run on it (tried on a
    random-weight copy at a small input size)."""
    resolved = resolve_model_name(name)
    geometry = geometry_of(resolved, input_size)
    reducers = model_support(resolved)
    info = {"name": name, "resolved": resolved, **geometry.to_dict(), "reducers": reducers}
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    typer.echo(f"{name} -> {resolved}")
    for key, value in geometry.to_dict().items():
        if key != "model":
            typer.echo(f"  {key:14s} {value}")
    typer.echo(f"  {'reducers':14s} {reducers_line(reducers)}")


def reducers_line(reducers: dict[str, str | None]) -> str:
    """The methods that run, then each refused one with its reason."""
    runs = ", ".join(method for method, reason in reducers.items() if reason is None) or "none"
    refused = "".join(f"; {method} refused: {reason}" for method, reason in reducers.items() if reason is not None)
    return runs + refused


SHORT_REASON = 36  # characters of a refusal in a table cell
_DOTTED = re.compile(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)")


def short_reason(line: str, width: int = SHORT_REASON) -> str:
    """A refusal cut to its first clause (the innermost parenthesis of it where one is open), dotted paths to their
    last name, at most `width` characters."""
    clause = line.split("; ")[0].split(": ")[0]
    if "(" in clause:
        clause = clause.rsplit("(", 1)[1].rstrip(")")
    clause = _DOTTED.sub(r"\1", clause).strip()
    return clause if len(clause) <= width else clause[: width - 1].rstrip() + "…"


def support_lines(rows: list[Row], methods: tuple[str, ...] = METHODS, verbose: bool = False) -> list[str]:
    """The support table: family, model, class, then per method "ok" or a short refusal (one refusal that holds for
    every method is written once); `verbose` adds each refusal's full line under its row."""
    cells = []
    for row in rows:
        reasons = [row.reducers[m] for m in methods]
        if all(r is not None for r in reasons) and len(set(reasons)) == 1:
            cells.append([f"refused: {short_reason(reasons[0], 2 * SHORT_REASON)}"])
        else:
            cells.append(["ok" if r is None else short_reason(r) for r in reasons])
    head = ["family", "model", "class"]
    fixed = [[row.family, row.model, row.description] for row in rows]
    widths = [max(len(x) for x in column) for column in zip(head, *fixed, strict=False)]
    spread = [max([len(m)] + [len(c[i]) for c in cells if len(c) == len(methods)]) for i, m in enumerate(methods)]

    def line(left: list[str], right: list[str]) -> str:
        parts = [f"{x:<{w}}" for x, w in zip(left, widths, strict=True)]
        parts += [f"{x:<{w}}" for x, w in zip(right, spread, strict=False)] if len(right) > 1 else right
        return "  ".join(parts).rstrip()

    lines = [line(head, list(methods))]
    for row, left, right in zip(rows, fixed, cells, strict=True):
        lines.append(line(left, right))
        if verbose:
            lines += _full_reasons(row, methods)
    return lines


def _full_reasons(row: Row, methods: tuple[str, ...]) -> list[str]:
    refused = {m: row.reducers[m] for m in methods if row.reducers[m] is not None}
    if len(refused) == len(methods) and len(set(refused.values())) == 1:
        return [f"    every reducer: {refused[methods[0]]}"]
    return [f"    {m}: {reason}" for m, reason in refused.items()]


@app.command("models")
def models_command(
    family: str = typer.Option(None, "--family", help="Only the families whose label contains this text."),
    verbose: bool = typer.Option(False, "--verbose", help="Print each refusal's full line."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Which ViT families pomt can prune with which reducer, found now: each representative model (random weights,
    a small input size) patched with a small removal and run once per reducer."""
    families = [f for f in FAMILIES if family is None or family.lower() in f.label.lower()]
    if not families:
        raise SettingError(f"--family {family!r} matches no family; the families: "
                           + ", ".join(f.label for f in FAMILIES))
    rows = support_table(families)
    if as_json:
        typer.echo(json.dumps({"methods": list(METHODS), "input_size": PROBE_SIZE,
                               "rows": [row.to_dict() for row in rows]}, indent=2))
        return
    for text in support_lines(rows, verbose=verbose):
        typer.echo(text)
    if not verbose and any(reason is not None for row in rows for reason in row.reducers.values()):
        typer.echo("(--verbose for the full reasons)")


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

@dataclass(frozen=True)
class Outputs:
    """The options of the command itself: a sweep instead of one run, and where the files go."""

    batch_sizes: str | None = option(None, "Sweep: comma-separated batch sizes.", panel=WORKLOAD)
    input_sizes: str | None = option(None, "Sweep: comma-separated input sizes.", panel=WORKLOAD)
    output_dir: Path = option(Path("bin"), "Where the CSV/JSON/PNG go.", panel=OUTPUTS)


def _ints(text: str | None, what: str, error: type[Exception]) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise error(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values:
        raise error(f"{what} is empty")
    if min(values) < 1:
        raise error(f"{what} must be positive integers, got {text!r}")
    return values


@app.command("bench")
@config_command(BenchConfig, Outputs)
def bench_command(config: BenchConfig, outputs: Outputs) -> None:
    """Compare the unpruned model with a schedule and other reducers: latency, FLOPs, memory, power, ops."""
    batches = _ints(outputs.batch_sizes, "--batch-sizes", BatchSizeError)
    sizes = _ints(outputs.input_sizes, "--input-sizes", InputSizeError)
    check_output_dir(outputs.output_dir)
    with interrupted_means("interrupted; a benchmark keeps no journal: nothing was written, run it again"):
        _bench(config, outputs, batches, sizes)


def _bench(config: BenchConfig, outputs: Outputs, batches: list[int] | None, sizes: list[int] | None) -> None:
    if batches is None and sizes is None:
        result = run_benchmark(config)
        typer.echo(format_table(result))
        paths = write_benchmark(result, outputs.output_dir)
    else:
        sizes = sizes or ([config.input_size] if config.input_size else None)
        if sizes is None:
            raise InputSizeError("a sweep needs --input-sizes (or --input-size)")
        sweep = run_sweep(config, batches or [config.batch_size or 1], sizes)
        for result in sweep.cells.values():
            typer.echo(format_table(result) + "\n")
        typer.echo(format_sweep(sweep))
        paths = write_sweep(sweep, outputs.output_dir)
    typer.echo("wrote " + ", ".join(str(path) for path in paths.values()))
