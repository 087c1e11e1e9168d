"""Benchmark outputs: aligned text tables, and CSV/JSON/PNG files (plots drawn by `pomt.plots`)."""

from __future__ import annotations

import math
from pathlib import Path

from pomt.bench.accuracy import Comparison
from pomt.bench.config import BASELINE
from pomt.bench.run import BenchResult, SweepResult
from pomt.io import atomic_write_csv, atomic_write_json, clear_stale, staged_set
from pomt.measurement.timing import GPU_PROFILE
from pomt.plots import plot_benchmark, plot_sweep
from pomt.verification.verify import BUSY_FLOOR, waits_on_host

COLUMNS = (
    "model", "method", "batch_size", "input_size", "tokens_kept", "latency_ms", "latency_iqr_ms", "throughput_ips",
    "speedup", "predicted_ms", "gflops", "params_m", "peak_mem_mb", "power_w", "energy_j_per_img",
    "ops_per_forward", "device_time_ms", "accuracy", "accuracy_low", "accuracy_high", "accuracy_kind", "clocks_locked",
)
EXTRA_COLUMNS = (
    "reducer", "amount", "latency_min_ms", "latency_p10_ms", "samples", "speedup_min", "measured_over_predicted",
    "predicted_error_pct", "latency_vs_schedule", "setting", "match_ratio", "match_ci_low", "match_ci_high",
    "accuracy_correct", "peak_mem_kind", "profiled_wall_ms", "profile_kind",
)
ALL_COLUMNS = COLUMNS + EXTRA_COLUMNS

_TABLE = (  # (header, column, format)
    ("method", "method", "{}"), ("amount", "amount", "{}"), ("tokens", "tokens_kept", "{}"),
    ("latency ms", "latency_ms", "{:.3f}"), ("IQR ms", "latency_iqr_ms", "{:.3f}"),
    ("min ms", "latency_min_ms", "{:.3f}"), ("img/s", "throughput_ips", "{:.1f}"), ("speedup", "speedup", "{:.3f}x"),
    ("vs sched", "latency_vs_schedule", "{:.3f}x"), ("pred ms", "predicted_ms", "{:.3f}"),
    ("meas/pred", "measured_over_predicted", "{:.3f}"), ("GFLOPs", "gflops", "{:.3f}"),
    ("params M", "params_m", "{:.2f}"), ("peak MB", "peak_mem_mb", "{:.2f}"), ("W", "power_w", "{:.1f}"),
    ("J/img", "energy_j_per_img", "{:.4f}"), ("ops/fwd", "ops_per_forward", "{:.0f}"),
    ("dev ms", "device_time_ms", "{:.3f}"), ("accuracy", "accuracy", "{:.3f}"),
    ("95% interval", ("accuracy_low", "accuracy_high"), "[{:.3f}, {:.3f}]"),
)


def _cell(row: dict, column: str | tuple[str, ...], fmt: str) -> str:
    """One table cell: the column's value (or the columns' values) formatted, "-" where one is missing."""
    values = [row.get(name) for name in ((column,) if isinstance(column, str) else column)]
    if any(v is None or (isinstance(v, float) and math.isnan(v)) for v in values):
        return "-"
    return fmt.format(*values)


def aligned(header: list[str], body: list[list[str]]) -> str:
    """Plain text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, body)])


def slower_than_unpruned(rows: list[dict]) -> list[str]:
    """The variants whose median speedup is below 1 although they remove tokens (one keeping as many as the
    unpruned model runs the same model: its speedup is noise around 1, not a break-even lost)."""
    kept = {r["method"]: r.get("tokens_kept") for r in rows}
    return [
        r["method"] for r in rows
        if r["method"] != BASELINE and (r.get("speedup") or 0) < 1 and r.get("tokens_kept") != kept.get(BASELINE)
    ]


def launch_bound(rows: list[dict]) -> list[str]:
    """The variants whose GPU kernels filled less than `BUSY_FLOOR` of their median latency, each with the share."""
    return [
        f"{r['method']} ({r['device_time_ms'] / r['latency_ms']:.0%})" for r in rows
        if r.get("profile_kind") == GPU_PROFILE and r.get("device_time_ms") and r.get("latency_ms")
        and waits_on_host(r["device_time_ms"], r["latency_ms"])
    ]


def format_table(result: BenchResult) -> str:
    """The benchmark as an aligned text table with a title and notes."""
    header = [h for h, _, _ in _TABLE]
    body = [[_cell(row, col, fmt) for _, col, fmt in _TABLE] for row in result.rows]
    meta, fp = result.meta, result.run.fingerprint
    kind = meta.get("accuracy_kind") or "none"
    title = (f"{meta.get('model')} on {result.run.device} ({fp.name or '?'}), batch {result.run.batch_size}, "
             f"input {result.run.input_size[0]}, {meta.get('threads')} threads, {meta.get('rounds')} rounds, "
             f"clocks locked: {fp.clocks_locked}")
    notes = [
        f"accuracy: {kind}" + (f" on {meta.get('accuracy_samples')} samples" if kind != "none" else ""),
        "speedup = unpruned median / variant median; GFLOPs per image (2 FLOPs per multiply-add)",
        "pred ms: the schedule's curve predicts each variant's latency relative to the unpruned model; applied to "
        "this run's unpruned median, so the machine's drift cancels; meas/pred = measured / predicted",
        *meta.get("notes", []),
    ]
    if slower := slower_than_unpruned(result.rows):
        notes.append(f"break-even not reached (slower than unpruned): {', '.join(slower)}")
    if waiting := launch_bound(result.rows):
        notes.append(f"launch-bound here, the GPU busy under {BUSY_FLOOR:.0%} of the forward: {', '.join(waiting)}; "
                     "their speed follows how fast this host issues kernels")
    return "\n".join([title, aligned(header, body), *(f"note: {n}" for n in notes), *comparison_lines(meta)])


def comparison_lines(meta: dict) -> list[str]:
    """How each reducer was tuned to the schedule's latency, and every accuracy difference with its interval."""
    lines = []
    if meta.get("match") == "flops" or meta.get("matches"):
        lines.append(f"reducers matched to the schedule's {meta['match']}" + (
            ": each setting probed against the schedule in paired rounds; ratio = its latency / the schedule's"
            if meta["match"] == "latency" else ""))
    for m in meta.get("matches", []):
        low, high = m["ci"]
        close = "within the noise" if m["within_noise"] else "the closest setting found, outside the noise"
        lines.append(f"  {m['name']}: {m['setting']} (setting {m['value']} of 0..{m['range'][1]}, "
                     f"{len(m['probes'])} probes): {m['ratio']:.3f}x [{low:.3f}, {high:.3f}], {close}")
    if comparisons := meta.get("comparisons", []):
        how = ("paired on the same images, Newcombe's method 10" if all(c.get("paired") for c in comparisons)
               else "Newcombe's from the Wilson intervals")
        lines.append(f"accuracy differences (95% interval, {how}):")
        lines += [f"  {Comparison.from_dict(c).line()}" for c in comparisons]
    return lines


def write_benchmark(result: BenchResult, output_dir: str | Path) -> dict[str, Path]:
    """`<stem>.benchmark.csv`, `.benchmark.json` and `.benchmark.png` in `output_dir`, written as one set."""
    out, stem, run = Path(output_dir), f"{result.stem}.benchmark", result.run
    title = f"{run.architecture}, {run.device}, batch {run.batch_size}, input {run.input_size[0]}"
    clear_stale(out, stem)
    with staged_set(out, stem) as staging:
        paths = {
            "csv": atomic_write_csv(staging / f"{stem}.csv", result.rows, ALL_COLUMNS),
            "json": atomic_write_json(staging / f"{stem}.json",
                                      {"meta": result.meta, "columns": list(COLUMNS), "rows": result.rows}),
            "png": plot_benchmark(staging / f"{stem}.png", title, result.rows),
        }
    return {kind: out / path.name for kind, path in paths.items()}


def speedups(sweep: SweepResult) -> dict[str, dict[tuple[int, int], float]]:
    """{variant: {(batch, size): speedup}} over the sweep (the unpruned baseline left out)."""
    table: dict[str, dict[tuple[int, int], float]] = {}
    for cell, result in sweep.cells.items():
        for row in result.rows:
            if row["method"] != BASELINE:
                table.setdefault(row["method"], {})[cell] = row["speedup"]
    return table


def format_sweep(sweep: SweepResult) -> str:
    """A speedup table per variant: batch sizes down, input sizes across; `!` marks break-even lost."""
    blocks = []
    for name, cells in speedups(sweep).items():
        header = [f"{name}: batch \\ input", *(str(s) for s in sweep.input_sizes)]
        body = []
        for batch in sweep.batch_sizes:
            row = [str(batch)]
            for size in sweep.input_sizes:
                value = cells.get((batch, size))
                row.append("-" if value is None else f"{value:.3f}x" + (" !" if value < 1 else "  "))
            body.append(row)
        blocks.append(aligned(header, body))
    blocks.append("note: speedup = unpruned median / variant median; '!' marks cells where pruning loses (< 1)")
    return "\n\n".join(blocks)


def write_sweep(sweep: SweepResult, output_dir: str | Path) -> dict[str, Path]:
    """All cells' rows as `<stem>.sweep.csv`/`.json`, the speedup heat-map as `<stem>.sweep.png` (one set, written
    after each cell's own benchmark files)."""
    out, stem, table = Path(output_dir), f"{sweep.stem}.sweep", speedups(sweep)
    rows = [row for result in sweep.cells.values() for row in result.rows]
    data = {
        "batch_sizes": sweep.batch_sizes, "input_sizes": sweep.input_sizes,
        "speedup": {
            name: [{"batch_size": b, "input_size": s, "speedup": v} for (b, s), v in cells.items()]
            for name, cells in table.items()
        },
        "columns": list(COLUMNS), "rows": rows,
        "cells": [{"batch_size": b, "input_size": s, "meta": r.meta} for (b, s), r in sweep.cells.items()],
    }
    title = f"{sweep.run.architecture} on {sweep.run.device}: speedup (< 1: pruning loses)"
    for result in sweep.cells.values():
        write_benchmark(result, out)
    clear_stale(out, stem)
    with staged_set(out, stem) as staging:
        paths = {
            "csv": atomic_write_csv(staging / f"{stem}.csv", rows, ALL_COLUMNS),
            "json": atomic_write_json(staging / f"{stem}.json", data),
            "png": plot_sweep(staging / f"{stem}.png", title, table, sweep.batch_sizes, sweep.input_sizes),
        }
    return {kind: out / path.name for kind, path in paths.items()}
