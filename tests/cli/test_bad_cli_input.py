"""Bad command lines never end in a traceback (issue 31): every `pomt` command answers a bad option, argument
or file it is pointed at with one line on stderr and exit code 2, before anything is measured; what is legal
but surprising runs with one warning line. The scripts: test_bad_script_input.py; broken files through
`offline --replay` and `bench --schedule`: test_bad_files.py; the Python API: test_bad_api_input.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import DATA, assert_one_line_error, run_in_process
from support.bad_files import TRACE, assert_refused_writing_nothing, make_scene, warning_lines

WORKLOAD = ("--model", "deit_tiny", "--input-size", "64", "--batch-size", "1")
TINY = (*WORKLOAD, "--no-progress")  # N = 17, built fast
TOO_MANY_THREADS = str((os.cpu_count() or 1) + 1)
QUICK_BENCH = ("--rounds", "1", "--warmup", "0", "--accuracy-samples", "0", "--no-profile", "--power-seconds", "0")


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    """The files the cases point at (`make_scene`), a foreign journal and a schedule path taken by a folder."""
    root = make_scene(tmp_path_factory.mktemp("scene"))
    journal = root / "journal"  # a trace of this workload measured with other settings
    run = run_in_process("offline", *TINY, "--output-dir", str(journal), "--passes", "2", "--reps", "1",
                         "--search", "full", "--no-verify", "--latency-only", "--grid-token-stride", "8")
    assert run.returncode == 0, run.stderr
    stem = "deit_tiny_patch16_224_cpu_bs1_is64"
    (root / "in_the_way").mkdir()
    (root / "in_the_way" / f"{stem}.schedule.json").mkdir()
    return root


# (id, arguments, fragments of the one error line). "{scene}" is the fixture's folder, "{out}" the test's own
# output folder, "{data}" tests/data.
CLI_CASES = [
    # 1. a model pomt cannot patch, refused by name at every entry point
    ("model-resnet18", ["model", "resnet18"], ["resnet18", "pomt supports"]),
    ("model-convnext", ["model", "convnext_tiny"], ["convnext_tiny", "pomt supports"]),
    ("model-parallel-blocks", ["model", "vit_small_patch16_18x2_224"], ["ParallelThingsBlock", "pomt supports"]),
    ("model-naflex", ["model", "naflexvit_base_patch16_siglip"], ["NaFlexVit", "no patch embedding"]),
    ("offline-resnet18", ["offline", "--model", "resnet18"], ["resnet18", "pomt supports"]),
    ("offline-convnext", ["offline", "--model", "convnext_tiny"], ["convnext_tiny", "pomt supports"]),
    ("bench-resnet18", ["bench", "--model", "resnet18"], ["resnet18", "pomt supports"]),
    ("record-resnet18", ["record", "--model", "resnet18"], ["resnet18", "pomt supports"]),
    ("export-resnet-schedule", ["export", "{scene}/resnet.schedule.json", "--no-pretrained", "--output",
                                "{out}/r.onnx"], ["resnet18", "pomt supports"]),
    ("bench-resnet-schedule", ["bench", "--schedule", "{scene}/resnet.schedule.json"], ["resnet18", "pomt supports"]),
    # 2. output paths, checked before anything is built
    ("offline-output-is-a-file", ["offline", "--output-dir", "{scene}/file"], ["--output-dir", "is a file"]),
    ("offline-output-under-a-file", ["offline", "--output-dir", "{scene}/file/sub"], ["lies under the file"]),
    ("offline-output-read-only", ["offline", "--output-dir", "/proc/pomt-out"], ["--output-dir", "not writable"]),
    ("bench-output-is-a-file", ["bench", "--model", "deit_tiny", "--output-dir", "{scene}/file"], ["is a file"]),
    ("bench-output-read-only", ["bench", "--model", "deit_tiny", "--output-dir", "/proc/x"], ["not writable"]),
    ("record-output-is-a-file", ["record", "--model", "deit_tiny", "--output-dir", "{scene}/file"], ["is a file"]),
    ("export-output-read-only", ["export", "{scene}/tiny.schedule.json", "--output", "/proc/x.onnx"],
     ["--output", "not writable"]),
    ("export-output-under-a-file", ["export", "{scene}/tiny.schedule.json", "--output", "{scene}/file/x.onnx"],
     ["--output", "is a file"]),
    ("export-output-is-a-folder", ["export", "{scene}/tiny.schedule.json", "--output", "{scene}/x.onnx"],
     ["--output", "is a folder"]),
    ("offline-schedule-path-is-a-folder", ["offline", *TINY, "--output-dir", "{scene}/in_the_way"],
     ["schedule.json", "is a folder"]),
    # 3. files that are not UTF-8 text
    ("export-latin1-schedule", ["export", "{scene}/latin1.json"], ["not UTF-8"]),
    ("bench-latin1-schedule", ["bench", "--schedule", "{scene}/latin1.json"], ["not UTF-8"]),
    ("offline-latin1-trace", ["offline", "--replay", "{scene}/latin1_trace.csv"], ["cannot read trace"]),
    ("offline-latin1-accuracy-curve", ["offline", *TINY, "--accuracy-curve", "{scene}/latin1.csv"],
     ["corrupt accuracy curve"]),
    # 4. threads, before the model is built
    ("offline-threads-0", ["offline", "--threads", "0"], ["--threads"]),
    ("offline-threads-negative", ["offline", "--threads", "-3"], ["--threads"]),
    ("bench-threads-0", ["bench", "--model", "deit_tiny", "--threads", "0"], ["--threads"]),
    ("record-threads-0", ["record", "--threads", "0"], ["--threads"]),
    ("device-threads-0", ["device", "--threads", "0"], ["--threads"]),
    # 6. and smaller: ranges refused as ranges, before anything is measured
    ("min-gain-negative", ["offline", "--min-gain", "-1"], ["--min-gain"]),
    ("min-gain-above-1", ["offline", "--min-gain", "2"], ["--min-gain"]),
    ("candidate-k-negative", ["offline", "--candidate-k", "-1"], ["--candidate-k"]),
    ("candidate-k-zero", ["offline", "--candidate-k", "0"], ["--candidate-k must be positive"]),
    ("min-accuracy-2", ["offline", "--min-accuracy", "2"], ["--min-accuracy"]),
    ("min-accuracy-negative", ["offline", "--min-accuracy", "-0.5"], ["--min-accuracy"]),
    ("min-accuracy-without-accuracy", ["offline", "--min-accuracy", "0.5"], ["--min-accuracy needs accuracy"]),
    ("latency-budget-negative", ["offline", "--latency-budget-ms", "-5"], ["--latency-budget-ms"]),
    ("latency-budget-zero", ["offline", "--latency-budget-ms", "0"], ["--latency-budget-ms must be positive"]),
    ("utility-without-accuracy", ["offline", "--policy", "utility"], ["utility policy needs accuracy"]),
    ("budget-without-budget", ["offline", "--policy", "budget"], ["needs --latency-budget-ms"]),
    ("alpha-2", ["offline", "--alpha", "2"], ["--alpha"]),
    ("accuracy-samples-0", ["offline", "--accuracy-samples", "0"], ["--accuracy-samples"]),
    ("accuracy-points-1", ["offline", "--accuracy-points", "1"], ["--accuracy-points"]),
    ("accuracy-batch-size-0", ["offline", "--accuracy-batch-size", "0"], ["--accuracy-batch-size"]),
    ("passes-1", ["offline", "--passes", "1"], ["--passes"]),
    ("confirm-rounds-2", ["offline", "--confirm-rounds", "2"], ["--confirm-rounds"]),
    ("budget-0", ["offline", "--budget", "0"], ["--budget"]),
    ("budget-above-1", ["offline", "--budget", "1.5"], ["--budget"]),
    ("step-alpha-1", ["offline", "--step-alpha", "1"], ["--step-alpha"]),
    ("visit-s-0", ["offline", "--visit-s", "0"], ["--visit-s"]),
    ("verify-rounds-2", ["offline", "--verify-rounds", "2"], ["--verify-rounds"]),
    ("verify-seconds-negative", ["offline", "--verify-seconds", "-1"], ["--verify-seconds"]),
    ("verify-candidates-0", ["offline", "--verify-candidates", "0"], ["--verify-candidates"]),
    ("batch-size-0", ["offline", "--batch-size", "0"], ["--batch-size"]),
    ("input-size-0", ["offline", "--input-size", "0"], ["--input-size"]),
    ("input-size-not-divisible", ["offline", "--model", "deit_tiny", "--input-size", "63"], ["not divisible"]),
    ("grid-stride-0", ["offline", "--grid-token-stride", "0"], ["--grid-token-stride"]),
    ("prune-block-negative", ["offline", "--prune-block", "-1"], ["--prune-block"]),
    ("prune-block-beyond-depth", ["offline", *TINY, "--prune-block", "12"], ["--prune-block 12"]),
    ("max-remove-negative", ["offline", "--max-remove", "-1"], ["--max-remove"]),
    ("max-remove-beyond-tokens", ["offline", *TINY, "--max-remove", "100"], ["--max-remove 100", "[0, 15]"]),
    ("seed-negative", ["offline", "--seed", "-1"], ["--seed"]),
    # 7. accuracy data whose classes are not the model's
    ("accuracy-only-foreign-classes", ["offline", *TINY, "--accuracy-only", "--no-pretrained", "--dataset-root",
                                       "{scene}/one_class"], ["1 class folders", "1000 outputs", "--agreement"]),
    ("offline-foreign-classes", ["offline", *TINY, "--no-pretrained", "--dataset-root", "{scene}/one_class"],
     ["1 class folders", "--agreement"]),
    ("bench-foreign-classes", ["bench", *TINY[:-1], "--methods", "none", "--dataset-root", "{scene}/one_class",
                               "--no-profile"], ["1 class folders", "--agreement"]),
    ("dataset-missing", ["offline", "--dataset-root", "/nonexistent/folder"], ["dataset folder not found"]),
    ("dataset-empty", ["offline", *TINY, "--no-pretrained", "--dataset-root", "{scene}/empty"], ["no images"]),
    ("agreement-without-dataset", ["offline", "--agreement"], ["--agreement", "--dataset-root"]),
    ("accuracy-only-without-dataset", ["offline", "--accuracy-only"], ["--accuracy-only needs --dataset-root"]),
    ("bench-dataset-missing", ["bench", "--model", "deit_tiny", "--dataset-root", "/nonexistent"],
     ["dataset folder not found"]),
    # 8. a replay asked for another workload than its trace's
    ("replay-other-model", ["offline", "--replay", "{data}/deit_small_bs4_amd_shuffled.csv", "--model", "deit_base"],
     ["--replay", "--model deit_base_patch16_224 (the trace's: deit_small_patch16_224)"]),
    ("replay-other-batch", ["offline", "--replay", "{data}/deit_small_bs4_amd_shuffled.csv", "--batch-size", "8"],
     ["--batch-size 8 (the trace's: 4)"]),
    ("replay-other-size", ["offline", "--replay", "{data}/deit_small_bs4_amd_shuffled.csv", "--input-size", "448"],
     ["--input-size 448x448"]),
    ("replay-missing", ["offline", "--replay", "/nonexistent/trace.csv"], ["trace not found"]),
    ("replay-accuracy-only", ["offline", "--replay", "{data}/deit_small_bs4_amd_shuffled.csv", "--accuracy-only",
                              "--dataset-root", "{scene}/one_class"], ["--replay analyses latency"]),
    # the rest of the commands and options
    ("unknown-command", ["magic"], ["No such command"]),
    ("unknown-option", ["offline", "--bogus"], ["--bogus"]),
    ("device-cuda-absent", ["offline", "--device", "cuda"], ["sees no CUDA GPU"]),
    ("device-unknown", ["offline", "--device", "tpu"], ["unknown device"]),
    ("dtype-unknown", ["offline", "--dtype", "float64"], ["float64"]),
    ("backend-tensorrt-on-cpu", ["offline", "--device", "cpu", "--backend", "tensorrt"], ["tensorrt"]),
    ("backend-cudagraph-on-cpu", ["offline", "--device", "cpu", "--backend", "cudagraph"], ["cudagraph", "NVIDIA GPU"]),
    ("method-unknown", ["offline", "--method", "magic"], ["magic"]),
    ("search-unknown", ["offline", "--search", "magic"], ["magic"]),
    ("latency-and-accuracy-only", ["offline", "--latency-only", "--accuracy-only"], ["exclude each other"]),
    ("accuracy-curve-missing", ["offline", *TINY, "--accuracy-curve", "/nonexistent.csv"],
     ["accuracy curve not found"]),
    ("checkpoint-missing", ["offline", *TINY, "--checkpoint", "/nonexistent.pth"], ["checkpoint file not found"]),
    ("resume-other-settings", ["offline", *TINY, "--output-dir", "{scene}/journal", "--resume", "--passes", "3",
                               "--reps", "1", "--search", "full", "--no-verify", "--latency-only",
                               "--grid-token-stride", "8"], ["other settings", "passes"]),
    ("export-format-unknown", ["export", "{scene}/tiny.schedule.json", "--format", "tflite"], ["tflite"]),
    ("export-wrong-suffix", ["export", "{scene}/tiny.schedule.json", "--output", "{out}/x.txt"], ["must end in .onnx"]),
    ("export-missing-schedule", ["export", "/nonexistent.schedule.json"], ["schedule file not found"]),
    ("export-corrupt-schedule", ["export", "{scene}/corrupt.json"], ["not JSON"]),
    ("export-future-schedule", ["export", "{scene}/future.schedule.json"], ["version"]),
    ("export-batch-size-0", ["export", "{scene}/tiny.schedule.json", "--batch-size", "0"], ["--batch-size"]),
    ("model-input-size-0", ["model", "deit_tiny", "--input-size", "0"], ["input size must be positive"]),
    ("model-unknown", ["model", "deit_smal"], ["unknown model", "deit_small"]),
    ("bench-keep-rate-0", ["bench", "--model", "deit_tiny", "--keep-rate", "0"], ["--keep-rate"]),
    ("bench-keep-rate-above-1", ["bench", "--model", "deit_tiny", "--keep-rate", "1.5"], ["--keep-rate"]),
    ("bench-remove-negative", ["bench", "--model", "deit_tiny", "--remove", "-1"], ["--remove"]),
    ("bench-rounds-0", ["bench", "--model", "deit_tiny", "--rounds", "0"], ["--rounds"]),
    ("bench-methods-unknown", ["bench", "--model", "deit_tiny", "--methods", "magic"], ["magic"]),
    ("bench-batch-sizes-text", ["bench", "--model", "deit_tiny", "--batch-sizes", "a,b"], ["--batch-sizes"]),
    ("bench-input-sizes-zero", ["bench", "--model", "deit_tiny", "--input-sizes", "0"], ["--input-sizes"]),
    ("bench-nothing-to-measure", ["bench"], ["--model", "--schedule"]),
    ("record-passes-1", ["record", "--passes", "1"], ["--passes"]),
    ("record-reference-visits-0", ["record", "--reference-visits", "0"], ["--reference-visits"]),
]


def _filled(args: list[str], scene: Path, out: Path) -> list[str]:
    return [a.format(scene=scene, out=out, data=DATA) for a in args]


@pytest.mark.parametrize(("args", "fragments"), [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_a_bad_command_line_is_one_line_and_exit_2(scene, tmp_path, args, fragments):
    args = _filled(args, scene, tmp_path)
    if args[0] in ("offline", "record", "bench") and "--output-dir" not in args:
        args += ["--output-dir", str(tmp_path)]
    result = run_in_process(*args)
    assert_one_line_error(result, *fragments)
    assert not any(tmp_path.glob("*.schedule.json")) and not any(tmp_path.glob("*.onnx"))


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
    case("No such command", "measur", id="unknown-command"),
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
    case("--passes", "record", *WORKLOAD, "--passes", "1", "--output-dir", "{O}", id="record-passes-one"),
    case("--visit-s must be a finite number", "record", *WORKLOAD, "--visit-s", "inf", "--output-dir", "{O}",
         id="record-visit-s-inf"),
    case("--min-step must be a finite number", "record", *WORKLOAD, "--min-step", "inf", "--output-dir", "{O}",
         id="record-min-step-inf"),
    case("--reference-visits", "record", *WORKLOAD, "--reference-visits", "0", "--output-dir", "{O}",
         id="record-reference-visits-zero"),
    case("is a file", "record", *WORKLOAD, "--output-dir", "{F}/a_file.txt", id="record-output-dir-file"),
    case("cannot prune", "record", "--model", "resnet18", "--output-dir", "{O}", id="record-resnet"),
    case("logical CPUs", "record", *WORKLOAD, "--threads", TOO_MANY_THREADS, "--output-dir", "{O}",
         id="record-threads-beyond-cpus"),
    case("needs", "record", *WORKLOAD[:4], "--batch-size", "10000000000000", "--output-dir", "{O}",
         id="record-batch-beyond-memory"),
]


@pytest.mark.parametrize(("args", "fragment"), INFO + OFFLINE + RECORD)
def test_a_bad_option_is_one_line_and_exit_2(args, fragment, bad, tmp_path):
    result = run_in_process(*fill(args, bad, tmp_path / "out"))
    assert_one_line_error(result, fragment)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())  # nothing measured


def bench(fragment: str, *args: str, id: str):
    """`bench` of deit_tiny at 64 px, as quick as a benchmark goes."""
    return case(fragment, "bench", "--model", "deit_tiny", "--input-size", "64", *QUICK_BENCH, *args, id=id)


BENCH = [
    bench("unknown method 'tome2'", "--methods", "pomt,tome2", id="method-typo"),
    bench("--methods names no variant", "--methods", "", id="methods-empty"),
    bench("--methods names no variant", "--methods", ",,,", id="methods-commas"),
    bench("tome needs --r", "--methods", "tome", id="tome-without-r"),
    bench("remove at most 15", "--methods", "pomt", "--remove", "16", id="remove-all"),
    bench("--keep-rate must lie in (0, 1]", "--methods", "pomt", "--keep-rate", "0", id="keep-rate-zero"),
    bench("--keep-rate", "--methods", "pomt", "--keep-rate", "nan", id="keep-rate-nan"),
    bench("--remove and --keep-rate", "--methods", "pomt", "--remove", "3", "--keep-rate", "0.5",
          id="remove-and-keep-rate"),
    bench("--match flops needs a --schedule", "--match", "flops", id="match-flops-without-schedule"),
    bench("--match", "--match", "latncy", id="match-typo"),
    bench("--match-rounds", "--match-rounds", "1", id="match-rounds-one"),
    bench("--prune-block 12 is outside", "--methods", "pomt", "--remove", "3", "--prune-block", "12",
          id="prune-block-depth"),
    bench("comma-separated integers", "--batch-sizes", "1,x", id="batch-sizes-letter"),
    bench("positive integers", "--batch-sizes", "0", id="batch-sizes-zero"),
    bench("--batch-sizes is empty", "--batch-sizes", ",", id="batch-sizes-comma"),
    bench("not divisible", "--input-sizes", "64,65", id="input-sizes-65"),
    bench("positive integers", "--input-sizes", "-64", id="input-sizes-negative"),
    bench("--power-seconds must be a finite number", "--power-seconds", "inf", id="power-seconds-inf"),
    bench("--power-seconds", "--power-seconds", "-1", id="power-seconds-negative"),
    bench("--rounds", "--rounds", "0", id="rounds-zero"),
    bench("dataset folder not found", "--dataset-root", "{F}/nosuch", id="dataset-missing"),
    bench("1 class folders", "--dataset-root", "{F}/one_class", "--accuracy-samples", "2", id="dataset-one-class"),
    bench("is a file", "--output-dir", "{F}/a_file.txt", id="output-dir-file"),
    bench("--seed", "--seed", "4294967296", id="seed-33-bits"),
    bench("needs", "--batch-size", "99999999999999", id="batch-beyond-memory"),
    case("give --model or a --schedule", "bench", *QUICK_BENCH, id="no-model-no-schedule"),
    case("schedule file not found", "bench", "--schedule", "{F}/nosuch.json", id="schedule-missing"),
]

EXPORT = [
    case("unknown export format 'tflite'", "export", "{F}/good.json", "--format", "tflite", id="format-tflite"),
    case("must end in .onnx", "export", "{F}/good.json", "--output", "{O}/model.xml", id="output-suffix"),
    case("must end in .onnx", "export", "{F}/good.json", "--output", "", id="output-empty"),
    case("is not writable", "export", "{F}/good.json", "--output", "/proc/model.onnx", id="output-proc"),
    case("is a file, not a folder", "export", "{F}/good.json", "--output", "{F}/a_file.txt/m.onnx",
         id="output-under-file"),
    case("schedule file not found", "export", "{F}/nosuch.json", id="schedule-missing"),
    case("--batch-size", "export", "{F}/good.json", "--batch-size", "0", id="batch-zero"),
    case("--seed", "export", "{F}/good.json", "--seed", "-1", id="seed-negative"),
    case("--seed", "export", "{F}/good.json", "--seed", "4294967296", id="seed-33-bits"),
    case("not a schedule's JSON", "export", "{F}/deep.json", id="nested-100000-deep"),
    case("field 'curve' must be a file name", "export", "{F}/curve_number.json", id="curve-number"),
    case("ToMe merges at most half", "export", "{F}/tome_beyond_cap.json", id="tome-beyond-cap"),
    case("cannot read checkpoint", "export", "{F}/good.json", "--checkpoint", "{F}/garbage.pth",
         "--output", "{O}/m.onnx", id="checkpoint-garbage"),
    case("Missing argument", "export", id="no-schedule"),
]


@pytest.mark.parametrize(("args", "fragment"), BENCH + EXPORT)
def test_a_bad_bench_or_export_setting_is_one_line_and_exit_2(args, fragment, bad, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_refused_writing_nothing(args, fragment, bad, tmp_path)


def test_float16_on_the_cpu_benchmarks_with_one_warning_line(tmp_path):
    result = run_in_process("bench", "--model", "deit_tiny", "--input-size", "64", "--dtype", "float16",
                            "--methods", "pomt", "--remove", "4", *QUICK_BENCH, "--output-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    lines = warning_lines(result)
    assert len(lines) == 1 and lines[0].startswith("warning: float16 on the CPU"), lines


def test_float16_on_the_cpu_is_one_warning_line(scene, tmp_path):
    result = run_in_process("offline", "--dtype", "float16", "--device", "cpu", *TINY, "--prune-block", "12",
                            "--output-dir", str(tmp_path))
    warning, error = result.stderr.splitlines()
    assert warning.startswith("warning: float16 on the CPU") and error.startswith("error: --prune-block 12")


def test_the_catalogue_is_long_enough():
    assert len(CLI_CASES) >= 80
