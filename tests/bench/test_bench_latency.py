"""pomt.bench.latency: reducer settings, the tuning search, the prediction from the schedule's curve, and
`pomt bench` matching reducers to a schedule's latency or FLOPs on deit_tiny."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from pomt.bench.latency import MAX_PROBES, Bracket, Probe, knob, largest_constant_r, predictor
from pomt.checks import check_removals
from pomt.cli import main
from pomt.errors import PatchError
from pomt.formats.schedule import load_schedule
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model, geometry_of
from pomt.patching import token_counts

from conftest import DATA
from support.bench_files import read_csv, read_rows, schedule_file, write_schedule

REDUCERS = ("pomt", "topk", "tome", "l2norm")


@pytest.fixture(scope="module")
def geometry():
    return model_geometry(create_model("deit_tiny", input_size=112))  # 49 patches + 1 class token, 12 blocks


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


def test_the_benchmark_predicts_a_schedule_as_the_offline_computation_did(tmp_path):
    # a noisy trace (8.6% a visit), where the smoothed curve's unpruned level is 2% off the measured point's
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
        main(["offline", "--replay", str(DATA / "deit_tiny_bs4_amd_noisy_chained.csv"), "--output-dir", str(tmp_path),
              "--no-progress", "--policy", "budget", "--latency-budget-ms", "135"])
        raise SystemExit(0)
    assert exit_.value.code in (0, None)
    source = next(tmp_path.glob("*.schedule.json"))
    schedule = load_schedule(source)
    assert schedule.removal
    ratio = predictor(schedule, source, geometry_of(schedule.model, 224))
    expected = schedule.predicted.pruned_ms / schedule.predicted.baseline_ms  # a replay measures no method cost
    assert ratio(schedule.method, schedule.removal) == pytest.approx(expected, abs=1e-4)


@pytest.mark.slow
def test_the_schedules_curve_predicts_every_reducer(tmp_path):
    """A curve file beside the schedule (here L(n) = n ms) predicts each variant from the tokens its blocks keep."""
    schedule = write_schedule(tmp_path / "s.schedule.json", {3: 50})
    data = json.loads(schedule.read_text())
    (tmp_path / "c.curve.csv").write_text("tokens,latency_ms\n" + "".join(f"{n},{n}\n" for n in range(2, 198)))
    data["curve"] = "c.curve.csv"
    schedule.write_text(json.dumps(data))
    args = "--methods none,topk,tome --remove 20 --r 4 --rounds 2 --warmup 0 --accuracy-samples 0 --no-profile"
    main(["bench", *args.split(), "--schedule", str(schedule), "--output-dir", str(tmp_path)])
    _, rows = read_csv(tmp_path / "deit_tiny_patch16_224_cpu_bs1_is224.benchmark.csv")
    by = {r["method"]: r for r in rows}
    unpruned = float(by["none"]["latency_ms"])
    expected = {  # sum over blocks of the tokens each receives, over 12 x 197
        "schedule": (4 * 197 + 8 * 147) / (12 * 197),
        "topk": (4 * 197 + 8 * 177) / (12 * 197),
        "tome": sum(token_counts(197, 1, 12, "tome", dict.fromkeys(range(12), 4))[:-1]) / (12 * 197),
    }
    for name, ratio in expected.items():
        assert float(by[name]["predicted_ms"]) == pytest.approx(ratio * unpruned, rel=1e-3), name


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


@pytest.mark.slow
def test_match_flops_within_two_percent(tmp_path):
    schedule = write_schedule(tmp_path / "s.schedule.json", {3: 60})
    args = "--methods none,topk,tome,l2norm --match flops --prune-block 6 --rounds 2 --warmup 0"
    args += " --accuracy-samples 0 --no-profile"
    main(["bench", *args.split(), "--schedule", str(schedule), "--output-dir", str(tmp_path)])
    _, rows = read_csv(tmp_path / "deit_tiny_patch16_224_cpu_bs1_is224.benchmark.csv")
    by = {r["method"]: r for r in rows}
    target = float(by["schedule"]["gflops"])
    for name in ("topk", "tome", "l2norm"):
        assert float(by[name]["gflops"]) == pytest.approx(target, rel=0.02), name
    assert by["topk"]["amount"].endswith("@6") and int(by["topk"]["amount"][1:-2]) > 60
