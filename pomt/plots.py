"""PNG plots of offline results: latency curve with steps, accuracy and utility, the chosen count."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

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
    try:
        return atomic_save_figure(path, figure)
    finally:
        plt.close(figure)
