"""End-to-end runs of offline_computation.py and `pomt record` on tiny models, for real (subprocesses, files,
kills), and on recorded traces (--replay)."""

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import pomt
from pomt.formats.trace import read_trace
from pomt.models.geometry import transformer_blocks
from pomt.models.registry import create_model

from conftest import DATA, ROOT, assert_one_line_error, run_in_process, run_script, run_script_in_process
from support.tiny_data import MODEL, SIZE

STEM = "test_vit_cpu_bs2_is96"
WORKLOAD = ("--model", MODEL, "--input-size", str(SIZE), "--batch-size", "2", "--threads", "1", "--no-progress")
QUICK = ("--passes", "3", "--visit-s", "0.01", "--confirm-rounds", "3", "--verify-rounds", "3")


def _offline(*args, out):
    return run_script("offline_computation.py", *WORKLOAD, *QUICK, "--output-dir", str(out), *args)


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("--model", "deit_tiny", "--batch-size", "0"), ("--batch-size",)),
        (("--model", "deit_tiny", "--grid-token-start", "300"), ("outside", "[2, 197]")),
        (("--model", "deit_tiny", "--grid-token-stop", "1"), ("outside", "[2, 197]")),
        (("--model", "deit_smal",), ("unknown model", "deit_small")),
        (("--model", "deit_tiny", "--input-size", "230"), ("not divisible",)),
        (("--model", "deit_tiny", "--dataset-root", "/nonexistent/folder"), ("dataset folder not found",)),
        (("--model", "deit_tiny", "--method", "magic"), ("'magic' is not one of",)),
        (("--model", "deit_tiny", "--prune-block", "12"), ("--prune-block 12",)),
        (("--model", "deit_tiny", "--passes", "1"), ("--passes",)),
        (("--model", "deit_tiny", "--backend", "tflite"), ("'tflite' is not one of",)),
        (("--model", "deit_tiny", "--dtype", "float8"), ("'float8' is not one of",)),
        (("--replay", "/nonexistent/trace.csv"), ("trace not found",)),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, fragments):
    result = run_script_in_process("offline_computation.py", *args, "--output-dir", str(tmp_path), "--no-progress")
    assert_one_line_error(result, *fragments)


def test_corrupt_accuracy_curve_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "acc.csv"
    bad.write_text("tokens,accuracy\nten,0.5\n")
    assert_one_line_error(_offline("--accuracy-curve", str(bad), out=tmp_path), "corrupt accuracy curve")


@pytest.mark.slow
def test_a_live_run_writes_its_journal_curve_schedule_and_plot(tmp_path):
    result = _offline("--latency-only", out=tmp_path)
    assert result.returncode == 0, result.stderr
    for fragment in ("N=37", "visits", "drift", "steps", "schedule", "predicted"):
        assert fragment in result.stdout
    for suffix in ("schedule.json", "curve.csv", "png", "trace.csv", "trace.json"):
        assert (tmp_path / f"{STEM}.{suffix}").stat().st_size > 0
    data = json.loads((tmp_path / f"{STEM}.schedule.json").read_text())
    assert data["policy"]["name"] == "step" and data["predicted"]["accuracy"] is None
    assert data["kept_tokens"] == 37 - sum(p["remove"] for p in data["prune"])
    measured = data["measurement"]
    assert measured["passes"] == 3 and measured["drift"]["reference_tokens"] == 37
    assert measured["visits"] <= measured["budget_visits"]
    assert all(step["paired_ci_pct"] and step["p_value"] is not None for step in data["steps"])
    trace = read_trace(tmp_path / f"{STEM}.trace.csv")
    assert len(trace.visits) == measured["visits"]
    assert trace.meta["device"]["kind"] == "cpu" and trace.meta["num_tokens"] == 37
    header = (tmp_path / f"{STEM}.curve.csv").read_text().splitlines()[0].split(",")
    assert header[:4] == ["tokens", "latency_ms", "median_ms", "relative"]
    assert pomt.load_schedule(tmp_path / f"{STEM}.schedule.json").to_dict() == data


@pytest.mark.slow
def test_a_removal_is_shipped_only_as_measured(tmp_path):
    """A policy that always has candidates forces verification; whatever they measured, the schedule says it.
    Utility at alpha 1 on a flat accuracy curve ranks every removal by this run's own latency, fastest first,
    so no figure from another run (or minute) decides whether there is anything to verify."""
    flat = tmp_path / "flat_accuracy.csv"
    flat.write_text("tokens,accuracy\n" + "".join(f"{n},0.5\n" for n in range(2, 38)))
    result = _offline("--accuracy-curve", str(flat), "--alpha", "1", "--prune-block", "1", "--max-remove", "35",
                      out=tmp_path)
    assert result.returncode == 0, result.stderr
    data = json.loads((tmp_path / f"{STEM}.schedule.json").read_text())
    verified = data["verified"]
    assert verified["device_fingerprint_hash"] and verified["candidates"]
    assert "verified" in result.stdout and (tmp_path / f"{STEM}.verify.csv").exists()
    fresh = verified["fresh_process"]  # the candidates that qualified here, measured again in a new process
    assert verified["gpu_work"] is None and "launch-bound" not in result.stdout  # a CPU is its own host
    if data["prune"]:
        assert verified["speedup_ci"][0] > 1 and verified["speedup"] >= 1 + data["policy"]["min_gain"]
        assert data["policy"]["reason_code"] == "verified" and verified["prediction_error"] is not None
        assert data["prune"][0]["remove"] in [c["remove"] for c in verified["candidates"]]
        held = [c for c in fresh["candidates"] if c["remove"] == data["prune"][0]["remove"]]
        assert held and held[0]["qualifies"] and "fresh process" in data["policy"]["reason"]
        assert "fresh" in result.stdout
    else:
        assert data["policy"]["reason_code"] in ("not_faster", "not_in_fresh_process")  # utility always ranks
        assert verified["speedup"] == 1.0
        if data["policy"]["reason_code"] == "not_in_fresh_process":
            assert not any(c["qualifies"] for c in fresh["candidates"])


def _kill_when(command, path: Path, lines: int, cwd=ROOT):
    """Start `command`, SIGKILL it once `path` holds `lines` lines; return what the file held then."""
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= lines:
            break
        time.sleep(0.02)
    assert process.poll() is None, "the run ended before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    return path.read_text().splitlines()


@pytest.mark.slow
def test_a_killed_search_resumes_measuring_only_what_is_missing(tmp_path):
    command = [sys.executable, str(ROOT / "offline_computation.py"), *WORKLOAD, *QUICK, "--output-dir",
               str(tmp_path), "--latency-only", "--search", "full", "--reps", "3"]
    trace = tmp_path / f"{STEM}.trace.csv"
    before = _kill_when(command, trace, 40)
    kept = [line for line in before if line.count(",") == 4]
    resumed = subprocess.run([*command, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    after = trace.read_text().splitlines()
    complete = (len(kept) - 1) // 3 * 3 + 1  # header + whole visits: a visit is written in one piece
    assert after[:complete] == kept[:complete]  # nothing measured before is lost or measured again
    data = json.loads((tmp_path / f"{STEM}.schedule.json").read_text())
    visits = data["measurement"]["visits"]
    assert len(read_trace(trace).visits) == visits
    assert f"({visits - (complete - 1) // 3} measured now" in resumed.stdout
    # the same command without --resume starts afresh: it measures every visit it uses
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    used, measured = re.search(r"(\d+) visits of \d+ forwards \((\d+) measured now", again.stdout).groups()
    assert used == measured


@pytest.mark.slow
def test_a_killed_recording_resumes_and_replays(tmp_path):
    command = [sys.executable, "-m", "pomt", "record", *WORKLOAD, "--passes", "4", "--reps", "2",
               "--output-dir", str(tmp_path)]
    path = tmp_path / f"{STEM}.record.csv"
    before = _kill_when(command, path, 60)
    resumed = subprocess.run([*command, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    trace = read_trace(path)
    assert len(trace.visits) == 4 * (35 + 3)  # every count in every pass, N three times (--reps: no calibration)
    assert trace.path.read_text().splitlines()[: len(before) - 2] == before[: len(before) - 2]
    assert {v.pass_index for v in trace.visits} == {1, 2, 3, 4}
    assert trace.meta["passes"] == 4 and trace.meta["device"]["kind"] == "cpu" and trace.meta["align"] == 8
    order = [v.tokens for v in trace.visits]
    for p in range(4):  # each multiple of 8 right beside the count below, in alternating order
        sequence = order[p * 38:(p + 1) * 38]
        for n in range(8, 36, 8):
            i = sequence.index(n)
            assert sequence[i - 1 if p % 2 == 0 else i + 1] == n - 1
    assert (tmp_path / f"{STEM}.record.png").stat().st_size > 0
    replayed = _offline("--replay", str(path), "--passes", "2", out=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    assert "replay of" in replayed.stdout


def test_a_recorded_trace_replays_through_the_whole_computation(tmp_path):
    trace = DATA / "deit_tiny_bs1_shuffled.csv"
    result = run_script("offline_computation.py", "--replay", str(trace), "--output-dir", str(tmp_path),
                        "--no-progress", "--passes", "2", "--confirm-rounds", "3")
    assert result.returncode == 0, result.stderr
    stem = "deit_tiny_patch16_224_replay_bs1_is224"
    data = json.loads((tmp_path / f"{stem}.schedule.json").read_text())
    assert data["model"] == "deit_tiny_patch16_224" and data["batch_size"] == 1
    assert data["device"]["replayed_from"] == str(trace) and data["measurement"]["replay"] == str(trace)
    assert "verified" not in data  # nothing was measured here
    assert (tmp_path / f"{stem}.png").stat().st_size > 0
    measured = data["measurement"]
    screened = measured["screened_edges"]  # aligned edges (a - 1, a) its coarse rounds showed to be no step
    assert measured["align"] == 8 and screened and all(high % 8 == 0 and low == high - 1 for low, high in screened)
    assert f"{len(screened)} aligned edges showed none in their coarse rounds" in result.stdout
    assert "224x224 px  batch 1  " in result.stdout  # the trace's batch, not --batch-size's default of 4
    again = run_script("offline_computation.py", "--replay", str(trace), "--output-dir", str(tmp_path / "again"),
                       "--no-progress", "--passes", "2", "--confirm-rounds", "3")
    assert again.returncode == 0, again.stderr  # a replay is deterministic: the same steps again
    assert json.loads((tmp_path / "again" / f"{stem}.schedule.json").read_text())["steps"] == data["steps"]


def test_a_bad_trace_is_one_line_exit_2(tmp_path):
    broken = tmp_path / "broken.csv"
    broken.write_text("tokens,pass,rep,t_s,ms\n197,0,0,0.0,oops\n")
    shutil.copy(DATA / "deit_tiny_bs1_shuffled.json", tmp_path / "broken.json")
    assert_one_line_error(run_script_in_process("offline_computation.py", "--replay", str(broken), "--no-progress"),
                          "not a number")
    mismatched = tmp_path / "mismatched.csv"
    shutil.copy(DATA / "deit_tiny_bs1_shuffled.csv", mismatched)
    sidecar = json.loads((DATA / "deit_tiny_bs1_shuffled.json").read_text())
    (tmp_path / "mismatched.json").write_text(json.dumps({**sidecar, "model": "dinov2_small"}))
    assert_one_line_error(run_script_in_process("offline_computation.py", "--replay", str(mismatched), "--no-progress"),
                          "N=197", "N=257")
    record = run_in_process("record", "--model", "deit_tiny", "--passes", "1", "--no-progress")
    assert_one_line_error(record, "--passes")


@pytest.mark.slow
def test_end_to_end_with_accuracy_writes_a_schedule_that_applies(tmp_path, trained):
    root, checkpoint, _ = trained
    result = _offline("--dataset-root", str(root), "--checkpoint", str(checkpoint), "--accuracy-points", "6",
                      "--alpha", "0.5", "--policy", "utility", out=tmp_path)
    assert result.returncode == 0, result.stderr
    for fragment in ("N=37", "steps", "schedule", "predicted", "top1"):
        assert fragment in result.stdout
    for suffix in ("schedule.json", "curve.csv", "png", "accuracy.csv", "trace.csv"):
        assert (tmp_path / f"{STEM}.{suffix}").stat().st_size > 0
    data = json.loads((tmp_path / f"{STEM}.schedule.json").read_text())
    assert data["policy"]["name"] == "utility"
    assert data["predicted"]["accuracy_kind"] == "top1"
    assert data["num_tokens"] == 37 and data["prefix_tokens"] == 1 and data["depth"] == 6
    assert data["device"]["kind"] == "cpu" and "clocks_locked" in data["device"]
    assert data["device"]["allocator"] == pomt.steady_allocator()  # measured as served: strict holds it to that
    schedule = pomt.load_schedule(tmp_path / f"{STEM}.schedule.json")

    model = create_model(MODEL, input_size=SIZE)
    pomt.apply_schedule(model, tmp_path / f"{STEM}.schedule.json", strict=bool(schedule.prune))
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
    second = _offline("--accuracy-curve", str(curve), "--grid-token-stride", "3", "--no-verify", out=tmp_path / "edge")
    assert second.returncode == 0, second.stderr
    data = json.loads((tmp_path / "edge" / f"{STEM}.schedule.json").read_text())
    assert data["policy"]["name"] == "utility"
    assert data["predicted"]["accuracy"] is not None
