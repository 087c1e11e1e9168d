"""The host allocator a CPU measurement runs under, and the steady one pomt measures with by default: under glibc's
defaults the mmap and trim thresholds adapt, so a ViT's forward gives pages back and faults them in again, a cost
neither steady between processes nor additive over blocks; with both fixed high (`STEADY`) the buffers stay mapped.
`steady_allocator` sets `STEADY` in this process and its environment, unless the environment chose an allocator."""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

from pomt.errors import SettingError

ALLOCATOR_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_ARENA_MAX",
                 "LD_PRELOAD")
STEADY = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20),  # the ceiling of glibc's own adaptation on 64-bit hosts
          "MALLOC_TRIM_THRESHOLD_": str(256 * 2**20)}
ALLOCATORS = ("steady", "inherit")
ALLOCATOR_HELP = ("Host allocator of a CPU run: steady fixes glibc's mmap and trim thresholds (32 MiB, 256 MiB) "
                  "for the run and its child processes unless the environment sets the allocator; inherit: as "
                  "started. Serve under the settings the schedule records (pomt.steady_allocator()).")
STEADY_ADVICE = ("measure with --allocator steady (the default) and serve under the allocator settings the "
                 "schedule records (pomt.steady_allocator()); docs/method.md, section 9")
_MALLOPT_PARAMETER = {"MALLOC_MMAP_THRESHOLD_": -3, "MALLOC_TRIM_THRESHOLD_": -1}  # M_MMAP_THRESHOLD, M_TRIM_...


def allocator_settings() -> dict[str, str]:
    """The host allocator's settings in force, as the environment states them (malloc tunables, a preload)."""
    return {name: os.environ[name] for name in ALLOCATOR_ENV if os.environ.get(name)}


def environment_chose_allocator() -> bool:
    """Whether the environment set a glibc malloc tunable or preloads another allocator (a "malloc" library)."""
    settings = allocator_settings()
    return any(name != "LD_PRELOAD" for name in settings) or "malloc" in settings.get("LD_PRELOAD", "").lower()


def _glibc_mallopt():
    """glibc's `mallopt`, or None on another C library (musl, macOS, Windows)."""
    try:
        libc = ctypes.CDLL(None)  # Windows refuses None (TypeError)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it
        return libc.mallopt
    except (OSError, AttributeError, TypeError):
        return None


def steady_allocator() -> dict[str, str]:
    """Fix glibc's mmap and trim thresholds here and in children unless the environment chose; returns the settings."""
    if environment_chose_allocator():
        return allocator_settings()
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return {}
    for name, value in STEADY.items():
        if mallopt(_MALLOPT_PARAMETER[name], int(value)) != 1:
            return allocator_settings()  # glibc refused it: the defaults stay, as the fingerprint then says
        os.environ[name] = value
    return allocator_settings()


def check_allocator(choice: str) -> str:
    """Raise SettingError unless `choice` is one of ALLOCATORS."""
    if choice not in ALLOCATORS:
        raise SettingError(f"--allocator must be one of {', '.join(ALLOCATORS)}, not {choice!r}")
    return choice


def use_allocator(choice: str) -> dict[str, str]:
    """`steady` (`steady_allocator`) or `inherit` (whatever this process runs); the settings in force."""
    return steady_allocator() if check_allocator(choice) == "steady" else allocator_settings()


def allocator_words(settings: Mapping[str, str] | None) -> str:
    """The settings in a few words: `glibc's defaults` where none is set."""
    return " ".join(f"{k}={v}" for k, v in sorted(settings.items())) if settings else "glibc's defaults"
