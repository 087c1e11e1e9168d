"""pomt.bench.config: the options' names and checks, and the defaults a schedule gives (dtype, runtime, match)."""

from __future__ import annotations

import dataclasses

import pytest

from pomt.bench.config import BenchConfig, resolve, resolve_match, variant_methods
from pomt.errors import PatchError, ScheduleError, SettingError
from pomt.formats.schedule import load_schedule, save_schedule
from pomt.runtimes import BACKENDS, DTYPES

from support.bench_files import write_schedule


def test_dtype_and_backend_options_are_the_runtimes_names():
    meta = {f.name: f.metadata for f in dataclasses.fields(BenchConfig)}
    assert meta["dtype"]["choices"] == tuple(DTYPES) and meta["backend"]["choices"] == BACKENDS


def test_a_schedule_is_benchmarked_in_its_own_dtype_unless_told(tmp_path):
    """A float16 schedule measured at float32 would benchmark another workload: --dtype defaults to the
    schedule's, an explicit --dtype wins, and without a schedule it is float32."""
    path = write_schedule(tmp_path / "s.schedule.json", {3: 10})
    half = save_schedule(dataclasses.replace(load_schedule(path), dtype="bfloat16"), tmp_path / "h.schedule.json")
    assert resolve(BenchConfig(schedule=half, device="cpu")).config.dtype == "bfloat16"
    assert resolve(BenchConfig(schedule=path, device="cpu")).config.dtype == "float32"
    assert resolve(BenchConfig(schedule=half, device="cpu", dtype="float32")).config.dtype == "float32"
    assert resolve(BenchConfig(model="deit_tiny", device="cpu")).config.dtype == "float32"


def test_a_schedule_is_benchmarked_on_its_own_runtime_unless_told(tmp_path):
    """A schedule's latency holds on the runtime it was measured on: --backend defaults to the schedule's runtime,
    an explicit --backend wins, and without a schedule it is eager."""
    path = write_schedule(tmp_path / "s.schedule.json", {3: 10})
    served = save_schedule(dataclasses.replace(load_schedule(path), backend={"name": "openvino"}),
                           tmp_path / "o.schedule.json")
    assert resolve(BenchConfig(schedule=served, device="cpu")).config.backend == "openvino"
    assert resolve(BenchConfig(schedule=path, device="cpu")).config.backend == "eager"
    assert resolve(BenchConfig(schedule=served, device="cpu", backend="eager")).config.backend == "eager"
    assert resolve(BenchConfig(model="deit_tiny", device="cpu")).config.backend == "eager"


def test_latency_is_the_default_match_with_a_schedule_and_no_amounts():
    assert resolve_match(BenchConfig(model="deit_tiny"), has_schedule=True) == "latency"
    assert resolve_match(BenchConfig(model="deit_tiny", r=2), has_schedule=True) == "none"
    assert resolve_match(BenchConfig(model="deit_tiny"), has_schedule=False) == "none"
    assert resolve_match(BenchConfig(model="deit_tiny", match="flops"), has_schedule=True) == "flops"
    with pytest.raises(ScheduleError, match="needs a --schedule"):
        resolve_match(BenchConfig(model="deit_tiny", match="latency"), has_schedule=False)
    with pytest.raises(SettingError, match="leave out --keep-rate"):
        resolve_match(BenchConfig(model="deit_tiny", match="latency", keep_rate=0.5), has_schedule=True)


def test_the_methods_and_the_match_are_checked_with_the_configuration():
    with pytest.raises(PatchError, match="choose one of none, pomt, topk, tome, l2norm, random"):
        BenchConfig(model="deit_tiny", methods="none,fastest").check()
    with pytest.raises(SettingError, match="--match must be one of auto, latency, flops, none"):
        BenchConfig(model="deit_tiny", match="fastest").check()
    assert variant_methods("tome, none,tome") == ["none", "tome"]
