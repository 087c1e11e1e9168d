"""Clock-state verdicts, the lock state file, and the snapshot taken around a measurement."""

import json
import os
from pathlib import Path

import pytest

from pomt.device import clocks

from device_fakes import make_tree


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
    assert clocks.clocks_locked_cpu(governors, turbo) is expected


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
    assert clocks.clocks_locked_gpu(gpu, targets) is expected


def test_lock_state(fake_root, tmp_path: Path):
    path = clocks.lock_state_path()
    assert path == tmp_path / "state" / "clock_state"
    assert clocks.read_lock_state() == {"active": False, "state_file": str(path), "targets": []}
    path.parent.mkdir()
    path.write_text("# header\nsysfs\t/sys/x\tpowersave\nnvidia\tpersistence\tDisabled\n"
                    "nvidia\tgpu_clocks\tlocked\n")
    state = clocks.read_lock_state()
    assert state["active"] is True and state["targets"] == ["cpu", "nvidia"]
    os.utime(path, (0, 0))  # written before the last boot: clocks were reset since
    assert clocks.read_lock_state()["active"] is False


def test_clock_snapshot_is_json(fake_root):
    make_tree(fake_root, ["performance"], cur_khz=[2400000])
    snap = clocks.clock_snapshot("cpu")
    assert json.loads(json.dumps(snap)) == snap
    assert snap["kind"] == "cpu"
    assert snap["cpu_freq_mhz"] == 2400.0
