"""benchmarks/frontier.py end to end on the tiny digits recipe (--smoke), with schedules given by --also."""

import json
import re

import pytest

from conftest import assert_one_line_error, run_script, run_script_in_process

ALSO = ("tome:0=2,3=2", "topk:1=3")
FORMS = {"uniform": r"chosen / fastest certified uniform \((\S+)\): (\d+\.\d{3})x \(verified, same rounds\)",
         "unpruned": r"no uniform schedule certified: chosen against the unpruned model (\d+\.\d{3})x$",
         "nothing": r"nothing shipped: \S"}


@pytest.mark.slow
def test_the_frontier_benchmark_compares_the_chosen_schedule_with_the_fastest_certified_uniform_one(tmp_path):
    result = run_script("benchmarks/frontier.py", "--smoke", "--batch-sizes", "4", "--also", *ALSO, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    saved = list((tmp_path / "bin" / "frontier-bench" / "bs4").glob("*.frontier-bench.json"))
    assert len(saved) == 1  # beside the run's own outputs
    doc = json.loads(saved[0].read_text())
    assert (tmp_path / "bin" / "frontier-bench" / "bs4" / f"{doc['stem']}.schedule.json").is_file()
    schedules = doc["schedules"]
    keys = {s["key"] for s in schedules}
    table = [line for line in lines if line.split() and line.split()[0] in keys]
    assert [tuple(line.split()[:2]) for line in table] == [(s["key"], s["role"]) for s in schedules]
    for line, s in zip(table, schedules, strict=True):  # the table prints what the JSON holds
        predicted, verified = line.split()[2:4]
        assert predicted == f"{s['predicted_speedup']:.3f}x" and verified == f"{s['verified_speedup']:.3f}x"
        assert f"{s['held_out']['lost']}/{s['held_out']['gained']}/{s['held_out']['images']}" in line
        assert line.endswith(f"  {s['verdict']}")

    also = [s for s in schedules if s["role"] == "also"]
    assert [s["key"] for s in also] == list(ALSO)  # in the table, as their own role
    for s in also:  # both splits in full, judged by the certification's test
        assert s["search"]["images"] == doc["search_images"] and s["held_out"]["images"] == doc["held_out_images"]
        assert s["verdict"] in ("certified", "not certified")
    for s in schedules:
        if s["role"] != "also":
            roles = s["role"].split(",")
            assert all(r in ("chosen", "uniform") or r.startswith("finalist:") for r in roles)
            assert s["verdict"] == "certified"  # only certified finalists are measured side by side
    for a in doc["also"]:
        assert a["line"] in lines

    matched = [(form, line) for line in lines for form, pattern in FORMS.items() if re.match(pattern, line)]
    assert len(matched) == 1, result.stdout  # the comparison line, in one of its three forms
    form, line = matched[0]
    comparison = doc["comparison"]
    assert (comparison["form"], comparison["line"]) == (form, line)
    roles = {r: s for s in schedules for r in s["role"].split(",")}
    assert (form == "nothing") == ("chosen" not in roles)
    assert (form == "unpruned") == ("chosen" in roles and "uniform" not in roles)
    if form == "uniform":
        assert comparison["against"] == roles["uniform"]["key"]
        ratio = roles["chosen"]["verified_speedup"] / roles["uniform"]["verified_speedup"]
        assert f"{ratio:.3f}x" in line and comparison["ratio"] == pytest.approx(ratio)
    assert doc["certification"] in lines and doc["certification"].startswith("certification: ")
    assert all(f"note: {note}" in lines for note in doc["notes"])


def test_an_also_schedule_the_model_cannot_take_is_one_line_before_anything_is_measured(tmp_path):
    result = run_script_in_process("benchmarks/frontier.py", "--smoke", "--batch-sizes", "4", "--also", "tome:0=40",
                                   cwd=tmp_path)
    assert_one_line_error(result, "ToMe merges at most half")
    assert not list((tmp_path / "bin" / "frontier-bench").glob("bs4/*.curve.csv"))


def test_a_curve_budget_outside_the_grid_is_one_line_before_anything_trains(tmp_path):
    result = run_script_in_process("benchmarks/frontier.py", "--smoke", "--batch-sizes", "4", "--budget", "1.5",
                                   cwd=tmp_path)
    assert_one_line_error(result, "--budget must lie in (0, 1]")
    assert not (tmp_path / "bin").exists()  # nothing trained, nothing written


def test_a_finalist_count_outside_the_offline_range_is_one_line_before_the_crops_case_trains(tmp_path):
    result = run_script_in_process("benchmarks/frontier.py", "--smoke", "--case", "crops", "--finalists", "0",
                                   cwd=tmp_path)
    assert_one_line_error(result, "--finalists")
    assert not (tmp_path / "bin").exists()


def test_a_recipe_of_no_epochs_is_one_line_before_anything_trains(tmp_path):
    result = run_script_in_process("benchmarks/frontier.py", "--smoke", "--batch-sizes", "4", "--epochs", "0",
                                   cwd=tmp_path)
    assert_one_line_error(result, "--epochs must be at least 1, got 0")
    assert not (tmp_path / "bin").exists()
