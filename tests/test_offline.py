"""End-to-end runs of offline_computation.py on tiny models, for real (subprocesses, files, kills)."""

import json
import signal
import subprocess
import sys
import time

import pytest
import torch

import pomt
from pomt.geometry import transformer_blocks
from pomt.models import create_model

from conftest import ROOT, assert_one_line_error, run_script
from tiny_data import MODEL, SIZE

STEM = "test_vit_cpu_bs2_is96"
FAST = ("--model", MODEL, "--input-size", str(SIZE), "--batch-size", "2", "--threads", "1", "--no-progress")


def _offline(*args, out):
    return run_script("offline_computation.py", *FAST, "--output-dir", str(out), *args)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--model", "deit_tiny", "--batch-size", "0"), ("batch size",)),
        (("--model", "deit_tiny", "--grid-token-start", "300"), ("outside", "[2, 197]")),
        (("--model", "deit_tiny", "--grid-token-stop", "1"), ("outside", "[2, 197]")),
        (("--model", "deit_smal",), ("unknown model", "deit_small")),
        (("--model", "deit_tiny", "--input-size", "230"), ("not divisible",)),
        (("--model", "deit_tiny", "--dataset-root", "/nonexistent/folder"), ("dataset folder not found",)),
        (("--model", "deit_tiny", "--method", "magic"), ("--method", "'magic' is not one of 'pomt'")),
        (("--model", "deit_tiny", "--prune-block", "12", "--grid-token-start", "197", "--grid-token-stop", "190"),
         ("--prune-block 12",)),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, fragments):
    result = run_script("offline_computation.py", *args, "--output-dir", str(tmp_path), "--min-run-s", "0.01",
                        "--no-progress")
    assert_one_line_error(result, *fragments)


def test_corrupt_accuracy_curve_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "acc.csv"
    bad.write_text("tokens,accuracy\nten,0.5\n")
    assert_one_line_error(_offline("--accuracy-curve", str(bad), out=tmp_path), "corrupt accuracy curve")


@pytest.mark.slow
def test_resume_after_kill_measures_each_point_once(tmp_path):
    command = [sys.executable, str(ROOT / "offline_computation.py"), *FAST, "--output-dir", str(tmp_path),
               "--search", "full", "--min-run-s", "0.3"]
    store = tmp_path / f"{STEM}.points.jsonl"
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if store.exists() and len(store.read_text().splitlines()) >= 5:  # header + 4 points
            break
        time.sleep(0.05)
    assert process.poll() is None, "the search ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    before = store.read_text().splitlines()
    measured_before = {json.loads(line)["tokens"] for line in before[1:] if line.endswith("}")}
    assert 4 <= len(measured_before) < SIZE // 16 * SIZE // 16

    resumed = subprocess.run([*command, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    after = store.read_text().splitlines()
    assert after[: len(before) - 1] == before[: len(before) - 1]  # nothing measured before is lost
    new = [json.loads(line)["tokens"] for line in after[len(before) - 1 :][1:] if line.strip()]
    missing = sorted(set(range(2, 38)) - measured_before)
    # The resumed grid pass measures exactly the missing counts; anything after it re-checks spikes.
    assert new[: len(missing)] == missing
    curve = (tmp_path / f"{STEM}.curve.csv").read_text().splitlines()[1:]
    tokens = [int(row.split(",")[0]) for row in curve]
    assert tokens == list(range(2, 38))  # every grid point exactly once


@pytest.mark.slow
def test_end_to_end_with_accuracy_writes_a_schedule_that_applies(tmp_path, trained):
    root, checkpoint, _ = trained
    result = _offline("--dataset-root", str(root), "--checkpoint", str(checkpoint), "--accuracy-points", "6",
                      "--min-run-s", "0.05", "--alpha", "0.5", out=tmp_path)
    assert result.returncode == 0, result.stderr
    for fragment in ("N=37", "steps", "schedule", "predicted", "top1"):
        assert fragment in result.stdout
    for suffix in ("schedule.json", "curve.csv", "png", "accuracy.csv", "points.jsonl"):
        assert (tmp_path / f"{STEM}.{suffix}").stat().st_size > 0

    data = json.loads((tmp_path / f"{STEM}.schedule.json").read_text())
    assert data["policy"]["name"] == "utility"
    assert data["predicted"]["accuracy_kind"] == "top1"
    assert data["num_tokens"] == 37 and data["prefix_tokens"] == 1 and data["depth"] == 6
    assert data["device"]["kind"] == "cpu" and "clocks_locked" in data["device"]
    schedule = pomt.load_schedule(tmp_path / f"{STEM}.schedule.json")
    assert schedule.to_dict() == data

    header = (tmp_path / f"{STEM}.curve.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["tokens", "median_ms", "iqr_ms", "samples", "accuracy"]

    model = create_model(MODEL, input_size=SIZE)
    pomt.apply_schedule(model, tmp_path / f"{STEM}.schedule.json")
    counts = []
    for block in transformer_blocks(model):
        block.register_forward_pre_hook(lambda _m, args: counts.append(args[0].shape[1]))
    with torch.no_grad():
        model(torch.randn(2, 3, SIZE, SIZE))
    expected = [37] * 6
    for item in schedule.prune:
        expected[item.block + 1 :] = [37 - item.remove] * (5 - item.block)
    assert counts == expected


@pytest.mark.slow
def test_accuracy_only_then_combined_with_latency(tmp_path, trained):
    root, checkpoint, _ = trained
    first = _offline("--accuracy-only", "--dataset-root", str(root), "--checkpoint", str(checkpoint),
                     "--accuracy-points", "5", out=tmp_path / "big")
    assert first.returncode == 0, first.stderr
    curve = tmp_path / "big" / f"{STEM}.accuracy.csv"
    assert curve.exists() and not (tmp_path / "big" / f"{STEM}.schedule.json").exists()
    second = _offline("--accuracy-curve", str(curve), "--min-run-s", "0.05", "--grid-token-stride", "3",
                      out=tmp_path / "edge")
    assert second.returncode == 0, second.stderr
    data = json.loads((tmp_path / "edge" / f"{STEM}.schedule.json").read_text())
    assert data["policy"]["name"] == "utility"
    assert data["predicted"]["accuracy"] is not None


@pytest.mark.slow
def test_latency_only_default_policy_is_step(tmp_path):
    result = _offline("--latency-only", "--min-run-s", "0.05", out=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / f"{STEM}.schedule.json").read_text())
    assert data["policy"]["name"] == "step"
    assert data["predicted"]["accuracy"] is None
    assert data["kept_tokens"] == 37 - sum(p["remove"] for p in data["prune"])
