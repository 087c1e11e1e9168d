"""The verification again, in a fresh process: the promise must hold where the schedule is served.

A step near N can move from one process to the next, so the candidates are measured once more in a new interpreter
(`spawn`, the model rebuilt from the workload, same seed, rounds and criterion); a removal ships only when it
qualified in both. The confirmed steps within the policy's reach are checked the same way.
"""

from __future__ import annotations

import ctypes
import math
import multiprocessing
import pickle
import signal
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from pomt.device.allocator import STEADY_ADVICE
from pomt.device.fingerprint import Fingerprint
from pomt.formats.schedule import Schedule
from pomt.formats.trace import Visit
from pomt.measurement.robust import PairedEffect, paired_effect
from pomt.measurement.sources import LiveSource, MeasurementRun
from pomt.verification.verify import (
    CandidateResult,
    Criterion,
    Rounds,
    TimedModel,
    Verification,
    choose,
    schedule_forward_at,
    verify,
)
from pomt.workload.prepare import Prepared, Workload, live_run, prepare

Pair = tuple[int, int]
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent dies
Job = TypeVar("Job")
Answer = TypeVar("Answer")


@dataclass(frozen=True)
class FreshJob:
    """What the fresh process needs: the workload, the candidate schedules by kept tokens, rounds and criterion."""

    workload: Workload
    schedules: dict[int, Schedule]
    rounds: Rounds
    criterion: Criterion


@dataclass(frozen=True)
class StepJob:
    """The steps to check in a fresh process: the workload, each step's (low, high) counts and the rounds."""

    workload: Workload
    pairs: tuple[Pair, ...]
    rounds: Rounds


class FreshWorker:
    """A new interpreter (`spawn`) running work sent to it one call at a time, its globals kept, its errors raised
    here; it ignores SIGINT and dies with its parent; as a context manager, joined on exit (terminated on error)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        with _sigint_ignored():  # inherited by the new interpreter from its first instruction on
            self._pool = context.Pool(1, initializer=_quiet_child)

    def run(self, work: Callable[[Job], Answer], job: Job) -> Answer:
        """`work(job)` there; the worker is terminated where it raised or was interrupted."""
        try:
            return self._pool.apply(work, (job,))
        except BaseException:
            self._pool.terminate()
            raise

    def run_copied(self, work: Callable[[Job], Answer], job: Job) -> Answer:
        """`work(job)` there on a copy of `job` (`by_value`), with this process's thread count."""
        return self.run(_copied_call, (work, by_value(job), torch.get_num_threads()))

    def __enter__(self) -> FreshWorker:
        return self

    def __exit__(self, kind: type | None, *_: object) -> None:
        if kind is None:
            self._pool.close()
        else:  # raised or interrupted: the worker may be mid-work
            self._pool.terminate()
        self._pool.join()


def by_value(job: object) -> bytes:
    """`job` pickled with its tensors' data copied: torch's multiprocessing pickling would move their storage to
    shared memory, where the parent's forwards run slower while the worker lives."""
    return pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL)


def _copied_call(packed: tuple[Callable[[Job], Answer], bytes, int]) -> Answer:
    work, job, threads = packed
    torch.set_num_threads(threads)
    return work(pickle.loads(job))


def in_fresh_process(work: Callable[[Job], Answer], job: Job) -> Answer:
    """`work(job)` in a new `FreshWorker`, closed when it answered."""
    with FreshWorker() as worker:
        return worker.run(work, job)


@contextmanager
def _sigint_ignored() -> Iterator[None]:
    """SIGINT ignored while a process is started (in the main thread), so that it starts ignoring it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _quiet_child() -> None:
    """SIGINT ignored, warnings silenced, and on Linux killed with its parent (not left measuring beside a resume)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    warnings.simplefilter("ignore")
    with suppress(OSError, AttributeError):  # not Linux: the worker ends when it next reads its closed pipe
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def verify_in_fresh_process(job: FreshJob) -> Verification:
    """The job's schedules verified against the unpruned model in a new process."""
    return in_fresh_process(_verify_here, job)


def step_rounds_in_fresh_process(job: StepJob) -> dict[Pair, list[tuple[Visit, Visit]]]:
    """Each step's paired rounds ((low visit, high visit) per round), measured in a new interpreter."""
    return in_fresh_process(_step_rounds_here, job)


def _prepared_here(workload: Workload) -> tuple[Workload, Prepared]:
    """The workload built afresh in this process (never resumed, no progress bars)."""
    workload = replace(workload, resume=False, progress=False)
    return workload, prepare(workload)


def _step_rounds_here(job: StepJob) -> dict[Pair, list[tuple[Visit, Visit]]]:
    """The fresh process's side of a step check: each step's two counts visited back to back, every step once
    per round in a seeded order, the order within a pair reversed every other round."""
    workload, prepared = _prepared_here(job.workload)
    measuring = live_run(workload, prepared)
    rng = np.random.default_rng(job.rounds.seed)
    rounds: dict[Pair, list[tuple[Visit, Visit]]] = {pair: [] for pair in job.pairs}
    for index in range(job.rounds.rounds):
        for i in rng.permutation(len(job.pairs)):
            low, high = job.pairs[i]
            order = (high, low) if index % 2 == 0 else (low, high)
            measuring.begin_pass(index, order)
            taken = {n: measuring.visit(n, job.rounds.reps, index) for n in order}
            rounds[(low, high)].append((taken[low], taken[high]))
    return rounds


def step_holds(here: PairedEffect, rounds: list[tuple[Visit, Visit]], alpha: float,
               min_step: float) -> tuple[PairedEffect, bool]:
    """The step's paired effect in the fresh `rounds` and whether it holds: in the direction confirmed here,
    significant at `alpha` one-sided, at least half of `min_step` (a real step near it reads under half the time)."""
    fresh = paired_effect([b.median_ms for _, b in rounds], [a.median_ms for a, _ in rounds], offset=here.offset)
    change, confirmed = fresh.excess - 1.0, here.excess - 1.0
    same_side = math.copysign(1.0, change) == math.copysign(1.0, confirmed)
    return fresh, same_side and fresh.p_value / 2.0 < alpha and abs(change) >= min_step / 2.0


def _verify_here(job: FreshJob) -> Verification:
    workload, prepared = _prepared_here(job.workload)
    n = prepared.geometry.num_tokens
    timed = TimedModel(prepared.model, prepared.x, prepared.setup.device, workload.threads, workload.backend)
    forward_at = schedule_forward_at(timed, job.schedules, Path(workload.output_dir) / prepared.cache_dir)
    measuring = MeasurementRun(LiveSource(forward_at, timed.device, timed.threads, backend=timed.backend))
    return verify(measuring, n, dict.fromkeys(n - kept for kept in job.schedules), job.rounds, job.criterion,
                  progress=False)


def held_in_both(here: Verification, fresh: Verification, criterion: Criterion) -> tuple[CandidateResult | None, str]:
    """The candidate to ship of those that qualified in both processes (on the fresh measurements), and why."""
    qualified_here = {c.remove for c in here.candidates if c.qualifies}
    both = [c for c in fresh.candidates if c.remove in qualified_here]
    if not both:
        return None, "in a fresh process: none of the candidates that qualified here was measured"
    chosen, reason = choose(both, criterion.min_gain, criterion.min_step)
    return chosen, f"in a fresh process: {reason}"


def placement_hint(fingerprint: Fingerprint, what: str = "the removal") -> str | None:
    """What to tell a CPU user whose removal, or step within reach, did not hold in a fresh process while the host
    allocator ran with its defaults (`pomt.device.allocator`); None elsewhere."""
    if fingerprint.kind != "cpu" or fingerprint.allocator:
        return None
    return (f"{what} held in the measuring process, not in a fresh one: on CPU that can be memory placement "
            f"under glibc's adaptive mmap threshold; {STEADY_ADVICE}")


__all__ = ["FreshJob", "FreshWorker", "StepJob", "by_value", "held_in_both", "in_fresh_process", "placement_hint",
           "step_holds", "step_rounds_in_fresh_process", "verify_in_fresh_process"]
