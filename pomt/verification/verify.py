"""Checks of a schedule on this machine before it ships: a schedule is a promise, so it is measured.

`verify` times the patched model (through `pomt.apply_schedule`) against the unpruned one in seeded, shuffled
rounds, each visit corrected for drift; a candidate qualifies when its paired speedup is significant and at least
1 + `min_gain`, and the one shipped removes the fewest tokens among those within `min_step` of the fastest.
`verify_rounds` gives short forwards more rounds; `measure_gpu_work` says whether a GPU schedule is launch-bound.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from pomt.deploy.apply import apply_schedule
from pomt.formats.schedule import Schedule
from pomt.formats.schedule_parts import VerificationRecord
from pomt.formats.trace import Visit
from pomt.measurement.drift import Drift, drift, drift_profile
from pomt.measurement.robust import paired_effect
from pomt.measurement.sources import ForwardAt, MeasurementRun
from pomt.measurement.timing import profile_forward
from pomt.models.geometry import model_geometry
from pomt.patching import unpatch
from pomt.runtimes import Forward, ProgramCache, ProgramFiles, build_forward


@dataclass(frozen=True, eq=False)
class TimedModel:
    """A model, the input it is timed on, and where its forwards run (threads None: torch's)."""

    model: nn.Module
    x: torch.Tensor
    device: str = "cpu"
    threads: int | None = None
    backend: str = "eager"


@dataclass(frozen=True)
class Rounds:
    """`rounds` paired rounds in a seeded order, `reps` timed forwards a visit (None: calibrated, where it is)."""

    rounds: int
    reps: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class Criterion:
    """A candidate qualifies at a speedup of 1 + `min_gain`, significant at `alpha`; `min_step`: see `choose`."""

    min_gain: float = 0.03
    min_step: float = 0.03
    alpha: float = 0.01


def schedule_forward_at(timed: TimedModel, schedules: Mapping[int, Schedule],
                        cache_dir: Path | None = None) -> ForwardAt:
    """`forward_at(kept)`: the unpruned model at N kept tokens, else the model patched with the schedule keeping
    that many, in its runtime (eager: unpatched after the visit; others: exported once per schedule)."""
    model, backend = timed.model, timed.backend
    num_tokens = model_geometry(model).num_tokens

    def build(kept: int) -> Forward:
        if kept == num_tokens:
            return build_forward(model, timed.x, backend=backend, threads=timed.threads,
                                 files=ProgramFiles(cache_dir, "latency"))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # candidates are unverified by construction
            apply_schedule(model, schedules[kept])
        try:
            forward = build_forward(model, timed.x, backend=backend, threads=timed.threads,
                                    files=ProgramFiles(cache_dir, "latency"))
        except BaseException:
            unpatch(model)
            raise
        if backend == "eager":
            return Forward(forward, forward.backend, None, release=lambda: (forward.close(), unpatch(model)))
        unpatch(model)  # the exported program keeps the patched graph
        return forward

    return ProgramCache(build, keep=0 if backend == "eager" else len(schedules) + 1)


ROUNDS_FACTOR = 4


def verify_rounds(min_rounds: int, seconds: float, forward_ms: float, reps: int, visits: int) -> int:
    """Rounds of `visits` visits of `reps` forwards of about `forward_ms`: as many as fill `seconds`, within
    `min_rounds` and ROUNDS_FACTOR x `min_rounds`."""
    round_ms = forward_ms * max(1, reps) * max(1, visits)
    if not (math.isfinite(round_ms) and round_ms > 0):
        return min_rounds
    return max(min_rounds, min(ROUNDS_FACTOR * min_rounds, math.ceil(1e3 * seconds / round_ms)))


@dataclass(frozen=True)
class CandidateResult:
    """One candidate removal as measured against the unpruned model."""

    remove: int
    pruned_ms: float
    speedup: float
    speedup_ci: tuple[float, float]
    p_value: float
    qualifies: bool
    predicted_ms: float | None = None

    def to_dict(self) -> dict:
        return {"remove": self.remove, "pruned_ms": round(self.pruned_ms, 4), "speedup": round(self.speedup, 4),
                "speedup_ci": [round(self.speedup_ci[0], 4), round(self.speedup_ci[1], 4)],
                "p_value": float(f"{self.p_value:.3g}"), "qualifies": self.qualifies,
                "predicted_ms": None if self.predicted_ms is None else round(self.predicted_ms, 4)}


@dataclass(frozen=True)
class Verification:
    """What the patched model delivered: each candidate measured, the one to ship (or None), and why."""

    unpruned_ms: float
    candidates: tuple[CandidateResult, ...]
    chosen: CandidateResult | None
    reason: str
    rounds: int
    reps: int
    drift: Drift | None

    def record(self, fingerprint_hash: str) -> VerificationRecord:
        """The schedule's `verified` object."""
        chosen = self.chosen
        predicted = chosen.predicted_ms if chosen else None
        return VerificationRecord(
            unpruned_ms=round(self.unpruned_ms, 4),
            pruned_ms=round(chosen.pruned_ms, 4) if chosen else round(self.unpruned_ms, 4),
            speedup=round(chosen.speedup, 4) if chosen else 1.0,
            speedup_ci=(round(chosen.speedup_ci[0], 4), round(chosen.speedup_ci[1], 4)) if chosen else (1.0, 1.0),
            predicted_ms=None if predicted is None else round(predicted, 4),
            prediction_error=None if predicted is None else round(chosen.pruned_ms / predicted - 1.0, 4),
            candidates=tuple(c.to_dict() for c in self.candidates), samples=self.rounds * self.reps,
            rounds=self.rounds, reason=self.reason, drift=None if self.drift is None else self.drift.to_dict(),
            device_fingerprint_hash=fingerprint_hash)


def verify(measuring: MeasurementRun, num_tokens: int, removals: Mapping[int, float | None], rounds: Rounds,
           criterion: Criterion = Criterion(), *, progress: bool = True) -> Verification:
    """Measure the candidate removals against the unpruned model and choose; `removals[remove]`: the predicted
    latency over the unpruned model's (None: none), judged against the unpruned latency measured here."""
    predicted_ratio = {r: ratio for r, ratio in removals.items() if r > 0}
    removed = sorted(predicted_ratio)
    rng = np.random.default_rng(rounds.seed)
    kept = [num_tokens] + [num_tokens - r for r in removed]
    visits: list[Visit] = []
    with tqdm(total=rounds.rounds * len(kept), desc="verify", unit="visit", disable=not progress) as bar:
        for r in range(rounds.rounds):
            order = [int(k) for k in rng.permutation(kept)]
            measuring.begin_pass(r + 1, order)
            for k in order:
                visits.append(measuring.visit(k, rounds.reps, r + 1))
                bar.update(1)
    _, drift_log = drift_profile(visits)
    value: dict[tuple[int, int], float] = {(v.tokens, v.pass_index): v.median_ms / math.exp(g)
                                           for v, g in zip(visits, drift_log, strict=True)}
    passes = range(1, rounds.rounds + 1)
    unpruned = [value[(num_tokens, p)] for p in passes]
    unpruned_ms = float(np.median(unpruned))
    results = []
    for remove in removed:
        effect = paired_effect(unpruned, [value[(num_tokens - remove, p)] for p in passes])
        speedup, ci = 1.0 / effect.ratio, (1.0 / effect.ci[1], 1.0 / effect.ci[0])
        ratio = predicted_ratio[remove]
        qualifies = effect.p_value < criterion.alpha and ci[0] > 1.0 and speedup >= 1.0 + criterion.min_gain
        results.append(CandidateResult(remove, unpruned_ms * effect.ratio, speedup, ci, effect.p_value, qualifies,
                                       None if ratio is None else unpruned_ms * ratio))
    chosen, reason = choose(results, criterion.min_gain, criterion.min_step)
    return Verification(unpruned_ms, tuple(results), chosen, reason, rounds.rounds, rounds.reps,
                        drift(visits, num_tokens))


def choose(results: Sequence[CandidateResult], min_gain: float, min_step: float) -> tuple[CandidateResult | None, str]:
    """The candidate to ship and the reason, in one sentence."""
    if not results:
        return None, "no candidate removal to verify"
    qualifying = [c for c in results if c.qualifies]
    if not qualifying:
        best = max(results, key=lambda c: c.speedup)
        return None, (f"no candidate is measurably faster by {min_gain:.0%} or more: the best, removing {best.remove}, "
                      f"measured {best.speedup:.3f}x (95% CI {best.speedup_ci[0]:.3f}-{best.speedup_ci[1]:.3f})")
    fastest = max(qualifying, key=lambda c: c.speedup)
    chosen = min((c for c in qualifying if c.speedup >= fastest.speedup / (1.0 + min_step)), key=lambda c: c.remove)
    return chosen, (f"measured {chosen.speedup:.3f}x (95% CI {chosen.speedup_ci[0]:.3f}-{chosen.speedup_ci[1]:.3f}) "
                    f"removing {chosen.remove}"
                    + ("" if chosen is fastest else f", within {min_step:.0%} of the fastest candidate"))


# where kernels take less GPU time than the host takes to issue them, latency follows the host's speed
BUSY_FLOOR = 0.85  # below this share of the verified forward spent in GPU work, the forward waits on its host


def waits_on_host(gpu_ms: float, wall_ms: float) -> bool:
    """Whether a forward whose kernels took `gpu_ms` of GPU time in `wall_ms` waited on its host."""
    return gpu_ms / wall_ms < BUSY_FLOOR


@dataclass(frozen=True)
class GpuWork:
    """GPU time (ms) and kernels a forward, unpruned and shipped, and the schedule's verified latency (ms)."""

    unpruned_ms: float
    pruned_ms: float
    unpruned_kernels: float
    pruned_kernels: float
    wall_ms: float

    @property
    def busy(self) -> float:
        """The share of the verified forward the GPU spent in the schedule's kernels."""
        return self.pruned_ms / self.wall_ms

    @property
    def gpu_speedup(self) -> float:
        """The speedup at the GPU's own pace: unpruned GPU time over the schedule's."""
        return self.unpruned_ms / self.pruned_ms

    @property
    def launch_bound(self) -> bool:
        return waits_on_host(self.pruned_ms, self.wall_ms)

    def to_dict(self) -> dict:
        return {"unpruned_ms": round(self.unpruned_ms, 4), "pruned_ms": round(self.pruned_ms, 4),
                "unpruned_kernels": round(self.unpruned_kernels, 1), "pruned_kernels": round(self.pruned_kernels, 1),
                "wall_ms": round(self.wall_ms, 4), "busy": round(self.busy, 3),
                "gpu_speedup": round(self.gpu_speedup, 4), "launch_bound": self.launch_bound}

    def note(self, verified_speedup: float) -> str | None:
        """A sentence where the schedule was launch-bound here; None where the GPU was busy enough."""
        if not self.launch_bound:
            return None
        return (f"launch-bound on this host: the GPU worked {self.pruned_ms:.2f} ms of the schedule's "
                f"{self.wall_ms:.2f} ms forward ({self.busy:.0%}; {self.pruned_kernels:.0f} kernels against "
                f"{self.unpruned_kernels:.0f} unpruned), so its {verified_speedup:.2f}x follows how fast the host "
                f"issues kernels: a slower or busier host serving it runs it slower; at the GPU's own pace "
                f"(served from a CUDA graph: `pomt.cuda_graph`, measured with --backend cudagraph) it would run up "
                f"to {self.gpu_speedup:.2f}x")


def measure_gpu_work(model: nn.Module, x: torch.Tensor, schedule: Schedule, device: str,
                     wall_ms: float) -> GpuWork | None:
    """The GPU work of `model` patched with `schedule` (eager) and unpruned, profiled once after a warm-up; None off
    CUDA. `wall_ms`: the schedule's verified latency here."""
    if not device.startswith("cuda"):
        return None
    forward_at = schedule_forward_at(TimedModel(model, x, device), {schedule.kept_tokens: schedule})
    with forward_at(schedule.num_tokens) as forward:
        unpruned = profile_forward(forward, device)
    with forward_at(schedule.kept_tokens) as forward:  # patched through apply_schedule, unpatched after
        pruned = profile_forward(forward, device)
    return GpuWork(unpruned.device_time_ms, pruned.device_time_ms, unpruned.ops_per_forward,
                   pruned.ops_per_forward, wall_ms)
