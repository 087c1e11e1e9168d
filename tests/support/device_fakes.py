"""Fakes of what pomt.device reads: a sysfs tree and just enough of pynvml."""

from __future__ import annotations

from pathlib import Path


def make_tree(root: Path, governors: list[str | None], no_turbo: str | None = None,
              boost: str | None = None, cur_khz: list[int] | None = None) -> Path:
    """A fake sysfs tree: one cpuN per governor (None: cpufreq without a governor file)."""
    cpu = root / "sys/devices/system/cpu"
    cpu.mkdir(parents=True)
    for i, gov in enumerate(governors):
        freq = cpu / f"cpu{i}" / "cpufreq"
        freq.mkdir(parents=True)
        if gov is not None:
            (freq / "scaling_governor").write_text(gov + "\n")
        if cur_khz:
            (freq / "scaling_cur_freq").write_text(f"{cur_khz[i]}\n")
            (freq / "cpuinfo_max_freq").write_text("3500000\n")
    if no_turbo is not None:
        (cpu / "intel_pstate").mkdir()
        (cpu / "intel_pstate/no_turbo").write_text(no_turbo + "\n")
    if boost is not None:
        (cpu / "cpufreq").mkdir()
        (cpu / "cpufreq/boost").write_text(boost + "\n")
    return root


class FakeNvml:
    """Just enough of pynvml: some calls answer, some raise, some do not exist."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 1, 2, 0

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetName(self, handle):
        return b"Fake GPU 80GB"

    def nvmlSystemGetDriverVersion(self):
        return "550.54"

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return {1: 1980, 2: 2619}[clock]

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return {1: 1980, 2: 2619}[clock]

    def nvmlDeviceGetApplicationsClock(self, handle, clock):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetPersistenceMode(self, handle):
        return 1

    def nvmlDeviceGetTemperature(self, handle, sensor):
        return 41

    def nvmlDeviceGetPowerUsage(self, handle):
        return 123456

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        raise self.NVMLError("Not Supported")

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return 0x41
