"""benchmarks/prediction_error.py's part `changes`: layouts of one mean count with more and more count changes,
timed against the uniform model at that count; and part `multi` with a schedule of the user's added (a tiny model,
a few rounds: the structure, not the figures)."""

import re

from pomt.frontier.latency import count_changes

from conftest import run_script_in_process


def test_the_changes_part_times_equal_mean_layouts_with_one_to_depth_less_one_changes():
    result = run_script_in_process("benchmarks/prediction_error.py", "--part", "changes", "--workloads",
                                   "test_vit:1:64", "--rounds", "3", "--allocator", "inherit")
    assert result.returncode == 0, result.stderr
    assert "against the uniform model at 13; linearity: (L(17) + L(9)) / 2 over L(13)" in result.stdout
    rows = re.findall(r"^  (.+?)\s+(\d+) changes, mean ([\d.]+) \(([\d-]+)\): ([+-][\d.]+)%", result.stdout, re.M)
    assert [(name, int(changes)) for name, changes, *_ in rows] == [
        ("2 levels", 1), ("3 levels", 2), ("6 levels", 5), ("one change after block 0", 1)]
    for _, changes, mean, layout, _ in rows:
        counts = [int(n) for n in layout.split("-")]
        assert len(counts) == 6 and count_changes(counts, 6) == int(changes)
        assert abs(float(mean) - 13) <= 0.5 and counts[0] == 17


def test_the_multi_part_prices_and_measures_a_schedule_given_with_also_beside_its_own():
    result = run_script_in_process("benchmarks/prediction_error.py", "--part", "multi", "--workloads",
                                   "test_vit:1:64", "--rounds", "2", "--cost-rounds", "2", "--curve-points", "4",
                                   "--allocator", "inherit", "--also", "tome:0=2,2=3", "topk:3=4,4=3")
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^  (\S+)\s+blocks\s+(\d+): predicted\s+([\d.]+) ms .*error ([+-][\d.]+)%", result.stdout, re.M)
    keys = [key for key, *_ in rows]
    assert keys[-2:] == ["tome:0=2,2=3", "topk:3=4,4=3"] and len(keys) == len(set(keys)) > 2
    assert f"of {len(rows)} schedules within 3%" in result.stdout
