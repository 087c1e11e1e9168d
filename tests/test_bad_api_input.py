"""Bad input through the Python API (issue 31): each bad call raises the one `pomt.errors` type for its
problem (never a TypeError or AttributeError from deep inside), in one line, and leaves the model as it was;
nonsense is refused before anything is measured; what is legal but surprising warns once."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import timm
import torch

import pomt
from pomt.accuracy import load_accuracy_curve
from pomt.bench.config import BenchConfig
from pomt.bench.run import run_benchmark
from pomt.errors import (
    BatchSizeError,
    CurveError,
    DatasetError,
    GridError,
    InputSizeError,
    OutputError,
    PatchError,
    ScheduleError,
    SettingError,
    TraceError,
    UnknownModelError,
    UnsupportedModelError,
    WeightsError,
)
from pomt.formats.curve import read_points
from pomt.formats.trace import read_trace
from pomt.measurement.search import SearchSettings
from pomt.offline import OfflineConfig, run_offline
from pomt.patching.api import patch_state
from pomt.workload.prepare import Workload

from conftest import DATA, ROOT, run_script, verified_record
from support.bad_files import good_schedule

SMALL_TRACE = DATA / "deit_small_bs4_amd_shuffled.csv"  # deit_small_patch16_224, batch 4, 224 px


@pytest.fixture(scope="module")
def tiny():
    """deit_tiny at 64 px (N = 17, 16 patch tokens), random weights."""
    return pomt.create_model("deit_tiny", 64)


def call(error: type[Exception], do, id: str):
    """`do(model, bad files' folder)` must raise `error`."""
    return pytest.param(error, do, id=id)


PATCH = [
    call(PatchError, lambda m, f: pomt.patch(m, "ToMe", {3: 2}), id="patch-method-capitalised"),
    call(PatchError, lambda m, f: pomt.patch(m, None, {3: 2}), id="patch-method-none"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", {3: -2}), id="patch-remove-negative"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", {12: 2}), id="patch-block-depth"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", {-1: 2}), id="patch-block-negative"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", {"3": 2}), id="patch-block-text"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", {3: 2.5}), id="patch-remove-float"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", {3: True}), id="patch-remove-true"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", {3: float("nan")}), id="patch-remove-nan"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", {3: 16}), id="patch-remove-all"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", {3: 10, 5: 6}), id="patch-remove-all-over-blocks"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", 10**6), id="patch-int-million"),
    call(PatchError, lambda m, f: pomt.patch(m, "tome", -1), id="patch-int-negative"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", [3, 2]), id="patch-list"),
    call(PatchError, lambda m, f: pomt.patch(m, "pomt", None), id="patch-none"),
    call(SettingError, lambda m, f: pomt.patch(m, "random", {3: 2}, seed="x"), id="patch-seed-text"),
    call(SettingError, lambda m, f: pomt.patch(m, "random", {3: 2}, seed=-1), id="patch-seed-negative"),
    call(SettingError, lambda m, f: pomt.patch(m, "random", {3: 2}, seed=2**64), id="patch-seed-64-bits"),
    call(BatchSizeError, lambda m, f: pomt.patch(m, "pomt", {3: 2}, batch_size=0), id="patch-batch-zero"),
    call(BatchSizeError, lambda m, f: pomt.patch(m, "pomt", {3: 2}, batch_size=1.5), id="patch-batch-float"),
    call(PatchError, lambda m, f: pomt.patch(timm.create_model("resnet18"), "pomt", {3: 2}), id="patch-resnet"),
    call(PatchError, lambda m, f: pomt.patch("deit_tiny", "pomt", {3: 2}), id="patch-a-name"),
    call(PatchError, lambda m, f: pomt.patch(torch.nn.Linear(2, 2), "pomt", {3: 2}), id="patch-linear"),
    call(PatchError, lambda m, f: pomt.unpatch("deit_tiny"), id="unpatch-a-name"),
    call(PatchError, lambda m, f: pomt.unpatch(None), id="unpatch-none"),
]

APPLY = [
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, None), id="apply-none"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, 5), id="apply-int"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, [good_schedule()]), id="apply-list-of-dict"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, json.dumps(good_schedule())), id="apply-json-text"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f), id="apply-folder"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "nosuch.json"), id="apply-missing"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "deep.json"), id="apply-nested-deep"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "long_number.json"), id="apply-5000-digits"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "not_utf8.json"), id="apply-not-utf8"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "model_null.json"), id="apply-model-null"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "version_true.json"), id="apply-version-true"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "nan_verified.json"), id="apply-verified-nan"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "tome_beyond_cap.json"), id="apply-tome-cap"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "curve_number.json"), id="apply-curve-number"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "input_other.json"), id="apply-input-size-other"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, f / "small_model.json", strict=True),
         id="apply-strict-other-model"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, good_schedule(num_tokens=197, kept_tokens=183)),
         id="apply-other-n"),
    call(ScheduleError, lambda m, f: pomt.apply_schedule(m, good_schedule(format=None)), id="apply-no-format"),
    call(BatchSizeError, lambda m, f: pomt.apply_schedule(m, f / "good.json", batch_size=0), id="apply-batch-zero"),
    call(UnsupportedModelError, lambda m, f: pomt.apply_schedule(timm.create_model("resnet18"), f / "good.json"),
         id="apply-resnet"),
    call(ScheduleError, lambda m, f: pomt.load_schedule(b"/tmp/schedule.json"), id="load-bytes"),
    call(ScheduleError, lambda m, f: pomt.load_schedule(f / "bom.json"), id="load-byte-order-mark"),
]

MODELS = [
    call(InputSizeError, lambda m, f: pomt.create_model("deit_tiny", 10**20), id="create-size-20-digits"),
    call(InputSizeError, lambda m, f: pomt.create_model("deit_tiny", 64.0), id="create-size-float"),
    call(InputSizeError, lambda m, f: pomt.create_model("deit_tiny", "64"), id="create-size-text"),
    call(InputSizeError, lambda m, f: pomt.create_model("deit_tiny", True), id="create-size-true"),
    call(InputSizeError, lambda m, f: pomt.create_model("deit_tiny", (64, 64, 64)), id="create-size-three"),
    call(InputSizeError, lambda m, f: pomt.create_model("deit_tiny", (64, 0)), id="create-width-zero"),
    call(InputSizeError, lambda m, f: pomt.create_model("deit_tiny", 72), id="create-size-72"),
    call(UnknownModelError, lambda m, f: pomt.create_model(None), id="create-name-none"),
    call(UnknownModelError, lambda m, f: pomt.create_model(5), id="create-name-int"),
    call(UnknownModelError, lambda m, f: pomt.create_model("deit_tiny.bogus_tag", 64), id="create-unknown-tag"),
    call(UnsupportedModelError, lambda m, f: pomt.create_model("convnext_tiny"), id="create-convnext"),
    call(WeightsError, lambda m, f: pomt.create_model("deit_tiny", 64, checkpoint=f), id="create-checkpoint-dir"),
    call(WeightsError, lambda m, f: pomt.create_model("deit_tiny", 64, checkpoint=f / "garbage.pth"),
         id="create-checkpoint-garbage"),
    call(UnknownModelError, lambda m, f: pomt.resolve_model_name(["deit_tiny"]), id="resolve-a-list"),
    call(PatchError, lambda m, f: pomt.model_geometry(torch.nn.Linear(2, 2)), id="geometry-linear"),
]

FILES = [
    call(TraceError, lambda m, f: read_trace(f / "huge_cell.csv"), id="trace-huge-cell"),
    call(TraceError, lambda m, f: read_trace(f / "sidecar_long_number.csv"), id="trace-sidecar-5000-digits"),
    call(TraceError, lambda m, f: read_trace(f / "sidecar_batch_true.csv"), id="trace-sidecar-batch-true"),
    call(CurveError, lambda m, f: read_points(f), id="curve-a-folder"),
    call(CurveError, lambda m, f: read_points(f / "not_utf8.json"), id="curve-binary"),
    call(CurveError, lambda m, f: load_accuracy_curve(f / "accuracy_one_count.csv"), id="accuracy-one-count"),
    call(CurveError, lambda m, f: load_accuracy_curve(f / "accuracy_count_twice.csv"), id="accuracy-count-twice"),
]


@pytest.mark.parametrize(("error", "do"), PATCH + APPLY + MODELS + FILES)
def test_bad_call_raises_its_pomt_error_and_leaves_the_model_alone(error, do, tiny, bad):
    classes = [type(block) for block in tiny.blocks]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # what a call warns before it raises is not the point here
            with pytest.raises(error) as raised:
                do(tiny, bad)
        assert type(raised.value) is error or error is PatchError  # UnsupportedModelError is a PatchError
        assert str(raised.value) and "\n" not in str(raised.value).strip()
        assert patch_state(tiny) is None and [type(block) for block in tiny.blocks] == classes
    finally:
        pomt.unpatch(tiny)  # a case that fails leaves the next one a model as it was


def _one_warning(do) -> str:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        do()
    assert len(seen) == 1, [str(w.message) for w in seen]
    return str(seen[0].message)


def test_a_schedule_verified_here_applied_to_a_bfloat16_model_warns_once_about_the_dtype(tiny):
    model = pomt.create_model("deit_tiny", 64).to(torch.bfloat16)
    schedule = good_schedule(verified=verified_record())
    message = _one_warning(lambda: pomt.apply_schedule(model, schedule))
    assert "measured in float32" in message and "bfloat16" in message
    assert patch_state(model) is not None


def test_a_schedule_verified_here_applied_for_another_batch_warns_once(tiny):
    message = _one_warning(lambda: pomt.apply_schedule(tiny, good_schedule(verified=verified_record()),
                                                        batch_size=8))
    assert "batch size 1, not 8" in message
    pomt.unpatch(tiny)


def test_a_patched_model_run_at_another_batch_warns_once_then_runs(tiny):
    pomt.patch(tiny, "pomt", {3: 4}, batch_size=1)
    try:
        message = _one_warning(lambda: [tiny(torch.randn(2, 3, 64, 64)) for _ in range(3)])
    finally:
        pomt.unpatch(tiny)
    assert "batch" in message


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
                                                            OfflineConfig(replay=SMALL_TRACE)), SettingError,
     "--batch-size"),
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


def test_a_schedule_of_another_model_of_the_same_geometry_warns(scene):
    with pytest.warns(UserWarning, match="made for deit_small_patch16_224, the model is deit_tiny_patch16_224"):
        pomt.apply_schedule(_deit_tiny(), scene / "small.schedule.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        warnings.simplefilter("ignore", pomt.UnverifiedScheduleWarning)  # before the line above: it is one too
        pomt.apply_schedule(_deit_tiny(), scene / "tiny.schedule.json")  # its own model: no word of it


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
