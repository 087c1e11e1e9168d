import json
import warnings

import pytest
import torch

from pomt.deploy.apply import apply_schedule
from pomt.errors import ScheduleError
from pomt.formats.schedule import BlockRemoval, Schedule, load_schedule, save_schedule
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.patching import unpatch

from conftest import verified_record


def _schedule(**overrides) -> Schedule:
    fields = dict(
        model="deit_small_patch16_224",
        input_size=(224, 224),
        batch_size=4,
        num_tokens=197,
        prefix_tokens=1,
        depth=12,
        method="pomt",
        prune=(BlockRemoval(3, 56),),
        policy={"name": "step", "alpha": None, "max_remove": 150, "min_gain": 0.03},
        predicted={"baseline_ms": 10.0, "pruned_ms": 8.0, "accuracy": None, "accuracy_kind": None},
        steps=[{"tokens": 141, "before_ms": 9.0, "after_ms": 8.0, "drop_pct": 11.1, "significance": 9.0}],
        device={"kind": "cpu", "name": "x", "threads": 2, "clocks_locked": False},
        curve="x.curve.csv",
    )
    fields.update(overrides)
    return Schedule(**fields)


def test_round_trip(tmp_path):
    schedule = _schedule()
    path = save_schedule(schedule, tmp_path / "s.schedule.json")
    data = json.loads(path.read_text())
    assert data["format"] == "pomt.schedule" and data["version"] == 1
    assert data["kept_tokens"] == 141
    assert data["prune"] == [{"block": 3, "remove": 56}]
    loaded = load_schedule(path)
    assert loaded.to_dict() == data
    assert loaded.removal == {3: 56}


def _mutated(**changes) -> dict:
    data = _schedule().to_dict()
    data.update(changes)
    return data


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "other"}, "not a pomt schedule"),
        ({"version": 2}, "newer pomt"),
        ({"version": "1"}, "unsupported"),
        ({"prune": [{"block": 12, "remove": 5}], "kept_tokens": 192}, "block 12"),
        ({"prune": [{"block": 3, "remove": 196}], "kept_tokens": 1}, "at least one patch token"),
        ({"prune": [{"block": 3, "remove": -1}]}, "remove"),
        ({"kept_tokens": 100}, "kept_tokens"),
        ({"batch_size": 0}, "batch_size"),
        ({"method": "magic"}, "method"),
        ({"input_size": [224]}, "input_size"),
        ({"device": "cpu"}, "device"),
    ],
)
def test_invalid_schedules_raise_one_clear_error(changes, message):
    with pytest.raises(ScheduleError, match=message):
        load_schedule(_mutated(**changes))


def test_missing_fields_and_corrupt_files(tmp_path):
    data = _schedule().to_dict()
    del data["steps"]
    with pytest.raises(ScheduleError, match="missing field.*steps"):
        load_schedule(data)
    corrupt = tmp_path / "bad.json"
    corrupt.write_text('{"format": "pomt.schedule", ')
    with pytest.raises(ScheduleError, match="corrupt schedule"):
        load_schedule(corrupt)
    with pytest.raises(ScheduleError, match="not found"):
        load_schedule(tmp_path / "missing.json")


def test_geometry_check():
    schedule = _schedule()
    schedule.check_geometry(model_geometry(create_model("deit_small", input_size=224)))
    with pytest.raises(ScheduleError, match="does not match"):
        schedule.check_geometry(model_geometry(create_model("dinov2_small", input_size=224)))


def test_backend_field_is_optional_and_round_trips(tmp_path):
    plain = _schedule()
    assert "backend" not in plain.to_dict() and load_schedule(plain.to_dict()).backend_name == "eager"
    backend = {"name": "openvino", "version": "2026.4.1", "torch": "2.14.1"}
    path = save_schedule(_schedule(backend=backend, dtype="bfloat16"), tmp_path / "s.schedule.json")
    loaded = load_schedule(path)
    assert loaded.backend == backend and loaded.backend_name == "openvino" and loaded.dtype == "bfloat16"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"backend": {"name": "tflite"}}, "backend.name"),
        ({"backend": {"version": "1"}}, "backend.name"),
        ({"backend": {"name": "compile", "version": 2}}, "backend.version"),
        ({"backend": "onnxruntime"}, "'backend' must be an object"),
        ({"dtype": "float8"}, "'dtype' must be one of float32, float16, bfloat16"),
    ],
)
def test_bad_backend_or_dtype_is_one_schedule_error(changes, message):
    with pytest.raises(ScheduleError, match=message):
        load_schedule(_mutated(**changes))


def test_apply_schedule_checks_the_parameter_dtype():
    model = create_model("deit_small").to(torch.bfloat16)
    schedule = _schedule(device={"kind": "cpu"}, verified=verified_record()).to_dict()
    with pytest.raises(ScheduleError, match="measured in float32, the model's parameters are bfloat16"):
        apply_schedule(model, schedule, strict=True)
    with pytest.warns(UserWarning, match="measured in float32"):
        apply_schedule(model, schedule)
    unpatch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_schedule(model, _schedule(device={"kind": "cpu"}, dtype="bfloat16", verified=verified_record()).to_dict())
    unpatch(model)
