"""benchmarks/held_out_drop.py's reading of several frontier runs: one list of schedules, each priced at its mean
predicted share of the unpruned model's latency over the runs that priced it."""

import importlib.util
import json

import pytest

from pomt.frontier.candidates import NONE, Candidate

from conftest import ROOT


def held_out_drop_script():
    spec = importlib.util.spec_from_file_location("held_out_drop", ROOT / "benchmarks" / "held_out_drop.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_run(path, unpruned_ms, rows):
    schedules = [{"key": "none", "family": "unpruned", "predicted_ms": unpruned_ms}]
    schedules += [{"key": key, "family": family, "predicted_ms": ms} for key, family, ms in rows]
    path.write_text(json.dumps({"schedules": schedules}))
    return path


def test_several_runs_give_each_schedule_once_at_its_mean_share_of_the_unpruned_latency(tmp_path):
    first = write_run(tmp_path / "a.frontier.json", 40.0, [("tome:0=2", "probe-tome", 30.0),
                                                           ("tome:0=1,1=1", "tome-constant", 36.0)])
    second = write_run(tmp_path / "b.frontier.json", 50.0, [("tome:0=2", "search-tome", 40.0),
                                                            ("topk:3=5", "probe-topk", 45.0)])
    found = held_out_drop_script().measured_schedules([first, second])
    assert found[0] == (NONE, "unpruned", 1.0)  # the unpruned model first: the replay's baseline
    priced = {candidate: (family, share) for candidate, family, share in found}
    assert len(found) == len(priced) == 4
    assert priced[Candidate.parse("tome:0=2")] == ("probe-tome", pytest.approx((30 / 40 + 40 / 50) / 2))
    assert priced[Candidate.parse("tome:0=1,1=1")] == ("tome-constant", pytest.approx(0.9))
    assert priced[Candidate.parse("topk:3=5")] == ("probe-topk", pytest.approx(0.9))
