"""Whether clocks are locked, and how fast they run: the lock state file of ``scripts/lock_clocks.sh``, the
CPU and GPU verdicts drawn from sysfs and NVML readings, and a cheap snapshot taken around a measurement."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from pomt.device.cpu import cpu_freq_mhz, read_text
from pomt.device.gpu import cuda_index, read_gpu_info

LOCK_COMMAND = "sudo scripts/lock_clocks.sh lock"
STATE_FILE_NAME = "clock_state"


def lock_state_path() -> Path:
    """Where scripts/lock_clocks.sh keeps its state by default."""
    return Path(os.environ.get("POMT_STATE_DIR") or "/var/lib/pomt") / STATE_FILE_NAME


def parse_lock_state(text: str) -> list[str]:
    """Targets a lock state file holds restore steps for: a sorted subset of "cpu", "jetson", "nvidia"."""
    kinds = {"sysfs": "cpu", "nvidia": "nvidia", "jetson": "jetson"}
    targets = set()
    for line in text.splitlines():
        kind = line.split("\t", 1)[0]
        if not line.startswith("#") and kind in kinds:
            targets.add(kinds[kind])
    return sorted(targets)


def read_lock_state(path: Path | None = None) -> dict[str, Any]:
    """Whether a pomt lock is active: state file present and written since the last boot."""
    path = path or lock_state_path()
    text = read_text(path)
    if text is None:
        return {"active": False, "state_file": str(path), "targets": []}
    try:
        stale = path.stat().st_mtime < psutil.boot_time()
    except OSError:
        stale = True
    return {"active": not stale, "state_file": str(path), "targets": parse_lock_state(text), "stale": stale}


def clocks_locked_cpu(governors: str, turbo: str) -> bool | None:
    """CPU verdict from ``parse_governors`` and ``parse_turbo`` output.

    True: every governor is "performance" and turbo is "off". False: a known governor is not
    "performance", or turbo is "on". None: otherwise (governor or turbo unreadable).
    """
    known = [] if governors == "unknown" else governors.split(",")
    if any(g != "performance" for g in known) or turbo == "on":
        return False
    if known and turbo == "off":
        return True
    return None


def clocks_locked_gpu(gpu: Mapping[str, Any] | None, lock_targets: Iterable[str] = ()) -> bool | None:
    """GPU verdict from ``read_gpu_info`` output and the targets of an active pomt lock.

    NVML cannot report clocks locked with ``nvidia-smi -lgc`` on most versions, so the evidence is:
    True: NVML reports a locked clock range; or persistence mode is on and an active pomt lock covers
    the GPU (``nvidia``, or ``jetson`` where NVML is absent); or persistence mode is on and the SM clock
    runs exactly at an applications clock below the maximum (the target ``nvidia-smi -ac`` pins: where the
    applications clock is the maximum, as on an H100 by default, a free GPU boosting under load reads it too).
    None: NVML unavailable or the SM clock unreadable (and no Jetson lock).
    False: otherwise - the SM clock is free-running (boosting, or idling down) with no lock.
    """
    targets = set(lock_targets)
    if not gpu:
        return True if "jetson" in targets else None
    locked = gpu.get("locked_gpu_clocks")
    if locked and locked.get("min_mhz") and locked.get("max_mhz"):
        return True
    persistence = gpu.get("persistence_mode")
    if persistence and "nvidia" in targets:
        return True
    sm, app, top = gpu.get("sm_clock_mhz"), gpu.get("applications_clock_sm_mhz"), gpu.get("sm_clock_max_mhz")
    if sm is None:
        return None
    pinned_below_boost = app is not None and (top is None or app < top)
    return bool(persistence and pinned_below_boost and sm == app)


def clock_snapshot(device: str) -> dict[str, Any]:
    """A cheap reading of clocks, temperature and power, taken before and after a measurement."""
    kind = device.split(":")[0]
    snap: dict[str, Any] = {"time": time.time(), "kind": kind, "cpu_freq_mhz": cpu_freq_mhz()["current"]}
    if kind == "cuda":
        gpu = read_gpu_info(cuda_index(device)) or {}
        for key in ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "throttle_reasons"):
            snap[key] = gpu.get(key)
    return snap
