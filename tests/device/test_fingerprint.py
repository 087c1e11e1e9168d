"""Device resolution, the fingerprint's shape and its dict form (older and partial ones included), its hash,
the refusal to measure on unlocked clocks, clock-state verdicts, the lock state file, and the snapshot taken
around a measurement."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import pomt.device as dev
from pomt.device import fingerprint
from pomt.device.allocator import ALLOCATOR_ENV
from pomt.device.fingerprint import Fingerprint, device_fingerprint, fingerprint_hash, require_locked_clocks
from pomt.errors import DeviceError

from conftest import DATA
from support.device_fakes import make_tree

HAS_CUDA = torch.cuda.is_available()
HAS_MPS = bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available())
CPU_KEYS = ["kind", "device", "name", "cpu_name", "threads", "cores_logical", "cores_physical", "governor", "turbo",
            "cpu_freq_mhz", "python", "torch", "timm", "numpy", "platform", "pomt_lock", "allocator",
            "cpu_clocks_locked", "clocks_locked"]
SIDECARS = sorted(p for p in DATA.glob("*.json") if isinstance(json.loads(p.read_text()).get("device"), dict))


def test_the_package_exports_its_modules_public_names():
    for name in dev.__all__:
        assert getattr(dev, name) is not None, name
    assert dev.device_fingerprint is device_fingerprint and dev.Fingerprint is Fingerprint


@pytest.mark.skipif(HAS_CUDA or HAS_MPS, reason="an accelerator is present")
def test_resolve_auto_is_cpu_here():
    assert fingerprint.resolve_device("auto") == "cpu"


@pytest.mark.skipif(HAS_CUDA, reason="a CUDA GPU is present")
@pytest.mark.parametrize("name", ["cuda", "cuda:1"])
def test_resolve_cuda_unavailable_raises(name):
    with pytest.raises(DeviceError, match="not available"):
        fingerprint.resolve_device(name)


@pytest.mark.skipif(HAS_MPS, reason="MPS is present")
def test_resolve_mps_unavailable_raises():
    with pytest.raises(DeviceError):
        fingerprint.resolve_device("mps")


def test_resolve_cpu_and_unknown():
    assert fingerprint.resolve_device(" CPU ") == "cpu"
    with pytest.raises(DeviceError, match="unknown device"):
        fingerprint.resolve_device("tpu")
    with pytest.raises(DeviceError):
        device_fingerprint("cuda:x")


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
    fp = device_fingerprint("cpu")
    assert fp.clocks_locked is verdict
    assert fp.cpu_clocks_locked is verdict


def test_fingerprint_is_json_and_has_the_keys(fake_root):
    make_tree(fake_root, ["performance"], no_turbo="1", cur_khz=[3000000])
    fp = device_fingerprint("cpu", threads=3)
    data = fp.to_dict()
    assert json.loads(json.dumps(data)) == data
    for key in ("kind", "name", "threads", "cores_logical", "cores_physical", "governor", "turbo",
                "cpu_freq_mhz", "python", "torch", "timm", "numpy", "platform", "clocks_locked",
                "cpu_clocks_locked", "pomt_lock", "allocator"):
        assert key in data, key
    assert list(data) == CPU_KEYS  # the order measurements have always recorded
    assert fp.kind == "cpu" and data["kind"] == "cpu"
    assert fp.threads == 3
    assert fp.governor == "performance"
    assert fp.turbo == "off"
    assert device_fingerprint("cpu").threads == torch.get_num_threads()


def test_cuda_fingerprint_uses_gpu_verdict(fake_nvml, tmp_path):
    make_tree(tmp_path / "sysfs", ["performance"], no_turbo="1")
    fp = device_fingerprint("cuda")
    data = fp.to_dict()
    assert json.loads(json.dumps(data)) == data and list(data) == [*CPU_KEYS, "gpu"]
    assert fp.kind == "cuda" and fp.name == "Fake GPU 80GB" and fp.gpu["driver"] == "550.54"
    assert fp.clocks_locked is False and fp.cpu_clocks_locked is True
    state = dev.lock_state_path()
    state.parent.mkdir()
    state.write_text("nvidia\tpersistence\tDisabled\nnvidia\tgpu_clocks\tlocked\n")
    assert device_fingerprint("cuda").clocks_locked is True


def test_the_allocator_settings_are_recorded_and_leave_the_device_identity_alone(monkeypatch):
    """glibc's dynamic mmap threshold moved a 10% cliff near N between processes (benchmarks/placement.py):
    a fingerprint says which allocator settings a curve was measured under, without making the machine
    another device for `apply_schedule`'s check."""
    for name in ALLOCATOR_ENV:  # whatever an earlier test in this process left set
        monkeypatch.delenv(name, raising=False)
    before = device_fingerprint("cpu")
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "1073741824")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    after = device_fingerprint("cpu")
    assert "MALLOC_MMAP_THRESHOLD_" not in before.allocator
    assert after.allocator == {"MALLOC_MMAP_THRESHOLD_": "1073741824",
                               "LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert fingerprint_hash(before) == fingerprint_hash(after)


@pytest.mark.parametrize("sidecar", SIDECARS, ids=lambda p: p.stem)
def test_a_recorded_fingerprint_is_written_back_as_it_was(sidecar):
    """Sidecars of several pomt versions (with and without `allocator`, with `gpu`): same keys, same order."""
    recorded = json.loads(sidecar.read_text())["device"]
    fp = Fingerprint.from_dict(recorded)
    assert json.dumps(fp.to_dict()) == json.dumps(recorded)
    assert fp.kind == recorded["kind"] and fp.name == recorded["name"] and fp.backend == recorded["backend"]
    assert fp.allocator == recorded.get("allocator") and fp.extra == {}


def test_a_partial_fingerprint_keeps_what_it_has_and_its_unknown_keys():
    """An old trace's few facts, a null that must stay, and keys this pomt does not know."""
    old = {"kind": "cpu", "name": None, "threads": 2, "future": {"a": 1}, "torch": "2.5.1", "timm": None}
    fp = Fingerprint.from_dict(old)
    assert (fp.kind, fp.name, fp.threads, fp.torch, fp.allocator) == ("cpu", None, 2, "2.5.1", None)
    assert fp.extra == {"future": {"a": 1}}
    assert json.dumps(fp.to_dict()) == json.dumps(old)
    replayed = Fingerprint.from_dict({**old, "replayed_from": "x.csv"})
    assert replayed.replayed_from == "x.csv" and list(replayed.to_dict())[-1] == "replayed_from"


def test_fields_set_later_follow_the_recorded_keys_as_a_dict_update_would():
    recorded = {"kind": "cpu", "name": "x", "dtype": "float16", "threads": 1}
    fp = replace(Fingerprint.from_dict(recorded), backend={"name": "eager"}, dtype="float32")
    assert fp.to_dict() == {**recorded, "backend": {"name": "eager"}, "dtype": "float32"}
    assert list(fp.to_dict()) == [*recorded, "backend"]
    assert Fingerprint(kind="cpu", threads=2).to_dict() == {"kind": "cpu", "threads": 2}
    assert Fingerprint().to_dict() == {}


def test_the_hash_is_the_one_earlier_pomt_computed():
    """Hashes of the same dicts computed by pomt before the fingerprint was typed (6e122db)."""
    amd = json.loads((DATA / "deit_small_bs4_amd_shuffled.json").read_text())["device"]
    h100 = json.loads((DATA / "deit_base_bs64_fp16_h100_shuffled.json").read_text())["device"]
    old = {"kind": "cpu", "name": "AMD EPYC", "threads": 2, "torch": "2.5.1", "timm": "1.0.11"}
    assert fingerprint_hash(Fingerprint.from_dict(amd)) == "b49ebaf973deab1b"
    assert fingerprint_hash(Fingerprint.from_dict(h100)) == "b3f9f926b06d99fb"
    assert fingerprint_hash(Fingerprint.from_dict(old)) == "44f61b6d8d4e5c77"
    changed = Fingerprint.from_dict({**amd, "governor": "powersave", "dtype": "bfloat16", "extra_key": 1})
    assert fingerprint_hash(changed) == "b49ebaf973deab1b"  # clocks, dtype and unknown keys are no identity


def test_require_locked_clocks():
    require_locked_clocks(Fingerprint.from_dict({"kind": "cpu", "clocks_locked": True}))
    for verdict in (False, None):
        with pytest.raises(DeviceError) as err:
            require_locked_clocks(Fingerprint.from_dict({"kind": "cpu", "clocks_locked": verdict,
                                                         "governor": "powersave"}))
        message = str(err.value)
        assert "scripts/lock_clocks.sh lock" in message and "\n" not in message
    gpu = {"sm_clock_mhz": 1980, "applications_clock_sm_mhz": 1755, "persistence_mode": False,
           "locked_gpu_clocks": None}
    with pytest.raises(DeviceError, match="SM clock 1980"):
        require_locked_clocks(Fingerprint.from_dict({"kind": "cuda", "clocks_locked": False, "gpu": gpu}))



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
    assert fingerprint.clocks_locked_cpu(governors, turbo) is expected


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
    # an H100 lent unlocked, read under load: boosting to its maximum, which is also its applications clock
    ({**GPU_FREE, "persistence_mode": True, "applications_clock_sm_mhz": 1980, "sm_clock_max_mhz": 1980}, (), False),
    ({**GPU_FREE, "persistence_mode": True, "sm_clock_mhz": 1755, "sm_clock_max_mhz": 1980}, (), True),
])
def test_clocks_locked_gpu(gpu, targets, expected):
    assert fingerprint.clocks_locked_gpu(gpu, targets) is expected


def test_lock_state(fake_root, tmp_path: Path):
    path = fingerprint.lock_state_path()
    assert path == tmp_path / "state" / "clock_state"
    assert fingerprint.read_lock_state() == {"active": False, "state_file": str(path), "targets": []}
    path.parent.mkdir()
    path.write_text("# header\nsysfs\t/sys/x\tpowersave\nnvidia\tpersistence\tDisabled\n"
                    "nvidia\tgpu_clocks\tlocked\n")
    state = fingerprint.read_lock_state()
    assert state["active"] is True and state["targets"] == ["cpu", "nvidia"]
    os.utime(path, (0, 0))  # written before the last boot: clocks were reset since
    assert fingerprint.read_lock_state()["active"] is False


def test_clock_snapshot_is_json(fake_root):
    make_tree(fake_root, ["performance"], cur_khz=[2400000])
    snap = fingerprint.clock_snapshot("cpu")
    assert json.loads(json.dumps(snap)) == snap
    assert snap["kind"] == "cpu"
    assert snap["cpu_freq_mhz"] == 2400.0
