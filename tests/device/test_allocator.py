"""The host allocator: the settings in force, the steady one set in this process and passed to its children."""

import json
import os
import subprocess
import sys

import pytest

from pomt.device import allocator
from pomt.device.allocator import ALLOCATOR_ENV, STEADY, allocator_settings, steady_allocator, use_allocator
from pomt.errors import SettingError
from pomt.workload.prepare import Host, prepare_run


@pytest.fixture
def defaults(monkeypatch):
    """The environment of a process started without allocator settings."""
    for name in ALLOCATOR_ENV:
        monkeypatch.delenv(name, raising=False)


def test_allocator_settings_are_the_tunables_set(defaults, monkeypatch):
    assert allocator_settings() == {}
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    monkeypatch.setenv("MALLOC_TOP_PAD_", "")
    assert allocator_settings() == {"MALLOC_ARENA_MAX": "2"}


@pytest.mark.skipif(allocator._glibc_mallopt() is None, reason="glibc only")
def test_the_steady_allocator_is_set_here_and_in_every_child_process(defaults):
    assert steady_allocator() == STEADY == allocator_settings()
    assert steady_allocator() == STEADY  # again: nothing changes
    child = subprocess.run([sys.executable, "-c", "from pomt.device import device_fingerprint as f; import json; "
                            "print(json.dumps(f('cpu').allocator))"], capture_output=True, text=True, check=True)
    assert json.loads(child.stdout) == STEADY


def test_an_allocator_the_environment_chose_is_left_alone(defaults, monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert steady_allocator() == {"MALLOC_ARENA_MAX": "2"}
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert steady_allocator() == {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}
    assert "MALLOC_MMAP_THRESHOLD_" not in os.environ


@pytest.mark.skipif(allocator._glibc_mallopt() is None, reason="glibc only")
def test_a_preload_that_is_no_allocator_does_not_stop_the_steady_one(defaults, monkeypatch):
    monkeypatch.setenv("LD_PRELOAD", "/opt/tools/libtrace-io.so")
    assert steady_allocator() == {**STEADY, "LD_PRELOAD": "/opt/tools/libtrace-io.so"}


def test_inherit_changes_nothing_and_other_choices_are_refused(defaults):
    assert use_allocator("inherit") == {}
    with pytest.raises(SettingError, match="--allocator must be one of steady, inherit"):
        use_allocator("jemalloc")


@pytest.mark.skipif(allocator._glibc_mallopt() is None, reason="glibc only")
def test_a_cpu_run_records_the_allocator_it_measures_under(defaults):
    assert prepare_run("deit_tiny", "cpu", host=Host("inherit")).fingerprint.allocator == {}
    assert prepare_run("deit_tiny", "cpu").fingerprint.allocator == STEADY
    with pytest.raises(SettingError):
        prepare_run("deit_tiny", "cpu", host=Host("tcmalloc"))
