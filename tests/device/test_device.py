"""Device resolution, clock-state verdicts on fake sysfs trees, and the fingerprint's shape."""

import json
import os
from pathlib import Path

import pytest
import torch

from pomt import device as dev
from pomt.errors import DeviceError

HAS_CUDA = torch.cuda.is_available()
HAS_MPS = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())


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


@pytest.fixture
def fake_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "sysfs"
    monkeypatch.setenv("POMT_SYSFS_ROOT", str(root))
    monkeypatch.setenv("POMT_STATE_DIR", str(tmp_path / "state"))
    return root


@pytest.mark.parametrize(("values", "expected"), [
    ([], "unknown"),
    ([None, ""], "unknown"),
    (["performance\n", "performance"], "performance"),
    (["powersave", None, "performance"], "performance,powersave"),
])
def test_parse_governors(values, expected):
    assert dev.parse_governors(values) == expected


@pytest.mark.parametrize(("no_turbo", "boost", "expected"), [
    ("1", None, "off"),
    ("0\n", None, "on"),
    (None, "0", "off"),
    (None, "1", "on"),
    ("1", "1", "off"),  # intel_pstate wins
    (None, None, "unknown"),
    ("garbage", None, "unknown"),
])
def test_parse_turbo(no_turbo, boost, expected):
    assert dev.parse_turbo(no_turbo, boost) == expected


@pytest.mark.parametrize(("governors", "turbo", "expected"), [
    ("performance", "off", True),
    ("performance", "on", False),
    ("performance", "unknown", None),
    ("performance,powersave", "off", False),
    ("powersave", "unknown", False),
    ("unknown", "on", False),
    ("unknown", "off", None),
    ("unknown", "unknown", None),
])
def test_clocks_locked_cpu(governors, turbo, expected):
    assert dev.clocks_locked_cpu(governors, turbo) is expected


@pytest.mark.parametrize(("governors", "no_turbo", "boost", "verdict"), [
    (["performance", "performance"], "1", None, True),
    (["performance", "performance"], None, "0", True),
    (["performance", "powersave"], "1", None, False),
    (["performance", "performance"], "0", None, False),
    (["performance", "performance"], None, None, None),
    ([None, None], None, None, None),
])
def test_verdict_from_fake_tree(fake_root, governors, no_turbo, boost, verdict):
    make_tree(fake_root, governors, no_turbo=no_turbo, boost=boost)
    fp = dev.device_fingerprint("cpu")
    assert fp["clocks_locked"] is verdict
    assert fp["cpu_clocks_locked"] is verdict


def test_readers_on_fake_tree(fake_root):
    make_tree(fake_root, ["schedutil", "performance"], boost="1", cur_khz=[1000000, 2000000])
    assert dev.read_governors() == "performance,schedutil"
    assert dev.read_turbo() == "on"
    assert dev.cpu_freq_mhz() == {"current": 1500.0, "max": 3500.0}


def test_missing_tree_reads_unknown(fake_root):
    assert dev.read_governors() == "unknown"
    assert dev.read_turbo() == "unknown"
    assert dev.cpu_freq_mhz() == {"current": None, "max": None}


def test_cpu_name_from_fake_cpuinfo(fake_root):
    (fake_root / "proc").mkdir(parents=True)
    (fake_root / "proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: Fake CPU @ 3.00GHz\n")
    assert dev.cpu_name() == "Fake CPU @ 3.00GHz"


def test_fingerprint_is_json_and_has_the_keys(fake_root):
    make_tree(fake_root, ["performance"], no_turbo="1", cur_khz=[3000000])
    fp = dev.device_fingerprint("cpu", threads=3)
    assert json.loads(json.dumps(fp)) == fp
    for key in ("kind", "name", "threads", "cores_logical", "cores_physical", "governor", "turbo",
                "cpu_freq_mhz", "python", "torch", "timm", "numpy", "platform", "clocks_locked",
                "cpu_clocks_locked", "pomt_lock", "allocator"):
        assert key in fp, key
    assert fp["kind"] == "cpu"
    assert fp["threads"] == 3
    assert fp["governor"] == "performance"
    assert fp["turbo"] == "off"
    assert dev.device_fingerprint("cpu")["threads"] == torch.get_num_threads()


def test_clock_snapshot_is_json(fake_root):
    make_tree(fake_root, ["performance"], cur_khz=[2400000])
    snap = dev.clock_snapshot("cpu")
    assert json.loads(json.dumps(snap)) == snap
    assert snap["kind"] == "cpu"
    assert snap["cpu_freq_mhz"] == 2400.0


@pytest.mark.skipif(HAS_CUDA or HAS_MPS, reason="an accelerator is present")
def test_resolve_auto_is_cpu_here():
    assert dev.resolve_device("auto") == "cpu"


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA GPU is present")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_resolve_cuda_unavailable_raises(name):
    with pytest.raises(DeviceError, match="not available"):
        dev.resolve_device(name)


@pytest.mark.skipif(HAS_MPS, reason="MPS is present")
def test_resolve_mps_unavailable_raises():
    with pytest.raises(DeviceError):
        dev.resolve_device("mps")


def test_resolve_cpu_and_unknown():
    assert dev.resolve_device(" CPU ") == "cpu"
    with pytest.raises(DeviceError, match="unknown device"):
        dev.resolve_device("tpu")
    with pytest.raises(DeviceError):
        dev.device_fingerprint("cuda:x")


GPU_FREE = {"sm_clock_mhz": 1980, "applications_clock_sm_mhz": 1755, "persistence_mode": False,
            "locked_gpu_clocks": None}


@pytest.mark.parametrize(("gpu", "targets", "expected"), [
    (None, (), None),
    (None, ("jetson",), True),
    ({}, ("cpu",), None),
    ({**GPU_FREE, "sm_clock_mhz": None}, (), None),
    (GPU_FREE, (), False),
    ({**GPU_FREE, "sm_clock_mhz": 210}, (), False),
    ({**GPU_FREE, "locked_gpu_clocks": {"min_mhz": 1500, "max_mhz": 1500}}, (), True),
    ({**GPU_FREE, "persistence_mode": True}, ("cpu", "nvidia"), True),
    ({**GPU_FREE, "persistence_mode": False}, ("nvidia",), False),
    ({**GPU_FREE, "persistence_mode": True, "sm_clock_mhz": 1755}, (), True),
    ({**GPU_FREE, "persistence_mode": False, "sm_clock_mhz": 1755}, (), False),
    ({**GPU_FREE, "persistence_mode": True, "applications_clock_sm_mhz": None}, (), False),
])
def test_clocks_locked_gpu(gpu, targets, expected):
    assert dev.clocks_locked_gpu(gpu, targets) is expected


def test_decode_throttle_reasons():
    assert dev.decode_throttle_reasons(None) is None
    assert dev.decode_throttle_reasons(0) == []
    assert dev.decode_throttle_reasons(0x1 | 0x40) == ["gpu_idle", "hw_thermal_slowdown"]
    assert dev.decode_throttle_reasons(0x4 | 0x1000) == ["sw_power_cap", "0x1000"]


def test_lock_state(fake_root, tmp_path: Path):
    path = dev.lock_state_path()
    assert path == tmp_path / "state" / "clock_state"
    assert dev.read_lock_state() == {"active": False, "state_file": str(path), "targets": []}
    path.parent.mkdir()
    path.write_text("# header\nsysfs\t/sys/x\tpowersave\nnvidia\tpersistence\tDisabled\n"
                    "nvidia\tgpu_clocks\tlocked\n")
    state = dev.read_lock_state()
    assert state["active"] is True and state["targets"] == ["cpu", "nvidia"]
    os.utime(path, (0, 0))  # written before the last boot: clocks were reset since
    assert dev.read_lock_state()["active"] is False


def test_require_locked_clocks():
    dev.require_locked_clocks({"kind": "cpu", "clocks_locked": True})
    for verdict in (False, None):
        with pytest.raises(DeviceError) as err:
            dev.require_locked_clocks({"kind": "cpu", "clocks_locked": verdict, "governor": "powersave"})
        message = str(err.value)
        assert "scripts/lock_clocks.sh lock" in message and "\n" not in message
    with pytest.raises(DeviceError, match="SM clock 1980"):
        dev.require_locked_clocks({"kind": "cuda", "clocks_locked": False, "gpu": GPU_FREE})


def test_gpu_power_is_float_or_none():
    power = dev.gpu_power_w(0)
    assert power is None or isinstance(power, float)


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


@pytest.fixture
def fake_nvml(fake_root, monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    nvml = FakeNvml()
    monkeypatch.setattr(dev, "_NVML", nvml)
    monkeypatch.setattr(dev, "_HANDLES", {0: "handle-0"})
    monkeypatch.setattr(dev, "resolve_device", lambda name: name)
    return nvml


def test_gpu_fields_from_nvml_survive_missing_and_failing_calls(fake_nvml):
    gpu = dev.read_gpu_info(0)
    assert gpu is not None
    assert gpu["name"] == "Fake GPU 80GB" and gpu["driver"] == "550.54"
    assert (gpu["sm_clock_mhz"], gpu["mem_clock_max_mhz"]) == (1980, 2619)
    assert gpu["applications_clock_sm_mhz"] is None and gpu["power_limit_w"] is None
    assert gpu["locked_gpu_clocks"] is None
    assert gpu["persistence_mode"] is True and gpu["power_w"] == pytest.approx(123.456)
    assert gpu["throttle_reasons"] == ["gpu_idle", "hw_thermal_slowdown"]
    assert dev.gpu_power_w(0) == pytest.approx(123.456)
    snap = dev.clock_snapshot("cuda:0")
    assert snap["sm_clock_mhz"] == 1980 and snap["temperature_c"] == 41


def test_cuda_fingerprint_uses_gpu_verdict(fake_nvml, tmp_path: Path):
    make_tree(tmp_path / "sysfs", ["performance"], no_turbo="1")
    fp = dev.device_fingerprint("cuda")
    assert json.loads(json.dumps(fp)) == fp
    assert fp["kind"] == "cuda" and fp["name"] == "Fake GPU 80GB"
    assert fp["clocks_locked"] is False and fp["cpu_clocks_locked"] is True
    state = dev.lock_state_path()
    state.parent.mkdir()
    state.write_text("nvidia\tpersistence\tDisabled\nnvidia\tgpu_clocks\tlocked\n")
    assert dev.device_fingerprint("cuda")["clocks_locked"] is True


def test_the_allocator_settings_are_recorded_and_leave_the_device_identity_alone(monkeypatch):
    """glibc's dynamic mmap threshold moved a 10% cliff near N between processes (benchmarks/placement.py):
    a fingerprint says which allocator settings a curve was measured under, without making the machine
    another device for `apply_schedule`'s check."""
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    before = dev.device_fingerprint("cpu")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1073741824")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    after = dev.device_fingerprint("cpu")
    assert "MALLOC_MMAP_THRESHOLD_" not in before["allocator"]
    assert after["allocator"] == {"MALLOC_MMAP_THRESHOLD_": "1073741824",
                                  "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert dev.fingerprint_hash(before) == dev.fingerprint_hash(after)
