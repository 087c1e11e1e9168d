"""Every PNG pomt writes; matplotlib draws off-screen (Agg), imported at the first plot."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pomt.io import atomic_save_figure


def _pyplot():
    """matplotlib's pyplot on Agg, imported at the first plot: a command drawing nothing should not pay for it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


STEPS_LISTED = 8  # confirmed steps listed with their interval in the plot's box
NOTE_WIDTH = 90  # characters a line of the plot's box holds before it wraps
DOUBTFUL_BANDS = 4.0  # a count's band this many times the curve's median band is drawn apart from the curve


@dataclass(frozen=True)
class OfflinePlot:
    """What the offline plot draws: every visit as a dot, the pooled curve with its 95% band, the priced curve, the
    confirmed `steps`, `rejected` candidates, steps a fresh process did not show (`here_only`, (low, high) each), the
    policy's `reach` shaded, the chosen count and what verification measured; accuracy and utility below when known."""

    title: str
    points: Sequence
    visit_values: Mapping[int, Sequence[float]]
    steps: Sequence = ()
    rejected: Sequence = ()
    chosen_tokens: int | None = None
    drift: Any = None
    accuracy: Mapping[int, float] | None = None
    accuracy_kind: str | None = None
    utility: Mapping[int, float] | None = None
    verified: Any = None
    here_only: Sequence[tuple[int, int]] = ()
    detection: str | None = None
    reach: tuple[int, int] | None = None
    priced: Mapping[int, float] | None = None


def plot_offline(path: str | Path, plot: OfflinePlot) -> Path:
    """Latency vs kept tokens, and accuracy and utility below when known (`OfflinePlot`)."""
    steps, chosen, accuracy = plot.steps, plot.chosen_tokens, plot.accuracy
    points = sorted(plot.points, key=lambda p: p.tokens)
    tokens = np.array([p.tokens for p in points])
    latency = np.array([p.latency_ms for p in points])
    spread = 1.96 * np.array([p.se_ms for p in points]) / np.where(latency > 0, latency, 1.0)
    lower, upper = latency * np.exp(-spread), latency * np.exp(spread)  # the standard error is of the log
    rows = 2 if accuracy else 1
    plt = _pyplot()
    figure, axes = plt.subplots(rows, 1, figsize=(10, 4.8 * rows), sharex=True, squeeze=False)
    ax = axes[0][0]
    dots = [(n, v) for n in sorted(plot.visit_values) for v in plot.visit_values[n]]
    if dots:
        ax.plot(*zip(*dots, strict=True), ".", color="0.6", ms=2.5, alpha=0.6, label="visits (drift-corrected)")
    # a count whose band is many times the curve's usual one was seen only while the machine's speed
    # jumped: it is drawn apart, with its band, so that its level does not read as part of the curve
    doubtful = spread > DOUBTFUL_BANDS * float(np.median(spread)) if spread.size else spread.astype(bool)
    sound = ~doubtful
    if plot.reach is not None:
        ax.axvspan(plot.reach[0] - 0.5, plot.reach[1] + 0.5, color="tab:green", alpha=0.07, lw=0,
                   label=f"within the policy's reach ({plot.reach[0]}-{plot.reach[1]})")
    ax.fill_between(tokens[sound], lower[sound], upper[sound], alpha=0.25, color="tab:blue", label="95% band")
    ax.plot(tokens[sound], latency[sound], "-", color="tab:blue", lw=1.2, label="pooled latency")
    if plot.priced:
        counts = sorted(plot.priced)
        ax.plot(counts, [plot.priced[n] for n in counts], "--", color="0.1", lw=1.0,
                label="priced from (each level shrunk toward the trend by its noise)")
    if doubtful.any():
        ax.errorbar(tokens[doubtful], latency[doubtful],
                    yerr=[latency[doubtful] - lower[doubtful], upper[doubtful] - latency[doubtful]],
                    fmt="D", mfc="none", color="tab:brown", ms=4, lw=0.8, capsize=2,
                    label="level in doubt (measured while the speed jumped)")
    shown = np.concatenate([latency, [v for _, v in dots]])
    if shown.size:  # a band left wide by a sudden speed change runs off the axes instead of flattening them
        ax.set_ylim(0.0, 1.15 * float(shown.max()))
    def on_curve(x: float) -> float:  # markers sit on the drawn curve, clear of the legend and the notes
        return float(np.interp(x, tokens[sound], latency[sound])) if sound.any() else 0.0

    for i, step in enumerate(steps):
        colour = "tab:red" if step.kind == "drop" else "tab:purple"
        edge = 0.5 * (step.tokens + step.upper_tokens)
        ax.axvline(edge, color=colour, ls="--", lw=0.9, label="confirmed step" if i == 0 else None)
        ax.annotate(f"{-step.paired_pct:+.1f}%", (edge, on_curve(edge)), xytext=(4, 14 + 10 * (i % 3)),
                    textcoords="offset points", fontsize=7, color=colour, ha="left", va="bottom",
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "alpha": 0.8, "edgecolor": "none"})
    elsewhere = [0.5 * (low + high) for low, high in plot.here_only]
    rejected = [c for c in plot.rejected if (c.low, c.high) not in plot.here_only]
    if rejected:
        middles = [0.5 * (c.low + c.high) for c in rejected]
        ax.plot(middles, [on_curve(x) for x in middles], "x", color="0.15", ms=7, mew=1.5, zorder=5,
                label="candidate rejected by paired test")
    if elsewhere:
        ax.plot(elsewhere, [on_curve(x) for x in elsewhere], "o", mfc="none", color="tab:orange", ms=9, mew=1.5,
                zorder=5, label="step in this process only (not in a fresh one)")
    if chosen is not None:
        ax.axvline(chosen, color="tab:green", lw=2, label=f"chosen: keep {chosen}")
    notes = offline_notes(steps, len(rejected), len(elsewhere), drift=plot.drift, detection=plot.detection,
                          verified=plot.verified)
    ax.text(0.99, 0.02, "\n".join(notes), transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8})
    ax.set_ylabel("latency per batch (ms)")
    ax.set_title(plot.title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    if accuracy:
        ax2 = axes[1][0]
        counts = sorted(accuracy)
        ax2.plot(counts, [accuracy[n] for n in counts], "o-", ms=3, label=f"accuracy ({plot.accuracy_kind})")
        if plot.utility:
            ucounts = sorted(plot.utility)
            ax2.plot(ucounts, [plot.utility[n] for n in ucounts], "-", lw=1, label="utility")
        if chosen is not None:
            ax2.axvline(chosen, color="tab:green", lw=2)
        ax2.set_ylabel("accuracy / utility")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8, loc="lower right")
    axes[-1][0].set_xlabel("kept tokens")
    return _saved(path, figure)


def offline_notes(steps: Sequence, rejected: int, elsewhere: int, *, drift=None, detection: str | None = None,
                  verified=None) -> list[str]:
    """The lines of the offline plot's box: drift, the steps judged, what the run could have seen, verification."""
    notes = []
    if drift is not None:
        notes.append(f"drift during measurement: {drift.pct:.0f}% (reference {drift.reference_tokens}"
                     f"{drift.one_pass_words()})")
    plural = "s" if len(steps) != 1 else ""
    notes.append(f"{len(steps)} step{plural} confirmed, {rejected} rejected by paired test"
                 + (f", {elsewhere} in this process only" if elsewhere else ""))
    if detection is not None:
        notes.extend(textwrap.wrap(detection, NOTE_WIDTH, subsequent_indent="  "))
    for step in list(steps)[:STEPS_LISTED]:
        low, high = step.paired_ci_pct or (step.paired_pct, step.paired_pct)
        notes.append(f"  {step.upper_tokens}->{step.tokens}: {-step.paired_pct:+.1f}% [{-high:+.1f}, {-low:+.1f}]")
    if len(steps) > STEPS_LISTED:
        notes.append(f"  (+{len(steps) - STEPS_LISTED} more in the schedule)")
    if verified is not None:
        chosen = verified.chosen
        notes.append("verified: no candidate measurably faster, nothing removed" if chosen is None else
                     f"verified: {chosen.speedup:.3f}x [{chosen.speedup_ci[0]:.3f}, {chosen.speedup_ci[1]:.3f}] "
                     f"removing {chosen.remove}")
    return notes


def _saved(path: str | Path, figure) -> Path:
    try:
        return atomic_save_figure(path, figure)
    finally:
        _pyplot().close(figure)


def plot_benchmark(path: str | Path, title: str, rows: Sequence[Mapping]) -> Path:
    """Latency bars with IQR error bars, speedup vs unpruned, and accuracy against speedup where measured."""
    names = [row["method"] for row in rows]
    measured = [r for r in rows if r.get("accuracy") is not None]
    panels = 3 if measured else 2
    plt = _pyplot()
    figure, axes = plt.subplots(1, panels, figsize=(max(6, 1.6 * len(names) + 3) + 4 * (panels - 2), 3.6))
    left, right = axes[0], axes[1]
    latency, iqr = [r["latency_ms"] for r in rows], [r["latency_iqr_ms"] / 2 for r in rows]
    left.bar(names, latency, yerr=iqr, capsize=4, color="tab:blue")
    left.set_ylabel("latency per batch (ms, median ± IQR/2)")
    speedups = [r["speedup"] for r in rows]
    right.bar(names, speedups, color=["tab:green" if s >= 1 else "tab:red" for s in speedups])
    right.axhline(1.0, color="black", linewidth=0.8)
    right.set_ylabel("speedup vs unpruned")
    for axis in (left, right):
        axis.tick_params(axis="x", rotation=30)
    if measured:
        _accuracy_panel(axes[2], measured)
    figure.suptitle(title)
    figure.tight_layout()
    return _saved(path, figure)


def _accuracy_panel(axis, rows: Sequence[Mapping]) -> None:
    """Accuracy (95% Wilson interval) against measured speedup, a labelled point per variant."""
    for i, row in enumerate(rows):
        accuracy, low, high = row["accuracy"], row.get("accuracy_low"), row.get("accuracy_high")
        error = None if low is None or high is None else [[accuracy - low], [high - accuracy]]
        axis.errorbar([row["speedup"]], [accuracy], yerr=error, fmt="o", capsize=4)
        axis.annotate(row["method"], (row["speedup"], accuracy), textcoords="offset points",
                      xytext=(5, 5 if i % 2 == 0 else -12), fontsize=8)  # a tuned reducer can sit on the schedule
    axis.axvline(1.0, color="black", linewidth=0.8)
    axis.set(xlabel="measured speedup vs unpruned", ylabel="accuracy (95% interval)")


def plot_sweep(path: str | Path, title: str, speedups: Mapping[str, Mapping[tuple[int, int], float]],
               batch_sizes: Sequence[int], input_sizes: Sequence[int]) -> Path:
    """Heat-map of speedup per (batch, input size), one panel per variant, centred on break-even (1.0)."""
    names = list(speedups) or ["(no reduced variant)"]
    from matplotlib import colors

    figure, axes = _pyplot().subplots(1, len(names), figsize=(3.2 * len(names) + 1, 3.2), squeeze=False)
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


def plot_frontier(path: str | Path, title: str, rows: Sequence[Mapping], floor: float | None = None) -> Path:
    """Accuracy (search split, Wilson interval) against speedup, one series per family: hollow where predicted, filled
    where verified; the frontier as a line, the chosen schedule as a star, `floor` dashed, and a ring round each
    schedule the search images were too few to tell. Rows as `pomt.frontier.report.rows` gives them."""
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(9, 5.4))
    def series(r: Mapping) -> str:  # probes and proposals of one reducer's per-block search are one series
        return f"{r['method']} per block" if r["family"].startswith(("probe-", "search-")) else r["family"]

    families = list(dict.fromkeys(series(r) for r in rows))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, family in enumerate(families):
        colour, mine = palette[index % len(palette)], [r for r in rows if series(r) == family]
        accuracy = np.array([r["search_accuracy"] for r in mine], dtype=float)
        error = np.array([[r["search_accuracy"] - r["search_low"] for r in mine],
                          [r["search_high"] - r["search_accuracy"] for r in mine]], dtype=float)
        ax.errorbar([r["predicted_speedup"] for r in mine], accuracy, yerr=error, fmt="o", mfc="none",
                    color=colour, ms=5, lw=0.6, capsize=2, alpha=0.7, label=f"{family} (predicted)")
        verified = [r for r in mine if r["verified_speedup"] is not None]
        if verified:
            ax.errorbar([r["verified_speedup"] for r in verified], [r["search_accuracy"] for r in verified],
                        xerr=np.array([[r["verified_speedup"] - r["verified_speedup_low"] for r in verified],
                                       [r["verified_speedup_high"] - r["verified_speedup"] for r in verified]]),
                        fmt="s", color=colour, ms=6, capsize=3, label=f"{family} (verified)")
    front = sorted((r for r in rows if r["on_frontier"]), key=lambda r: r["predicted_speedup"])
    if front:
        ax.step([r["predicted_speedup"] for r in front], [r["search_accuracy"] for r in front], where="post",
                color="black", lw=1.0, label="frontier (predicted)")
    for verdict, colour, label in ((True, "tab:green", "certified on the held-out images"),
                                   (False, "tab:red", "a finalist not certified")):
        ringed = [r for r in rows if r.get("certified") is verdict]
        if ringed:
            ax.plot([r["predicted_speedup"] for r in ringed], [r["search_accuracy"] for r in ringed], "o",
                    mfc="none", mec=colour, ms=11, mew=1.0, label=label)
    for r in rows:
        if r["chosen"]:
            x = r["verified_speedup"] if r["verified_speedup"] is not None else r["predicted_speedup"]
            ax.plot([x], [r["search_accuracy"]], "*", color="gold", mec="black", ms=16, label="chosen", zorder=5)
    if floor is not None:
        ax.axhline(floor, color="tab:red", ls="--", lw=0.8, label="the drop asked (certified on held-out images)")
    ax.axvline(1.0, color="0.5", lw=0.6)
    ax.set_xlabel("speedup over the unpruned model (predicted; verified where measured, 95% CI)")
    ax.set_ylabel("accuracy on the search split (95% Wilson interval)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    figure.tight_layout()
    return _saved(path, figure)
