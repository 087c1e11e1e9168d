"""benchmarks/frontier.py end to end on the tiny digits recipe (--smoke), with schedules given by --also."""

import json

from conftest import assert_one_line_error, run_script, run_script_in_process


def test_the_frontier_benchmark_measures_given_schedules_side_by_side(tmp_path):
    result = run_script("benchmarks/frontier.py", "--smoke", "--batch-sizes", "4", "--also", "tome:0=2,3=2",
                        "topk:1=3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    rows = [line.split() for line in lines if line.strip().startswith(("tome:0=2,3=2 ", "topk:1=3 "))]
    assert [row[1:3] for row in rows] == [["also", "1"], ["also", "2"]]  # in the table, as their own family
    for number, key in ((1, "tome:0=2,3=2"), (2, "topk:1=3")):
        summary = next(line for line in lines if line.strip().startswith(f"also {number} ({key}) / "))
        assert "search-split drop bound" in summary and ("meets the goal" in summary or "misses" in summary)
    journal = next((tmp_path / "bin" / "frontier-bench" / "bs4").glob("*.frontier-journal.jsonl"))
    measured = {(e["key"].split("|")[1], e["split"].split(":")[0])
                for e in map(json.loads, journal.read_text().splitlines()[1:])}
    for key in ("tome:0=2,3=2", "topk:1=3"):
        assert {(key, "search"), (key, "held_out")} <= measured  # both splits, through the run's journal


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
