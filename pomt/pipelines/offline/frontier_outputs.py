"""The frontier's files in a run's output set: `<stem>.frontier.csv` (one row per evaluated schedule),
`<stem>.frontier.json` (the same rows with what was searched and how) and `<stem>.frontier.png`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pomt.frontier.report import COLUMNS
from pomt.io import atomic_write_csv, atomic_write_json
from pomt.plots import plot_frontier

FRONTIER_SET = {"frontier_csv": "frontier.csv", "frontier_json": "frontier.json", "frontier_plot": "frontier.png"}


@dataclass(frozen=True)
class FrontierReport:
    """What the frontier's files hold: the rows, the JSON document, the unpruned accuracy less the drop asked (None: no
    drop asked) and the plot's title."""

    rows: list[dict]
    document: dict
    floor: float | None
    title: str


def write_frontier(folder: Path, names: Mapping[str, str], report: FrontierReport) -> dict[str, Path]:
    """The three files in `folder` (a staging folder), by kind."""
    return {
        "frontier_csv": atomic_write_csv(folder / names["frontier_csv"], report.rows, COLUMNS),
        "frontier_json": atomic_write_json(folder / names["frontier_json"], report.document),
        "frontier_plot": plot_frontier(folder / names["frontier_plot"], report.title, report.rows, report.floor),
    }
