"""Operators or kernels per forward, and the time the device spends in them, from `torch.profiler`.

On CPU: aten operators dispatched per forward, and their summed self CPU time. On CUDA: GPU activities
(kernels, memcpy, memset) per forward and their summed device time. Comparing that device time with
the measured wall latency shows how much of a forward is launch and framework overhead.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from pomt.measurement.timing import interleaved

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
            kept = [
                line
                for line in sink.read().decode(errors="replace").splitlines()
                if line.strip() and not _KINETO_CHATTER.match(line)
            ]
            if kept:
                print("\n".join(kept), file=sys.stderr)


def profile_forward(
    fn: Callable[[], object], device: str, forwards: int = 3, warmup: int = 2
) -> ProfileSummary:
    """Profile `forwards` back-to-back calls of `fn` after `warmup` unprofiled ones (both timed and
    synchronised by `pomt.measurement.timing`)."""
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
        return ProfileSummary(
            len(gpu) / forwards, busy_us / 1e3 / forwards, wall_ms, GPU_PROFILE, forwards
        )
    aten = [e for e in events if e.name.startswith("aten::")]
    self_us = sum(e.self_cpu_time_total for e in events if e.device_type == DeviceType.CPU)
    return ProfileSummary(
        len(aten) / forwards, self_us / 1e3 / forwards, wall_ms, CPU_PROFILE, forwards
    )
