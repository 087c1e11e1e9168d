"""Honest latency measurement: warm-up, fixed threads, synchronised timing, robust statistics, and profiles.

Statistics of per-call latencies are computed in one place (`summarise`). On CUDA every call is timed with CUDA
events; elsewhere with the synchronised wall clock. `profile_forward` counts the operators or kernels per forward
and the device time in them: against the wall latency, how much of a forward is launch and framework overhead.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# torch.utils.benchmark imports cpp_extension, which logs "No CUDA runtime is found" on CUDA builds without a GPU.
logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
from torch.utils import benchmark  # noqa: E402

DEFAULT_MIN_RUN_S = 0.2
DEFAULT_WARMUP = 2


@dataclass(frozen=True)
class Stats:
    """Robust statistics of a list of per-call latencies in milliseconds."""

    median_ms: float
    iqr_ms: float
    min_ms: float
    p10_ms: float
    mean_ms: float
    samples: int


def summarise(times_ms: list[float] | np.ndarray) -> Stats:
    """Median, IQR, minimum, 10th percentile and mean of per-call times (ms)."""
    t = np.asarray(times_ms, dtype=float)
    if t.size == 0:
        raise ValueError("no timing samples")
    q10, q25, q50, q75 = np.percentile(t, [10, 25, 50, 75])
    return Stats(median_ms=float(q50), iqr_ms=float(q75 - q25), min_ms=float(t.min()), p10_ms=float(q10),
                 mean_ms=float(t.mean()), samples=int(t.size))


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
    """`reps` per-call latencies (ms) of `fn`, back to back: CUDA events on CUDA, the synchronised wall clock
    elsewhere (`Timer.timeit` would add two hidden warm-up calls to every reading). No warm-up: the caller decides."""
    if reps < 1:
        raise ValueError("reps must be >= 1")
    if device.startswith("cuda"):
        return _cuda_event_times(fn, reps)
    with fixed_threads(threads):
        return [_time_block(fn, device, 1) for _ in range(reps)]


def time_callable(fn: Callable[[], object], device: str = "cpu", threads: int | None = None,
                  warmup: int = DEFAULT_WARMUP, min_run_s: float = DEFAULT_MIN_RUN_S,
                  min_samples: int = 5) -> tuple[Stats, int]:
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


@dataclass(frozen=True)
class InterleavedResult:
    """Per-variant statistics from one interleaved run."""

    stats: dict[str, Stats]


def interleaved(variants: dict[str, Callable[[], object]], device: str = "cpu", threads: int | None = None,
                rounds: int = 20, calls_per_round: int = 1, warmup: int = DEFAULT_WARMUP) -> InterleavedResult:
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

GPU_PROFILE = "gpu_kernels_device_time"  # ProfileSummary.kind on CUDA
CPU_PROFILE = "aten_ops_cpu_self_time"  # elsewhere
_KINETO_CHATTER = re.compile(r"^(USDT:|(INFO|WARNING|ERROR|STAGE):\d{4}-\d\d-\d\d )")


@dataclass(frozen=True)
class ProfileSummary:
    """Per-forward counts and times from one profiled run."""

    ops_per_forward: float
    device_time_ms: float
    profiled_wall_ms: float
    kind: str  # CPU_PROFILE or GPU_PROFILE
    forwards: int


def _per_call_ms(fn: Callable[[], object], device: str, calls: int) -> float:
    """Mean time (ms) of `calls` back-to-back calls, synchronised at both ends."""
    return interleaved({"fn": fn}, device, rounds=1, calls_per_round=calls, warmup=0).stats["fn"].mean_ms


@contextlib.contextmanager
def _quiet_kineto() -> Iterator[None]:
    """Drop the profiler library's own log lines from stderr; pass everything else through."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    sys.stderr.flush()
    saved = os.dup(fd)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), fd)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, fd)
            os.close(saved)
            sink.seek(0)
            kept = [line for line in sink.read().decode(errors="replace").splitlines()
                    if line.strip() and not _KINETO_CHATTER.match(line)]
            if kept:
                print("\n".join(kept), file=sys.stderr)


def profile_forward(fn: Callable[[], object], device: str, forwards: int = 3, warmup: int = 2) -> ProfileSummary:
    """Profile `forwards` back-to-back synchronised calls of `fn` after `warmup` unprofiled ones."""
    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    if warmup:
        _per_call_ms(fn, device, warmup)
    with _quiet_kineto(), warnings.catch_warnings():
        # One profiling cycle: torch's note that a new cycle would clear the events does not apply.
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        with profile(activities=activities) as prof:
            wall_ms = _per_call_ms(fn, device, forwards)
    events = prof.events()
    if cuda:
        gpu = [e for e in events if e.device_type == DeviceType.CUDA]
        busy_us = sum(e.time_range.elapsed_us() for e in gpu)
        return ProfileSummary(len(gpu) / forwards, busy_us / 1e3 / forwards, wall_ms, GPU_PROFILE, forwards)
    aten = [e for e in events if e.name.startswith("aten::")]
    self_us = sum(e.self_cpu_time_total for e in events if e.device_type == DeviceType.CPU)
    return ProfileSummary(len(aten) / forwards, self_us / 1e3 / forwards, wall_ms, CPU_PROFILE, forwards)
