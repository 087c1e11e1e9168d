"""Every schedule a frontier search evaluated, as table rows (`COLUMNS`) and as one JSON document, and their files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pomt.frontier.candidates import Candidate
from pomt.frontier.choice import Evaluated
from pomt.frontier.search import FrontierResult
from pomt.io import atomic_write_csv, atomic_write_json
from pomt.plots import plot_frontier
from pomt.stats import CONFIDENCE, Proportion
from pomt.verification.verify import CandidateResult

FORMAT = "pomt.frontier"
VERSION = 1
COLUMNS = ("key", "family", "method", "removal", "on_frontier", "chosen", "predicted_ms", "predicted_speedup",
           "verified_ms", "verified_speedup", "verified_speedup_low", "verified_speedup_high", "search_accuracy",
           "search_low", "search_high", "search_images", "search_lost", "search_gained", "search_drop_bound_points",
           "held_out_accuracy", "held_out_low", "held_out_high", "held_out_images", "held_out_lost",
           "held_out_gained", "certified", "held_out_drop_bound_points", "held_out_images_to_certify")


def _split(prefix: str, proportion: Proportion | None) -> dict:
    if proportion is None:
        return dict.fromkeys(f"{prefix}_{name}" for name in ("accuracy", "low", "high", "images", "lost", "gained"))
    low, high = proportion.interval()
    return {f"{prefix}_accuracy": round(proportion.value, 6), f"{prefix}_low": round(low, 6),
            f"{prefix}_high": round(high, 6), f"{prefix}_images": proportion.trials,
            f"{prefix}_lost": proportion.lost, f"{prefix}_gained": proportion.gained}


def row(point: Evaluated, baseline_ms: float, measured: CandidateResult | None, confidence: float = CONFIDENCE,
        certified: Mapping | None = None) -> dict:
    """One evaluated schedule as a table row (`rows` marks frontier and chosen); a finalist's `certified` row
    (`Certification.row`) adds its verdict, the bound it was judged on and the held-out images that would certify it."""
    bound = point.search.drop_bound(confidence)
    certified = certified or {}
    return {"key": point.candidate.key, "family": point.family, "method": point.candidate.method,
            "removal": ";".join(f"{b}={r}" for b, r in point.candidate.removal),
            "on_frontier": False, "chosen": False, "predicted_ms": round(point.predicted_ms, 5),
            "predicted_speedup": round(baseline_ms / point.predicted_ms, 5) if point.predicted_ms > 0 else None,
            "verified_ms": None if measured is None else round(measured.pruned_ms, 5),
            "verified_speedup": None if measured is None else round(measured.speedup, 5),
            "verified_speedup_low": None if measured is None else round(measured.speedup_ci[0], 5),
            "verified_speedup_high": None if measured is None else round(measured.speedup_ci[1], 5),
            **_split("search", point.search), **_split("held_out", point.held_out),
            "search_drop_bound_points": None if bound is None else round(100 * bound, 4),
            "certified": None if not certified else certified["verdict"] == "certified",
            "held_out_drop_bound_points": certified.get("bound_points"),
            "held_out_images_to_certify": certified.get("images_to_certify")}


def rows(result: FrontierResult, baseline_ms: float, chosen: Candidate | None,
         measured: Mapping[Candidate, CandidateResult], confidence: float = CONFIDENCE,
         certified: Mapping[str, Mapping] | None = None) -> list[dict]:
    """Every evaluated schedule, the unpruned one first, then fastest predicted first (`row`); `certified`: the
    finalists' rows by key."""
    front = {e.candidate for e in result.frontier}
    others = sorted((e for e in result.evaluated if not e.candidate.unpruned),
                    key=lambda e: (e.predicted_ms, e.candidate))
    certified = certified or {}
    return [{**row(e, baseline_ms, measured.get(e.candidate), confidence, certified.get(e.candidate.key)),
             "on_frontier": e.candidate in front, "chosen": e.candidate == chosen} for e in [result.baseline, *others]]


def document(result: FrontierResult, table: Sequence[dict], facts: Mapping, notes: Sequence[str]) -> dict:
    """The JSON document: `facts` (model, goal, times, costs, best uniform), the frontier's keys, notes, every row."""
    return {"format": FORMAT, "version": VERSION, **facts, "evals": result.evals, "notes": list(notes),
            "frontier": [e.candidate.key for e in result.frontier], "schedules": list(table)}


FRONTIER_SET = {"frontier_csv": "frontier.csv", "frontier_json": "frontier.json", "frontier_plot": "frontier.png"}


@dataclass(frozen=True)
class FrontierReport:
    """What the frontier's files hold; `floor`: the unpruned accuracy less the drop asked (None: none asked)."""

    rows: list[dict]
    document: dict
    floor: float | None
    title: str


def write_frontier(folder: Path, names: Mapping[str, str], report: FrontierReport) -> dict[str, Path]:
    """The three files in `folder` (a staging folder), by kind."""
    return {"frontier_csv": atomic_write_csv(folder / names["frontier_csv"], report.rows, COLUMNS),
            "frontier_json": atomic_write_json(folder / names["frontier_json"], report.document),
            "frontier_plot": plot_frontier(folder / names["frontier_plot"], report.title, report.rows, report.floor)}
