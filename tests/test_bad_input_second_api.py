"""The second bad-input catalogue (issue 31), part three: the Python API. Each bad call raises the one
`pomt.errors` type for its problem (never a TypeError or AttributeError from deep inside), and leaves the model
as it was; what is legal but surprising warns once."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import timm
import torch

import pomt
from pomt.accuracy import load_accuracy_curve
from pomt.errors import (
    BatchSizeError,
    CurveError,
    InputSizeError,
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
from pomt.patching.api import patch_state

from bad_files_second import good_schedule, make_bad_files
from conftest import verified_record


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    return make_bad_files(tmp_path_factory.mktemp("bad"))


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
