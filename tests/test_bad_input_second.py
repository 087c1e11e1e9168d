"""The second bad-input catalogue (issue 31), written apart from the first: what a user gets wrong at the
`pomt model`, `device`, `backend`, `offline` and `record` commands, and through the two scripts. Every case
ends with exit code 2 and one line on stderr naming the problem, no traceback, before anything is measured;
Ctrl-C ends with exit code 130 and one line. Schedules, traces and `bench` / `export`: the `_files` module;
the Python API: the `_api` module."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bad_files_second import TRACE, make_bad_files
from conftest import ROOT, assert_one_line_error, run_in_process, run_script_in_process

TINY = ("--model", "deit_tiny", "--input-size", "64", "--batch-size", "1")
TOO_MANY_THREADS = str((os.cpu_count() or 1) + 1)


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    return make_bad_files(tmp_path_factory.mktemp("bad"))


def fill(args: tuple[str, ...], bad: Path, out: Path) -> list[str]:
    """The case's arguments with {F} (the bad files' folder), {O} (an output folder) and {T} (a good trace)."""
    return [a.format(F=bad, O=out, T=TRACE) for a in args]


def case(fragment: str, *args: str, id: str):
    return pytest.param(args, fragment, id=id)


def offline(fragment: str, *args: str, id: str):
    """An `offline` case on the tiny workload, its outputs in a fresh folder."""
    return case(fragment, "offline", *TINY, "--no-progress", "--output-dir", "{O}", *args, id=id)


INFO = [
    case("unknown model 'deit_tinny'", "model", "deit_tinny", id="model-typo"),
    case("unknown model ''", "model", "", id="model-empty-name"),
    case("unknown model 'DEIT_TINY'", "model", "DEIT_TINY", id="model-upper-case"),
    case("unknown pretrained tag 'bogus_tag'", "model", "deit_tiny.bogus_tag", id="model-unknown-tag"),
    case("cannot prune", "model", "resnet18", id="model-resnet"),
    case("cannot prune", "model", "swin_tiny_patch4_window7_224", id="model-swin"),
    case("positive", "model", "deit_tiny", "--input-size", "0", id="model-size-zero"),
    case("positive", "model", "deit_tiny", "--input-size", "-16", id="model-size-negative"),
    case("not divisible by the patch size 16x16", "model", "deit_tiny", "--input-size", "65", id="model-size-65"),
    case("not divisible by the patch size 14x14", "model", "dinov2_small", "--input-size", "64", id="dinov2-size-64"),
    case("--input-size", "model", "deit_tiny", "--input-size", "6.4e1", id="model-size-float"),
    case("exceeds 4096", "model", "deit_tiny", "--input-size", "99999999999999999999", id="model-size-20-digits"),
    case("exceeds 4096", "model", "deit_tiny", "--input-size", "4097", id="model-size-4097"),
    case("Missing argument", "model", id="model-no-name"),
    case("not available", "device", "--device", "cuda", id="device-cuda-absent"),
    case("unknown device 'cuda:-1'", "device", "--device", "cuda:-1", id="device-cuda-negative"),
    case("unknown device 'gpu'", "device", "--device", "gpu", id="device-gpu"),
    case("--threads", "device", "--threads", "0", id="device-threads-zero"),
    case("logical CPUs", "device", "--threads", TOO_MANY_THREADS, id="device-threads-beyond-cpus"),
    case("unknown backend 'nosuch'", "backend", "nosuch", id="backend-unknown"),
    case("NVIDIA GPU", "backend", "tensorrt", id="backend-tensorrt-on-cpu"),
    case("NVIDIA GPU", "backend", "cudagraph", id="backend-cudagraph-on-cpu"),
    case("unknown device 'tpu'", "backend", "eager", "--device", "tpu", id="backend-device-tpu"),
    case("No such command", "measure", id="unknown-command"),
]

OFFLINE = [
    offline("--batch-size", "--batch-size", "0", id="batch-zero"),
    offline("--batch-size", "--batch-size", "1.5", id="batch-float"),
    offline("--batch-size", "--batch-size", "nan", id="batch-nan"),
    offline("needs", "--batch-size", "99999999999999", id="batch-beyond-memory"),
    offline("--threads", "--threads", "-1", id="threads-negative"),
    offline("logical CPUs", "--threads", TOO_MANY_THREADS, id="threads-beyond-cpus"),
    offline("--alpha", "--alpha", "nan", id="alpha-nan"),
    offline("--alpha", "--alpha", "1.5", id="alpha-above-one"),
    offline("--visit-s must be a finite number", "--visit-s", "inf", id="visit-s-inf"),
    offline("--visit-s must be positive", "--visit-s", "0", id="visit-s-zero"),
    offline("--visit-s must be positive", "--visit-s", "-1", id="visit-s-negative"),
    offline("--candidate-k must be a finite number", "--candidate-k", "inf", id="candidate-k-inf"),
    offline("--candidate-k must be positive", "--candidate-k", "0", id="candidate-k-zero"),
    offline("--min-step must be a finite number", "--min-step", "inf", id="min-step-inf"),
    offline("--min-step", "--min-step", "nan", id="min-step-nan"),
    offline("--step-alpha", "--step-alpha", "1", id="step-alpha-one"),
    offline("--step-alpha", "--step-alpha", "0", id="step-alpha-zero"),
    offline("--budget", "--budget", "0", id="budget-zero"),
    offline("--budget", "--budget", "1.5", id="budget-above-one"),
    offline("--detect", "--detect", "100", id="detect-100"),
    offline("--detect", "--detect", "nan", id="detect-nan"),
    offline("--latency-budget-ms must be positive", "--latency-budget-ms", "0", id="latency-budget-zero"),
    offline("--latency-budget-ms must be a finite number", "--latency-budget-ms", "inf", id="latency-budget-inf"),
    offline("--latency-budget-ms", "--latency-budget-ms", "-5", id="latency-budget-negative"),
    offline("--min-accuracy", "--min-accuracy", "1.5", id="min-accuracy-above-one"),
    offline("--prune-block 12 is outside", "--prune-block", "12", id="prune-block-depth"),
    offline("--prune-block", "--prune-block", "-1", id="prune-block-negative"),
    offline("--max-remove 17 is outside [0, 15]", "--max-remove", "17", id="max-remove-all"),
    offline("--grid-token-start", "--grid-token-start", "0", id="grid-start-zero"),
    offline("outside the allowed range [2, 17]", "--grid-token-start", "500", id="grid-start-beyond-n"),
    offline("outside the allowed range [2, 17]", "--grid-token-stop", "1", id="grid-stop-one"),
    offline("--grid-token-stride", "--grid-token-stride", "0", id="grid-stride-zero"),
    offline("--seed", "--seed", "-1", id="seed-negative"),
    offline("--seed", "--seed", "99999999999999999999999", id="seed-23-digits"),
    offline("--method", "--method", "ToMe", id="method-capitalised"),
    offline("--policy", "--policy", "best", id="policy-unknown"),
    offline("--search", "--search", "binary", id="search-unknown"),
    offline("--dtype", "--dtype", "int8", id="dtype-int8"),
    offline("NVIDIA GPU", "--backend", "tensorrt", id="backend-tensorrt"),
    offline("not available", "--device", "cuda", id="device-cuda"),
    offline("unknown device", "--device", "tpu", id="device-tpu"),
    offline("No such option", "--nosuch-flag", id="flag-unknown"),
    offline("unexpected extra argument", "deit_small", id="positional-model"),
    offline("--passes", "--passes", "1", id="passes-one"),
    offline("--coarse-passes", "--coarse-passes", "1", id="coarse-passes-one"),
    offline("--confirm-rounds", "--confirm-rounds", "2", id="confirm-rounds-two"),
    offline("--verify-rounds", "--verify-rounds", "2", id="verify-rounds-two"),
    offline("--verify-candidates", "--verify-candidates", "0", id="verify-candidates-zero"),
    offline("--accuracy-points", "--accuracy-points", "1", id="accuracy-points-one"),
    offline("--accuracy-samples", "--accuracy-samples", "0", id="accuracy-samples-zero"),
    offline("--align", "--align", "-1", id="align-negative"),
    offline("exclude each other", "--latency-only", "--accuracy-only", id="latency-and-accuracy-only"),
    offline("--agreement measures A(n) on --dataset-root", "--agreement", id="agreement-without-data"),
    offline("needs --latency-budget-ms", "--policy", "budget", id="budget-policy-without-budget"),
    offline("the utility policy needs accuracy", "--policy", "utility", id="utility-without-accuracy"),
    offline("--min-accuracy needs accuracy", "--min-accuracy", "0.5", id="min-accuracy-without-accuracy"),
    offline("--accuracy-only needs --dataset-root", "--accuracy-only", id="accuracy-only-without-data"),
    offline("--dataset-root would go unused", "--latency-only", "--dataset-root", "{F}/flat",
            id="latency-only-with-data"),
    offline("--dataset-root would go unused", "--accuracy-curve", "{F}/accuracy_one_count.csv", "--dataset-root",
            "{F}/flat", id="accuracy-curve-with-data"),
    offline("dataset folder not found", "--dataset-root", "{F}/a_file.txt", id="dataset-is-a-file"),
    offline("dataset folder not found", "--dataset-root", "{F}/nosuch", id="dataset-missing"),
    offline("no images in", "--accuracy-only", "--no-pretrained", "--dataset-root", "{F}/empty",
            id="dataset-empty"),
    offline("no usable images", "--accuracy-only", "--no-pretrained", "--dataset-root", "{F}/texts",
            id="dataset-text-files"),
    offline("no usable images", "--accuracy-only", "--no-pretrained", "--dataset-root", "{F}/empty_classes",
            id="dataset-empty-classes"),
    offline("cannot read an image", "--accuracy-only", "--no-pretrained", "--agreement", "--dataset-root",
            "{F}/corrupt", id="dataset-corrupt-image"),
    offline("1 class folders", "--accuracy-only", "--no-pretrained", "--dataset-root", "{F}/one_class",
            id="dataset-one-class"),
    offline("cannot read checkpoint", "--checkpoint", "{F}/garbage.pth", id="checkpoint-garbage"),
    offline("cannot read checkpoint", "--checkpoint", "{F}/empty.pth", id="checkpoint-empty"),
    offline("cannot read checkpoint", "--checkpoint", "{F}/a_list.pth", id="checkpoint-list"),
    offline("does not fit", "--checkpoint", "{F}/other_keys.pth", id="checkpoint-other-keys"),
    offline("checkpoint file not found", "--checkpoint", "{F}/nosuch.pth", id="checkpoint-missing"),
    offline("checkpoint file not found", "--checkpoint", "{F}", id="checkpoint-folder"),
    offline("is a file, not a folder", "--output-dir", "{F}/a_file.txt", id="output-dir-file"),
    offline("lies under the file", "--output-dir", "{F}/a_file.txt/sub", id="output-dir-under-file"),
    offline("is not writable", "--output-dir", "/proc/pomt-output", id="output-dir-proc"),
    offline("--input-size", "--input-size", "8192", id="input-size-8192"),
    offline("cannot prune", "--model", "convnext_tiny", id="model-convnext"),
    offline("unknown pretrained tag", "--model", "deit_tiny.in22k", id="model-unknown-tag"),
    offline("accuracy curve not found", "--accuracy-curve", "{F}/nosuch.csv", id="accuracy-curve-missing"),
    offline("token counts listed twice", "--accuracy-curve", "{F}/accuracy_count_twice.csv", id="accuracy-count-twice"),
    offline("needs numeric 'tokens'", "--accuracy-curve", "{F}/accuracy_no_columns.csv", id="accuracy-no-columns"),
]

RECORD = [
    case("--passes", "record", *TINY, "--passes", "1", "--output-dir", "{O}", id="record-passes-one"),
    case("--visit-s must be a finite number", "record", *TINY, "--visit-s", "inf", "--output-dir", "{O}",
         id="record-visit-s-inf"),
    case("--min-step must be a finite number", "record", *TINY, "--min-step", "inf", "--output-dir", "{O}",
         id="record-min-step-inf"),
    case("--reference-visits", "record", *TINY, "--reference-visits", "0", "--output-dir", "{O}",
         id="record-reference-visits-zero"),
    case("is a file", "record", *TINY, "--output-dir", "{F}/a_file.txt", id="record-output-dir-file"),
    case("cannot prune", "record", "--model", "resnet18", "--output-dir", "{O}", id="record-resnet"),
    case("logical CPUs", "record", *TINY, "--threads", TOO_MANY_THREADS, "--output-dir", "{O}",
         id="record-threads-beyond-cpus"),
    case("needs", "record", *TINY[:4], "--batch-size", "10000000000000", "--output-dir", "{O}",
         id="record-batch-beyond-memory"),
]


@pytest.mark.parametrize(("args", "fragment"), INFO + OFFLINE + RECORD)
def test_bad_input_is_one_line_and_exit_2(args, fragment, bad, tmp_path):
    result = run_in_process(*fill(args, bad, tmp_path / "out"))
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing measured


@pytest.mark.parametrize(
    ("script", "args", "fragment"),
    [
        ("offline_computation.py", ("--model", "deit_tiny", "--visit-s", "inf"), "--visit-s"),
        ("offline_computation.py", ("--replay", "{F}/huge_cell.csv"), "field larger than field limit"),
        ("benchmark.py", ("--model", "deit_tiny", "--methods", ",,"), "--methods names no variant"),
        ("benchmark.py", ("--schedule", "{F}/deep.json"), "not a schedule's JSON"),
    ],
    ids=["offline-script-visit-s-inf", "offline-script-huge-cell", "bench-script-no-methods",
         "bench-script-deep-json"],
)
def test_the_scripts_themselves_say_it_in_one_line(script, args, fragment, bad, tmp_path):
    out = str(tmp_path / "out")
    result = run_script_in_process(script, *fill(args, bad, tmp_path), "--output-dir", out, cwd=tmp_path)
    assert_one_line_error(result, fragment)


def _start(script: str, *args: str, cwd: Path) -> subprocess.Popen:
    """A top-level script in a session of its own, as a terminal's foreground job (Ctrl-C reaches its group)."""
    return subprocess.Popen([sys.executable, str(ROOT / script), *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def _once_written(process: subprocess.Popen, path: Path, lines: int) -> None:
    """Wait (bounded only by the run itself) until the journal `path` holds `lines` lines."""
    while process.poll() is None:
        if path.exists() and len(path.read_text().splitlines()) >= lines:
            return
        time.sleep(0.02)
    raise AssertionError(f"the run ended before {path.name} held {lines} lines: {process.stderr.read()}")


@pytest.mark.parametrize(
    ("script", "args", "journal"),
    [
        ("offline_computation.py", ("--search", "full", "--latency-only", "--passes", "40"), "trace.csv"),
        ("offline_computation.py", ("--search", "adaptive", "--latency-only", "--coarse-passes", "40"), "trace.csv"),
    ],
    ids=["full-search", "adaptive-search"],
)
def test_ctrl_c_in_the_offline_script_is_exit_130_with_its_resume_line(script, args, journal, tmp_path):
    out = tmp_path / "out"
    process = _start(script, *TINY, "--threads", "1", "--reps", "2", "--no-progress", "--output-dir", str(out),
                     *args, cwd=tmp_path)
    _once_written(process, out / f"deit_tiny_patch16_224_cpu_bs1_is64.{journal}", 4)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert process.returncode == 130, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "rerun with --resume to continue" in lines[0], lines[0]
