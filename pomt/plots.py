"""Every PNG pomt writes: the offline latency curve (steps, accuracy, utility, the chosen count), the
benchmark's latency and speedup bars, and the sweep's speedup heat-map. Matplotlib draws off-screen (Agg)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colors  # noqa: E402

from pomt.io import atomic_save_figure  # noqa: E402
from pomt.measure import LatencyPoint  # noqa: E402


def plot_offline(
    path: str | Path,
    title: str,
    points: Sequence[LatencyPoint],
    steps: Sequence,
    chosen_tokens: int | None,
    accuracy: Mapping[int, float] | None = None,
    accuracy_kind: str | None = None,
    utility: Mapping[int, float] | None = None,
) -> Path:
    """Latency vs kept tokens (median with IQR band, steps marked, choice marked); accuracy/utility below."""
    points = sorted(points, key=lambda p: p.tokens)
    tokens = [p.tokens for p in points]
    median = [p.median_ms for p in points]
    rows = 2 if accuracy else 1
    figure, axes = plt.subplots(rows, 1, figsize=(9, 4.2 * rows), sharex=True, squeeze=False)
    ax = axes[0][0]
    ax.fill_between(
        tokens,
        [p.median_ms - p.iqr_ms / 2 for p in points],
        [p.median_ms + p.iqr_ms / 2 for p in points],
        alpha=0.25,
        label="IQR",
    )
    ax.plot(tokens, median, ".-", lw=1, ms=3, label="median latency")
    for i, step in enumerate(steps):
        colour = "tab:red" if step.kind == "drop" else "tab:purple"
        ax.axvline(step.tokens, color=colour, ls="--", lw=0.8, label=("step" if i == 0 else None))
        ax.annotate(f"{-step.drop_pct:+.1f}%", (step.tokens, step.after_ms), fontsize=7, color=colour)
    if chosen_tokens is not None:
        ax.axvline(chosen_tokens, color="tab:green", lw=2, label=f"chosen: keep {chosen_tokens}")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    if accuracy:
        ax2 = axes[1][0]
        counts = sorted(accuracy)
        ax2.plot(counts, [accuracy[n] for n in counts], "o-", ms=3, label=f"accuracy ({accuracy_kind})")
        if utility:
            ucounts = sorted(utility)
            ax2.plot(ucounts, [utility[n] for n in ucounts], "-", lw=1, label="utility")
        if chosen_tokens is not None:
            ax2.axvline(chosen_tokens, color="tab:green", lw=2)
        ax2.set_ylabel("accuracy / utility")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8, loc="lower right")
    axes[-1][0].set_xlabel("kept tokens")
    return _saved(path, figure)


def _saved(path: str | Path, figure) -> Path:
    try:
        return atomic_save_figure(path, figure)
    finally:
        plt.close(figure)


def plot_benchmark(path: str | Path, title: str, rows: Sequence[Mapping]) -> Path:
    """Latency bars with IQR error bars (left) and speedup vs unpruned (right), one bar per variant."""
    names = [row["method"] for row in rows]
    figure, (left, right) = plt.subplots(1, 2, figsize=(max(6, 1.6 * len(names) + 3), 3.6))
    latency, iqr = [r["latency_ms"] for r in rows], [r["latency_iqr_ms"] / 2 for r in rows]
    left.bar(names, latency, yerr=iqr, capsize=4, color="tab:blue")
    left.set_ylabel("latency per batch (ms, median ± IQR/2)")
    speedups = [r["speedup"] for r in rows]
    right.bar(names, speedups, color=["tab:green" if s >= 1 else "tab:red" for s in speedups])
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_ylabel("speedup vs unpruned")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30)
    figure.suptitle(title)
    figure.tight_layout()
    return _saved(path, figure)


def plot_sweep(
    path: str | Path,
    title: str,
    speedups: Mapping[str, Mapping[tuple[int, int], float]],
    batch_sizes: Sequence[int],
    input_sizes: Sequence[int],
) -> Path:
    """Heat-map of speedup per (batch, input size), one panel per variant, centred on break-even (1.0)."""
    names = list(speedups) or ["(no reduced variant)"]
    figure, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names) + 1, 3.2), squeeze=False)
    values = [v for cells in speedups.values() for v in cells.values()] or [1.0]
    spread = max(abs(math.log(v)) for v in values if v > 0) or 0.1
    norm = colors.LogNorm(vmin=math.exp(-spread), vmax=math.exp(spread))
    for axis, name in zip(axes[0], names, strict=True):
        grid = np.full((len(batch_sizes), len(input_sizes)), np.nan)
        for (batch, size), value in speedups.get(name, {}).items():
            grid[batch_sizes.index(batch), input_sizes.index(size)] = value
        image = axis.imshow(grid, cmap="RdYlGn", norm=norm, aspect="auto")
        for i, j in np.ndindex(grid.shape):
            if not np.isnan(grid[i, j]):
                mark = "\n(loses)" if grid[i, j] < 1 else ""
                axis.text(j, i, f"{grid[i, j]:.2f}x{mark}", ha="center", va="center", fontsize=8)
        axis.set_xticks(range(len(input_sizes)), [str(s) for s in input_sizes])
        axis.set_yticks(range(len(batch_sizes)), [str(b) for b in batch_sizes])
        axis.set(xlabel="input size", ylabel="batch size", title=name)
    bar = figure.colorbar(image, ax=axes[0].tolist(), label="speedup vs unpruned")
    ticks = [math.exp(-spread), math.exp(-spread / 2), 1.0, math.exp(spread / 2), math.exp(spread)]
    bar.set_ticks(ticks, labels=[f"{t:.2f}x" for t in ticks])
    bar.ax.minorticks_off()
    figure.suptitle(title, y=1.04)
    return _saved(path, figure)
