"""Tuning one reducer's setting to a target latency from paired measurements (pure logic, no timing).

A probe is the reducer at one setting measured against the target (the schedule) in paired rounds: the
ratio of their latencies with its interval (`pomt.measurement.paired.paired_effect`). A setting removes more
as it rises (`pomt.bench.knobs`), so latency falls with it up to noise and steps. The search keeps the
largest setting measured slower than the target and the smallest measured faster; between them it probes
where the line through their log-ratios crosses 0 (regula falsi), and without both it steps outwards,
doubling the step. It stops when a probe lies within TOLERANCE of the target, when the slower and faster
settings are neighbours, at the end of the range, or when the probes run out; the answer is the probe
closest to the target, and whether its interval holds 1 (this run's noise cannot tell it from the target)
is reported with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_PROBES = 8
TOLERANCE = 0.01  # a probe this close to the target (relative) ends the search


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
    """The probes of one reducer so far, and where to probe next (see the module docstring)."""

    high: int
    start: int
    max_probes: int = MAX_PROBES
    probes: dict[int, Probe] = field(default_factory=dict)

    def add(self, probe: Probe) -> None:
        self.probes[probe.value] = probe

    def _slower(self) -> list[Probe]:
        return sorted((p for p in self.probes.values() if p.ratio > 1.0), key=lambda p: p.value)

    def _faster(self) -> list[Probe]:
        return sorted((p for p in self.probes.values() if p.ratio <= 1.0), key=lambda p: p.value)

    def next_value(self) -> int | None:
        """The setting to probe next, or None when the search is over."""
        if not self.probes:
            return min(max(self.start, 0), self.high)
        if len(self.probes) >= self.max_probes or abs(math.log(self.chosen().ratio)) <= math.log1p(TOLERANCE):
            return None
        slower, faster = self._slower(), self._faster()
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
        for value in (guess, fallback):
            if value is not None and value not in self.probes:
                return value
        return None

    def chosen(self) -> Probe:
        """The probe closest to the target (smallest |log ratio|)."""
        if not self.probes:
            raise ValueError("no probe measured")
        return min(self.probes.values(), key=lambda p: (abs(math.log(p.ratio)), p.value))
