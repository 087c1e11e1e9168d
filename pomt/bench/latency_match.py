"""Every other reducer tuned to the schedule's measured latency, on this device, in this run.

For each reducer the FLOP-matched setting (`pomt.bench.flops.match_amount` over its `pomt.bench.knobs` setting)
is the first probe; each probe is timed against the schedule in paired rounds (every round visits the
schedule and the probes in a seeded random order, through the runtime the benchmark times on) and the
search (`pomt.bench.bracket`) picks the next setting until the latency matches within the noise. The
reducers are probed together, one setting each per iteration, so one iteration's rounds serve them all.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from pomt.bench.bracket import Bracket, Probe
from pomt.bench.flops import match_amount
from pomt.bench.knobs import Knob, knob
from pomt.bench.variants import SCHEDULE, FlopsFn, Reduction
from pomt.errors import PatchError
from pomt.measurement.paired import paired_effect
from pomt.measurement.timing import fixed_threads, time_calls
from pomt.models.geometry import Geometry
from pomt.patching import patch, unpatch
from pomt.runtimes import build_forward


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


def match_latency(
    base: nn.Module,
    x: torch.Tensor,
    reductions: Sequence[Reduction],
    schedule_model: nn.Module,
    geometry: Geometry,
    flops_at: FlopsFn,
    timing: Timing,
    prune_block: int = 3,
    progress: bool | None = None,
) -> tuple[list[Reduction], list[Match]]:
    """The reductions with every reducer's removal tuned to `schedule_model`'s latency, and how each was tuned."""
    target = next((r for r in reductions if r.name == SCHEDULE), None)
    if target is None:
        raise PatchError("--match latency needs a --schedule to match")
    target_flops = flops_at(target.method, target.removal)
    searches: dict[str, tuple[Knob, Bracket, nn.Module]] = {}
    for reduction in reductions:
        if reduction.method is None or reduction.name == SCHEDULE:
            continue
        setting = knob(reduction.method, geometry, prune_block)
        start = match_amount(lambda v, s=setting: flops_at(s.method, s.removal(v)), target_flops, 0, setting.high)
        searches[reduction.name] = (setting, Bracket(setting.high, start), copy.deepcopy(base))
    rng = np.random.default_rng(timing.seed)
    bar = tqdm(total=sum(b.max_probes for _, b, _ in searches.values()), desc="matching latency", unit="probe",
               leave=False, disable=None if progress is None else not progress)
    with bar:
        while True:
            values = {name: b.next_value() for name, (_, b, _) in searches.items()}
            values = {name: v for name, v in values.items() if v is not None}
            if not values:
                break
            measured = _probe_round(schedule_model, x, {name: (searches[name][2], searches[name][0].method,
                                                              searches[name][0].removal(v))
                                                       for name, v in values.items()}, timing, rng)
            for name, value in values.items():
                effect = measured[name]
                searches[name][1].add(Probe(value, effect.ratio, effect.ci))
            bar.update(len(values))
    matches = [Match(name, setting, tuple(sorted(b.probes.values(), key=lambda p: p.value)), b.chosen())
               for name, (setting, b, _) in searches.items()]
    by_name = {m.name: m.reduction for m in matches}
    return [by_name.get(r.name, r) for r in reductions], matches


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
                                                                device=timing.device, threads=threads,
                                                                cache_key="latency"))
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
