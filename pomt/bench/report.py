"""Benchmark outputs: aligned text tables, CSV/JSON rows, latency/speedup bars and the sweep heat-map."""

from __future__ import annotations

import math
from pathlib import Path

from pomt.bench.run import BenchResult, SweepResult
from pomt.bench.variants import BASELINE
from pomt.io import atomic_save_figure, atomic_write_csv, atomic_write_json

COLUMNS = (
    "model",
    "method",
    "batch_size",
    "input_size",
    "tokens_kept",
    "latency_ms",
    "latency_iqr_ms",
    "throughput_ips",
    "speedup",
    "predicted_ms",
    "gflops",
    "params_m",
    "peak_mem_mb",
    "power_w",
    "energy_j_per_img",
    "ops_per_forward",
    "device_time_ms",
    "accuracy",
    "accuracy_kind",
    "clocks_locked",
)
EXTRA_COLUMNS = (
    "reducer",
    "amount",
    "latency_min_ms",
    "latency_p10_ms",
    "samples",
    "speedup_min",
    "predicted_error_pct",
    "peak_mem_kind",
    "rss_delta_mb",
    "profiled_wall_ms",
    "profile_kind",
)
ALL_COLUMNS = COLUMNS + EXTRA_COLUMNS

_TABLE = (  # (header, column, format)
    ("method", "method", "{}"),
    ("amount", "amount", "{}"),
    ("tokens", "tokens_kept", "{}"),
    ("latency ms", "latency_ms", "{:.3f}"),
    ("IQR ms", "latency_iqr_ms", "{:.3f}"),
    ("min ms", "latency_min_ms", "{:.3f}"),
    ("img/s", "throughput_ips", "{:.1f}"),
    ("speedup", "speedup", "{:.3f}x"),
    ("pred ms", "predicted_ms", "{:.3f}"),
    ("GFLOPs", "gflops", "{:.3f}"),
    ("params M", "params_m", "{:.2f}"),
    ("peak MB", "peak_mem_mb", "{:.2f}"),
    ("W", "power_w", "{:.1f}"),
    ("J/img", "energy_j_per_img", "{:.4f}"),
    ("ops/fwd", "ops_per_forward", "{:.0f}"),
    ("dev ms", "device_time_ms", "{:.3f}"),
    ("accuracy", "accuracy", "{:.3f}"),
)


def _cell(value, fmt: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def aligned(header: list[str], body: list[list[str]]) -> str:
    """Plain text table: first column left-aligned, the others right-aligned."""
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(header), "  ".join("-" * w for w in widths), *map(line, body)])


def format_table(result: BenchResult) -> str:
    """The benchmark as an aligned text table with a title and notes."""
    header = [h for h, _, _ in _TABLE]
    body = [[_cell(row.get(col), fmt) for _, col, fmt in _TABLE] for row in result.rows]
    meta = result.meta
    kind = meta.get("accuracy_kind") or "none"
    fp = meta.get("fingerprint", {})
    title = (
        f"{meta.get('model')} on {result.run.device} ({fp.get('name', '?')}), batch {result.run.batch_size}, "
        f"input {result.run.input_size[0]}, {meta.get('threads')} threads, {meta.get('rounds')} rounds, "
        f"clocks locked: {fp.get('clocks_locked')}"
    )
    notes = [
        f"accuracy: {kind}" + (f" on {meta.get('accuracy_samples')} samples" if kind != "none" else ""),
        "speedup = unpruned median / variant median; GFLOPs per image (2 FLOPs per multiply-add)",
        *meta.get("notes", []),
    ]
    slower = [r["method"] for r in result.rows if r["method"] != BASELINE and (r.get("speedup") or 0) < 1]
    if slower:
        notes.append(f"break-even not reached (slower than unpruned): {', '.join(slower)}")
    return "\n".join([title, aligned(header, body), *(f"note: {n}" for n in notes)])


def write_benchmark(result: BenchResult, output_dir: str | Path) -> dict[str, Path]:
    """`<stem>.benchmark.csv`, `.benchmark.json` and `.benchmark.png` in `output_dir`, written atomically."""
    out = Path(output_dir)
    paths = {
        "csv": atomic_write_csv(out / f"{result.stem}.benchmark.csv", result.rows, ALL_COLUMNS),
        "json": atomic_write_json(
            out / f"{result.stem}.benchmark.json",
            {"meta": result.meta, "columns": list(COLUMNS), "rows": result.rows},
        ),
    }
    paths["png"] = atomic_save_figure(out / f"{result.stem}.benchmark.png", plot_benchmark(result))
    return paths


def plot_benchmark(result: BenchResult):
    """Latency bars with IQR error bars (left) and speedup vs unpruned (right)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    names = [row["method"] for row in result.rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(max(6, 1.6 * len(names) + 3), 3.6))
    left.bar(
        names,
        [r["latency_ms"] for r in result.rows],
        yerr=[r["latency_iqr_ms"] / 2 for r in result.rows],
        capsize=4,
        color="tab:blue",
    )
    left.set_ylabel("latency per batch (ms, median ± IQR/2)")
    speedups = [r["speedup"] for r in result.rows]
    right.bar(names, speedups, color=["tab:green" if s >= 1 else "tab:red" for s in speedups])
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_ylabel("speedup vs unpruned")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30)
    figure.suptitle(
        f"{result.run.architecture}, {result.run.device}, batch {result.run.batch_size}, "
        f"input {result.run.input_size[0]}"
    )
    figure.tight_layout()
    plt.close(figure)
    return figure


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
    blocks.append(
        "note: speedup = unpruned median / variant median; '!' marks cells where pruning loses (< 1)"
    )
    return "\n\n".join(blocks)


def plot_sweep(sweep: SweepResult):
    """Heat-map of speedup per (batch, input size), one panel per variant, centred on break-even (1.0)."""
    import matplotlib

    matplotlib.use("Agg")
    import numpy as np
    from matplotlib import colors
    from matplotlib import pyplot as plt

    table = speedups(sweep)
    names = list(table) or ["(no reduced variant)"]
    figure, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 1, 3.2), squeeze=False)
    values = [v for cells in table.values() for v in cells.values()] or [1.0]
    spread = max(abs(math.log(v)) for v in values if v > 0) or 0.1
    norm = colors.LogNorm(vmin=math.exp(-spread), vmax=math.exp(spread))
    for axis, name in zip(axes[0], names, strict=True):
        grid = np.full((len(sweep.batch_sizes), len(sweep.input_sizes)), np.nan)
        for (batch, size), value in table.get(name, {}).items():
            grid[sweep.batch_sizes.index(batch), sweep.input_sizes.index(size)] = value
        image = axis.imshow(grid, cmap="RdYlGn", norm=norm, aspect="auto")
        for i, j in np.ndindex(grid.shape):
            if not np.isnan(grid[i, j]):
                mark = "\n(loses)" if grid[i, j] < 1 else ""
                axis.text(j, i, f"{grid[i, j]:.2f}x{mark}", ha="center", va="center", fontsize=8)
        axis.set_xticks(range(len(sweep.input_sizes)), [str(s) for s in sweep.input_sizes])
        axis.set_yticks(range(len(sweep.batch_sizes)), [str(b) for b in sweep.batch_sizes])
        axis.set_xlabel("input size")
        axis.set_ylabel("batch size")
        axis.set_title(name)
    bar = figure.colorbar(image, ax=axes[0].tolist(), label="speedup vs unpruned")
    ticks = [math.exp(-spread), math.exp(-spread / 2), 1.0, math.exp(spread / 2), math.exp(spread)]
    bar.set_ticks(ticks, labels=[f"{t:.2f}x" for t in ticks])
    bar.ax.minorticks_off()
    figure.suptitle(f"{sweep.run.architecture} on {sweep.run.device}: speedup (< 1: pruning loses)", y=1.04)
    plt.close(figure)
    return figure


def write_sweep(sweep: SweepResult, output_dir: str | Path) -> dict[str, Path]:
    """All cells' rows as `<stem>.sweep.csv`/`.json`, the speedup heat-map as `<stem>.sweep.png`, and
    each cell's own benchmark files."""
    out = Path(output_dir)
    rows = [row for result in sweep.cells.values() for row in result.rows]
    stem = f"{sweep.stem}.sweep"
    table = {
        name: [{"batch_size": b, "input_size": s, "speedup": v} for (b, s), v in cells.items()]
        for name, cells in speedups(sweep).items()
    }
    paths = {
        "csv": atomic_write_csv(out / f"{stem}.csv", rows, ALL_COLUMNS),
        "json": atomic_write_json(
            out / f"{stem}.json",
            {
                "batch_sizes": sweep.batch_sizes,
                "input_sizes": sweep.input_sizes,
                "speedup": table,
                "columns": list(COLUMNS),
                "rows": rows,
                "cells": [
                    {"batch_size": b, "input_size": s, "meta": r.meta} for (b, s), r in sweep.cells.items()
                ],
            },
        ),
        "png": atomic_save_figure(out / f"{stem}.png", plot_sweep(sweep)),
    }
    for result in sweep.cells.values():
        write_benchmark(result, out)
    return paths
