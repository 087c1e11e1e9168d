"""Bad input never ends in a traceback (issue 31): a catalogue of bad inputs across the commands and the API,
every case of the issue included. A command answers with one line on stderr and exit code 2 (most run in this
process through `pomt.cli.main`; each script once in a subprocess), the API with one exception type; nonsense is
refused before anything is measured. The interrupt and kill tests are in test_interrupts.py."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import timm

import pomt
from pomt.bench.run import BenchConfig, run_benchmark
from pomt.errors import (
    DatasetError,
    GridError,
    OutputError,
    PatchError,
    ScheduleError,
    SettingError,
    UnsupportedModelError,
)
from pomt.measurement.search import SearchSettings
from pomt.offline import OfflineConfig, run_offline
from pomt.workload.prepare import Workload

from conftest import (
    DATA,
    ROOT,
    assert_one_line_error,
    run_in_process,
    run_script,
    run_script_in_process,
    schedule_dict,
)
from tiny_data import make_image_folder

TRACE = DATA / "deit_small_bs4_amd_shuffled.csv"  # deit_small_patch16_224, batch 4, 224 px
TINY = ("--model", "deit_tiny", "--input-size", "64", "--batch-size", "1", "--no-progress")  # N = 17, built fast


@pytest.fixture(scope="module")
def scene(tmp_path_factory) -> Path:
    """The files the cases point at: a file in the way, schedules good and bad, data folders, a foreign journal."""
    root = tmp_path_factory.mktemp("scene")
    (root / "file").write_text("not a folder\n")
    (root / "x.onnx").mkdir()
    (root / "empty").mkdir()
    (root / "latin1.json").write_bytes('{"model": "d\xe9it"}'.encode("latin-1"))
    (root / "latin1.csv").write_bytes("tokens,accuracy\n17,0.5 \xe9\n".encode("latin-1"))
    (root / "latin1_trace.csv").write_bytes("tokens,pass,rep,t_s,ms\n17,0,0,0.0,1.0 \xff\n".encode("latin-1"))
    (root / "latin1_trace.json").write_text((DATA / "deit_tiny_bs1_shuffled.json").read_text())
    (root / "corrupt.json").write_text("{ not json")
    (root / "resnet.schedule.json").write_text(json.dumps(schedule_dict("resnet18")))
    (root / "tiny.schedule.json").write_text(json.dumps(schedule_dict()))
    (root / "small.schedule.json").write_text(json.dumps(schedule_dict("deit_small_patch16_224")))
    (root / "future.schedule.json").write_text(json.dumps(schedule_dict(version=99)))
    make_image_folder(root / "one_class" / "only_class", per_class=4, labelled=False)  # one class folder
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
    ("model-eva", ["model", "eva02_tiny_patch14_224"], ["EvaBlock", "pomt supports"]),
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


SCRIPT_CASES = [
    ("benchmark-latin1-schedule", "benchmark.py", ["--schedule", "{scene}/latin1.json"], ["not UTF-8"]),
    ("benchmark-output-is-a-file", "benchmark.py", ["--model", "deit_tiny", "--output-dir", "{scene}/file"],
     ["is a file"]),
    ("offline-script-resnet18", "offline_computation.py", ["--model", "resnet18", "--no-progress"],
     ["resnet18", "pomt supports"]),
    ("offline-script-threads-0", "offline_computation.py", ["--threads", "0", "--no-progress"], ["--threads"]),
    ("frontier-benchmark-unknown-model", "benchmarks/frontier.py", ["--model", "nonesuch", "--smoke"],
     ["unknown model 'nonesuch'"]),
    ("frontier-benchmark-absent-device", "benchmarks/frontier.py", ["--device", "cuda:99", "--smoke"],
     ["cuda:99"]),
    ("frontier-benchmark-unreadable-also", "benchmarks/frontier.py", ["--also", "tome:0", "--smoke"],
     ["cannot read schedule 'tome:0'"]),
    ("frontier-benchmark-also-unpruned", "benchmarks/frontier.py", ["--also", "none", "--smoke"],
     ["--also takes pruned schedules"]),
    ("frontier-benchmark-cudagraph-on-cpu", "benchmarks/frontier.py", ["--backend", "cudagraph", "--smoke"],
     ["cudagraph backend runs on an NVIDIA GPU"]),
    ("serve-graph-without-a-gpu", "benchmarks/serve_graph.py", ["{scene}/tiny.schedule.json"],
     ["serves on an NVIDIA GPU"]),
    ("prediction-error-cudagraph-on-cpu", "benchmarks/prediction_error.py", ["--part", "multi", "--backend",
                                                                              "cudagraph"],
     ["cudagraph backend runs on an NVIDIA GPU"]),
    ("prediction-error-changes-on-cuda", "benchmarks/prediction_error.py", ["--part", "changes", "--device", "cuda"],
     ["--part changes measures the CPU only"]),
    ("prediction-error-unreadable-also", "benchmarks/prediction_error.py", ["--part", "multi", "--also", "tome:0"],
     ["cannot read schedule 'tome:0'"]),
    ("prediction-error-also-beyond-depth", "benchmarks/prediction_error.py",
     ["--part", "multi", "--workloads", "test_vit:1:64", "--also", "tome:40=2"], ["prune block 40", "0..5"]),
    ("prediction-error-also-outside-multi", "benchmarks/prediction_error.py", ["--part", "changes", "--also",
                                                                                "tome:0=2"],
     ["--also adds schedules to --part multi"]),
]
# One case of each script through a real interpreter (what a user's shell runs, import-time warnings
# included); the others in this process, as the same script runs there.
THROUGH_A_SUBPROCESS = [(c[1], c[2]) for c in SCRIPT_CASES
                        if c[0] in ("benchmark-latin1-schedule", "offline-script-resnet18",
                                    "frontier-benchmark-unknown-model")]


@pytest.mark.parametrize(("script", "args", "fragments"), [c[1:] for c in SCRIPT_CASES],
                         ids=[c[0] for c in SCRIPT_CASES])
def test_the_scripts_answer_bad_input_with_one_line(scene, tmp_path, script, args, fragments):
    run = run_script if (script, args) in THROUGH_A_SUBPROCESS else run_script_in_process
    assert_one_line_error(run(script, *_filled(args, scene, tmp_path)), *fragments)


def _resnet():
    return timm.create_model("resnet18")


def _deit_tiny(size: int = 224):
    return pomt.create_model("deit_tiny", input_size=size)


# (id, call(scene, out), exception type, message fragment)
API_CASES = [
    ("apply-to-resnet", lambda s, o: pomt.apply_schedule(_resnet(), s / "tiny.schedule.json"), UnsupportedModelError,
     "pomt supports"),
    ("apply-resnet-is-a-patch-error", lambda s, o: pomt.apply_schedule(_resnet(), s / "tiny.schedule.json"),
     PatchError, "ResNet"),
    ("create-resnet", lambda s, o: pomt.create_model("resnet18"), UnsupportedModelError, "resnet18"),
    ("apply-latin1", lambda s, o: pomt.apply_schedule(_deit_tiny(), s / "latin1.json"), ScheduleError, "UTF-8"),
    ("load-latin1", lambda s, o: pomt.load_schedule(s / "latin1.json"), ScheduleError, "UTF-8"),
    ("apply-other-model-strict", lambda s, o: pomt.apply_schedule(_deit_tiny(), s / "small.schedule.json",
                                                                  strict=True), ScheduleError, "deit_small"),
    ("apply-corrupt", lambda s, o: pomt.apply_schedule(_deit_tiny(), s / "corrupt.json"), ScheduleError, "not JSON"),
    ("apply-missing", lambda s, o: pomt.apply_schedule(_deit_tiny(), s / "nope.json"), ScheduleError, "not found"),
    ("apply-future", lambda s, o: pomt.apply_schedule(_deit_tiny(), s / "future.schedule.json"), ScheduleError,
     "version"),
    ("apply-other-geometry", lambda s, o: pomt.apply_schedule(_deit_tiny(64), s / "tiny.schedule.json"),
     ScheduleError, "does not match"),
    ("offline-threads-0", lambda s, o: run_offline(Workload(threads=0, output_dir=o)), SettingError, "--threads"),
    ("offline-output-is-a-file", lambda s, o: run_offline(Workload(output_dir=s / "file")), OutputError,
     "is a file"),
    ("offline-min-gain", lambda s, o: run_offline(Workload(output_dir=o), OfflineConfig(min_gain=-1)), SettingError,
     "--min-gain"),
    ("offline-candidate-k", lambda s, o: run_offline(Workload(output_dir=o), None, SearchSettings(candidate_k=-1)),
     GridError, "--candidate-k"),
    ("offline-replay-other-batch", lambda s, o: run_offline(Workload(batch_size=8, output_dir=o),
                                                            OfflineConfig(replay=TRACE)), SettingError, "--batch-size"),
    ("offline-foreign-classes", lambda s, o: run_offline(
        Workload(model="deit_tiny", input_size=64, batch_size=1, output_dir=o, progress=False),
        OfflineConfig(accuracy_only=True, dataset_root=s / "one_class", pretrained=False)), DatasetError,
     "class folders"),
    ("bench-threads", lambda s, o: run_benchmark(BenchConfig(model="deit_tiny", threads=-3)), SettingError,
     "--threads"),
    ("bench-keep-rate", lambda s, o: run_benchmark(BenchConfig(model="deit_tiny", keep_rate=0.0)), SettingError,
     "--keep-rate"),
]


@pytest.mark.parametrize(("call", "error", "fragment"), [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES])
def test_bad_input_through_the_api_raises_one_error_type(scene, tmp_path, call, error, fragment):
    with pytest.raises(error, match=fragment) as raised:
        call(scene, tmp_path)
    assert isinstance(raised.value, pomt.errors.PomtError) and "\n" not in str(raised.value)


def test_the_catalogue_is_long_enough():
    assert len(CLI_CASES) + len(SCRIPT_CASES) + len(API_CASES) >= 80


def test_a_schedule_of_another_model_of_the_same_geometry_warns(scene):
    with pytest.warns(UserWarning, match="made for deit_small_patch16_224, the model is deit_tiny_patch16_224"):
        pomt.apply_schedule(_deit_tiny(), scene / "small.schedule.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", pomt.UnverifiedScheduleWarning)  # before the line above: it is one too
        pomt.apply_schedule(_deit_tiny(), scene / "tiny.schedule.json")  # its own model: no word of it


def test_float16_on_the_cpu_is_one_warning_line(scene, tmp_path):
    result = run_in_process("offline", "--dtype", "float16", "--device", "cpu", *TINY, "--prune-block", "12",
                            "--output-dir", str(tmp_path))
    warning, error = result.stderr.splitlines()
    assert warning.startswith("warning: float16 on the CPU") and error.startswith("error: --prune-block 12")


APPLY_STRICTLY = """
import json, sys, warnings
import pomt
data = json.load(open(sys.argv[1]))
if not data["prune"]:  # nothing shipped: apply the first verified candidate, as measured on this machine
    data["prune"] = [{"block": data["policy"]["prune_block"], "remove": data["verified"]["candidates"][0]["remove"]}]
    data["kept_tokens"] = data["num_tokens"] - data["prune"][0]["remove"]
warnings.simplefilter("error")
pomt.steady_allocator()  # served under the allocator settings it was measured with, as the README says
model = pomt.create_model(data["model"], input_size=data["input_size"])
pomt.apply_schedule(model, data, strict=True, batch_size=data["batch_size"])
print("applied")
"""


@pytest.mark.slow
def test_a_schedule_verified_here_applies_in_a_new_process_without_a_warning(tmp_path):
    """The offline run hashes its fingerprint with the eager runtime; apply_schedule in another process, in
    PyTorch on the same machine, hashes the same (it raised a false alarm, and strict refused it). The run
    keeps torch's default threads, as the new process does, and the new process sets the steady allocator the
    run measured under (strict refuses other settings)."""
    flat = tmp_path / "flat_accuracy.csv"
    flat.write_text("tokens,accuracy\n" + "".join(f"{n},0.5\n" for n in range(2, 38)))
    run = run_script("offline_computation.py", "--model", "test_vit", "--input-size", "96", "--batch-size", "2",
                     "--no-progress", "--passes", "3", "--visit-s", "0.01", "--confirm-rounds", "3",
                     "--verify-rounds", "3", "--no-verify-fresh", "--accuracy-curve", str(flat), "--alpha", "1",
                     "--prune-block", "1", "--max-remove", "35", "--output-dir", str(tmp_path))
    assert run.returncode == 0, run.stderr
    schedule = tmp_path / "test_vit_cpu_bs2_is96.schedule.json"
    assert json.loads(schedule.read_text())["verified"]["device_fingerprint_hash"]
    result = subprocess.run([sys.executable, "-c", APPLY_STRICTLY, str(schedule)], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    assert (result.returncode, result.stdout, result.stderr) == (0, "applied\n", "")
