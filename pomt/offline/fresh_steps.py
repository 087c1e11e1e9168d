"""The confirmed steps a schedule could land below, measured again in a fresh process (`pomt.verification.fresh`):
a step that does not hold there is rejected before the policy sees it."""

from __future__ import annotations

from dataclasses import replace

from pomt.measurement.confirmation import Confirmation, confirmed_steps
from pomt.measurement.paired import PairedEffect
from pomt.measurement.search import SearchSettings
from pomt.offline.latency import Latency
from pomt.verification.fresh import StepJob, step_holds, step_rounds_in_fresh_process
from pomt.workload.prepare import Workload


def check_steps_in_fresh_process(workload: Workload, settings: SearchSettings, latency: Latency,
                                 reach: int) -> Latency:
    """The latency with its confirmed steps at `reach` kept tokens or more measured again in a fresh process;
    a step that does not hold there is rejected, its reason saying both measurements, and every check is
    recorded (`Latency.fresh_steps`). The other policies choose from the curve, not from its steps: their
    removal is checked in the fresh process by the verification alone."""
    search = latency.search
    within = [c for c in search.candidates if c.accepted and c.effect is not None and c.low >= reach]
    if not within:
        return latency
    job = StepJob(workload, tuple((c.low, c.high) for c in within), search.reps, settings.confirm_rounds)
    rounds = step_rounds_in_fresh_process(job)
    records, verdicts = [], {}
    for c in within:
        fresh, held = step_holds(c.effect, rounds[(c.low, c.high)], settings.step_alpha, settings.min_step)
        records.append(fresh_record(c, fresh, held))
        if not held:
            verdicts[(c.low, c.high)] = here_only(c, fresh)
    if verdicts:
        candidates = [verdicts.get((c.low, c.high), c) for c in search.candidates]
        search = replace(search, candidates=candidates, steps=confirmed_steps(search.points, candidates))
    return replace(latency, search=search, fresh_steps=tuple(records))


def fresh_record(step: Confirmation, fresh: PairedEffect, held: bool) -> dict:
    """What the schedule's measurement records of one step's check: both effects, and whether it held."""
    here_pct, fresh_pct = step.effect.saving_pct[0], fresh.saving_pct
    return {"low": step.low, "high": step.high, "held": held, "paired_pct": round(here_pct, 3),
            "fresh_pct": round(fresh_pct[0], 3),
            "fresh_ci_pct": [round(fresh_pct[1][0], 3), round(fresh_pct[1][1], 3)],
            "fresh_p_value": float(f"{fresh.p_value:.3g}"), "rounds": fresh.pairs}


def here_only(step: Confirmation, fresh: PairedEffect) -> Confirmation:
    """The step rejected: confirmed here, not in the fresh process."""
    low, high = fresh.saving_pct[1]
    return replace(step, accepted=False, kind="none",
                   reason=(f"{step.reason}, here only: in a fresh process {-fresh.saving_pct[0]:+.1f}% "
                           f"[{-high:+.1f}, {-low:+.1f}] (p = {fresh.p_value:.2g}, {fresh.pairs} rounds)"))
