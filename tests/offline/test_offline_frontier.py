"""The frontier policy end to end: offline_computation.py with a tiny trained ViT on a tiny labelled folder
searches schedules across blocks and reducers, verifies the best, and writes the frontier's files and a
schedule that `pomt.apply_schedule` loads; a killed search resumes from its accuracy cache."""

from __future__ import annotations

import csv
import json
import sqlite3
import warnings

import pytest
import torch

import pomt
from pomt.models.geometry import transformer_blocks
from pomt.models.registry import create_model
from pomt.patching import token_counts

from conftest import run_script
from support.tiny_data import MODEL, SIZE

STEM = "test_vit_cpu_bs16_is96"  # batch 16: tokens saved pay more than the reducers cost
WORKLOAD = ("--model", MODEL, "--input-size", str(SIZE), "--batch-size", "16", "--threads", "1", "--no-progress")
QUICK = ("--passes", "3", "--visit-s", "0.01", "--confirm-rounds", "3", "--verify-rounds", "3")
# 40 of the folder's images: 20 search images bound a drop to 16 points, so the goal is 20 points
FRONTIER = ("--accuracy-samples", "40", "--max-accuracy-drop", "20", "--max-evals", "26")


def _frontier(trained, out, *args):
    root, checkpoint, _ = trained
    return run_script("offline_computation.py", *WORKLOAD, *QUICK, *FRONTIER, "--dataset-root", str(root),
                      "--checkpoint", str(checkpoint), "--output-dir", str(out), *args)


def _cached(out) -> list[tuple]:
    """The accuracy cache's results, in the order they were written."""
    (path,) = (out / "cache" / "accuracy").glob("*.sqlite")
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT split, key, correct, images, lost, gained FROM results ORDER BY written_at")
        return rows.fetchall()


def _keep_first(out, count: int) -> None:
    """The cache as a run killed after `count` accuracies left it."""
    (path,) = (out / "cache" / "accuracy").glob("*.sqlite")
    with sqlite3.connect(path) as db:
        db.execute("DELETE FROM results WHERE rowid NOT IN (SELECT rowid FROM results ORDER BY written_at LIMIT ?)",
                   (count,))


@pytest.mark.slow
def test_the_frontier_run_writes_its_files_a_schedule_that_applies_and_resumes(tmp_path, trained):
    result = _frontier(trained, tmp_path)
    assert result.returncode == 0, result.stderr
    for fragment in ("frontier", "held-out", "policy frontier", "time: latency"):
        assert fragment in result.stdout, result.stdout
    assert len(result.stdout.splitlines()) <= 15, result.stdout  # the summary; --verbose prints every row
    for suffix in ("frontier.csv", "frontier.json", "frontier.png", "schedule.json", "png"):
        assert (tmp_path / f"{STEM}.{suffix}").stat().st_size > 0, suffix
    rows = _rows(tmp_path)
    families = {r["family"] for r in rows}
    assert {"unpruned", "tome-constant", "tome-decreasing", "topk-rate", "pomt-block3"} <= families
    assert all(r["search_accuracy"] and r["search_low"] and r["search_high"] for r in rows)
    assert all(r["held_out_accuracy"] for r in rows if r["certified"])  # the finalists, measured held out
    document = json.loads((tmp_path / f"{STEM}.frontier.json").read_text())
    assert document["format"] == "pomt.frontier" and document["accuracy_kind"] == "top1"
    assert set(document["seconds"]) == {"latency", "reducer_costs", "accuracy"}
    assert set(document["reducer_costs"]) == {"pomt", "topk", "tome", "l2norm"}
    mixed = document["mixed_counts"]  # the latency model's calibration of mixed counts, measured in the run
    assert len(mixed["layout"]) == 6 and mixed["ci"][0] <= mixed["over_blocks"] <= mixed["ci"][1]
    assert isinstance(mixed["kappa"], float)

    data = json.loads((tmp_path / f"{STEM}.schedule.json").read_text())
    assert data["policy"]["name"] == "frontier" and data["predicted"]["accuracy_kind"] == "top1"
    frontier = data["frontier"]
    assert frontier["file"] == f"{STEM}.frontier.json"
    assert frontier["unpruned"]["held_out"]["images"] == document["held_out_images"] >= 20
    assert frontier["accuracy_confidence"] == 0.95
    if len(data["prune"]) > 1:  # the summary names every pruning block, not the first alone
        assert f"tokens at blocks {data['prune'][0]['block']}" in result.stdout or "blocks, " in result.stdout
    if frontier["best_uniform"]:  # its held-out drop is printed with its paired interval
        assert "points [" in result.stdout and "] paired" in result.stdout, result.stdout
    certification = frontier["certification"]  # the finalists, each certified or not on the held-out images
    assert certification == document["certification"] and 1 <= len(certification["schedules"]) <= 4
    assert certification["held_out_images"] == document["held_out_images"] and certification["confidence"] == 0.95
    by_key = {r["key"]: r for r in rows}
    for finalist in certification["schedules"]:
        row = by_key[finalist["key"]]  # the table says the same of every finalist
        assert row["certified"] == str(finalist["verdict"] == "certified")
        assert int(row["held_out_images"]) == finalist["images"] <= certification["held_out_images"]
        if finalist["verdict"] == "certified":
            assert finalist["bound_points"] <= 20 and finalist["images"] in certification["looks"]
        else:
            assert f"not certified: {finalist['key']}" in " ".join(document["notes"])
    assert by_key["none"]["certified"] == ""
    assert "certified  " in result.stdout
    # what ships depends on this machine's timings: every outcome must be reported as such
    code = data["policy"]["reason_code"]
    if data["prune"]:  # shipped: verified, and its held-out accuracy is reported
        assert code == "verified" and frontier["chosen"]["certified_bound_points"] <= 20  # certified held out
        assert by_key[frontier["chosen"]["key"]]["certified"] == "True"
        assert data["verified"]["speedup"] > 1.0
    else:
        assert code in {"not_faster", "not_in_fresh_process", "no_candidate", "not_certified"}
        assert frontier["chosen"] is None
    if code not in {"no_candidate", "not_certified"}:  # verified: its row carries the measured speedup
        assert any(r["verified_speedup"] for r in rows) and data["verified"]["candidates"]
        # every schedule that could ship (verified) has its held-out accuracy, frontier or not
        assert all(r["held_out_accuracy"] for r in rows if r["verified_speedup"]), rows
        assert (tmp_path / f"{STEM}.verify.csv").stat().st_size > 0
    _applies(tmp_path / f"{STEM}.schedule.json")

    # killed after 10 accuracies: --resume measures only the rest, to the same frontier
    cached = _cached(tmp_path)
    assert f"{len(cached)} accuracies measured now" in result.stdout
    _keep_first(tmp_path, 10)
    again = _frontier(trained, tmp_path, "--resume", "--no-verify")
    assert again.returncode == 0, again.stderr
    assert f"{len(cached) - 10} accuracies measured now" in again.stdout
    assert sorted(_cached(tmp_path)) == sorted(cached)
    assert _rows(tmp_path, "search_accuracy") == [(r["key"], r["search_accuracy"]) for r in rows]
    again_document = json.loads((tmp_path / f"{STEM}.frontier.json").read_text())
    for priced_by in ("reducer_costs", "mixed_counts"):  # as the killed run measured them, not measured anew
        assert again_document[priced_by] == document[priced_by]
    resumed = json.loads((tmp_path / f"{STEM}.schedule.json").read_text())
    if resumed["policy"]["reason_code"] not in {"no_candidate", "not_certified"}:  # --no-verify: the best certified
        assert resumed["prune"] and resumed["frontier"]["chosen"]["certified_bound_points"] <= 20
    _applies(tmp_path / f"{STEM}.schedule.json")


def _rows(folder, column: str | None = None) -> list:
    with (folder / f"{STEM}.frontier.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    return rows if column is None else [(r["key"], r[column]) for r in rows]


def _applies(path) -> None:
    schedule = pomt.load_schedule(path)
    model = create_model(MODEL, input_size=SIZE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an unverified schedule warns
        pomt.apply_schedule(model, path)
    counts = []
    for block in transformer_blocks(model):
        block.register_forward_pre_hook(lambda _m, args: counts.append(args[0].shape[1]))
    with torch.no_grad():
        model(torch.randn(16, 3, SIZE, SIZE))
    assert counts == token_counts(37, 1, 6, schedule.method, schedule.removal)[:-1]
