"""A CUDA GPU as NVML reports it; where NVML is missing or a call fails, the reading is None."""

from __future__ import annotations

from typing import Any

import torch

# NVML clock event ("throttle") reason bits (nvmlClocksEventReason*), as snake_case names.
THROTTLE_REASONS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}

_NVML: Any = None  # the pynvml module once initialised, False once it failed
_HANDLES: dict[int, Any] = {}


def cuda_index(device: str) -> int:
    """The index of a "cuda" or "cuda:N" device string."""
    _, _, index = device.partition(":")
    return int(index) if index else 0


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
        "index": index, "name": _try(nvml.nvmlDeviceGetName, handle), "driver": _try(nvml.nvmlSystemGetDriverVersion),
        "sm_clock_mhz": _try(nvml.nvmlDeviceGetClockInfo, handle, sm),
        "sm_clock_max_mhz": _try(nvml.nvmlDeviceGetMaxClockInfo, handle, sm),
        "mem_clock_mhz": _try(nvml.nvmlDeviceGetClockInfo, handle, mem),
        "mem_clock_max_mhz": _try(nvml.nvmlDeviceGetMaxClockInfo, handle, mem),
        "locked_gpu_clocks": _locked_gpu_clocks(nvml, handle), "applications_clock_sm_mhz": _try(app_clock, handle, sm),
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
