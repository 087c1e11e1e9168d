"""Where latency samples come from: the model on this machine (live) or a recorded trace (replay).

Both answer `visit(tokens, reps, pass_index) -> Visit`: `reps` timed forwards at a token count, after one untimed
forward where the runtime needs it, so search and verification run unchanged live or on a trace (`--replay`). A
`MeasurementRun` adds the journal: a resumed run is served the visits it already made before it measures anew.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import nn

from pomt.formats.trace import Trace, TraceWriter, Visit, rounded
from pomt.measurement.drift import drift_profile
from pomt.measurement.timing import fixed_threads, synchronize, time_calls
from pomt.runtimes import ProgramCache, ProgramFiles, build_forward, settles_every_visit

ForwardAt = Callable[[int], AbstractContextManager[Callable[[], object]]]
PAIRED = 2  # a pass of two counts is a paired round
PAIR_PROGRESS = 0.1  # seconds of pair gap a replay trades for each second nearer its clock
LATEST_START = 0.5  # a seeded replay starts its clock within the first half of the recording's span
OPEN_PROGRAMS = 4  # compiled programs (one per count) a live source keeps open


class Source(Protocol):
    """Anything that can time forwards at a kept-token count. It may also have `begin_pass(pass_index, members)` and
    `begin_unit(pass_index, members)`, told the counts a pass, or the next back-to-back unit, will visit, and
    `left(tokens)`, the visits of a count it can still serve."""

    def visit(self, tokens: int, reps: int, pass_index: int) -> Visit: ...


def live_forwards(model: nn.Module, x: torch.Tensor, *, backend: str = "eager", threads: int | None = None,
                  cache_dir: Path | None = None) -> ForwardAt:
    """`forward_at(n)`: a context whose callable runs one forward of `model(x)` with n tokens kept, in `backend`; the
    programs of runtimes other than eager stay open for the OPEN_PROGRAMS counts used last."""
    return ProgramCache(lambda n: build_forward(model, x, backend=backend, tokens=n, threads=threads,
                                                files=ProgramFiles(cache_dir, "latency")),
                        keep=0 if backend == "eager" else OPEN_PROGRAMS)


class LiveSource:
    """Times forwards on this machine, after an untimed forward at every visit, or at a count's first visit only
    where `backend` (the runtime `forward_at` runs; None: not told) on `device` keeps what it sets up."""

    def __init__(self, forward_at: ForwardAt, device: str = "cpu", threads: int | None = None,
                 clock: Callable[[], float] = time.perf_counter, start_s: float = 0.0, backend: str | None = None):
        self.forward_at, self.device, self.threads = forward_at, device, threads
        self._clock = clock
        self._origin = clock() - start_s
        self._settle_always = backend is None or settles_every_visit(device, backend)
        self._settled: set[int] = set()

    def now(self) -> float:
        """Seconds since the source started (continuing a resumed trace's time line)."""
        return self._clock() - self._origin

    def visit(self, tokens: int, reps: int, pass_index: int) -> Visit:
        with fixed_threads(self.threads) as threads, torch.inference_mode(), self.forward_at(tokens) as forward:
            if self._settle_always or tokens not in self._settled:
                forward()  # untimed: a new shape's first forward pays for kernel and memory set-up
                synchronize(self.device)
                self._settled.add(tokens)
            start = self.now()
            samples = time_calls(forward, self.device, reps, threads)
        return Visit(tokens, pass_index, start, tuple(samples))


class TraceExhausted(Exception):
    """A replay was asked for more visits of a count than its trace holds."""

    WORDS = "the trace holds no more visits"  # how its message begins (what a rejected candidate's reason quotes)

    @classmethod
    def of(cls, counts: object) -> TraceExhausted:
        return cls(f"{cls.WORDS} of {counts} tokens")


class ReplaySource:
    """Serves a recorded trace as if it were the device. A virtual clock starts at `start` (a share of the
    recording's span) and advances by what each served visit costs; a visit gets the unused recorded visit of its
    count nearest in time to the clock, its samples scaled by the recording's drift at the clock over that when it
    was recorded. A paired round is served the two unused visits closest in time to each other. A recorded visit is
    never served twice (`TraceExhausted`), and keeps its recorded length whatever `reps` asks."""

    def __init__(self, trace: Trace, start: float = 0.0):
        if not 0.0 <= start < 1.0:
            raise ValueError(f"a replay's start is a share of the recording's span in [0, 1), got {start}")
        self.trace = trace
        self._visits: dict[int, list[Visit]] = defaultdict(list)
        self._recorded_drift: dict[int, list[float]] = defaultdict(list)  # log drift when each was recorded
        _, drift_log = drift_profile(trace.visits)
        for visit, log_drift in zip(trace.visits, drift_log, strict=True):
            self._visits[visit.tokens].append(visit)
            self._recorded_drift[visit.tokens].append(float(log_drift))
        in_time = np.argsort([v.t_s for v in trace.visits], kind="stable")
        self._drift_times = np.array([trace.visits[i].t_s for i in in_time])
        self._drift_log = np.asarray(drift_log)[in_time]
        self._times = {n: np.array([v.t_s for v in visits]) for n, visits in self._visits.items()}
        self._free = {n: np.ones(len(visits), dtype=bool) for n, visits in self._visits.items()}
        self._plan: tuple[int, dict[int, int]] | None = None  # (paired round, the recorded visit of each side)
        self.preferred_reps = int(np.median([len(v.samples_ms) for v in trace.visits]))
        first, last = self._drift_times[0], self._drift_times[-1]
        self.clock_s = float(first + start * (last - first))
        self.served = 0
        self._settle_always = settles_every_visit(trace.device_kind, trace.backend)
        self._settled: set[int] = set()

    @classmethod
    def seeded(cls, trace: Trace, seed: int | Sequence[int]) -> ReplaySource:
        """A replay whose clock starts at a seeded point of the recording's first LATEST_START of its span."""
        return cls(trace, start=float(np.random.default_rng(seed).uniform(0.0, LATEST_START)))

    @property
    def counts(self) -> list[int]:
        return sorted(self._visits)

    def begin_pass(self, pass_index: int, members: Sequence[int]) -> None:
        """For a paired round, choose the two recorded visits it is served (see the class docstring)."""
        self.begin_unit(pass_index, members)

    def begin_unit(self, pass_index: int, members: Sequence[int]) -> None:
        """The next visits of `pass_index` are `members`, back to back: two counts are served as a paired round."""
        counts = sorted(set(members))
        self._plan = None
        if len(counts) != PAIRED or any(n not in self._visits for n in counts):
            return
        (a, b), free = counts, [np.flatnonzero(self._free[n]) for n in counts]
        if not (free[0].size and free[1].size):
            return
        ta, tb = self._times[a][free[0]], self._times[b][free[1]]
        gap = np.abs(ta[:, None] - tb[None, :]) + PAIR_PROGRESS * np.abs(ta[:, None] - self.clock_s)
        i, j = np.unravel_index(np.argmin(gap), gap.shape)
        self._plan = (pass_index, {a: int(free[0][i]), b: int(free[1][j])})

    def left(self, tokens: int) -> int:
        """Recorded visits of `tokens` not served yet."""
        return int(self._free[tokens].sum()) if tokens in self._free else 0

    def visit(self, tokens: int, reps: int, pass_index: int) -> Visit:
        if tokens not in self._visits:
            raise KeyError(f"the trace has no samples at {tokens} tokens")
        free = np.flatnonzero(self._free[tokens])
        if free.size == 0:
            raise TraceExhausted.of(tokens)
        planned = self._plan[1].get(tokens) if self._plan is not None and self._plan[0] == pass_index else None
        if planned is not None and self._free[tokens][planned]:
            pick = planned
        else:
            pick = int(free[np.argmin(np.abs(self._times[tokens][free] - self.clock_s))])
        self._free[tokens][pick] = False
        recorded = self._visits[tokens][pick]
        self.served += 1
        return self._moved_to_clock(recorded, self._recorded_drift[tokens][pick], pass_index)

    def _moved_to_clock(self, recorded: Visit, recorded_log_drift: float, pass_index: int) -> Visit:
        """`recorded` as if measured now, at the clock's time and the recording's drift there; the clock advances."""
        drift_now = float(np.interp(self.clock_s, self._drift_times, self._drift_log))
        samples = tuple(ms * math.exp(drift_now - recorded_log_drift) for ms in recorded.samples_ms)
        settles = self._settle_always or recorded.tokens not in self._settled
        self._settled.add(recorded.tokens)
        start = self.clock_s + (float(np.median(samples)) / 1e3 if settles else 0.0)
        self.clock_s = start + sum(samples) / 1e3
        return Visit(recorded.tokens, pass_index, start, samples)


class MeasurementRun:
    """A source plus the run's journal and visit count: what search and verification measure through. A resumed
    run is served its journal's visits in order while they match what is asked (count, pass, reps); at the first
    mismatch the rest of the journal is dropped and measuring continues live."""

    def __init__(self, source: Source, journal: TraceWriter | None = None,
                 on_visit: Callable[[Visit], None] | None = None):
        self.source = source
        self.journal = journal
        self.on_visit = on_visit
        self.visits = 0  # visits asked for in this run, served from the journal or measured
        self.measured = 0  # visits measured in this run
        self._replayed = 0
        self._resumable = len(journal.visits) if journal is not None else 0  # what the journal held at start

    def begin_pass(self, pass_index: int, members: Sequence[int]) -> None:
        """Tell the source which counts the pass will visit (it may use it, see `Source`)."""
        self._tell("begin_pass", pass_index, members)

    def begin_unit(self, pass_index: int, members: Sequence[int]) -> None:
        """Tell the source which counts it will visit next, back to back (see `Source`)."""
        self._tell("begin_unit", pass_index, members)

    def _tell(self, what: str, pass_index: int, members: Sequence[int]) -> None:
        begin = getattr(self.source, what, None)
        if begin is not None and self._replayed >= self._resumable:  # not while the journal serves
            begin(pass_index, members)

    def can_visit(self, tokens: int) -> bool:
        """Whether the source can serve a visit of `tokens` (a replay only as long as its trace holds one)."""
        left = getattr(self.source, "left", None)
        return left is None or self._replayed < self._resumable or left(tokens) > 0

    def visit(self, tokens: int, reps: int, pass_index: int) -> Visit:
        visit = self._from_journal(tokens, reps, pass_index)
        if visit is None:
            visit = self.source.visit(tokens, reps, pass_index)
            visit = self.journal.add(visit) if self.journal is not None else rounded(visit)
            self.measured += 1
        self.visits += 1
        if self.on_visit is not None:
            self.on_visit(visit)
        return visit

    def _from_journal(self, tokens: int, reps: int, pass_index: int) -> Visit | None:
        if self.journal is None or self._replayed >= self._resumable:
            return None
        stored = self.journal.visits[self._replayed]
        if (stored.tokens, stored.pass_index, len(stored.samples_ms)) != (tokens, pass_index, reps):
            self.journal.truncate(self._replayed)
            self._resumable = self._replayed
            return None
        self._replayed += 1
        return stored


def journal_end_s(journal: TraceWriter | None) -> float:
    """Where a resumed run's clock continues: just after the journal's last forward."""
    if journal is None or not journal.visits:
        return 0.0
    last = journal.visits[-1]
    return last.t_s + sum(last.samples_ms) / 1e3 + 1.0


def calibrate_reps(seconds_per_forward: float, visit_s: float, most: int = 8) -> int:
    """Timed forwards per visit so that a visit lasts about `visit_s` (at least 1, at most `most`)."""
    if not math.isfinite(seconds_per_forward) or seconds_per_forward <= 0:
        return most
    return max(1, min(most, round(visit_s / seconds_per_forward)))
