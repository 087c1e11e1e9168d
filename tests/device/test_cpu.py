"""The CPU's sysfs readings on fake trees: governors, turbo, frequencies, the model name."""

import pytest

from pomt.device import cpu

from support.device_fakes import make_tree


@pytest.mark.parametrize(("values", "expected"), [
    ([], "unknown"),
    ([None, ""], "unknown"),
    (["performance\n", "performance"], "performance"),
    (["powersave", None, "performance"], "performance,powersave"),
])
def test_parse_governors(values, expected):
    assert cpu.parse_governors(values) == expected


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
    assert cpu.parse_turbo(no_turbo, boost) == expected


def test_readers_on_fake_tree(fake_root):
    make_tree(fake_root, ["schedutil", "performance"], boost="1", cur_khz=[1000000, 2000000])
    assert cpu.read_governors() == "performance,schedutil"
    assert cpu.read_turbo() == "on"
    assert cpu.cpu_freq_mhz() == {"current": 1500.0, "max": 3500.0}


def test_missing_tree_reads_unknown(fake_root):
    assert cpu.read_governors() == "unknown"
    assert cpu.read_turbo() == "unknown"
    assert cpu.cpu_freq_mhz() == {"current": None, "max": None}


def test_cpu_name_from_fake_cpuinfo(fake_root):
    (fake_root / "proc").mkdir(parents=True)
    (fake_root / "proc/cpuinfo").write_text("processor\t: 0\nmodel name\t: Fake CPU @ 3.00GHz\n")
    assert cpu.cpu_name() == "Fake CPU @ 3.00GHz"

