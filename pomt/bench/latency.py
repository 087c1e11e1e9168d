"""The reducers' latency against the schedule's: predicted from its curve, and tuned to its measured latency.

`predictor` prices a variant on the schedule's curve as the offline computation priced it. `match_latency` turns
each reducer's one setting (`Knob`) until its latency matches the schedule's in this run: the FLOP-matched setting
is the first probe, each probe is timed against the schedule in paired rounds (a seeded random order per round),
and a `Bracket` picks the next setting. The reducers are probed together, so one iteration's rounds serve them all.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from pomt.bench.config import SCHEDULE
from pomt.bench.costs import flops_function, match_amount
from pomt.bench.variants import Reduction, Variant
from pomt.checks import check_removals
from pomt.errors import CurveError, PatchError
from pomt.formats.curve import read_points
from pomt.formats.schedule import Schedule
from pomt.frontier.candidates import topk_rate
from pomt.frontier.reducer_costs import cost_function
from pomt.measurement.robust import paired_effect, priced_levels, step_spans
from pomt.measurement.timing import fixed_threads, time_calls
from pomt.models.geometry import Geometry
from pomt.patching import patch, token_counts, unpatch
from pomt.policies import predict_from_counts
from pomt.runtimes import ProgramFiles, build_forward

Predictor = Callable[[str | None, Mapping[int, int]], float]
MAX_PROBES = 8
TOLERANCE = 0.01  # a probe this close to the target (relative) ends the search


def predictor(schedule: Schedule, source: object, geometry) -> Predictor | None:
    """Latency of a variant over the unpruned model's, predicted from the schedule's curve file (beside it) as the
    offline computation priced it: every block at the tokens it receives, plus the method's own cost where the
    schedule measured it. Without the curve, the schedule's own prediction only."""
    baseline, pruned = schedule.predicted.baseline_ms, schedule.predicted.pruned_ms
    curve = None
    if schedule.curve and isinstance(source, (str, Path)):
        path = Path(source).parent / schedule.curve
        with contextlib.suppress(CurveError):
            curve = priced_levels(read_points(path), step_spans(schedule.steps))
    if curve is None:
        if not (isinstance(baseline, (int, float)) and isinstance(pruned, (int, float)) and baseline > 0):
            return None
        return lambda method, removal: 1.0 if not removal else (
            pruned / baseline if (method, dict(removal)) == (schedule.method, schedule.removal) else None)
    costs = (schedule.verified.method_cost_ms if schedule.verified is not None else None) or {}
    cost = cost_function({int(r): float(c) for r, c in costs.items()})
    n, prefix, depth = geometry.num_tokens, geometry.prefix_tokens, geometry.depth
    unpruned = predict_from_counts(curve, [n] * depth)

    def ratio(method: str | None, removal: Mapping[int, int]) -> float:
        if not method or not removal:
            return 1.0
        kept = token_counts(n, prefix, depth, method, removal)[:-1]  # what each block receives
        own_blocks = schedule.removal if method == schedule.method else {}
        extra = sum(cost(r) for b, r in removal.items() if b in own_blocks)
        return (predict_from_counts(curve, kept) + extra) / unpruned

    return ratio


@dataclass(frozen=True)
class Knob:
    """A reducer's setting from 0 to `high` on `geometry`; `removal(value)` is its {block: remove}."""

    method: str
    geometry: Geometry
    high: int
    prune_block: int = 3

    def removal(self, value: int) -> dict[int, int]:
        """{block: tokens removed} at `value` (empty at 0)."""
        if not 0 <= value <= self.high:
            raise PatchError(f"{self.method} setting {value} is outside its range 0..{self.high}")
        g = self.geometry
        if value == 0:
            return {}
        if self.method == "tome":
            return dict.fromkeys(range(g.depth), value)
        if self.method == "topk":
            return topk_rate(g.num_tokens, g.prefix_tokens, g.depth, [1 - value / g.patch_tokens])[0].as_dict()
        return {self.prune_block: value}

    def describe(self, value: int) -> str:
        """The setting as a user reads it: "r=4", "keep 0.70", "R=40"."""
        if self.method == "tome":
            return f"r={value}"
        if self.method == "topk":
            return f"keep {1 - value / self.geometry.patch_tokens:.3f}"
        return f"R={value}"


def largest_constant_r(geometry: Geometry) -> int:
    """The largest r ToMe can merge at every block without clamping (0 when even r = 1 cannot)."""
    r = 0
    while True:
        try:
            check_removals("tome", dict.fromkeys(range(geometry.depth), r + 1), geometry.num_tokens,
                           geometry.prefix_tokens, geometry.depth)
        except PatchError:
            return r
        r += 1


def knob(method: str, geometry: Geometry, prune_block: int = 3) -> Knob:
    """The one setting of `method` on a model of `geometry`, from 0 (nothing removed) to its `high`: for `tome` r
    merged at every block (up to the largest r no block clamps); for `topk` the patch tokens not kept at its rate
    blocks; for the others R removed at `prune_block`. Latency falls with the value up to noise and steps."""
    high = largest_constant_r(geometry) if method == "tome" else geometry.patch_tokens - 1
    return Knob(method, geometry, high, prune_block)


@dataclass(frozen=True)
class Probe:
    """A setting's latency over the target's: the geometric mean of paired ratios, with its interval."""

    value: int
    ratio: float
    ci: tuple[float, float]

    @property
    def matched(self) -> bool:
        """The interval holds 1: this run cannot tell the setting's latency from the target's."""
        return self.ci[0] <= 1.0 <= self.ci[1]

    def to_dict(self) -> dict:
        return {"value": self.value, "ratio": round(self.ratio, 5), "ci": [round(c, 5) for c in self.ci]}


@dataclass
class Bracket:
    """The probes of one reducer's setting so far, and where to probe next (pure logic, no timing): regula falsi
    between the largest setting slower than the target and the smallest faster, else outwards with a doubling
    step; done within TOLERANCE, at neighbouring settings, at the end of the range, or out of probes."""

    high: int
    start: int
    max_probes: int = MAX_PROBES
    probes: dict[int, Probe] = field(default_factory=dict)

    def add(self, probe: Probe) -> None:
        self.probes[probe.value] = probe

    def next_value(self) -> int | None:
        """The setting to probe next, or None when the search is over."""
        if not self.probes:
            return min(max(self.start, 0), self.high)
        if len(self.probes) >= self.max_probes or abs(math.log(self.chosen().ratio)) <= math.log1p(TOLERANCE):
            return None
        ordered = sorted(self.probes.values(), key=lambda p: p.value)
        slower, faster = [p for p in ordered if p.ratio > 1.0], [p for p in ordered if p.ratio <= 1.0]
        if slower and faster:
            low, high = slower[-1], faster[0]
            if high.value - low.value <= 1:
                return None
            share = math.log(low.ratio) / (math.log(low.ratio) - math.log(high.ratio))
            guess = min(max(round(low.value + share * (high.value - low.value)), low.value + 1), high.value - 1)
            return self._unprobed(guess, (low.value + high.value) // 2)
        side, limit, sign = (slower, self.high, 1) if slower else (faster, 0, -1)
        edge = side[-1] if sign > 0 else side[0]
        if edge.value == limit:
            return None
        step = max(1, round(0.05 * self.high))
        if len(side) > 1:
            neighbour = side[-2] if sign > 0 else side[1]
            step = 2 * abs(edge.value - neighbour.value)
        guess = edge.value + sign * step
        return self._unprobed(min(guess, limit) if sign > 0 else max(guess, limit), None)

    def _unprobed(self, guess: int, fallback: int | None) -> int | None:
        return next((v for v in (guess, fallback) if v is not None and v not in self.probes), None)

    def chosen(self) -> Probe:
        """The probe closest to the target (smallest |log ratio|)."""
        if not self.probes:
            raise ValueError("no probe measured")
        return min(self.probes.values(), key=lambda p: (abs(math.log(p.ratio)), p.value))


@dataclass(frozen=True)
class Match:
    """How one reducer was tuned: its setting, the probes measured, and the one chosen."""

    name: str
    knob: Knob
    probes: tuple[Probe, ...]
    chosen: Probe

    @property
    def reduction(self) -> Reduction:
        return Reduction(self.name, self.knob.method, self.knob.removal(self.chosen.value))

    @property
    def setting(self) -> str:
        return self.knob.describe(self.chosen.value)

    def to_dict(self) -> dict:
        return {"name": self.name, "method": self.knob.method, "setting": self.setting, "value": self.chosen.value,
                "range": [0, self.knob.high], "ratio": round(self.chosen.ratio, 5),
                "ci": [round(c, 5) for c in self.chosen.ci], "within_noise": self.chosen.matched,
                "probes": [p.to_dict() for p in self.probes]}


@dataclass(frozen=True)
class Timing:
    """How the probes are timed: device, threads, runtime, paired rounds per probe, warm-up calls."""

    device: str = "cpu"
    threads: int | None = None
    backend: str = "eager"
    rounds: int = 10
    warmup: int = 1
    seed: int = 0


def match_latency(base: nn.Module, x: torch.Tensor, target: Variant, knobs: Mapping[str, Knob], timing: Timing,
                  progress: bool | None = None) -> list[Match]:
    """Each reducer's knob (by variant name) tuned to the latency of `target`, the schedule's variant."""
    flops_at = flops_function(base, x[:1])
    target_flops = flops_at(target.reduction.method, target.reduction.removal)
    searches: dict[str, tuple[Knob, Bracket, nn.Module]] = {}
    for name, setting in knobs.items():
        start = match_amount(lambda v, s=setting: flops_at(s.method, s.removal(v)), target_flops, 0, setting.high)
        searches[name] = (setting, Bracket(setting.high, start), copy.deepcopy(base))
    rng = np.random.default_rng(timing.seed)
    bar = tqdm(total=sum(b.max_probes for _, b, _ in searches.values()), desc="matching latency", unit="probe",
               leave=False, disable=None if progress is None else not progress)
    with bar:
        while True:
            values = {name: b.next_value() for name, (_, b, _) in searches.items()}
            values = {name: v for name, v in values.items() if v is not None}
            if not values:
                break
            probes = {name: (searches[name][2], searches[name][0].method, searches[name][0].removal(v))
                      for name, v in values.items()}
            measured = _probe_round(target.model, x, probes, timing, rng)
            for name, value in values.items():
                searches[name][1].add(Probe(value, measured[name].ratio, measured[name].ci))
            bar.update(len(values))
    return [Match(name, setting, tuple(sorted(b.probes.values(), key=lambda p: p.value)), b.chosen())
            for name, (setting, b, _) in searches.items()]


def _probe_round(schedule_model: nn.Module, x: torch.Tensor, probes: dict[str, tuple[nn.Module, str, dict]],
                 timing: Timing, rng: np.random.Generator) -> dict:
    """{probe name: paired effect of its latency over the schedule's} from one set of paired rounds."""
    with contextlib.ExitStack() as stack:
        models = {SCHEDULE: schedule_model}
        for name, (model, method, removal) in probes.items():
            unpatch(model)
            if removal:
                patch(model, method, removal, seed=timing.seed)
            models[name] = model
        with fixed_threads(timing.threads) as threads:
            forwards = {name: stack.enter_context(build_forward(model.eval(), x, backend=timing.backend,
                                                                threads=threads, files=ProgramFiles(None, "latency")))
                        for name, model in models.items()}
            times: dict[str, list[float]] = {name: [] for name in forwards}
            names = list(forwards)
            with torch.inference_mode():
                for name in names:
                    for _ in range(timing.warmup):
                        forwards[name]()
                for _ in range(timing.rounds):
                    for i in rng.permutation(len(names)):
                        times[names[i]] += time_calls(forwards[names[i]], timing.device, 1, threads)
    return {name: paired_effect(times[SCHEDULE], times[name]) for name in probes}
