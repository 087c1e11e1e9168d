"""Every schedule a frontier search evaluated, as table rows and as one JSON document (pure): reducer,
removals, predicted latency, measured latency and speedup with their interval where verified, accuracy with
its Wilson interval on each split measured."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pomt.choice.binomial import Proportion
from pomt.choice.candidates import Candidate
from pomt.choice.frontier import FrontierResult
from pomt.choice.pareto import Evaluated
from pomt.choice.verify import CandidateResult

FORMAT = "pomt.frontier"
VERSION = 1
COLUMNS = (
    "key", "family", "method", "removal", "on_frontier", "chosen", "predicted_ms", "predicted_speedup",
    "verified_ms", "verified_speedup", "verified_speedup_low", "verified_speedup_high",
    "search_accuracy", "search_low", "search_high", "search_images",
    "held_out_accuracy", "held_out_low", "held_out_high", "held_out_images",
)


def _split(prefix: str, proportion: Proportion | None) -> dict:
    if proportion is None:
        return {f"{prefix}_accuracy": None, f"{prefix}_low": None, f"{prefix}_high": None, f"{prefix}_images": None}
    low, high = proportion.interval()
    return {f"{prefix}_accuracy": round(proportion.value, 6), f"{prefix}_low": round(low, 6),
            f"{prefix}_high": round(high, 6), f"{prefix}_images": proportion.trials}


def row(point: Evaluated, baseline_ms: float, on_frontier: bool, chosen: bool,
        measured: CandidateResult | None) -> dict:
    """One evaluated schedule as a table row (COLUMNS)."""
    return {
        "key": point.candidate.key, "family": point.family, "method": point.candidate.method,
        "removal": ";".join(f"{b}={r}" for b, r in point.candidate.removal),
        "on_frontier": on_frontier, "chosen": chosen, "predicted_ms": round(point.predicted_ms, 5),
        "predicted_speedup": round(baseline_ms / point.predicted_ms, 5) if point.predicted_ms > 0 else None,
        "verified_ms": None if measured is None else round(measured.pruned_ms, 5),
        "verified_speedup": None if measured is None else round(measured.speedup, 5),
        "verified_speedup_low": None if measured is None else round(measured.speedup_ci[0], 5),
        "verified_speedup_high": None if measured is None else round(measured.speedup_ci[1], 5),
        **_split("search", point.search), **_split("held_out", point.held_out),
    }


def rows(result: FrontierResult, baseline_ms: float, chosen: Candidate | None,
         measured: Mapping[Candidate, CandidateResult]) -> list[dict]:
    """Every evaluated schedule (the unpruned one first), fastest predicted first after it."""
    front = {e.candidate for e in result.frontier}
    others = sorted((e for e in result.evaluated if not e.candidate.unpruned),
                    key=lambda e: (e.predicted_ms, e.candidate))
    return [row(e, baseline_ms, e.candidate in front, e.candidate == chosen, measured.get(e.candidate))
            for e in [result.baseline, *others]]


def document(result: FrontierResult, table: Sequence[dict], facts: Mapping) -> dict:
    """The JSON document: what was searched and how (`facts`: model, goal, times, costs, best uniform),
    the frontier's keys, the search's notes, and every row."""
    return {"format": FORMAT, "version": VERSION, **facts, "evals": result.evals, "notes": list(result.notes),
            "frontier": [e.candidate.key for e in result.frontier], "schedules": list(table)}
