"""Honest latency measurement: warm-up, fixed threads, synchronised timing, robust statistics.

A latency point is a small value object; statistics are computed in one place (`summarise`).
CPU and MPS use `torch.utils.benchmark.Timer`; CUDA uses CUDA events around every call.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

# torch.utils.benchmark imports cpp_extension, which logs "No CUDA runtime is found" on CUDA builds of
# torch without a GPU: import-time noise that would turn a one-line CLI error into two lines.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
from torch.utils import benchmark  # noqa: E402

DEFAULT_MIN_RUN_S = 0.2
DEFAULT_WARMUP = 2
SPREAD_LIMIT = 0.05  # IQR / median above which a point is re-measured


@dataclass(frozen=True)
class Stats:
    """Robust statistics of a list of per-call latencies in milliseconds."""

    median_ms: float
    iqr_ms: float
    min_ms: float
    p10_ms: float
    mean_ms: float
    samples: int

    @property
    def spread(self) -> float:
        """IQR relative to the median: the noise figure used to decide re-measurement."""
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else math.inf


def summarise(times_ms: list[float] | np.ndarray) -> Stats:
    """Median, IQR, minimum, 10th percentile and mean of per-call times (ms)."""
    t = np.asarray(times_ms, dtype=float)
    if t.size == 0:
        raise ValueError("no timing samples")
    q10, q25, q50, q75 = np.percentile(t, [10, 25, 50, 75])
    return Stats(
        median_ms=float(q50),
        iqr_ms=float(q75 - q25),
        min_ms=float(t.min()),
        p10_ms=float(q10),
        mean_ms=float(t.mean()),
        samples=int(t.size),
    )


@dataclass(frozen=True)
class LatencyPoint:
    """Latency of one forward pass at a given number of kept tokens."""

    tokens: int
    median_ms: float
    iqr_ms: float
    samples: int
    threads: int
    device: str
    min_ms: float = float("nan")
    p10_ms: float = float("nan")
    clocks: dict = field(default_factory=dict, compare=False)

    @property
    def spread(self) -> float:
        return self.iqr_ms / self.median_ms if self.median_ms > 0 else math.inf

    def to_row(self) -> dict:
        """Flat dict for CSV/JSON (clock snapshot left out)."""
        row = asdict(self)
        row.pop("clocks")
        return row

    @classmethod
    def from_stats(cls, tokens: int, stats: Stats, threads: int, device: str, clocks: dict | None = None):
        return cls(
            tokens=tokens,
            median_ms=stats.median_ms,
            iqr_ms=stats.iqr_ms,
            samples=stats.samples,
            threads=threads,
            device=device,
            min_ms=stats.min_ms,
            p10_ms=stats.p10_ms,
            clocks=clocks or {},
        )


@contextlib.contextmanager
def fixed_threads(threads: int | None) -> Iterator[int]:
    """Pin torch's intra-op thread count for the duration; yields the count in force."""
    previous = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise ValueError("threads must be >= 1")
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(previous)


def synchronize(device: str) -> None:
    """Wait for queued device work so wall-clock timing is honest."""
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    elif device.startswith("mps"):
        torch.mps.synchronize()


def _cuda_event_times(fn: Callable[[], object], iterations: int) -> list[float]:
    """Per-call device time (ms) with CUDA events; every call is bracketed separately."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for start, end in zip(starts, ends, strict=True):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in zip(starts, ends, strict=True)]


def _timer_times(fn: Callable[[], object], threads: int, min_run_s: float, device: str) -> list[float]:
    """Per-call wall times (ms) from torch.utils.benchmark; it synchronises CUDA itself."""
    if device.startswith("mps"):
        def call() -> None:
            fn()
            torch.mps.synchronize()
    else:
        call = fn
    timer = benchmark.Timer(stmt="call()", globals={"call": call}, num_threads=threads)
    measurement = timer.blocked_autorange(min_run_time=min_run_s)
    return [t * 1e3 for t in measurement.times]


def time_calls(fn: Callable[[], object], device: str, reps: int, threads: int | None = None) -> list[float]:
    """`reps` per-call latencies (ms) of `fn`, back to back: CUDA events around each call on CUDA, the
    synchronised wall clock elsewhere (`torch.utils.benchmark.Timer.timeit` would add two hidden warm-up
    calls to every reading). No warm-up: the caller decides."""
    if reps < 1:
        raise ValueError("reps must be >= 1")
    if device.startswith("cuda"):
        return _cuda_event_times(fn, reps)
    with fixed_threads(threads):
        return [_time_block(fn, device, 1) for _ in range(reps)]


def time_callable(
    fn: Callable[[], object],
    device: str = "cpu",
    threads: int | None = None,
    warmup: int = DEFAULT_WARMUP,
    min_run_s: float = DEFAULT_MIN_RUN_S,
    min_samples: int = 5,
) -> tuple[Stats, int]:
    """Time `fn` after warm-up; returns statistics over per-call latencies and the thread count used."""
    with fixed_threads(threads) as used_threads, torch.inference_mode():
        for _ in range(warmup):
            fn()
        synchronize(device)
        if device.startswith("cuda"):
            first = _cuda_event_times(fn, 3)
            per_call_s = max(float(np.median(first)) / 1e3, 1e-6)
            iterations = max(min_samples, int(min_run_s / per_call_s))
            times = _cuda_event_times(fn, iterations)
        else:
            times = _timer_times(fn, used_threads, min_run_s, device)
            while len(times) < min_samples:
                times += _timer_times(fn, used_threads, min_run_s / 2, device)
    return summarise(times), used_threads


def measure_point(
    fn: Callable[[], object],
    tokens: int,
    device: str = "cpu",
    threads: int | None = None,
    min_run_s: float = DEFAULT_MIN_RUN_S,
    spread_limit: float = SPREAD_LIMIT,
    retries: int = 2,
    snapshot: Callable[[], dict] | None = None,
    warmup: int = DEFAULT_WARMUP,
) -> LatencyPoint:
    """Measure one point; re-measure (keeping the tighter result) while its spread is too large."""
    before = snapshot() if snapshot else {}
    best: Stats | None = None
    for attempt in range(retries + 1):
        stats, used = time_callable(fn, device, threads, warmup=warmup, min_run_s=min_run_s * (1 + attempt))
        if best is None or stats.spread < best.spread:
            best = stats
        if best.spread <= spread_limit:
            break
    after = snapshot() if snapshot else {}
    clocks = {"before": before, "after": after} if snapshot else {}
    return LatencyPoint.from_stats(tokens, best, used, device, clocks)


@dataclass(frozen=True)
class ABResult:
    """Interleaved comparison of two callables: statistics of each and the ratio of B over A."""

    a: Stats
    b: Stats
    ratio_median: float
    ratio_min: float


def interleaved_ab(
    fn_a: Callable[[], object],
    fn_b: Callable[[], object],
    device: str = "cpu",
    threads: int | None = None,
    rounds: int = 20,
    calls_per_round: int = 1,
    warmup: int = DEFAULT_WARMUP,
) -> ABResult:
    """Alternate A and B calls (A B B A A B ...) so that drift and noise hit both alike."""
    return interleaved({"a": fn_a, "b": fn_b}, device, threads, rounds, calls_per_round, warmup).as_ab()


@dataclass(frozen=True)
class InterleavedResult:
    """Per-variant statistics from one interleaved run."""

    stats: dict[str, Stats]

    def as_ab(self) -> ABResult:
        a, b = self.stats["a"], self.stats["b"]
        return ABResult(a=a, b=b, ratio_median=b.median_ms / a.median_ms, ratio_min=b.min_ms / a.min_ms)


def interleaved(
    variants: dict[str, Callable[[], object]],
    device: str = "cpu",
    threads: int | None = None,
    rounds: int = 20,
    calls_per_round: int = 1,
    warmup: int = DEFAULT_WARMUP,
) -> InterleavedResult:
    """Time several callables round-robin, reversing the order every round to cancel position bias."""
    names = list(variants)
    times: dict[str, list[float]] = {name: [] for name in names}
    with fixed_threads(threads), torch.inference_mode():
        for name in names:
            for _ in range(warmup):
                variants[name]()
        synchronize(device)
        for r in range(rounds):
            order = names if r % 2 == 0 else names[::-1]
            for name in order:
                times[name].append(_time_block(variants[name], device, calls_per_round))
    return InterleavedResult({name: summarise(t) for name, t in times.items()})


def _time_block(fn: Callable[[], object], device: str, calls: int) -> float:
    """Mean per-call time (ms) of `calls` back-to-back calls, synchronised at both ends."""
    if device.startswith("cuda"):
        return float(np.mean(_cuda_event_times(fn, calls)))
    synchronize(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) * 1e3 / calls
