"""Which device to run on, a JSON fingerprint of it with its clock state, and light clock readings.

Clock state comes from sysfs (CPU governor, turbo) and NVML via pynvml (GPU clocks, power, throttling).
The sysfs root honours ``POMT_SYSFS_ROOT`` like ``scripts/lock_clocks.sh``, so tests can use a fake tree.
Nothing here prints or exits; failures to read clock state give ``None``/"unknown", never an exception.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import re
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil
import torch

from pomt.errors import DeviceError

LOCK_COMMAND = "sudo scripts/lock_clocks.sh lock"
STATE_FILE_NAME = "clock_state"

# NVML clock event ("throttle") reason bits (nvmlClocksEventReason*), as snake_case names.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


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


def _cuda_index(device: str) -> int:
    _, _, index = device.partition(":")
    return int(index) if index else 0


def sysfs_root() -> Path:
    """The root every sysfs/procfs path is read under: ``$POMT_SYSFS_ROOT`` or ``/``."""
    return Path(os.environ.get("POMT_SYSFS_ROOT") or "/")


def _cpu_dir() -> Path:
    return sysfs_root() / "sys/devices/system/cpu"


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cpu_dirs() -> list[Path]:
    dirs = [p for p in _cpu_dir().glob("cpu[0-9]*") if p.name[3:].isdigit()]
    return sorted(dirs, key=lambda p: int(p.name[3:]))


def parse_governors(values: Iterable[str | None]) -> str:
    """Unique scaling governors, sorted and joined by ","; "unknown" when none was readable."""
    found = sorted({v.strip() for v in values if v and v.strip()})
    return ",".join(found) if found else "unknown"


def parse_turbo(no_turbo: str | None, boost: str | None) -> str:
    """"on"/"off"/"unknown" from intel_pstate/no_turbo (1 = off) or, failing that, cpufreq/boost (0 = off)."""
    if no_turbo is not None and no_turbo.strip() in ("0", "1"):
        return "off" if no_turbo.strip() == "1" else "on"
    if boost is not None and boost.strip() in ("0", "1"):
        return "off" if boost.strip() == "0" else "on"
    return "unknown"


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


def read_governors() -> str:
    """Unique scaling governors across CPUs, from sysfs."""
    return parse_governors(_read(d / "cpufreq/scaling_governor") for d in _cpu_dirs())


def read_turbo() -> str:
    """Turbo/boost state from sysfs: "on", "off" or "unknown"."""
    return parse_turbo(_read(_cpu_dir() / "intel_pstate/no_turbo"), _read(_cpu_dir() / "cpufreq/boost"))


def _khz_to_mhz(values: Iterable[str | None]) -> list[float]:
    out = []
    for v in values:
        try:
            out.append(int(v or "") / 1000.0)
        except (TypeError, ValueError):
            continue
    return out


def cpu_freq_mhz() -> dict[str, float | None]:
    """Mean current and highest maximum CPU frequency in MHz (sysfs; psutil when sysfs has none)."""
    dirs = _cpu_dirs()
    current = _khz_to_mhz(_read(d / "cpufreq/scaling_cur_freq") for d in dirs)
    maximum = _khz_to_mhz(_read(d / "cpufreq/cpuinfo_max_freq") for d in dirs)
    result: dict[str, float | None] = {
        "current": round(sum(current) / len(current), 1) if current else None,
        "max": max(maximum) if maximum else None,
    }
    if result["current"] is None and not os.environ.get("POMT_SYSFS_ROOT"):
        try:
            freq = psutil.cpu_freq()
        except (OSError, NotImplementedError, AttributeError):
            freq = None
        if freq is not None and freq.current:
            result = {"current": round(freq.current, 1), "max": round(freq.max, 1) if freq.max else None}
    return result


def cpu_name() -> str:
    """CPU model from /proc/cpuinfo ("model name"), else platform.processor() or the machine type."""
    text = _read(sysfs_root() / "proc/cpuinfo") or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"


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
    text = _read(path)
    if text is None:
        return {"active": False, "state_file": str(path), "targets": []}
    try:
        stale = path.stat().st_mtime < psutil.boot_time()
    except OSError:
        stale = True
    return {"active": not stale, "state_file": str(path), "targets": parse_lock_state(text), "stale": stale}


_NVML: Any = None  # the pynvml module once initialised, False once it failed
_HANDLES: dict[int, Any] = {}


def _nvml() -> Any:
    """pynvml, imported and initialised on first use; None when NVML is not usable here."""
    global _NVML
    if _NVML is None:
        try:
            import pynvml

            pynvml.nvmlInit()
            _NVML = pynvml
        except Exception:  # ImportError, NVMLError (no driver / library), OSError
            _NVML = False
    return _NVML or None


def _nvml_handle(index: int) -> Any:
    """NVML handle of CUDA device ``index`` (matched by UUID, as CUDA and NVML may order GPUs differently)."""
    if index in _HANDLES:
        return _HANDLES[index]
    nvml = _nvml()
    if nvml is None:
        return None
    handle = None
    try:
        uuid = str(torch.cuda.get_device_properties(index).uuid)
        handle = nvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}")
    except Exception:
        handle = _try(nvml.nvmlDeviceGetHandleByIndex, index)
    if handle is not None:
        _HANDLES[index] = handle
    return handle


def _try(fn: Any, *args: Any) -> Any:
    """fn(*args), or None when the function is missing or NVML reports an error."""
    if fn is None:
        return None
    try:
        value = fn(*args)
    except Exception:  # pynvml.NVMLError and its many subclasses; NotSupported is common
        return None
    return value.decode() if isinstance(value, bytes) else value


def decode_throttle_reasons(mask: int | None) -> list[str] | None:
    """Names of the set NVML clock event reason bits (unknown bits as hex), None if the mask is unknown."""
    if mask is None:
        return None
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    return names + ([hex(rest)] if rest else [])


def _locked_gpu_clocks(nvml: Any, handle: Any) -> dict[str, int] | None:
    """Locked GPU clock range where this NVML has a getter for it (most versions do not)."""
    value = _try(getattr(nvml, "nvmlDeviceGetGpuLockedClocks", None), handle)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return {"min_mhz": int(value[0]), "max_mhz": int(value[1])}
    return None


def read_gpu_info(index: int = 0) -> dict[str, Any] | None:
    """NVML facts and clock state of CUDA device ``index``; None when NVML is unavailable."""
    nvml = _nvml()
    handle = _nvml_handle(index)
    if nvml is None or handle is None:
        return None
    sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    events = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
    mask = _try(events, handle) if events else None
    if mask is None:
        mask = _try(getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None), handle)
    persistence = _try(nvml.nvmlDeviceGetPersistenceMode, handle)
    app_clock = getattr(nvml, "nvmlDeviceGetApplicationsClock", None)  # deprecated, may go away
    return {
        "index": index,
        "name": _try(nvml.nvmlDeviceGetName, handle),
        "driver": _try(nvml.nvmlSystemGetDriverVersion),
        "sm_clock_mhz": _try(nvml.nvmlDeviceGetClockInfo, handle, sm),
        "sm_clock_max_mhz": _try(nvml.nvmlDeviceGetMaxClockInfo, handle, sm),
        "mem_clock_mhz": _try(nvml.nvmlDeviceGetClockInfo, handle, mem),
        "mem_clock_max_mhz": _try(nvml.nvmlDeviceGetMaxClockInfo, handle, mem),
        "locked_gpu_clocks": _locked_gpu_clocks(nvml, handle),
        "applications_clock_sm_mhz": _try(app_clock, handle, sm),
        "applications_clock_mem_mhz": _try(app_clock, handle, mem),
        "persistence_mode": None if persistence is None else bool(persistence),
        "temperature_c": _try(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "power_w": _milliwatts(_try(nvml.nvmlDeviceGetPowerUsage, handle)),
        "power_limit_w": _milliwatts(_try(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)),
        "throttle_reasons": decode_throttle_reasons(mask),
    }


def _milliwatts(value: int | None) -> float | None:
    return None if value is None else value / 1000.0


def gpu_power_w(index: int = 0) -> float | None:
    """Current board power draw of CUDA device ``index`` in watts; None when NVML cannot tell."""
    nvml = _nvml()
    handle = _nvml_handle(index)
    if nvml is None or handle is None:
        return None
    return _milliwatts(_try(nvml.nvmlDeviceGetPowerUsage, handle))


def clocks_locked_gpu(gpu: Mapping[str, Any] | None, lock_targets: Iterable[str] = ()) -> bool | None:
    """GPU verdict from ``read_gpu_info`` output and the targets of an active pomt lock.

    NVML cannot report clocks locked with ``nvidia-smi -lgc`` on most versions, so the evidence is:
    True: NVML reports a locked clock range; or persistence mode is on and an active pomt lock covers
    the GPU (``nvidia``, or ``jetson`` where NVML is absent); or persistence mode is on and the SM clock
    runs exactly at the applications clock (the target ``nvidia-smi -ac`` pins).
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
    sm, app = gpu.get("sm_clock_mhz"), gpu.get("applications_clock_sm_mhz")
    if sm is None:
        return None
    return bool(persistence and app is not None and sm == app)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def device_fingerprint(device: str = "cpu", threads: int | None = None) -> dict[str, Any]:
    """JSON-serialisable facts about the device and its clock state, recorded with every measurement.

    ``clocks_locked`` is the verdict for the device measured on: the CPU's (``clocks_locked_cpu``) on
    "cpu", the GPU's (``clocks_locked_gpu``) on "cuda", None on "mps" (no clock control there).
    ``cpu_clocks_locked`` always gives the CPU's verdict. Raises DeviceError if the device is unavailable.
    """
    device = resolve_device(device)
    kind = device.split(":")[0]
    governor, turbo = read_governors(), read_turbo()
    lock = read_lock_state()
    cpu_locked = clocks_locked_cpu(governor, turbo)
    cpu = cpu_name()
    fp: dict[str, Any] = {
        "kind": kind,
        "device": device,
        "name": cpu,
        "cpu_name": cpu,
        "threads": threads if threads is not None else torch.get_num_threads(),
        "cores_logical": psutil.cpu_count(logical=True),
        "cores_physical": psutil.cpu_count(logical=False),
        "governor": governor,
        "turbo": turbo,
        "cpu_freq_mhz": cpu_freq_mhz(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "timm": _version("timm"),
        "numpy": _version("numpy"),
        "platform": platform.platform(),
        "pomt_lock": lock,
        "allocator": allocator_settings(),
        "cpu_clocks_locked": cpu_locked,
        "clocks_locked": cpu_locked if kind == "cpu" else None,
    }
    if kind == "cuda":
        index = _cuda_index(device)
        gpu = read_gpu_info(index)
        fp["gpu"] = gpu
        fp["name"] = (gpu or {}).get("name") or torch.cuda.get_device_name(index)
        fp["clocks_locked"] = clocks_locked_gpu(gpu, lock["targets"] if lock["active"] else ())
    return fp


ALLOCATOR_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX",
                 "LD_PRELOAD")


def allocator_settings() -> dict[str, str]:
    """The host allocator's settings this process started with (glibc malloc tunables, a preloaded
    jemalloc or tcmalloc): on the 2-core VM, under glibc's dynamic mmap threshold some placements of
    deit_small at batch 4 ran 6-11% slower at N than at N - 3, and none did with the threshold fixed
    (`benchmarks/placement.py`), so a schedule's steps near N may hold only under the allocator settings
    they were measured with."""
    return {name: os.environ[name] for name in ALLOCATOR_ENV if os.environ.get(name)}


IDENTITY = ("kind", "name", "cpu_name", "threads", "cores_logical", "torch", "backend")


def fingerprint_hash(fingerprint: Mapping[str, Any]) -> str:
    """A short hash of what makes a device the same device for latency: its kind and name, the CPU,
    threads and cores, torch and the runtime backend (clocks, temperatures and frequencies left out)."""
    identity = {key: fingerprint.get(key) for key in IDENTITY}
    gpu = fingerprint.get("gpu") or {}
    identity["gpu"] = {key: gpu.get(key) for key in ("name", "driver")} if gpu else None
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def clock_snapshot(device: str) -> dict[str, Any]:
    """A cheap reading of clocks, temperature and power, taken before and after a measurement."""
    kind = device.split(":")[0]
    snap: dict[str, Any] = {"time": time.time(), "kind": kind, "cpu_freq_mhz": cpu_freq_mhz()["current"]}
    if kind == "cuda":
        gpu = read_gpu_info(_cuda_index(device)) or {}
        for key in ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w", "throttle_reasons"):
            snap[key] = gpu.get(key)
    return snap


def require_locked_clocks(fingerprint: Mapping[str, Any]) -> None:
    """Raise DeviceError unless ``fingerprint["clocks_locked"]`` is True."""
    verdict = fingerprint.get("clocks_locked")
    if verdict is True:
        return
    kind = fingerprint.get("kind", "cpu")
    if kind == "cuda":
        gpu = fingerprint.get("gpu") or {}
        detail = f"SM clock {gpu.get('sm_clock_mhz')} MHz, persistence {gpu.get('persistence_mode')}"
    else:
        detail = f"governor {fingerprint.get('governor')}, turbo {fingerprint.get('turbo')}"
    state = "cannot tell whether clocks are locked" if verdict is None else "clocks are not locked"
    raise DeviceError(f"{state} on {kind} ({detail}); run '{LOCK_COMMAND}' first, or measure without "
                      "--require-locked-clocks")


__all__ = [
    "clock_snapshot",
    "fingerprint_hash",
    "clocks_locked_cpu",
    "clocks_locked_gpu",
    "decode_throttle_reasons",
    "device_fingerprint",
    "gpu_power_w",
    "parse_governors",
    "parse_lock_state",
    "parse_turbo",
    "read_gpu_info",
    "read_lock_state",
    "require_locked_clocks",
    "resolve_device",
]
