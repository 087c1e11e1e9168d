"""The frontier of (predicted latency, accuracy), whether a schedule meets an accuracy goal, what may ship from
it, best first, the uniform schedule to beat, the frontier's table, and a
frontier schedule as the schedule file it ships as (on hand-made evaluations; the last applied to a tiny ViT)."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch

import pomt
from pomt.formats.schedule import BlockRemoval, Schedule, load_schedule, save_schedule
from pomt.frontier.candidates import Candidate
from pomt.frontier.choice import (
    Evaluated,
    Goal,
    accuracy_at_least,
    best_uniform,
    drop_within,
    first_verified,
    held_out_drop,
    pareto_front,
    preference,
    to_verify,
    verified_choice,
)
from pomt.frontier.latency import LatencyModel
from pomt.frontier.report import COLUMNS, document, row, rows
from pomt.frontier.search import FrontierResult
from pomt.models.geometry import transformer_blocks
from pomt.models.registry import create_model
from pomt.offline.choose import as_schedule, effective_removal
from pomt.offline.write import frontier_record
from pomt.stats import Proportion
from pomt.verification.verify import CandidateResult

UNPRUNED = Evaluated(Candidate.of("pomt", {}), "unpruned", 10.0, Proportion(90, 100))


def point(method: str, removal: dict, family: str, ms: float, correct: int) -> Evaluated:
    return Evaluated(Candidate.of(method, removal), family, ms, Proportion(correct, 100))


POINTS = [
    point("tome", {0: 2, 1: 2}, "tome-constant", 8.0, 89),
    point("tome", {0: 4, 1: 4}, "tome-constant", 7.0, 85),
    point("pomt", {5: 20}, "search-pomt", 7.5, 90),
    point("pomt", {2: 30, 6: 10}, "search-pomt", 6.0, 89),
    point("topk", {3: 30}, "topk-rate", 6.5, 80),
]


def result(points=POINTS) -> FrontierResult:
    evaluated = (UNPRUNED, *points)
    return FrontierResult(UNPRUNED, evaluated, tuple(pareto_front(evaluated)), len(evaluated))


def test_the_fastest_within_the_drop_ships_first_then_the_next():
    order = preference(result(), Goal(max_drop_points=1.0))
    assert [p.candidate.key for p in order] == ["pomt:2=30,6=10", "pomt:5=20"]
    assert preference(result(), Goal(max_drop_points=0.5))[0].candidate.key == "pomt:5=20"
    slower = point("pomt", {11: 1}, "search-pomt", 10.5, 95)  # more accurate, but slower than unpruned
    assert slower in result([*POINTS, slower]).frontier
    assert slower not in preference(result([*POINTS, slower]), Goal(max_drop_points=1.0))


def test_a_latency_budget_ships_the_most_accurate_within_it():
    order = preference(result(), Goal(max_drop_points=None, latency_budget_ms=7.6))
    assert [p.candidate.key for p in order] == ["pomt:5=20", "pomt:2=30,6=10"]
    floor = Goal(max_drop_points=None, latency_budget_ms=7.6, min_accuracy=0.9, confidence=0.5)
    assert preference(result(), floor)[0].candidate.key == "pomt:5=20"
    assert preference(result(), replace(floor, confidence=0.95)) == []  # 90 of 100: its lower bound is 0.840
    assert preference(result(), replace(floor, min_accuracy=0.83, confidence=0.95))[0].candidate.key == "pomt:5=20"
    assert preference(result(), Goal(max_drop_points=None, latency_budget_ms=5.0)) == []


def test_above_half_confidence_a_schedule_that_changed_fewer_images_can_ship_first():
    baseline = Evaluated(Candidate.of("pomt", {}), "unpruned", 10.0, Proportion(900, 1000, 0, 0))
    churn = Evaluated(Candidate.of("tome", {0: 9}), "search-tome", 6.0, Proportion(895, 1000, 40, 35))
    steady = Evaluated(Candidate.of("pomt", {3: 20}), "search-pomt", 6.5, Proportion(894, 1000, 6, 0))
    found = FrontierResult(baseline, (baseline, churn, steady), tuple(pareto_front([baseline, churn, steady])), 3)
    assert steady not in found.frontier  # slower and less accurate than `churn`
    assert [p.candidate for p in preference(found, Goal(1.5, confidence=0.5))] == [churn.candidate]
    # churn's drop is bounded at 1.94 points (it changed 75 images), steady's at 1.07 (it changed 6)
    assert [p.candidate for p in preference(found, Goal(1.5))] == [steady.candidate]
    assert Goal(1.5, latency_budget_ms=5.0).describe() == \
        "within 1.5 points of the unpruned accuracy at 95% confidence, predicted within 5 ms"
    assert "confidence" not in Goal(1.5, confidence=0.5).describe()


def test_each_reducers_best_is_verified_not_only_the_predicted_first():
    # tome:0=2,1=2 meets the goal but is off its frontier (pomt:5=20 is predicted faster and more accurate)
    goal = Goal(1.0)
    assert [p.candidate.key for p in preference(result(), goal)] == ["pomt:2=30,6=10", "pomt:5=20"]
    assert [p.candidate.key for p in to_verify(result(), goal, first=1)] == ["pomt:2=30,6=10", "tome:0=2,1=2"]
    assert [p.candidate.key for p in to_verify(result(), goal, first=2)] == \
        ["pomt:2=30,6=10", "pomt:5=20", "tome:0=2,1=2"]  # no top-k or l2norm schedule meets the goal
    loose = Goal(10.0)  # now top-k's does too; the uniform one to beat is last unless already in
    assert [p.candidate.key for p in to_verify(result(), loose, first=1)] == \
        ["pomt:2=30,6=10", "topk:3=30", "tome:0=4,1=4"]


def test_the_uniform_schedule_to_beat_is_the_best_uniform_one_within_the_goal():
    assert best_uniform(result(), Goal(1.0)).candidate.key == "tome:0=2,1=2"
    assert best_uniform(result(), Goal(max_drop_points=None, latency_budget_ms=6.9)).family == "topk-rate"
    assert best_uniform(result(), Goal(0.5)) is None


def test_the_table_has_every_schedule_its_intervals_and_what_was_verified():
    chosen = POINTS[3].candidate
    verified = {chosen: CandidateResult(6, 6.2, 1.6, (1.5, 1.7), 0.001, True, 6.0)}
    found = result()
    table = rows(found, 10.0, chosen, verified)
    assert [r["key"] for r in table][:2] == ["none", "pomt:2=30,6=10"]
    first = table[1]
    assert set(first) == set(COLUMNS)
    assert first["chosen"] and first["on_frontier"] and first["removal"] == "2=30;6=10"
    assert first["verified_speedup"] == 1.6 and first["verified_speedup_low"] == 1.5
    assert first["search_low"] < 0.89 < first["search_high"] and first["held_out_accuracy"] is None
    assert first["predicted_speedup"] == round(10.0 / 6.0, 5)
    assert first["search_lost"] is None and first["search_drop_bound_points"] is None  # not measured paired
    paired = Evaluated(Candidate.of("tome", {0: 2}), "search-tome", 6.0, Proportion(318, 400, 21, 19))
    record = row(paired, 10.0, None)
    assert record["search_lost"] == 21 and record["search_gained"] == 19 and record["held_out_lost"] is None
    assert record["search_drop_bound_points"] == pytest.approx(3.125, abs=1e-3)  # at 95%; 0.5 reads the drop
    assert row(paired, 10.0, None, confidence=0.5)["search_drop_bound_points"] == pytest.approx(0.5)
    assert record["certified"] is None and record["held_out_images_to_certify"] is None  # not a finalist
    finalist = {"verdict": "failed", "bound_points": 3.5, "images_to_certify": 1200}
    told = row(paired, 10.0, None, certified=finalist)
    assert told["certified"] is False and told["held_out_drop_bound_points"] == 3.5
    assert told["held_out_images_to_certify"] == 1200
    marked = rows(found, 10.0, chosen, verified, certified={chosen.key: {**finalist, "verdict": "certified"}})
    assert [r["certified"] for r in marked if r["key"] == chosen.key] == [True]
    assert all(r["certified"] is None for r in marked if r["key"] != chosen.key)
    doc = document(found, table, {"model": "m"}, ["the search's note", "the verification's note"])
    assert doc["format"] == "pomt.frontier" and doc["model"] == "m" and len(doc["schedules"]) == len(POINTS) + 1
    assert doc["notes"] == ["the search's note", "the verification's note"]


def test_tome_removals_are_written_as_each_block_really_merges():
    latency = LatencyModel({n: float(n) for n in range(2, 18)}, 17, 1, 4)
    assert effective_removal(latency, Candidate.of("tome", {0: 8, 1: 8, 2: 8})) == {0: 8, 1: 4, 2: 2}
    assert effective_removal(latency, Candidate.of("pomt", {1: 5, 3: 2})) == {1: 5, 3: 2}


def test_the_held_out_drop_is_the_paired_drop_on_the_images_measured():
    chosen = point("tome", {0: 2}, "search-tome", 6.0, 89)
    assert held_out_drop(chosen) is None  # not measured held out
    assert held_out_drop(chosen.with_held_out(Proportion(87, 100, 4, 1))) == pytest.approx(3.0)
    assert held_out_drop(chosen.with_held_out(Proportion(87, 100))) is None  # not paired


def test_the_frontier_record_names_the_uniform_schedule_beaten_and_by_how_much():
    chosen, uniform = POINTS[3], POINTS[0]
    measured = {chosen.candidate: CandidateResult(1, 6.0, 1.6, (1.5, 1.7), 0.001, True),
                uniform.candidate: CandidateResult(2, 8.0, 1.25, (1.2, 1.3), 0.001, True)}
    record = frontier_record("x.frontier.json", "top1", Goal(1.0), UNPRUNED, chosen, uniform, measured, 6)
    assert record["file"] == "x.frontier.json" and record["chosen"]["verified_speedup"] == 1.6
    beat = record["best_uniform"]
    assert beat["key"] == "tome:0=2,1=2" and beat["speedup_over"] == 1.28 and beat["predicted_speedup_over"] == 1.3333


def test_a_schedule_that_does_not_verify_falls_back_to_the_next_or_to_nothing():
    assert first_verified([1, 2, 3], {1, 2}) == 1
    assert first_verified([1, 2, 3], {2, 3}) == 2  # the fastest did not verify: the next ships
    assert first_verified([1, 2, 3], {1, 2}, held_fresh={2}) == 2  # the fastest did not hold in a fresh process
    assert first_verified([1, 2, 3], {1}, held_fresh=set()) is None
    assert first_verified([1, 2], {3}) is None  # only what is in the order can ship


def test_the_fastest_measured_ships_the_uniform_one_included_unless_only_a_budget_was_asked():
    speedups = {1: 1.40, 2: 1.30, 3: 1.48}  # 3: the best uniform schedule, predicted slower, measured faster
    drop = Goal(max_drop_points=1.0)
    assert verified_choice([1, 2, 3], speedups, {1, 2, 3}, None, drop) == 3
    assert verified_choice([1, 2, 3], speedups, {1, 2, 3}, {1, 2}, drop) == 1  # 3 did not hold in a fresh process
    assert verified_choice([1, 2, 3], speedups, {2}, None, drop) == 2
    assert verified_choice([1, 2, 3], speedups, set(), None, drop) is None
    assert verified_choice([1, 2], {1: 1.2, 2: 1.2}, {1, 2}, None, drop) == 1  # a tie: the order decides
    budget = Goal(max_drop_points=None, latency_budget_ms=5.0)  # the most accurate within the budget first
    assert verified_choice([1, 2, 3], speedups, {1, 2, 3}, None, budget) == 1


def test_a_frontier_schedule_is_a_version_1_file_that_apply_schedule_loads(tmp_path):
    latency = LatencyModel({n: float(n) for n in range(2, 38)}, 37, 1, 6)
    base = Schedule(model="test_vit", input_size=(96, 96), batch_size=2, num_tokens=37, prefix_tokens=1, depth=6,
                    method="pomt", prune=(BlockRemoval(3, 10),))
    candidate = Candidate.of("tome", {0: 12, 1: 12, 2: 12})  # ToMe merges 12, then 12, then 6 (its cap)
    schedule = as_schedule(base, latency, candidate, {"file": "x.frontier.json"})
    path = save_schedule(schedule, tmp_path / "x.schedule.json")
    loaded = load_schedule(path)
    assert loaded.method == "tome" and loaded.removal == {0: 12, 1: 12, 2: 6} and loaded.kept_tokens == 7
    assert loaded.frontier == {"file": "x.frontier.json"}
    model = create_model("test_vit", input_size=96)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unverified
        pomt.apply_schedule(model, path)
    counts = []
    for block in transformer_blocks(model):
        block.register_forward_pre_hook(lambda _m, args: counts.append(args[0].shape[1]))
    with torch.inference_mode():
        model(torch.randn(2, 3, 96, 96))
    assert counts == [37, 25, 13, 7, 7, 7]


def ranked(ms: float, correct: int, remove: int = 1) -> Evaluated:
    return Evaluated(Candidate.of("pomt", {0: remove}), "test", ms, Proportion(correct, 1000))


RANKED = [ranked(10.0, 900, 0), ranked(9.0, 895, 1), ranked(8.0, 880, 2), ranked(8.5, 870, 3), ranked(7.0, 850, 4),
          ranked(7.0, 860, 5)]


def test_the_frontier_keeps_what_nothing_beats_fastest_first():
    assert [p.candidate.as_dict() for p in pareto_front(RANKED)] == [{0: 5}, {0: 2}, {0: 1}, {}]


def paired_result(correct: int, lost: int, gained: int, images: int = 400) -> Evaluated:
    return Evaluated(Candidate.of("tome", {0: 2}), "test", 5.0, Proportion(correct, images, lost, gained))


def test_a_drop_is_judged_on_its_bound_where_measured_paired():
    # both measured 0.5 points below an unpruned 0.8 on 400 images: 2 net images lost
    few = paired_result(318, lost=2, gained=0)  # changed 2 images
    many = paired_result(318, lost=21, gained=19)  # changed 40: the same net loss is far less certain
    assert drop_within(few, 0.8, 1.0, 0.5) and drop_within(many, 0.8, 1.0, 0.5)  # 0.5: the measured drop
    assert drop_within(few, 0.8, 1.25, 0.95) and not drop_within(few, 0.8, 1.2, 0.95)  # bound 1.22 points
    assert not drop_within(many, 0.8, 3.1, 0.95) and drop_within(many, 0.8, 3.15, 0.95)  # bound 3.12 points


def test_without_pairing_the_measured_drop_decides():
    assert drop_within(RANKED[2], 0.9, 2.0, 0.95) and not drop_within(RANKED[2], 0.9, 1.9, 0.95)


def test_a_floor_on_accuracy_is_judged_on_the_lower_bound():
    assert accuracy_at_least(RANKED[1], 0.895, 0.5)
    assert not accuracy_at_least(RANKED[1], 0.895, 0.95)
    assert accuracy_at_least(RANKED[1], 0.87, 0.95)  # the one-sided 95% bound of 895 of 1000 is 0.878


def test_an_evaluated_schedule_reports_both_splits():
    record = ranked(9.0, 895).with_held_out(Proportion(440, 500)).to_dict()
    assert record["removal"] == {"0": 1} and record["search"]["accuracy"] == 0.895
    assert record["held_out"]["images"] == 500
