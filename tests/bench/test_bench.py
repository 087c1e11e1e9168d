"""pomt.bench: FLOP counts, amount matching, variant planning, tables; end-to-end runs on deit_tiny."""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
from pathlib import Path

import pytest
import torch

from pomt.bench.flops import count_flops, match_amount
from pomt.bench.report import COLUMNS, launch_bound, slower_than_unpruned
from pomt.bench.run import BenchConfig, resolve
from pomt.bench.variants import flops_function, plan_reductions, tome_removal
from pomt.checks import METHODS
from pomt.cli import main
from pomt.device import Fingerprint
from pomt.errors import PatchError
from pomt.formats.schedule import BlockRemoval, Schedule, load_schedule, save_schedule
from pomt.formats.schedule_parts import Prediction
from pomt.measurement.profile import CPU_PROFILE, GPU_PROFILE
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.patching import patch, token_counts
from pomt.runtimes import BACKENDS, DTYPES

from conftest import assert_one_line_error, run_script_in_process
from flops_oracle import vit_flops

PATCH, DEPTH = 16, 12  # deit_tiny


@pytest.fixture(scope="module")
def tiny64():
    return create_model("deit_tiny", input_size=64)


def write_schedule(
    path,
    removal: dict[int, int],
    input_size: int = 224,
    num_tokens: int | None = None,
    batch: int = 1,
    predicted: dict | None = None,
):
    tokens = num_tokens or (input_size // PATCH) ** 2 + 1
    schedule = Schedule(
        model="deit_tiny_patch16_224",
        input_size=(input_size, input_size),
        batch_size=batch,
        num_tokens=tokens,
        prefix_tokens=1,
        depth=DEPTH,
        method="pomt",
        prune=tuple(BlockRemoval(b, r) for b, r in removal.items()),
        predicted=Prediction.from_dict(predicted or {"baseline_ms": 5.0, "pruned_ms": 4.0}),
        device=Fingerprint(kind="cpu"),
    )
    return save_schedule(schedule, path)


def read_csv(path):
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return reader.fieldnames, list(reader)


def test_counted_flops_equal_the_hand_count(tiny64):
    x = torch.randn(2, 3, 64, 64)
    assert count_flops(tiny64, x) == 2 * vit_flops(tiny64)
    for method, prune in [("pomt", {3: 5}), ("topk", {3: 5}), ("l2norm", {2: 3, 6: 4}), ("tome", 2)]:
        pruned = patch(copy.deepcopy(tiny64), method, prune)
        removal = prune if isinstance(prune, dict) else dict.fromkeys(range(DEPTH), prune)
        assert count_flops(pruned, x) == 2 * vit_flops(tiny64, method, removal), method


@pytest.mark.parametrize("name", ["deit_tiny", "deit_tiny_distilled", "dinov2_small_reg"])
def test_flops_function_counts_on_a_weightless_copy_exactly(name):
    base = create_model(name, input_size=112)
    x = torch.randn(1, 3, 112, 112)
    flops_at = flops_function(base, x)
    assert flops_at(None, {}) == count_flops(base, x) == vit_flops(base)
    for method in METHODS:  # random needs a real generator: counted on a real copy
        removal = {1: 4, 5: 3}
        assert flops_at(method, removal) == count_flops(patch(copy.deepcopy(base), method, removal), x), method
    assert next(base.parameters()).device.type == "cpu"


def test_match_amount_finds_the_closest_amount():
    flops = {amount: 100.0 - 7 * amount for amount in range(11)}
    assert match_amount(flops.__getitem__, 60.0, 0, 10) == 6  # 58 is closer than 65
    assert match_amount(flops.__getitem__, 1000.0, 0, 10) == 0
    assert match_amount(flops.__getitem__, -5.0, 0, 10) == 10


def test_dtype_and_backend_options_are_the_runtimes_names():
    meta = {f.name: f.metadata for f in dataclasses.fields(BenchConfig)}
    assert meta["dtype"]["choices"] == tuple(DTYPES) and meta["backend"]["choices"] == BACKENDS


def test_tome_removal_spreads_the_merge_count_over_the_last_blocks():
    totals = [sum(tome_removal(merges, 4).values()) for merges in range(10)]
    assert totals == list(range(10))
    assert tome_removal(6, 4) == {0: 1, 1: 1, 2: 2, 3: 2}


def test_plan_reductions_puts_the_baseline_and_schedule_first(tiny64):
    geometry = model_geometry(tiny64)
    plans = plan_reductions(["topk", "tome"], geometry, remove=4, r=2, prune_block=3)
    assert [(p.name, p.removal, p.amount) for p in plans] == [
        ("none", {}, ""),
        ("topk", {3: 4}, "-4@3"),
        ("tome", dict.fromkeys(range(DEPTH), 2), "r=2"),
    ]
    with pytest.raises(PatchError, match="choose one of none, pomt, topk, tome, l2norm, random"):
        plan_reductions(["none", "fastest"], geometry)
    with pytest.raises(PatchError, match="--r"):
        plan_reductions(["tome"], geometry)
    with pytest.raises(PatchError, match="cannot remove 16"):
        plan_reductions(["topk"], geometry, remove=16)


@pytest.mark.slow
def test_break_even_is_lost_only_by_variants_that_remove_tokens():
    rows = [{"method": "none", "tokens_kept": 197, "speedup": 1.0},
            {"method": "schedule", "tokens_kept": 197, "speedup": 0.999},
            {"method": "topk", "tokens_kept": 99, "speedup": 0.93},
            {"method": "tome", "tokens_kept": 101, "speedup": 1.2}]
    assert slower_than_unpruned(rows) == ["topk"]


def test_a_variant_whose_kernels_leave_the_gpu_idle_is_named_launch_bound():
    # the H100's benchmark of 2026-11-28 (machine A): the schedule 3.29 ms of GPU work in an 8.675 ms forward
    rows = [{"method": "none", "latency_ms": 7.021, "device_time_ms": 6.409, "profile_kind": GPU_PROFILE},
            {"method": "schedule", "latency_ms": 8.675, "device_time_ms": 3.293, "profile_kind": GPU_PROFILE},
            {"method": "topk", "latency_ms": 3.2, "device_time_ms": 2.9, "profile_kind": GPU_PROFILE},
            {"method": "tome", "latency_ms": 9.0, "device_time_ms": 1.0, "profile_kind": CPU_PROFILE},
            {"method": "l2norm", "latency_ms": 9.0, "device_time_ms": None, "profile_kind": ""}]
    assert launch_bound(rows) == ["schedule (38%)"]  # unpruned 91% and top-k 91% busy; a CPU is its own host


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


def test_half_precision_benchmark_measures_accuracy(tmp_path):
    """--dtype bfloat16 (float16 on CUDA): the accuracy images are cast to the models' dtype."""
    args = "--model test_vit --input-size 96 --methods none,topk --remove 10 --rounds 2 --warmup 0 --threads 1"
    main(["bench", *args.split(), "--dtype", "bfloat16", "--accuracy-samples", "4", "--no-profile",
          "--output-dir", str(tmp_path)])
    _, rows = read_csv(tmp_path / "test_vit_cpu_bs1_is96.benchmark.csv")
    by = {r["method"]: r for r in rows}
    assert float(by["none"]["accuracy"]) == 1.0 and 0 <= float(by["topk"]["accuracy"]) <= 1


def test_a_schedule_is_benchmarked_in_its_own_dtype_unless_told(tmp_path):
    """A float16 schedule measured at float32 would benchmark another workload: --dtype defaults to the
    schedule's, an explicit --dtype wins, and without a schedule it is float32."""
    path = write_schedule(tmp_path / "s.schedule.json", {3: 10})
    half = save_schedule(dataclasses.replace(load_schedule(path), dtype="bfloat16"), tmp_path / "h.schedule.json")
    assert resolve(BenchConfig(schedule=half, device="cpu")).config.dtype == "bfloat16"
    assert resolve(BenchConfig(schedule=path, device="cpu")).config.dtype == "float32"
    assert resolve(BenchConfig(schedule=half, device="cpu", dtype="float32")).config.dtype == "float32"
    assert resolve(BenchConfig(model="deit_tiny", device="cpu")).config.dtype == "float32"


def test_a_schedule_is_benchmarked_on_its_own_runtime_unless_told(tmp_path):
    """On an H200 a schedule measured and verified as CUDA graphs ran 2.18x there and 0.86x eager: --backend
    defaults to the schedule's runtime, an explicit --backend wins, and without a schedule it is eager."""
    path = write_schedule(tmp_path / "s.schedule.json", {3: 10})
    served = save_schedule(dataclasses.replace(load_schedule(path), backend={"name": "openvino"}),
                           tmp_path / "o.schedule.json")
    assert resolve(BenchConfig(schedule=served, device="cpu")).config.backend == "openvino"
    assert resolve(BenchConfig(schedule=path, device="cpu")).config.backend == "eager"
    assert resolve(BenchConfig(schedule=served, device="cpu", backend="eager")).config.backend == "eager"
    assert resolve(BenchConfig(model="deit_tiny", device="cpu")).config.backend == "eager"


@pytest.mark.slow
def test_match_flops_within_two_percent(tmp_path):
    schedule = write_schedule(tmp_path / "s.schedule.json", {3: 60})
    args = "--methods none,topk,tome,l2norm --match flops --prune-block 6 --rounds 2 --warmup 0"
    args += " --accuracy-samples 0 --no-profile"
    main(["bench", *args.split(), "--schedule", str(schedule), "--output-dir", str(tmp_path)])
    _, rows = read_csv(tmp_path / "deit_tiny_patch16_224_cpu_bs1_is224.benchmark.csv")
    by = {r["method"]: r for r in rows}
    target = float(by["schedule"]["gflops"])
    for name in ("topk", "tome", "l2norm"):
        assert float(by[name]["gflops"]) == pytest.approx(target, rel=0.02), name
    assert by["topk"]["amount"].endswith("@6") and int(by["topk"]["amount"][1:-2]) > 60


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


@pytest.mark.slow
def test_top1_on_an_image_folder(tmp_path, trained):
    from tiny_data import SIZE

    root, checkpoint, _ = trained  # a model whose classifier has the folder's classes
    args = f"--model test_vit --input-size {SIZE} --methods none,random --remove 10 --batch-size 2"
    args += " --accuracy-samples 6 --rounds 2 --warmup 0 --no-profile"
    main(["bench", *args.split(), "--dataset-root", str(root), "--checkpoint", str(checkpoint),
          "--output-dir", str(tmp_path)])
    _, rows = read_csv(next(tmp_path.glob("*.benchmark.csv")))
    assert {r["accuracy_kind"] for r in rows} == {"top1"}
    assert all(0 <= float(r["accuracy"]) <= 1 for r in rows)


@pytest.mark.slow
def test_the_schedules_curve_predicts_every_reducer(tmp_path):
    """A curve file beside the schedule (here L(n) = n ms) predicts each variant from the tokens its blocks keep."""
    schedule = write_schedule(tmp_path / "s.schedule.json", {3: 50})
    data = json.loads(schedule.read_text())
    (tmp_path / "c.curve.csv").write_text("tokens,latency_ms\n" + "".join(f"{n},{n}\n" for n in range(2, 198)))
    data["curve"] = "c.curve.csv"
    schedule.write_text(json.dumps(data))
    args = "--methods none,topk,tome --remove 20 --r 4 --rounds 2 --warmup 0 --accuracy-samples 0 --no-profile"
    main(["bench", *args.split(), "--schedule", str(schedule), "--output-dir", str(tmp_path)])
    _, rows = read_csv(tmp_path / "deit_tiny_patch16_224_cpu_bs1_is224.benchmark.csv")
    by = {r["method"]: r for r in rows}
    unpruned = float(by["none"]["latency_ms"])
    expected = {  # sum over blocks of the tokens each receives, over 12 x 197
        "schedule": (4 * 197 + 8 * 147) / (12 * 197),
        "topk": (4 * 197 + 8 * 177) / (12 * 197),
        "tome": sum(token_counts(197, 1, 12, "tome", dict.fromkeys(range(12), 4))[:-1]) / (12 * 197),
    }
    for name, ratio in expected.items():
        assert float(by[name]["predicted_ms"]) == pytest.approx(ratio * unpruned, rel=1e-3), name


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
