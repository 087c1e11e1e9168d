"""The latency curve: the search over kept-token counts (`pomt.measurement.search.LatencySearch`) on the
run's source, its journal told what the search settled on."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pomt.measurement.search import LatencySearch, SearchResult
from pomt.offline.config import Request
from pomt.offline.prepare import Run


@dataclass(frozen=True)
class Latency:
    """The search's result, the seconds it took, its journal (None on a replay), and the record of each
    confirmed step within reach measured again in a fresh process (`check_steps_in_fresh_process`)."""

    search: SearchResult
    seconds: float
    trace: Path | None = None
    fresh_steps: tuple[dict, ...] = ()


def measure_latency(request: Request, run: Run, reach: int) -> Latency:
    """Search the run's grid; candidate steps at `reach` kept tokens or more (those a schedule may land
    below) are examined first."""
    workload, config, settings = request.workload, request.config, request.settings
    started = time.perf_counter()
    search = LatencySearch(run.session, run.prepared.grid, run.geometry.num_tokens, settings,
                           adaptive=config.search == "adaptive", seed=workload.seed, focus_from=reach,
                           progress=workload.progress).run()
    seconds = time.perf_counter() - started
    journal = run.session.journal
    if journal is None:
        return Latency(search, seconds)
    journal.update_meta(passes=settings.passes, reps=search.reps,
                        drift=None if search.drift is None else search.drift.to_dict())
    return Latency(search, seconds, journal.path)
