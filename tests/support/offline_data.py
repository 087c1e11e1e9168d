"""Hand-made products of the offline computation's stages (a run, a search, a curve with one drop), so a
stage can be tested on its own without measuring."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from pomt.device import Fingerprint
from pomt.formats.curve import CurvePoint
from pomt.measurement.confirmation import Confirmation
from pomt.measurement.drift import Drift
from pomt.measurement.robust import paired_effect
from pomt.measurement.search import SearchResult
from pomt.measurement.steps import Step
from pomt.models.geometry import Geometry
from pomt.offline.measure import Run
from pomt.workload.prepare import Prepared, RunSetup

N = 197
GEOMETRY = Geometry(model="deit_small_patch16_224", input_size=(224, 224), patch_size=(16, 16), grid=(14, 14),
                    prefix_tokens=1, num_tokens=N, depth=12, embed_dim=384, num_heads=6)
LIVE = Fingerprint.from_dict({"kind": "cpu", "device": "cpu", "name": "Fake CPU", "threads": 2, "allocator": {},
                              "clocks_locked": None, "backend": {"name": "eager", "version": "2.5"},
                              "dtype": "bfloat16"})
# one drop: 151 -> 150 kept tokens, 20% faster (beyond a flat trend), confirmed by paired measurement
DROP = Step(tokens=150, upper_tokens=151, before_ms=10.0, after_ms=8.0, drop_ms=2.0, drop_pct=20.0, significance=12.0,
            kind="drop", excess_ms=2.0, paired_pct=20.0, paired_ci_pct=(18.0, 22.0), p_value=1e-4, pairs=8)


def latency_ms(tokens: int) -> float:
    return 10.0 if tokens > 150 else 8.0


def point(tokens: int) -> CurvePoint:
    ms = latency_ms(tokens)
    return CurvePoint(tokens=tokens, latency_ms=ms, median_ms=ms, relative=ms / 10.0, spread_ms=0.0, min_ms=ms,
                      visits=3, samples=6, se_ms=0.01 * ms)


def confirmation(low: int, high: int, accepted: bool, screened: bool = False) -> Confirmation:
    effect = None if screened else paired_effect([1.0] * 6, [0.8 * (1 + e) for e in (0.01, -0.01, 0.0, 0.0, 0.01, 0.0)])
    kind = "drop" if accepted else "none"
    return Confirmation(low, high, effect, accepted, kind, f"{kind} at {high} -> {low}", 10.0, screened)


def search_result(steps: tuple[Step, ...] = (DROP,), drift: Drift | None = None) -> SearchResult:
    """A search over every count from 140 to N with the given confirmed steps; its candidates: the drop
    (accepted), 181 -> 180 (rejected), 176 -> 175 (an aligned edge screened out)."""
    candidates = [confirmation(150, 151, True), confirmation(180, 181, False), confirmation(175, 176, False, True)]
    return SearchResult(points=[point(n) for n in range(140, N + 1)], steps=list(steps), candidates=candidates,
                        drift=drift, noise=0.0123456, reps=3, visits=120, measured=120, full_grid_visits=232,
                        budget_visits=400, budget_spent=False)


def make_run(replay: Path | None = None, fingerprint: Fingerprint = LIVE) -> Run:
    """A run on the geometry above, live unless `replay` names a trace (nothing is measured through it)."""
    device = "replay" if replay is not None else "cpu"
    setup = RunSetup(GEOMETRY.model, device, fingerprint, 4, GEOMETRY.input_size)
    return Run(Prepared(setup, GEOMETRY, list(range(140, N + 1)), nn.Identity(), None), None, replay)
