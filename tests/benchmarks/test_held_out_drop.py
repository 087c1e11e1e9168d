"""benchmarks/held_out_drop.py: its reading of several frontier runs, and its replay of the selection (finalists
picked on the search part, certified batch by batch on the held-out part, the shipped one read on fresh images)
on synthetic per-image outcomes."""

import csv
import importlib.util
import json
import sys

import numpy as np
import pytest
import torch

from pomt.frontier.candidates import NONE, Candidate
from pomt.frontier.certify import CERTIFIED, FAILED
from pomt.frontier.choice import Goal

from conftest import ROOT

HARMLESS, SLOWER, LOSSY = (Candidate.parse(key) for key in ("tome:0=2", "topk:3=5", "tome:0=4,1=4"))


@pytest.fixture(scope="module")
def module():
    spec = importlib.util.spec_from_file_location("held_out_drop", ROOT / "benchmarks" / "held_out_drop.py")
    loaded = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = loaded  # its dataclasses look their module up
    try:
        spec.loader.exec_module(loaded)
        yield loaded
    finally:
        sys.modules.pop(spec.name, None)


def write_run(path, unpruned_ms, rows):
    schedules = [{"key": "none", "family": "unpruned", "predicted_ms": unpruned_ms}]
    schedules += [{"key": key, "family": family, "predicted_ms": ms} for key, family, ms in rows]
    path.write_text(json.dumps({"schedules": schedules}))
    return path


def test_several_runs_give_each_schedule_once_at_its_mean_share_of_the_unpruned_latency(module, tmp_path):
    first = write_run(tmp_path / "a.frontier.json", 40.0, [("tome:0=2", "probe-tome", 30.0),
                                                           ("tome:0=1,1=1", "tome-constant", 36.0)])
    second = write_run(tmp_path / "b.frontier.json", 50.0, [("tome:0=2", "search-tome", 40.0),
                                                            ("topk:3=5", "probe-topk", 45.0)])
    found = module.measured_schedules([first, second])
    assert found[0] == (NONE, "unpruned", 1.0)  # the unpruned model first: the replay's baseline
    priced = {candidate: (family, share) for candidate, family, share in found}
    assert len(found) == len(priced) == 4
    assert priced[Candidate.parse("tome:0=2")] == ("probe-tome", pytest.approx((30 / 40 + 40 / 50) / 2))
    assert priced[Candidate.parse("tome:0=1,1=1")] == ("tome-constant", pytest.approx(0.9))
    assert priced[Candidate.parse("topk:3=5")] == ("probe-topk", pytest.approx(0.9))


def synthetic(module, images, lossy_loses):
    """The unpruned model right on 90% of the images; a harmless schedule and a slower one that change nothing, and
    the fastest, which loses the right images `lossy_loses` marks."""
    unpruned = torch.arange(images) % 10 != 0
    lossy = unpruned & ~lossy_loses
    schedules = ((NONE, "unpruned", 1.0), (HARMLESS, "tome-constant", 0.8), (SLOWER, "topk-rate", 0.9),
                 (LOSSY, "probe-tome", 0.5))
    right = {NONE: unpruned, HARMLESS: unpruned.clone(), SLOWER: unpruned.clone(), LOSSY: lossy}
    return module.Measured(schedules, right)


def test_the_harmless_schedule_is_certified_and_ships_and_the_lossy_one_fails_on_the_held_out_part(module):
    images = torch.arange(3000)
    loses = (images >= 1000) & (images % 2 == 1)  # nothing on the search part, about half beyond it
    measured = synthetic(module, 3000, loses)
    split = module.Split(search=images[:1000], held_out=images[1000:2000], fresh=images[2000:])
    goal = Goal(1.0, confidence=0.95)
    baseline, certification = module.certify(measured, split, goal, 4, 32)
    # the faster uniform one leads; the slower one adds nothing the fastest, sure on the search part, does not
    assert [p.candidate for p in certification.finalists] == [HARMLESS, LOSSY]
    verdicts = {p.candidate: certification.verdict(p) for p in certification.finalists}
    assert verdicts == {LOSSY: FAILED, HARMLESS: CERTIFIED}
    held = {p.candidate: p.held_out for p in certification.finalists}
    assert held[LOSSY].trials < 1000 and held[LOSSY].trials % 32 == 0  # stopped after a batch: surely beyond
    assert held[HARMLESS].trials in certification.certifier.looks and held[HARMLESS].lost == 0
    shipped, uniform = module.picks(baseline, certification)
    assert shipped.candidate == uniform.candidate == HARMLESS  # the one certified
    row = module.replay(measured, split, goal, 4, 32)
    assert (row["shipped"], row["certified"], row["finalists"]) == (HARMLESS.key, 1, 2)
    assert row["shipped_drop"] == 0 and row["shipped_within"] and row["shipped_speedup"] == pytest.approx(1.25)
    assert row["shipped_over_uniform"] == pytest.approx(1.0)


def test_with_nothing_certified_the_unpruned_model_ships_at_no_speedup(module):
    images = torch.arange(3000)
    measured = synthetic(module, 3000, (images >= 1000) & (images % 2 == 1))
    split = module.Split(search=images[:1000], held_out=images[1000:1100], fresh=images[2000:])  # too few to certify
    row = module.replay(measured, split, Goal(1.0, confidence=0.95), 4, 32)
    assert (row["shipped"], row["uniform"], row["certified"]) == (NONE.key, NONE.key, 0)
    assert row["shipped_speedup"] == row["uniform_speedup"] == 1.0 and row["shipped_within"]


def row(drop, shipped="tome:0=2", certified=1):
    return {"confidence": 0.95, "finalists_asked": 4, "held_out_images": 800, "shipped": shipped,
            "shipped_drop": drop, "shipped_within": drop <= 1.0, "certified": certified,
            "shipped_speedup": 1.0 if shipped == NONE.key else 1.5, "uniform_speedup": 1.2,
            "shipped_over_uniform": 1.0 if shipped == NONE.key else 1.25, "uniform_within": True}


def test_the_promise_is_the_share_of_splits_whose_shipped_drop_on_fresh_images_is_within_the_goal(module):
    rows = [row(0.5), row(1.5), row(0.0, NONE.key, 0), row(1.0), row(2.5)]
    found = module.summary(rows, drop=1.0, gain=1.10)
    assert found["promise"] == pytest.approx(3 / 5)
    assert found["promise_when_pruned"] == pytest.approx(2 / 4)  # the unpruned fallback kept out
    assert found["none_certified"] == pytest.approx(1 / 5) and found["gain_met"] == pytest.approx(4 / 5)
    assert found["mean_drop"] == pytest.approx(5.5 / 5) and found["shipped_speedup"] == pytest.approx(1.4)


def test_replayed_splits_are_summarised_and_written(module, tmp_path):
    rng = np.random.default_rng(1)
    measured = synthetic(module, 2400, torch.from_numpy(rng.random(2400) < 0.3))  # the lossy one: about 27 points
    goals = [Goal(1.0, confidence=q) for q in (0.9, 0.95)]
    rows = module.replay_splits(measured, 6, goals, [4], 32)
    assert len(rows) == 12 and {r["held_out_images"] for r in rows} == {800}  # 1200 in half A, 2/3 held out
    assert all(r["shipped"] == HARMLESS.key and r["shipped_within"] for r in rows)
    found = module.summaries(rows, 1.0, 1.10)
    assert [(s["confidence"], s["splits"], s["promise"]) for s in found] == [(0.9, 6, 1.0), (0.95, 6, 1.0)]
    assert module.report(found, 1.10)[1].split()[:3] == ["0.900", "4", "|"]
    paths = module.write_outputs(tmp_path, "run", rows, found, 1.0)
    assert [p.name for p in paths] == ["run.held-out-drop.csv", "run.held-out-drop.json", "run.held-out-drop.png"]
    with paths[0].open() as handle:
        written = list(csv.DictReader(handle))
    assert len(written) == 12 and written[0]["shipped"] == HARMLESS.key
    assert json.loads(paths[1].read_text())["summaries"][1]["promise"] == 1.0
    assert paths[2].read_bytes().startswith(b"\x89PNG")
