"""The files a run leaves beside its journals: the curve CSV, the schedule JSON and the plot, each written
atomically under the run's stem."""

from __future__ import annotations

from pathlib import Path

from pomt.choice.policy import utility_values
from pomt.formats.curve import write_curve
from pomt.formats.schedule import Schedule, save_schedule
from pomt.measurement.drift import corrected_values
from pomt.pipelines.offline.config import OfflineConfig
from pomt.pipelines.offline.prepare import Run
from pomt.pipelines.offline.records import Findings
from pomt.plots import plot_offline


def write_outputs(folder: Path, run: Run, config: OfflineConfig, findings: Findings,
                  schedule: Schedule) -> dict[str, Path]:
    """`<stem>.curve.csv`, `<stem>.schedule.json` and `<stem>.png` in `folder`, by kind."""
    stem, search, accuracy = run.setup.stem, findings.latency.search, findings.accuracy
    return {
        "curve": write_curve(folder / f"{stem}.curve.csv", search.points, accuracy),
        "schedule": save_schedule(schedule, folder / f"{stem}.schedule.json"),
        "plot": plot(folder / f"{stem}.png", run, config, findings),
    }


def plot(path: Path, run: Run, config: OfflineConfig, findings: Findings) -> Path:
    """The curve with its steps, the candidates rejected, the choice and what verified it, A(n) and U(n)."""
    search, accuracy, verdict = findings.latency.search, findings.accuracy, findings.verdict
    setting = findings.ranking.setting
    utility = utility_values(setting, config.alpha) if setting.accuracy is not None else None
    title = (f"{run.geometry.model} on {run.setup.fingerprint.name or run.setup.device}, batch "
             f"{run.setup.batch_size}, {run.geometry.input_size[0]}x{run.geometry.input_size[1]} px")
    if run.replay is not None:
        title += f" (replay of {Path(run.replay).name})"
    return plot_offline(
        path, title, search.points, corrected_values(search.design), search.steps,
        [c for c in search.rejected_candidates if c.effect is not None], verdict.decision.kept_tokens,
        drift=search.drift, accuracy=accuracy.values if accuracy else None,
        accuracy_kind=accuracy.kind if accuracy else None, utility=utility, verified=verdict.verification,
        here_only=[(f["low"], f["high"]) for f in findings.latency.fresh_steps if not f["held"]],
        detection=search.detection_sentence(),
    )
