"""The verification again, in a fresh process: the promise must hold where the schedule is served.

On the 2-core VM the position of a step near N changes from one process to the next (deit_small at batch 4:
194 kept tokens read 0.92, 0.98, 1.00 and 0.91 of N in four processes; README, "A step can move between
processes"). A search confirms the steps of the process it runs in, and the verification beside it measures
the same process, so a removal it ships can rest on a step that the serving process does not have. The
offline computation therefore measures its candidates once more in a new interpreter (`spawn`): the model
built afresh from the workload (random weights: latency does not depend on them), the same input seed, the
same paired rounds and criterion (`pomt.verify.verify`). A removal ships only when it qualified in both.
"""

from __future__ import annotations

import multiprocessing
from dataclasses import dataclass, replace
from pathlib import Path

from pomt.schedule import Schedule
from pomt.sources import LiveSource, Session
from pomt.verify import CandidateResult, Verification, choose, schedule_forward_at, verify
from pomt.workload import Workload, prepare


@dataclass(frozen=True)
class FreshJob:
    """What the fresh process needs: the workload to rebuild, the candidate schedules (by kept tokens: the
    removals verified) and the verification's settings."""

    workload: Workload
    schedules: dict[int, Schedule]
    reps: int
    rounds: int
    min_gain: float
    min_step: float
    alpha: float


def verify_in_fresh_process(job: FreshJob) -> Verification:
    """Run `job` in a new interpreter and return its verification (errors there are raised here)."""
    context = multiprocessing.get_context("spawn")
    with context.Pool(1) as pool:
        return pool.apply(_verify_here, (job,))


def _verify_here(job: FreshJob) -> Verification:
    """The fresh process's side: build the workload, patch through each candidate schedule, verify."""
    workload = replace(job.workload, resume=False, progress=False)
    prepared = prepare(workload)
    n = prepared.geometry.num_tokens
    forward_at = schedule_forward_at(prepared.model, prepared.x, job.schedules, backend=workload.backend,
                                     device=prepared.setup.device, threads=workload.threads,
                                     cache_dir=Path(workload.output_dir) / prepared.cache_dir)
    session = Session(LiveSource(forward_at, prepared.setup.device, workload.threads))
    return verify(session, n, [n - kept for kept in job.schedules], reps=job.reps, rounds=job.rounds,
                  min_gain=job.min_gain, min_step=job.min_step, alpha=job.alpha, seed=workload.seed, progress=False)


def held_in_both(here: Verification, fresh: Verification, min_gain: float,
                 min_step: float) -> tuple[CandidateResult | None, str]:
    """The candidate to ship among those that qualified in both processes (chosen on the fresh process's
    measurements, as `pomt.verify.choose` chooses), and the fresh process's verdict in one sentence."""
    qualified_here = {c.remove for c in here.candidates if c.qualifies}
    both = [c for c in fresh.candidates if c.remove in qualified_here]
    if not both:
        return None, "in a fresh process: none of the candidates that qualified here was measured"
    chosen, reason = choose(both, min_gain, min_step)
    return chosen, f"in a fresh process: {reason}"


def placement_hint(fingerprint: dict) -> str | None:
    """What to tell a CPU user whose removal did not hold in a fresh process while the host allocator ran
    with its defaults (`benchmarks/placement.py`: under glibc's adaptive mmap threshold some placements ran
    N 6-11% slower than N - 3, none with the threshold fixed); None elsewhere."""
    if fingerprint.get("kind") != "cpu" or fingerprint.get("allocator"):
        return None
    return ("the removal held only in the process that found its step: on CPU that can be memory placement "
            "under glibc's adaptive mmap threshold; measure and serve with MALLOC_MMAP_THRESHOLD_ set "
            "(or another fixed allocator) to compare like with like (benchmarks/placement.py)")


__all__ = ["FreshJob", "held_in_both", "placement_hint", "verify_in_fresh_process"]
