"""The CPU as sysfs and procfs show it: scaling governors, turbo, frequencies and the model name. Every path is
read under ``POMT_SYSFS_ROOT``, so tests can use a fake tree; what cannot be read is "unknown" or None."""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable
from pathlib import Path

import psutil


def sysfs_root() -> Path:
    """The root every sysfs/procfs path is read under: ``$POMT_SYSFS_ROOT`` or ``/``."""
    return Path(os.environ.get("POMT_SYSFS_ROOT") or "/")


def read_text(path: Path) -> str | None:
    """The file's text, stripped; None when it cannot be read."""
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _cpu_dir() -> Path:
    return sysfs_root() / "sys/devices/system/cpu"


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


def read_governors() -> str:
    """Unique scaling governors across CPUs, from sysfs."""
    return parse_governors(read_text(d / "cpufreq/scaling_governor") for d in _cpu_dirs())


def read_turbo() -> str:
    """Turbo/boost state from sysfs: "on", "off" or "unknown"."""
    return parse_turbo(read_text(_cpu_dir() / "intel_pstate/no_turbo"), read_text(_cpu_dir() / "cpufreq/boost"))


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
    current = _khz_to_mhz(read_text(d / "cpufreq/scaling_cur_freq") for d in dirs)
    maximum = _khz_to_mhz(read_text(d / "cpufreq/cpuinfo_max_freq") for d in dirs)
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
    text = read_text(sysfs_root() / "proc/cpuinfo") or ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "Hardware") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine() or "unknown"
