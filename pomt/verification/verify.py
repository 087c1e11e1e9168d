"""Checks of a schedule on this machine before it ships: a schedule is a promise, so it is measured.

- `verify`: the patched model, through `pomt.apply_schedule`, against the unpruned model. Every round
  visits each variant once in a seeded random order; each visit is corrected for the drift at its time
  (`pomt.measurement.drift.drift_profile`), and each candidate's speedup is judged on its paired log-ratios with the
  unpruned visits of the same rounds. A candidate qualifies when its speedup is significant (interval
  above 1) and at least 1 + `min_gain`; the one shipped removes the fewest tokens among those whose
  speedup is within `min_step` of the fastest one's (prune just enough). None qualifying: remove 0.
- `verify_rounds`: how many rounds: at least the caller's, more where rounds are so short that a few seconds
  hold more (at most ROUNDS_FACTOR times as many). Ten rounds of a 7 ms forward (deit_tiny at 112 px, batch 1)
  take under 3 s and gave intervals of +-4-5% around speedups of 1.03-1.05x, so whether a schedule 5% faster
  shipped was a coin's toss from run to run; the rounds are set before anything is measured, from the
  unpruned model's measured latency, so the test's false-step rate stays what it was.
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
from pomt.measurement.paired import paired_effect
from pomt.measurement.sources import ForwardAt, Session
from pomt.models.geometry import model_geometry
from pomt.patching import unpatch
from pomt.runtimes import Forward, ProgramCache, build_forward


def schedule_forward_at(model: nn.Module, x: torch.Tensor, schedules: Mapping[int, Schedule], *,
                        backend: str = "eager", device: str = "cpu", threads: int | None = None,
                        cache_dir: Path | None = None) -> ForwardAt:
    """`forward_at(kept)`: the unpruned model at N kept tokens, else the model patched with the schedule
    that keeps that many, through `pomt.apply_schedule`, run in `backend`. Eager runs the patched model
    itself (unpatched again after the visit); other runtimes export it once per schedule, patched."""
    num_tokens = model_geometry(model).num_tokens

    def build(kept: int) -> Forward:
        if kept == num_tokens:
            return build_forward(model, x, backend=backend, device=device, threads=threads, cache_dir=cache_dir,
                                 cache_key="latency")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # candidates are unverified by construction
            apply_schedule(model, schedules[kept])
        try:
            forward = build_forward(model, x, backend=backend, device=device, threads=threads,
                                    cache_dir=cache_dir, cache_key="latency")
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
    """Rounds of a verification whose rounds are `visits` visits of `reps` forwards of about `forward_ms`: at
    least `min_rounds`, as many as fill `seconds`, at most ROUNDS_FACTOR x `min_rounds` (module docstring)."""
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
        return {
            "remove": self.remove,
            "pruned_ms": round(self.pruned_ms, 4),
            "speedup": round(self.speedup, 4),
            "speedup_ci": [round(self.speedup_ci[0], 4), round(self.speedup_ci[1], 4)],
            "p_value": float(f"{self.p_value:.3g}"),
            "qualifies": self.qualifies,
            "predicted_ms": None if self.predicted_ms is None else round(self.predicted_ms, 4),
        }


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
        """What the schedule's `verified` object says of this verification."""
        chosen = self.chosen
        predicted = chosen.predicted_ms if chosen else None
        return VerificationRecord(
            unpruned_ms=round(self.unpruned_ms, 4),
            pruned_ms=round(chosen.pruned_ms, 4) if chosen else round(self.unpruned_ms, 4),
            speedup=round(chosen.speedup, 4) if chosen else 1.0,
            speedup_ci=(round(chosen.speedup_ci[0], 4), round(chosen.speedup_ci[1], 4)) if chosen else (1.0, 1.0),
            predicted_ms=None if predicted is None else round(predicted, 4),
            prediction_error=None if predicted is None else round(chosen.pruned_ms / predicted - 1.0, 4),
            candidates=tuple(c.to_dict() for c in self.candidates),
            samples=self.rounds * self.reps,
            rounds=self.rounds,
            reason=self.reason,
            drift=None if self.drift is None else self.drift.to_dict(),
            device_fingerprint_hash=fingerprint_hash,
        )


def verify(
    session: Session,
    num_tokens: int,
    removals: Sequence[int],
    *,
    reps: int,
    rounds: int = 10,
    predicted_ratio: Mapping[int, float] | None = None,
    min_gain: float = 0.03,
    min_step: float = 0.03,
    alpha: float = 0.01,
    seed: int = 0,
    progress: bool = True,
) -> Verification:
    """Measure the candidates (removals) against the unpruned model and choose; see the module docstring.

    `predicted_ratio[remove]` is the latency the prediction promised over the unpruned model's; the
    predicted latency of a candidate is that ratio times the unpruned latency measured here, so the
    prediction is judged on the same minute's speed as the measurement.
    """
    removals = sorted({r for r in removals if r > 0})
    rng = np.random.default_rng(seed)
    kept = [num_tokens] + [num_tokens - r for r in removals]
    visits: list[Visit] = []
    with tqdm(total=rounds * len(kept), desc="verify", unit="visit", disable=not progress) as bar:
        for r in range(rounds):
            order = [int(k) for k in rng.permutation(kept)]
            session.begin_pass(r + 1, order)
            for k in order:
                visits.append(session.visit(k, reps, r + 1))
                bar.update(1)
    _, drift_log = drift_profile(visits)
    value: dict[tuple[int, int], float] = {
        (v.tokens, v.pass_index): v.median_ms / math.exp(g) for v, g in zip(visits, drift_log, strict=True)
    }
    passes = range(1, rounds + 1)
    unpruned = [value[(num_tokens, p)] for p in passes]
    unpruned_ms = float(np.median(unpruned))
    results = []
    for remove in removals:
        effect = paired_effect(unpruned, [value[(num_tokens - remove, p)] for p in passes])
        speedup, ci = 1.0 / effect.ratio, (1.0 / effect.ci[1], 1.0 / effect.ci[0])
        ratio = (predicted_ratio or {}).get(remove)
        results.append(CandidateResult(
            remove=remove,
            pruned_ms=unpruned_ms * effect.ratio,
            speedup=speedup,
            speedup_ci=ci,
            p_value=effect.p_value,
            qualifies=effect.p_value < alpha and ci[0] > 1.0 and speedup >= 1.0 + min_gain,
            predicted_ms=None if ratio is None else unpruned_ms * ratio,
        ))
    chosen, reason = choose(results, min_gain, min_step)
    return Verification(unpruned_ms, tuple(results), chosen, reason, rounds, reps, drift(visits, num_tokens))


def choose(results: Sequence[CandidateResult], min_gain: float, min_step: float) -> tuple[CandidateResult | None, str]:
    """The candidate to ship and the reason, in one sentence (see the module docstring)."""
    if not results:
        return None, "no candidate removal to verify"
    qualifying = [c for c in results if c.qualifies]
    if not qualifying:
        best = max(results, key=lambda c: c.speedup)
        return None, (
            f"no candidate is measurably faster by {min_gain:.0%} or more: the best, removing {best.remove}, "
            f"measured {best.speedup:.3f}x (95% CI {best.speedup_ci[0]:.3f}-{best.speedup_ci[1]:.3f})"
        )
    fastest = max(qualifying, key=lambda c: c.speedup)
    chosen = min((c for c in qualifying if c.speedup >= fastest.speedup / (1.0 + min_step)), key=lambda c: c.remove)
    return chosen, (
        f"measured {chosen.speedup:.3f}x (95% CI {chosen.speedup_ci[0]:.3f}-{chosen.speedup_ci[1]:.3f}) removing "
        f"{chosen.remove}" + ("" if chosen is fastest else f", within {min_step:.0%} of the fastest candidate")
    )
