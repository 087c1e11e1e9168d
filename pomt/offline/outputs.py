"""The files a run leaves beside its journals: the curve CSV, the schedule JSON, the plot and (where measured)
the accuracy CSV or the frontier's CSV, JSON and plot, written as one set (`pomt.io.staged_set`): a run
killed at any moment leaves the previous set or the new one, and what it left half-written is cleared when
the next run starts (`prepare_outputs`)."""

from __future__ import annotations

from pathlib import Path

from pomt.accuracy import save_accuracy_curve
from pomt.checks import check_output_file
from pomt.formats.curve import write_curve
from pomt.formats.schedule import Schedule, save_schedule
from pomt.frontier.report import FRONTIER_SET, FrontierReport, write_frontier
from pomt.io import clear_stale, staged_set
from pomt.measurement.drift import corrected_values
from pomt.offline.config import OfflineConfig
from pomt.offline.prepare import Run
from pomt.offline.records import Findings
from pomt.plots import plot_offline
from pomt.policies import utility_values

SET = {"curve": "curve.csv", "accuracy": "accuracy.csv", "plot": "png", "schedule": "schedule.json",
       **FRONTIER_SET}


def output_names(stem: str) -> dict[str, str]:
    """The file names of a run's set, by kind."""
    return {kind: f"{stem}.{suffix}" for kind, suffix in SET.items()}


def prepare_outputs(folder: Path, stem: str) -> None:
    """Before anything is measured: finish or remove what a killed run of this stem left in `folder`
    (`pomt.io.clear_stale`), and refuse a folder standing where one of the set's files must go."""
    clear_stale(folder, stem)
    for name in output_names(stem).values():
        check_output_file(folder / name, "output file")


def write_outputs(folder: Path, run: Run, config: OfflineConfig, findings: Findings,
                  schedule: Schedule, frontier: FrontierReport | None = None) -> dict[str, Path]:
    """`<stem>.curve.csv`, `<stem>.schedule.json`, `<stem>.png` (and `<stem>.accuracy.csv` where A(n) was
    measured, `<stem>.frontier.csv/.json/.png` where a frontier was searched) in `folder` as one set, the
    schedule moved into place last; by kind."""
    search, accuracy = findings.latency.search, findings.accuracy
    names = output_names(run.setup.stem)
    with staged_set(folder, run.setup.stem, last=[names["schedule"]]) as staging:
        written = {
            "curve": write_curve(staging / names["curve"], search.points, accuracy),
            "schedule": save_schedule(schedule, staging / names["schedule"]),
            "plot": plot(staging / names["plot"], run, config, findings),
        }
        if findings.measured_accuracy:
            written["accuracy"] = save_accuracy_curve(staging / names["accuracy"], accuracy)
        if frontier is not None:
            written |= write_frontier(staging, names, frontier)
    return {kind: folder / path.name for kind, path in written.items()}


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
        detection=search.detection_sentence(), reach=None if search.detection is None else search.detection.reach,
        priced=setting.curve,
    )
