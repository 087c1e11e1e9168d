"""Traces made by the tests: a known latency curve measured on a simulated drifting machine.

Every sample is level(n) x drift(t) x lognormal noise, taken in shuffled passes with the reference in
each, one untimed forward before each visit, time advancing with the samples: the design pomt uses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from pomt.formats.trace import Trace, Visit

N = 197


def linear_levels(steps: dict[int, float] | None = None) -> Callable[[int], float]:
    """5 + 0.1 n ms, with every count above k multiplied by steps[k]."""
    steps = steps or {}
    return lambda n: (5.0 + 0.1 * n) * math.prod(f for k, f in steps.items() if n > k)


def slow_drift(amplitude: float = 0.2, period_s: float = 300.0) -> Callable[[float], float]:
    return lambda t: 1.0 + amplitude * math.sin(2 * math.pi * t / period_s)


def synthetic_trace(
    levels: Callable[[int], float],
    counts: Sequence[int] = range(2, N + 1),
    passes: int = 12,
    reps: int = 3,
    drift: Callable[[float], float] = slow_drift(),
    noise: float = 0.01,
    seed: int = 0,
    order: str = "shuffled",
) -> Trace:
    """A trace of `counts` (N always included) in `passes` passes; `order` "shuffled" or "ascending"."""
    rng = np.random.default_rng(seed)
    members = sorted(set(counts) | {N})
    visits, t = [], 0.0
    for p in range(passes):
        sequence = rng.permutation(members) if order == "shuffled" else members
        for n in sequence:
            n = int(n)
            t += levels(n) * drift(t) / 1e3  # the untimed forward
            samples = tuple(float(levels(n) * drift(t) * math.exp(rng.normal(0, noise))) for _ in range(reps))
            visits.append(Visit(n, p, t, samples))
            t += sum(samples) / 1e3
    meta = {"model": "deit_tiny_patch16_224", "batch_size": 1, "input_size": [224, 224], "num_tokens": N,
            "prefix_tokens": 1, "passes": passes, "reps": reps, "order": order, "synthetic": True}
    return Trace(tuple(visits), meta)
