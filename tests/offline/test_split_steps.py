"""The offline computation in three steps (`pomt measure` on the device, `pomt search` anywhere, `pomt verify` on
the device) gives the schedule one run gives from the same visits, and refuses another device's files in one line."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from conftest import ROOT, assert_one_line_error, run_in_process, run_script
from support.tiny_data import MODEL, SIZE

STEM = "test_vit_cpu_bs16_is96"
WORKLOAD = ("--model", MODEL, "--input-size", str(SIZE), "--batch-size", "16", "--threads", "1", "--no-progress")
QUICK = ("--passes", "3", "--visit-s", "0.01", "--confirm-rounds", "3", "--verify-rounds", "3")
FRONTIER = ("--accuracy-samples", "40", "--max-accuracy-drop", "20", "--max-evals", "26")


def pomt(*args: str) -> subprocess.CompletedProcess:
    """The console script in a subprocess."""
    return subprocess.run([sys.executable, "-m", "pomt", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=900)


def _frontier_rows(folder) -> list[tuple]:
    with (folder / f"{STEM}.frontier.csv").open() as handle:
        return [(r["key"], r["search_accuracy"], r["held_out_images"], r["certified"]) for r in csv.DictReader(handle)]


@pytest.mark.slow
def test_three_steps_ship_what_one_run_ships_from_the_same_visits(tmp_path, trained):
    root, checkpoint, _ = trained
    device, anywhere, back = tmp_path / "device", tmp_path / "anywhere", tmp_path / "back"
    measured = pomt("measure", *WORKLOAD, *QUICK, "--output-dir", str(device))
    assert measured.returncode == 0, measured.stderr
    latency = device / f"{STEM}.latency.json"
    assert json.loads(latency.read_text())["format"] == "pomt.latency" and "latency file" in measured.stdout

    searched = pomt("search", "--latency-file", str(latency), "--dataset-root", str(root), "--checkpoint",
                    str(checkpoint), *FRONTIER, "--no-progress", "--output-dir", str(anywhere))
    assert searched.returncode == 0, searched.stderr
    candidates = anywhere / f"{STEM}.candidates.json"
    assert "finalists certified" in searched.stdout and (anywhere / f"{STEM}.frontier.png").stat().st_size
    assert not (anywhere / f"{STEM}.schedule.json").exists()  # unverified: no schedule yet

    verified = pomt("verify", "--candidates-file", str(candidates), "--checkpoint", str(checkpoint), *QUICK[-2:],
                    "--no-verify", "--no-progress", "--output-dir", str(back))
    assert verified.returncode == 0, verified.stderr
    split = json.loads((back / f"{STEM}.schedule.json").read_text())

    # one run served the same visits (--resume on the device's journal) with the same settings
    single = run_script("offline_computation.py", *WORKLOAD, *QUICK, *FRONTIER, "--dataset-root", str(root),
                        "--checkpoint", str(checkpoint), "--resume", "--no-verify", "--output-dir", str(device))
    assert single.returncode == 0, single.stderr
    one = json.loads((device / f"{STEM}.schedule.json").read_text())
    for field in ("method", "prune", "steps"):
        assert split[field] == one[field], field
    assert split["policy"]["reason_code"] == one["policy"]["reason_code"]
    assert split["frontier"]["certification"] == one["frontier"]["certification"]
    assert _frontier_rows(back) == _frontier_rows(device)


@pytest.mark.slow
def test_another_devices_candidates_and_broken_files_are_refused_in_one_line(tmp_path, trained):
    root, checkpoint, _ = trained
    measured = pomt("measure", *WORKLOAD, *QUICK, "--output-dir", str(tmp_path))
    assert measured.returncode == 0, measured.stderr
    latency = tmp_path / f"{STEM}.latency.json"
    bundle = json.loads(latency.read_text())

    corrupt = tmp_path / "corrupt.latency.json"
    corrupt.write_text(latency.read_text()[:100])
    assert_one_line_error(run_in_process("search", "--latency-file", str(corrupt), "--dataset-root", str(root)),
                          "is not a readable pomt.latency file")
    newer = tmp_path / "newer.latency.json"
    newer.write_text(json.dumps({**bundle, "version": 99}))
    assert_one_line_error(run_in_process("search", "--latency-file", str(newer), "--dataset-root", str(root)),
                          "version 99")
    assert_one_line_error(run_in_process("search", "--latency-file", str(latency), "--dataset-root", str(root),
                                         "--model", "deit_tiny"), "not --model deit_tiny")

    other = tmp_path / "other"
    searched = pomt("search", "--latency-file", str(latency), "--dataset-root", str(root), "--checkpoint",
                    str(checkpoint), *FRONTIER, "--no-progress", "--output-dir", str(other))
    assert searched.returncode == 0, searched.stderr
    document = json.loads((other / f"{STEM}.candidates.json").read_text())
    document["latency"]["fingerprint_hash"] = "0" * 16  # priced on another device
    elsewhere = tmp_path / "elsewhere.candidates.json"
    elsewhere.write_text(json.dumps(document))
    assert_one_line_error(run_in_process("verify", "--candidates-file", str(elsewhere), "--output-dir",
                                         str(tmp_path / "v")), "was priced on another device or workload")
    assert not list((tmp_path / "v").glob("*.schedule.json"))
