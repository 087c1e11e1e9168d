"""Comparison at equal latency: reducer settings, the tuning search, accuracy intervals, and benchmark.py end to end
on deit_tiny at 64 px (--match latency and --match flops), plus its bad input."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch

from pomt.bench.bracket import MAX_PROBES, Bracket, Probe
from pomt.bench.compare import Comparison, compare
from pomt.bench.knobs import knob, largest_constant_r
from pomt.bench.run import BenchConfig, resolve_match
from pomt.checks import check_removals
from pomt.cli import main
from pomt.device import Fingerprint
from pomt.errors import PatchError, ScheduleError, SettingError
from pomt.formats.schedule import BlockRemoval, Schedule, save_schedule
from pomt.formats.schedule_parts import Prediction
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.patching import token_counts
from pomt.stats import Proportion, difference_interval

REDUCERS = ("pomt", "topk", "tome", "l2norm")


@pytest.fixture(scope="module")
def geometry():
    return model_geometry(create_model("deit_tiny", input_size=112))  # 49 patches + 1 class token, 12 blocks


def schedule_file(path, method: str, removal: dict[int, int], size: int = 64):
    tokens = (size // 16) ** 2 + 1
    schedule = Schedule(model="deit_tiny_patch16_224", input_size=(size, size), batch_size=1, num_tokens=tokens,
                        prefix_tokens=1, depth=12, method=method,
                        prune=tuple(BlockRemoval(b, r) for b, r in removal.items()),
                        predicted=Prediction.from_dict({"baseline_ms": 5.0, "pruned_ms": 4.0}),
                        device=Fingerprint(kind="cpu"))
    return save_schedule(schedule, path)


@pytest.mark.parametrize("method", REDUCERS)
def test_every_setting_is_legal_and_removes_more_as_it_rises(geometry, method):
    setting = knob(method, geometry, prune_block=3)
    assert setting.removal(0) == {}
    totals = []
    for value in range(setting.high + 1):
        removal = setting.removal(value)
        check_removals(method, removal, geometry.num_tokens, geometry.prefix_tokens, geometry.depth)
        totals.append(sum(token_counts(geometry.num_tokens, geometry.prefix_tokens, geometry.depth, method,
                                       removal)[:-1]))
    assert all(a >= b for a, b in zip(totals, totals[1:], strict=False)) and totals[-1] < totals[0]
    with pytest.raises(PatchError, match="outside its range"):
        setting.removal(setting.high + 1)


def test_tome_is_r_at_every_block_and_topk_a_rate_at_its_blocks(geometry):
    r = largest_constant_r(geometry)
    assert knob("tome", geometry).removal(2) == dict.fromkeys(range(12), 2)
    with pytest.raises(PatchError):  # one more would be clamped by some block
        check_removals("tome", dict.fromkeys(range(12), r + 1), geometry.num_tokens, 1, 12)
    assert sorted(knob("topk", geometry).removal(10)) == [3, 6, 9]
    assert knob("pomt", geometry, prune_block=5).removal(7) == {5: 7}
    with pytest.raises(PatchError, match="--prune-block"):
        knob("l2norm", geometry, prune_block=12)


def synthetic(value: int, target: float) -> Probe:
    """Latency falling 2% a setting from 1.5 at setting 0, over a target latency; a narrow interval."""
    ratio = (1.5 - 0.02 * value) / target
    return Probe(value, ratio, (ratio * 0.995, ratio * 1.005))


def tune(target: float, start: int, high: int = 60) -> Bracket:
    bracket = Bracket(high, start)
    while (value := bracket.next_value()) is not None:
        assert 0 <= value <= high
        bracket.add(synthetic(value, target))
    return bracket


@pytest.mark.parametrize("start", [0, 10, 30, 60])
def test_the_search_finds_the_setting_of_equal_latency_from_any_start(start):
    bracket = tune(1.0, start)  # latency 1.0 at setting 25
    assert bracket.chosen().value == 25 and len(bracket.probes) <= MAX_PROBES


def test_a_faster_target_needs_a_larger_setting_and_an_unreachable_one_the_end_of_the_range():
    chosen = [tune(target, 20).chosen().value for target in (1.4, 1.2, 1.0, 0.8)]
    assert chosen == sorted(chosen) and chosen[0] < chosen[-1]
    assert tune(0.1, 20).chosen().value == 60 and not tune(0.1, 20).chosen().matched
    assert tune(2.0, 20).chosen().value == 0


def test_difference_interval_is_newcombes():
    low, high = difference_interval(Proportion(56, 70), Proportion(48, 80))  # Newcombe (1998), method 10
    assert (round(low, 4), round(high, 4)) == (0.0524, 0.3339)
    low, high = difference_interval(Proportion(40, 50), Proportion(40, 50))
    assert low < 0 < high and math.isclose(-low, high)


def test_a_difference_whose_interval_holds_zero_is_not_ranked():
    rows = [{"method": "none", "accuracy_correct": 50, "latency_ms": 10.0},
            {"method": "schedule", "accuracy_correct": 45, "latency_ms": 8.0, "amount": "-10@3"},
            {"method": "tome", "accuracy_correct": 44, "latency_ms": 8.1, "amount": "r=2"},
            {"method": "topk", "accuracy_correct": 20, "latency_ms": 7.9, "amount": "-20@3"}]
    by = {c.name: c for c in compare(rows, 50)}
    assert by["tome"].verdict == "indistinguishable" and "not ranked" in by["tome"].line()
    assert by["topk"].verdict == "behind" and "schedule more accurate" in by["topk"].line()
    assert by["none"].verdict == "ahead" and by["tome"].latency_ratio == pytest.approx(8.1 / 8.0)
    assert Comparison.from_dict(by["topk"].to_dict()).line() == by["topk"].line()
    assert compare([{**row, "accuracy_correct": None} for row in rows], 0) == []


def test_variants_on_the_same_images_are_compared_paired():
    """ToMe loses 10 of the 600 images the schedule got right and gains none: unpaired, 590 against 600 of 800
    is not ranked; paired, those ten images are the whole difference and it is ranked."""
    right = torch.zeros(800, dtype=torch.bool)
    right[:600] = True
    tome = right.clone()
    tome[:10] = False
    rows = [{"method": "none", "accuracy_correct": 600, "latency_ms": 10.0},
            {"method": "schedule", "accuracy_correct": 600, "latency_ms": 8.0, "amount": "-10@3"},
            {"method": "tome", "accuracy_correct": 590, "latency_ms": 8.1, "amount": "r=2"}]
    unpaired = {c.name: c for c in compare(rows, 800)}
    paired = {c.name: c for c in compare(rows, 800, {"none": right, "schedule": right, "tome": tome})}
    assert unpaired["tome"].verdict == "indistinguishable" and not unpaired["tome"].paired
    assert paired["tome"].verdict == "behind" and paired["tome"].paired and paired["tome"].ci[1] < 0
    assert paired["none"].ci == pytest.approx((0.0, 0.0), abs=0.01)  # the same images right: no difference
    again = Comparison.from_dict(paired["tome"].to_dict())
    assert again.paired and again.line() == paired["tome"].line()


def test_latency_is_the_default_match_with_a_schedule_and_no_amounts():
    assert resolve_match(BenchConfig(model="deit_tiny"), has_schedule=True) == "latency"
    assert resolve_match(BenchConfig(model="deit_tiny", r=2), has_schedule=True) == "none"
    assert resolve_match(BenchConfig(model="deit_tiny"), has_schedule=False) == "none"
    assert resolve_match(BenchConfig(model="deit_tiny", match="flops"), has_schedule=True) == "flops"
    with pytest.raises(ScheduleError, match="needs a --schedule"):
        resolve_match(BenchConfig(model="deit_tiny", match="latency"), has_schedule=False)
    with pytest.raises(SettingError, match="leave out --keep-rate"):
        resolve_match(BenchConfig(model="deit_tiny", match="latency", keep_rate=0.5), has_schedule=True)


def read_rows(path):
    with open(path, newline="") as handle:
        return {row["method"]: row for row in csv.DictReader(handle)}


def test_reducers_matched_to_a_multi_block_schedules_latency(tmp_path, capsys):
    schedule = schedule_file(tmp_path / "s.schedule.json", "topk", {2: 4, 7: 3})
    args = "--methods none,pomt,topk,tome,l2norm --rounds 2 --warmup 0 --match-rounds 2 --accuracy-samples 8"
    main(["bench", *args.split(), "--no-profile", "--schedule", str(schedule), "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    stem = tmp_path / "deit_tiny_patch16_224_cpu_bs1_is64.benchmark"
    meta = json.loads(Path(f"{stem}.json").read_text())["meta"]
    assert meta["match"] == "latency" and meta["accuracy_samples"] == 8
    assert [m["name"] for m in meta["matches"]] == ["pomt", "topk", "tome", "l2norm"]
    for m in meta["matches"]:
        assert 0 <= m["value"] <= m["range"][1] and 1 <= len(m["probes"]) <= MAX_PROBES
        assert m["value"] in [p["value"] for p in m["probes"]] and m["ci"][0] <= m["ratio"] <= m["ci"][1]
    rows = read_rows(Path(f"{stem}.csv"))
    assert float(rows["schedule"]["latency_vs_schedule"]) == 1.0
    assert rows["tome"]["setting"].startswith("r=") and rows["topk"]["setting"].startswith("keep ")
    for row in rows.values():
        assert float(row["accuracy_low"]) <= float(row["accuracy"]) <= float(row["accuracy_high"])
    assert {c["name"] for c in meta["comparisons"]} == {"none", "pomt", "topk", "tome", "l2norm"}
    assert "reducers matched to the schedule's latency" in out and "vs schedule [" in out
    assert Path(f"{stem}.png").stat().st_size > 0


def test_match_flops_still_matches_flops(tmp_path):
    schedule = schedule_file(tmp_path / "s.schedule.json", "pomt", {3: 6})
    args = "--methods none,topk,l2norm --match flops --rounds 1 --warmup 0 --accuracy-samples 0 --no-profile"
    main(["bench", *args.split(), "--schedule", str(schedule), "--output-dir", str(tmp_path)])
    stem = tmp_path / "deit_tiny_patch16_224_cpu_bs1_is64.benchmark"
    rows = read_rows(Path(f"{stem}.csv"))
    assert float(rows["l2norm"]["gflops"]) == pytest.approx(float(rows["schedule"]["gflops"]), rel=1e-6)
    assert rows["topk"]["accuracy"] == "" and rows["topk"]["accuracy_low"] == ""
    assert json.loads(Path(f"{stem}.json").read_text())["meta"]["match"] == "flops"


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "deit_tiny", "--match", "fastest"], "--match"),
        (["--model", "deit_tiny", "--methods", "tome", "--match", "latency"], "--match latency needs a --schedule"),
        (["--model", "deit_tiny", "--match", "flops"], "--match flops needs a --schedule"),
        (["SCHEDULE", "--methods", "tome", "--r", "2", "--match", "latency"], "leave out --r"),
        (["SCHEDULE", "--methods", "topk", "--input-sizes", "64,96"], "needs the schedule's input size 64"),
        (["SCHEDULE", "--methods", "pomt", "--prune-block", "12"], "--prune-block 12 is outside"),
        (["SCHEDULE", "--match-rounds", "1"], "--match-rounds"),
    ],
)
def test_bad_match_input_is_one_line(args, fragment, tmp_path, capsys):
    schedule = schedule_file(tmp_path / "s.schedule.json", "tome", dict.fromkeys(range(12), 1))
    args = [part for arg in args for part in (["--schedule", str(schedule)] if arg == "SCHEDULE" else [arg])]
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args, "--output-dir", str(tmp_path), "--accuracy-samples", "0", "--no-profile",
              "--rounds", "1", "--warmup", "0"])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "warning" not in line]
    assert len(lines) == 1 and fragment in lines[0], lines
    assert not list(tmp_path.glob("*.benchmark.*"))
