"""pomt.bench.report: break-even and launch-bound notes, and the sweep's table and heat-map."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pomt.bench.report import launch_bound, slower_than_unpruned
from pomt.cli import main
from pomt.measurement.timing import CPU_PROFILE, GPU_PROFILE

from support.bench_files import read_csv


@pytest.mark.slow
def test_break_even_is_lost_only_by_variants_that_remove_tokens():
    rows = [{"method": "none", "tokens_kept": 197, "speedup": 1.0},
            {"method": "schedule", "tokens_kept": 197, "speedup": 0.999},
            {"method": "topk", "tokens_kept": 99, "speedup": 0.93},
            {"method": "tome", "tokens_kept": 101, "speedup": 1.2}]
    assert slower_than_unpruned(rows) == ["topk"]


def test_a_variant_whose_kernels_leave_the_gpu_idle_is_named_launch_bound():
    # the schedule: 3.29 ms of GPU work in an 8.675 ms forward
    rows = [{"method": "none", "latency_ms": 7.021, "device_time_ms": 6.409, "profile_kind": GPU_PROFILE},
            {"method": "schedule", "latency_ms": 8.675, "device_time_ms": 3.293, "profile_kind": GPU_PROFILE},
            {"method": "topk", "latency_ms": 3.2, "device_time_ms": 2.9, "profile_kind": GPU_PROFILE},
            {"method": "tome", "latency_ms": 9.0, "device_time_ms": 1.0, "profile_kind": CPU_PROFILE},
            {"method": "l2norm", "latency_ms": 9.0, "device_time_ms": None, "profile_kind": ""}]
    assert launch_bound(rows) == ["schedule (38%)"]  # unpruned 91% and top-k 91% busy; a CPU is its own host


@pytest.mark.slow
def test_sweep_table_and_heatmap(tmp_path, capsys):
    args = "--model deit_tiny --methods topk --keep-rate 0.5 --batch-sizes 1,2 --input-sizes 32,64"
    args += " --rounds 2 --warmup 0 --accuracy-samples 0 --no-profile"
    main(["bench", *args.split(), "--output-dir", str(tmp_path)])
    out = capsys.readouterr().out
    table = out[out.index("topk: batch \\ input") :]
    lines = table.splitlines()
    assert lines[0].split()[-2:] == ["32", "64"]
    assert [line.split()[0] for line in lines[2:4]] == ["1", "2"]
    assert all(line.count("x") == 2 for line in lines[2:4])
    stem = tmp_path / "deit_tiny_patch16_224_cpu_bs1-2_is32-64.sweep"
    _, rows = read_csv(f"{stem}.csv")
    cells = sorted({(int(r["batch_size"]), int(r["input_size"])) for r in rows})
    assert cells == [(1, 32), (1, 64), (2, 32), (2, 64)]
    assert {r["tokens_kept"] for r in rows if r["method"] == "topk"} == {"3", "9"}
    assert (tmp_path / f"{stem.name}.png").stat().st_size > 0
    assert len(json.loads(Path(f"{stem}.json").read_text())["speedup"]["topk"]) == 4
