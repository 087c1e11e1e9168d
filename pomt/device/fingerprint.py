"""The device a run measures on and its fingerprint: clock state, a hash for latency, and the refusal to measure."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import psutil
import torch

from pomt.device.allocator import allocator_settings
from pomt.device.cpu import cpu_freq_mhz, cpu_name, read_governors, read_text, read_turbo
from pomt.device.gpu import cuda_index, read_gpu_info
from pomt.errors import DeviceError

LOCK_COMMAND = "sudo scripts/lock_clocks.sh lock"
STATE_FILE_NAME = "clock_state"
IDENTITY = ("kind", "name", "cpu_name", "threads", "cores_logical", "torch", "backend")


def resolve_device(name: str) -> str:
    """Turn "auto", "cpu", "cuda", "cuda:N" or "mps" into an available device string, or raise DeviceError."""
    name = name.strip().lower()
    if name == "auto":
        if torch.cuda.is_available():
            return "cuda"
        return "mps" if _mps_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if name == "mps":
        if not _mps_available():
            raise DeviceError("device 'mps' is not available (needs Apple silicon and torch built with MPS)")
        return "mps"
    match = re.fullmatch(r"cuda(?::(\d+))?", name)
    if match is None:
        raise DeviceError(f"unknown device '{name}': use auto, cpu, cuda, cuda:N or mps")
    if not torch.cuda.is_available():
        raise DeviceError(f"device '{name}' is not available: torch {torch.__version__} sees no CUDA GPU")
    count = torch.cuda.device_count()
    if match.group(1) is not None and int(match.group(1)) >= count:
        raise DeviceError(f"device '{name}' does not exist: only cuda:0..cuda:{count - 1} are visible")
    return name


def _mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


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
    """CPU verdict: True if all governors are "performance" and turbo "off"; False if known otherwise; else None."""
    known = [] if governors == "unknown" else governors.split(",")
    if any(g != "performance" for g in known) or turbo == "on":
        return False
    if known and turbo == "off":
        return True
    return None


def clocks_locked_gpu(gpu: Mapping[str, Any] | None, lock_targets: Iterable[str] = ()) -> bool | None:
    """GPU verdict from ``read_gpu_info`` output and the targets of an active pomt lock.

    NVML cannot report clocks locked with ``nvidia-smi -lgc`` on most versions, so the evidence is:
    True: NVML reports a locked clock range; or persistence mode is on and an active pomt lock covers the GPU
    (``nvidia``, or ``jetson`` where NVML is absent); or persistence mode is on and the SM clock runs exactly at an
    applications clock below the maximum (where it is the maximum, a free GPU boosting under load reads it too).
    None: NVML unavailable or the SM clock unreadable (and no Jetson lock). False: otherwise (free-running)."""
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


@dataclass(frozen=True)
class Fingerprint:
    """The device and its clock state as a measurement records them; `from_dict` then `to_dict` gives the dict back."""

    kind: str | None = None  # cpu, cuda or mps
    device: str | None = None
    name: str | None = None  # the GPU's on cuda, else the CPU's
    cpu_name: str | None = None
    threads: int | None = None
    cores_logical: int | None = None
    cores_physical: int | None = None
    governor: str | None = None
    turbo: str | None = None
    cpu_freq_mhz: dict | None = None
    python: str | None = None
    torch: str | None = None
    timm: str | None = None
    numpy: str | None = None
    platform: str | None = None
    pomt_lock: dict | None = None
    allocator: dict | None = None  # `pomt.device.allocator.allocator_settings`
    cpu_clocks_locked: bool | None = None
    clocks_locked: bool | None = None  # the verdict for the device measured on
    gpu: dict | None = None  # `pomt.device.gpu.read_gpu_info`, on cuda
    backend: dict | None = None  # the runtime measured on (`pomt.runtimes.backend_info`)
    dtype: str | None = None
    replayed_from: str | None = None  # the trace a replay analysed
    extra: Mapping[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = ()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Fingerprint:
        """Any fingerprint dict, older or partial ones included; absent keys stay absent in `to_dict`."""
        known = {key: value for key, value in data.items() if key in FIELDS}
        extra = {key: value for key, value in data.items() if key not in FIELDS}
        return cls(**known, extra=extra, keys=tuple(data))

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: the recorded keys in their order, then fields set since (not None), then `extra`."""
        keys = list(self.keys)
        keys += [name for name in FIELDS if name not in keys and getattr(self, name) is not None]
        keys += [key for key in self.extra if key not in keys]
        return {key: self.extra[key] if key in self.extra else getattr(self, key) for key in keys}


FIELDS = tuple(f.name for f in fields(Fingerprint) if f.name not in ("extra", "keys"))


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_fingerprint(device: str = "cpu", threads: int | None = None) -> Fingerprint:
    """Facts about the device and its clock state, recorded with every measurement; ``clocks_locked`` is the
    verdict for the device measured on (None on "mps"). Raises DeviceError if the device is unavailable."""
    device = resolve_device(device)
    kind = device.split(":")[0]
    governor, turbo = read_governors(), read_turbo()
    lock = read_lock_state()
    cpu_locked = clocks_locked_cpu(governor, turbo)
    cpu = cpu_name()
    fp: dict[str, Any] = {
        "kind": kind, "device": device, "name": cpu, "cpu_name": cpu,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "cores_logical": psutil.cpu_count(logical=True), "cores_physical": psutil.cpu_count(logical=False),
        "governor": governor, "turbo": turbo, "cpu_freq_mhz": cpu_freq_mhz(), "python": platform.python_version(),
        "torch": torch.__version__, "timm": _version("timm"), "numpy": _version("numpy"),
        "platform": platform.platform(), "pomt_lock": lock, "allocator": allocator_settings(),
        "cpu_clocks_locked": cpu_locked, "clocks_locked": cpu_locked if kind == "cpu" else None,
    }
    if kind == "cuda":
        index = cuda_index(device)
        gpu = read_gpu_info(index)
        fp["gpu"] = gpu
        fp["name"] = (gpu or {}).get("name") or torch.cuda.get_device_name(index)
        fp["clocks_locked"] = clocks_locked_gpu(gpu, lock["targets"] if lock["active"] else ())
    return Fingerprint.from_dict(fp)


def fingerprint_hash(fingerprint: Fingerprint) -> str:
    """A short hash of what makes a device the same for latency (clocks, temperatures and frequencies left out)."""
    identity = {key: getattr(fingerprint, key) for key in IDENTITY}
    gpu = fingerprint.gpu or {}
    identity["gpu"] = {key: gpu.get(key) for key in ("name", "driver")} if gpu else None
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def require_locked_clocks(fingerprint: Fingerprint) -> None:
    """Raise DeviceError unless the fingerprint's ``clocks_locked`` is True."""
    verdict = fingerprint.clocks_locked
    if verdict is True:
        return
    kind = fingerprint.kind or "cpu"
    if kind == "cuda":
        gpu = fingerprint.gpu or {}
        detail = f"SM clock {gpu.get('sm_clock_mhz')} MHz, persistence {gpu.get('persistence_mode')}"
    else:
        detail = f"governor {fingerprint.governor}, turbo {fingerprint.turbo}"
    state = "cannot tell whether clocks are locked" if verdict is None else "clocks are not locked"
    raise DeviceError(f"{state} on {kind} ({detail}); run '{LOCK_COMMAND}' first, or measure without "
                      "--require-locked-clocks")
