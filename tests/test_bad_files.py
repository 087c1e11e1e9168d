"""Broken or mismatched files (issue 31): traces and their sidecars and accuracy curves through `offline
--replay`, schedules through `bench --schedule`, each answered with one line on stderr and exit code 2, no
traceback, nothing written; a schedule that is legal but surprising is benchmarked with one warning line."""

from __future__ import annotations

import json

import pytest

from conftest import run_in_process, verified_record
from support.bad_files import TRACE, assert_refused_writing_nothing, good_schedule, warning_lines

QUICK_BENCH = ("--rounds", "1", "--warmup", "0", "--accuracy-samples", "0", "--no-profile", "--power-seconds", "0")


def case(fragment: str, *args: str, id: str):
    return pytest.param(args, fragment, id=id)


def replay(fragment: str, trace: str, *args: str, id: str):
    """`offline --replay` of `trace` ({F}: the bad files' folder, {T}: a good trace)."""
    return case(fragment, "offline", "--replay", trace, "--no-progress", *args, id=id)


def scheduled(fragment: str, name: str, id: str):
    """`bench --schedule` of one of the broken schedules."""
    return case(fragment, "bench", "--schedule", f"{{F}}/{name}.json", *QUICK_BENCH, id=id)


REPLAY = [
    replay("trace not found", "{F}/nosuch.csv", id="missing"),
    replay("cannot read trace", "{F}", id="a-folder"),
    replay("not a latency trace", str(TRACE.with_suffix(".json")), id="the-sidecar-itself"),
    replay("trace sidecar not found", "{F}/no_sidecar.csv", id="no-sidecar"),
    replay("header must start with", "{F}/header_other.csv", id="other-header"),
    replay("header must start with", "{F}/no_text.csv", id="empty-csv"),
    replay("holds no measurements", "{F}/header_only.csv", id="header-only"),
    replay("is not finite", "{F}/nan_ms.csv", id="nan-ms"),
    replay("ms > 0 are required", "{F}/negative_ms.csv", id="negative-ms"),
    replay("outside [2, 197]", "{F}/beyond_n.csv", id="count-beyond-n"),
    replay("field larger than field limit", "{F}/huge_cell.csv", id="huge-cell"),
    replay("is not a number", "{F}/nul_byte.csv", id="nul-byte"),
    replay("no visit at N = 197", "{F}/no_reference.csv", id="no-reference-count"),
    replay("corrupt trace sidecar", "{F}/sidecar_long_number.csv", id="sidecar-5000-digits"),
    replay("expected a JSON object", "{F}/sidecar_list.csv", id="sidecar-list"),
    replay("unknown model 'deit_tinny'", "{F}/sidecar_typo.csv", id="sidecar-model-typo"),
    replay("cannot prune", "{F}/sidecar_resnet.csv", id="sidecar-resnet"),
    replay("outside [2, 50]", "{F}/sidecar_n.csv", id="sidecar-wrong-n"),
    replay("is invalid", "{F}/sidecar_size_text.csv", id="sidecar-size-text"),
    replay("is invalid", "{F}/sidecar_batch_true.csv", id="sidecar-batch-true"),
    replay("exceeds 4096", "{F}/sidecar_huge_size.csv", id="sidecar-size-100000"),
    replay("not --model deit_small", "{T}", "--model", "deit_small", id="other-model"),
    replay("not --input-size 64x64", "{T}", "--input-size", "64", id="other-input-size"),
    replay("not --batch-size 4", "{T}", "--batch-size", "4", id="other-batch"),
    replay("--accuracy-only measures none", "{T}", "--accuracy-only", id="accuracy-only"),
    replay("not --device cuda (the trace's: cpu)", "{T}", "--device", "cuda", id="other-device"),
    replay("not --threads 1 (the trace's: 2)", "{T}", "--threads", "1", id="other-threads"),
    replay("not --dtype bfloat16", "{T}", "--dtype", "bfloat16", id="other-dtype"),
    replay("not --backend onnxruntime", "{T}", "--backend", "onnxruntime", id="other-backend"),
    replay("accuracy must lie in [0, 1]", "{T}", "--accuracy-curve", "{F}/accuracy_above_one.csv", id="accuracy-2"),
    replay("accuracy must lie in [0, 1]", "{T}", "--accuracy-curve", "{F}/accuracy_nan.csv", id="accuracy-nan"),
    replay("holds one token count", "{T}", "--accuracy-curve", "{F}/accuracy_one_count.csv", id="accuracy-one-count"),
    replay("outside this model's range", "{T}", "--accuracy-curve", "{F}/accuracy_beyond_n.csv",
           id="accuracy-count-beyond-n"),
    replay("mixes kinds", "{T}", "--accuracy-curve", "{F}/accuracy_mixed_kinds.csv", id="accuracy-mixed-kinds"),
    replay("accuracy curve not found", "{T}", "--accuracy-curve", "{F}", id="accuracy-curve-folder"),
    replay("corrupt accuracy curve", "{T}", "--accuracy-curve", "{F}/not_utf8.json", id="accuracy-curve-binary"),
    replay("--prune-block 12 is outside", "{T}", "--prune-block", "12", id="prune-block-depth"),
    replay("--max-remove 196 is outside [0, 195]", "{T}", "--max-remove", "196", id="max-remove-all"),
]

SCHEDULES = [
    scheduled("field 'curve' must be a file name", "curve_number", id="curve-number"),
    scheduled("field 'curve' must be a file name", "curve_dot", id="curve-dot"),
    scheduled("field 'model' must be a timm model name", "model_null", id="model-null"),
    scheduled("field 'model' must be a timm model name", "model_number", id="model-number"),
    scheduled("version True is unsupported", "version_true", id="version-true"),
    scheduled("written by a newer pomt", "version_two", id="version-2"),
    scheduled("not a pomt schedule", "format_other", id="format-trace"),
    scheduled("'verified.unpruned_ms' must be a positive number", "nan_verified", id="verified-nan"),
    scheduled("'verified.speedup' must be a positive number", "inf_speedup", id="verified-inf"),
    scheduled("'verified.method_cost_ms' must map", "cost_list", id="method-cost-list"),
    scheduled("not a schedule's JSON", "deep", id="nested-100000-deep"),
    scheduled("not a schedule's JSON", "long_number", id="number-5000-digits"),
    scheduled("Unexpected UTF-8 BOM", "bom", id="byte-order-mark"),
    scheduled("not a pomt schedule", "list", id="a-list"),
    scheduled("not JSON", "empty", id="empty-file"),
    scheduled("not JSON", "truncated", id="truncated"),
    scheduled("not UTF-8", "not_utf8", id="not-utf8"),
    scheduled("field 'input_size' must be [height, width]", "input_bool", id="input-size-true"),
    scheduled("does not match", "input_other", id="input-size-224-for-n-17"),
    scheduled("field 'steps' must be a list", "steps_text", id="steps-text"),
    scheduled("field 'policy' must be an object", "policy_list", id="policy-list"),
    scheduled("field 'device' must be an object", "device_text", id="device-text"),
    scheduled("cannot prune", "resnet", id="model-resnet"),
    scheduled("unknown model 'deit_tinny'", "typo_model", id="model-typo"),
    scheduled("'batch_size' must be an integer >= 1", "batch_zero", id="batch-zero"),
    scheduled("ToMe merges at most half", "tome_beyond_cap", id="tome-beyond-cap"),
    scheduled("must be a list of {block, remove}", "prune_pairs", id="prune-pairs"),
    scheduled("strictly increasing", "blocks_twice", id="block-twice"),
    scheduled("'remove' must be an integer", "remove_float", id="remove-float"),
    scheduled("'prefix_tokens' must be an integer >= 0", "prefix_negative", id="prefix-negative"),
    scheduled("field 'dtype' must be one of", "dtype_int8", id="dtype-int8"),
    scheduled("field 'backend.name' must be one of", "backend_tpu", id="backend-tpu"),
    scheduled("kept_tokens 5 != num_tokens 17", "kept_wrong", id="kept-tokens-wrong"),
]

@pytest.mark.parametrize(("args", "fragment"), REPLAY + SCHEDULES)
def test_a_bad_or_mismatched_file_is_one_line_and_exit_2(args, fragment, bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_refused_writing_nothing(args, fragment, bad, tmp_path)


def test_a_schedule_of_another_model_of_the_same_geometry_is_benchmarked_with_one_warning_line(tmp_path):
    """vit_tiny and deit_tiny share N, prefix and depth: asked for deit_tiny, the bench warns once (not once
    itself and once more through apply_schedule) that the schedule was made for another model."""
    path = tmp_path / "vit.schedule.json"  # verified here, at this test's thread count
    path.write_text(json.dumps(good_schedule(model="vit_tiny_patch16_224", verified=verified_record())))
    result = run_in_process("bench", "--schedule", str(path), "--model", "deit_tiny", *QUICK_BENCH,
                            "--output-dir", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    lines = warning_lines(result)
    assert len(lines) == 1 and "made for vit_tiny_patch16_224" in lines[0], lines
    written = json.loads(next((tmp_path / "out").glob("*.benchmark.json")).read_text())
    assert written["meta"]["model"] == "deit_tiny_patch16_224"
