"""Which device to run on, its fingerprint with its clock state, and light clock readings (`cpu`, `gpu`,
`fingerprint`, `allocator`). Nothing here prints or exits; unreadable clock state gives None or "unknown"."""

from pomt.device.allocator import allocator_settings, steady_allocator
from pomt.device.cpu import cpu_freq_mhz, cpu_name, parse_governors, parse_turbo, read_governors, read_turbo, sysfs_root
from pomt.device.fingerprint import (
    LOCK_COMMAND,
    Fingerprint,
    clock_snapshot,
    clocks_locked_cpu,
    clocks_locked_gpu,
    device_fingerprint,
    fingerprint_hash,
    lock_state_path,
    parse_lock_state,
    read_lock_state,
    require_locked_clocks,
    resolve_device,
)
from pomt.device.gpu import decode_throttle_reasons, gpu_power_w, read_gpu_info

__all__ = [
    "LOCK_COMMAND", "Fingerprint", "allocator_settings", "clock_snapshot", "clocks_locked_cpu", "clocks_locked_gpu",
    "cpu_freq_mhz", "cpu_name", "decode_throttle_reasons", "device_fingerprint", "fingerprint_hash", "gpu_power_w",
    "lock_state_path", "parse_governors", "parse_lock_state", "parse_turbo", "read_governors", "read_gpu_info",
    "read_lock_state", "read_turbo", "require_locked_clocks", "resolve_device", "steady_allocator", "sysfs_root",
]
