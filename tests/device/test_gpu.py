"""NVML readings through a fake pynvml: calls that fail or do not exist read None."""

import pytest

from pomt.device import fingerprint, gpu


def test_decode_throttle_reasons():
    assert gpu.decode_throttle_reasons(None) is None
    assert gpu.decode_throttle_reasons(0) == []
    assert gpu.decode_throttle_reasons(0x1 | 0x40) == ["gpu_idle", "hw_thermal_slowdown"]
    assert gpu.decode_throttle_reasons(0x4 | 0x1000) == ["sw_power_cap", "0x1000"]


def test_gpu_power_is_float_or_none():
    power = gpu.gpu_power_w(0)
    assert power is None or isinstance(power, float)


def test_cuda_index():
    assert (gpu.cuda_index("cuda"), gpu.cuda_index("cuda:0"), gpu.cuda_index("cuda:3")) == (0, 0, 3)


def test_gpu_fields_from_nvml_survive_missing_and_failing_calls(fake_nvml):
    info = gpu.read_gpu_info(0)
    assert info is not None
    assert info["name"] == "Fake GPU 80GB" and info["driver"] == "550.54"
    assert (info["sm_clock_mhz"], info["mem_clock_max_mhz"]) == (1980, 2619)
    assert info["applications_clock_sm_mhz"] is None and info["power_limit_w"] is None
    assert info["locked_gpu_clocks"] is None
    assert info["persistence_mode"] is True and info["power_w"] == pytest.approx(123.456)
    assert info["throttle_reasons"] == ["gpu_idle", "hw_thermal_slowdown"]
    assert gpu.gpu_power_w(0) == pytest.approx(123.456)
    snap = fingerprint.clock_snapshot("cuda:0")
    assert snap["sm_clock_mhz"] == 1980 and snap["temperature_c"] == 41
