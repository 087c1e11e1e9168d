"""pomt.bench.run: `pomt bench` end to end on deit_tiny (eager and ONNX Runtime), and its bad input in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pomt.bench.report import COLUMNS
from pomt.cli import main
from pomt.models.registry import create_model

from conftest import assert_one_line_error, run_script_in_process
from support.bench_files import read_csv, schedule_file, write_schedule
from support.flops_oracle import vit_flops


def test_end_to_end_schedule_and_reducers(tmp_path, capsys):
    schedule = write_schedule(tmp_path / "s.schedule.json", {3: 50})
    args = "--model deit_tiny --methods none,topk,tome --remove 50 --r 4 --batch-size 1 --input-size 224"
    args += " --rounds 3 --warmup 1 --accuracy-samples 2 --threads 1"
    main(["bench", *args.split(), "--schedule", str(schedule), "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    stem = tmp_path / "deit_tiny_patch16_224_cpu_bs1_is224"
    columns, rows = read_csv(f"{stem}.benchmark.csv")
    assert tuple(columns[: len(COLUMNS)]) == COLUMNS
    assert [r["method"] for r in rows] == ["none", "schedule", "topk", "tome"]
    by = {r["method"]: r for r in rows}
    for row in rows:
        assert float(row["latency_ms"]) > 0 and float(row["throughput_ips"]) > 0 and float(row["speedup"]) > 0
        assert float(row["ops_per_forward"]) > 0 and float(row["device_time_ms"]) > 0
        assert row["accuracy_kind"] == "agreement" and 0 <= float(row["accuracy"]) <= 1
        assert row["power_w"] == "" and row["peak_mem_kind"] == "cpu_max_allocated"
        assert float(row["peak_mem_mb"]) > float(row["params_m"]) * 4e6 / 2**20  # weights + activations
    assert float(by["none"]["accuracy"]) == 1.0 and float(by["none"]["speedup"]) == 1.0
    # no curve beside the schedule: its own prediction (4 of 5 ms) applied to this run's unpruned median
    unpruned = float(by["none"]["latency_ms"])
    assert by["schedule"]["tokens_kept"] == "147"
    assert float(by["schedule"]["predicted_ms"]) == pytest.approx(0.8 * unpruned, rel=1e-3)
    assert float(by["schedule"]["measured_over_predicted"]) == pytest.approx(
        float(by["schedule"]["latency_ms"]) / float(by["schedule"]["predicted_ms"]), rel=1e-3)
    assert float(by["none"]["predicted_ms"]) == pytest.approx(unpruned, rel=1e-3) and by["topk"]["predicted_ms"] == ""
    tiny = create_model("deit_tiny", input_size=224)
    for name in ("schedule", "topk"):
        assert float(by[name]["gflops"]) < float(by["none"]["gflops"])
        assert float(by[name]["gflops"]) == pytest.approx(vit_flops(tiny, "pomt", {3: 50}) / 1e9, rel=0.01)
    assert float(by["none"]["gflops"]) == pytest.approx(vit_flops(tiny) / 1e9, rel=1e-6)
    meta = json.loads(Path(f"{stem}.benchmark.json").read_text())["meta"]
    assert meta["rounds"] == 3 and meta["threads"] == 1 and "clocks_locked" in meta["fingerprint"]
    assert (tmp_path / f"{stem.name}.benchmark.png").stat().st_size > 0
    assert "schedule" in out and "power is measured on NVIDIA GPUs only" in out


@pytest.mark.slow
def test_a_benchmark_on_onnx_runtime(tmp_path):
    args = "--model deit_tiny --input-size 64 --methods none,topk --remove 8 --rounds 2 --warmup 1"
    args += " --accuracy-samples 0 --no-profile --backend onnxruntime"
    main(["bench", *args.split(), "--output-dir", str(tmp_path)])
    stem = tmp_path / "deit_tiny_patch16_224_cpu_bs1_is64"
    meta = json.loads(Path(f"{stem}.benchmark.json").read_text())["meta"]
    assert meta["backend"]["name"] == "onnxruntime" and meta["fingerprint"]["backend"]["name"] == "onnxruntime"
    assert any("timed on onnxruntime" in note for note in meta["notes"])
    _, rows = read_csv(f"{stem}.benchmark.csv")
    assert [r["method"] for r in rows] == ["none", "topk"] and all(float(r["latency_ms"]) > 0 for r in rows)


def test_missing_schedule_file_is_one_line(tmp_path):
    absent = str(tmp_path / "absent.json")
    result = run_script_in_process("benchmark.py", "--schedule", absent, "--output-dir", str(tmp_path))
    assert_one_line_error(result, "schedule file not found")


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "deit_tiny", "--methods", "none,fastest"], "choose one of none, pomt, topk"),
        (["--model", "deit_tiny", "--batch-size", "0"], "--batch-size"),
        (["--model", "deit_tiny", "--input-size", "100"], "not divisible by the patch size"),
        (["--model", "deit_tiny", "--methods", "topk"], "needs --remove"),
    ],
)
def test_bad_input_is_one_line(args, fragment, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args, "--output-dir", str(tmp_path), "--accuracy-samples", "0", "--no-profile"])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and fragment in lines[0], lines


def test_schedule_for_another_model_is_one_line(tmp_path, capsys):
    schedule = write_schedule(tmp_path / "s.schedule.json", {3: 50}, num_tokens=257)  # a DINOv2-sized grid
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--model", "deit_tiny", "--schedule", str(schedule), "--output-dir", str(tmp_path)])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "does not match" in lines[0], lines


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--model", "deit_tiny", "--match", "fastest"], "--match"),
        (["--model", "deit_tiny", "--methods", "tome", "--match", "latency"], "--match latency needs a --schedule"),
        (["--model", "deit_tiny", "--match", "flops"], "--match flops needs a --schedule"),
        (["SCHEDULE", "--methods", "tome", "--r", "2", "--match", "latency"], "leave out --r"),
        (["SCHEDULE", "--methods", "topk", "--input-sizes", "64,96"], "needs the schedule's input size 64"),
        (["SCHEDULE", "--methods", "pomt", "--prune-block", "12"], "--prune-block 12 is outside"),
        (["SCHEDULE", "--match-rounds", "1"], "--match-rounds"),
    ],
)
def test_bad_match_input_is_one_line(args, fragment, tmp_path, capsys):
    schedule = schedule_file(tmp_path / "s.schedule.json", "tome", dict.fromkeys(range(12), 1))
    args = [part for arg in args for part in (["--schedule", str(schedule)] if arg == "SCHEDULE" else [arg])]
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", *args, "--output-dir", str(tmp_path), "--accuracy-samples", "0", "--no-profile",
              "--rounds", "1", "--warmup", "0"])
    assert exit_info.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "warning" not in line]
    assert len(lines) == 1 and fragment in lines[0], lines
    assert not list(tmp_path.glob("*.benchmark.*"))
