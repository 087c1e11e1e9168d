"""The frontier search made ready before anything is measured: the calibration images split into a search and
a held-out split and checked against the drop asked (`pomt.checks.check_drop_resolution`), the accuracy
journal beside the outputs opened (continued with --resume, refused when it belongs to another model)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pomt.checks import check_drop_resolution
from pomt.errors import SettingError
from pomt.frontier.calibration import SEARCH, Calibration, HostedCalibration, split_indices
from pomt.frontier.choice import Goal
from pomt.frontier.journal import AccuracyJournal, model_identity
from pomt.offline.accuracy import Sample
from pomt.offline.config import OfflineConfig, max_accuracy_drop
from pomt.offline.prepare import Run
from pomt.runtimes import parameter_dtype
from pomt.workload.prepare import Workload

JOURNAL = "frontier-journal.jsonl"


@dataclass(frozen=True)
class FrontierSetup:
    """The calibration images and their journal, and what the shipped schedule must meet."""

    calibration: Calibration | HostedCalibration  # hosted in a worker process while the frontier runs
    goal: Goal
    journal: Path


def journal_path(output_dir: str | Path, stem: str) -> Path:
    """`<output>/<stem>.frontier-journal.jsonl`: every measured (schedule, split) accuracy, one line each."""
    return Path(output_dir) / f"{stem}.{JOURNAL}"


def goal_of(config: OfflineConfig) -> Goal:
    """The goal the options ask: a drop (default 1 point, none with only a latency budget), a budget, a floor,
    and the confidence the accuracy goals are met at."""
    only_budget = config.latency_budget_ms is not None and config.max_accuracy_drop is None
    return Goal(None if only_budget else max_accuracy_drop(config), config.latency_budget_ms, config.min_accuracy,
                config.accuracy_confidence)


def prepare_frontier(workload: Workload, config: OfflineConfig, run: Run, sample: Sample) -> FrontierSetup:
    """Split and check the calibration images and open the journal (a run without --resume starts it afresh)."""
    dataset, kind = sample
    model, geometry = run.prepared.model, run.geometry
    if run.prepared.grid and min(run.prepared.grid) > geometry.prefix_tokens + 1:
        raise SettingError(f"the frontier prices schedules down to {geometry.prefix_tokens + 1} kept tokens, but the "
                           f"grid stops at {min(run.prepared.grid)}: leave --grid-token-stop out, or give --policy "
                           "utility")
    path = journal_path(workload.output_dir, run.setup.stem)
    goal = goal_of(config)
    if goal.max_drop_points is not None:
        search = split_indices(len(dataset), config.held_out, workload.seed)[SEARCH]
        check_drop_resolution(len(search), goal.max_drop_points)
    if not workload.resume:
        path.unlink(missing_ok=True)
    journal = AccuracyJournal(path, model_identity(model))
    device = run.setup.device if run.replay is None else "cpu"
    calibration = Calibration(model, dataset, kind, journal, held_out=config.held_out, seed=workload.seed,
                              batch_size=config.accuracy_batch_size, device=device, dtype=parameter_dtype(model),
                              progress=workload.progress)
    return FrontierSetup(calibration, goal, path)
