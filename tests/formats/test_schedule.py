import json
import warnings

import pytest
import torch

from pomt.deploy.apply import apply_schedule
from pomt.device import Fingerprint
from pomt.errors import ScheduleError
from pomt.formats.schedule import BlockRemoval, Schedule, load_schedule, save_schedule
from pomt.formats.schedule_parts import MeasurementRecord, Prediction, SchedulePolicy, VerificationRecord, Verified
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.patching import unpatch

from conftest import DATA, verified_record

GOLDEN = sorted((DATA / "golden").glob("*.schedule.json"))


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
        policy=SchedulePolicy(name="step", alpha=None, max_remove=150, min_gain=0.03),
        predicted=Prediction(baseline_ms=10.0, pruned_ms=8.0, accuracy=None, accuracy_kind=None),
        steps=[{"tokens": 141, "before_ms": 9.0, "after_ms": 8.0, "drop_pct": 11.1, "significance": 9.0}],
        device=Fingerprint.from_dict({"kind": "cpu", "name": "x", "threads": 2, "clocks_locked": False}),
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
    schedule = _schedule(device=Fingerprint(kind="cpu"), verified=Verified.from_dict(verified_record())).to_dict()
    with pytest.raises(ScheduleError, match="measured in float32, the model's parameters are bfloat16"):
        apply_schedule(model, schedule, strict=True)
    with pytest.warns(UserWarning, match="measured in float32"):
        apply_schedule(model, schedule)
    unpatch(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        apply_schedule(model, _schedule(device=Fingerprint(kind="cpu"), dtype="bfloat16",
                                        verified=Verified.from_dict(verified_record())).to_dict())
    unpatch(model)


@pytest.mark.parametrize("path", GOLDEN, ids=lambda p: p.name.removesuffix(".schedule.json"))
def test_every_golden_schedule_loads_and_is_written_back_as_it_was(path):
    """Schedules the offline computation wrote before its parts were typed: same keys, order and values."""
    text = path.read_text()
    loaded = load_schedule(path)
    assert json.dumps(loaded.to_dict()) == json.dumps(json.loads(text))
    data = json.loads(text)
    assert loaded.policy.name == data["policy"]["name"] and loaded.policy.reason_code == data["policy"]["reason_code"]
    assert loaded.predicted.pruned_ms == data["predicted"]["pruned_ms"]
    assert loaded.measurement.visits == data["measurement"]["visits"]
    assert loaded.measurement.warning == data["measurement"]["warning"]
    assert loaded.device.replayed_from == data["device"]["replayed_from"] and loaded.verified is None


def test_a_schedule_of_an_older_pomt_loads():
    """Version 1 as first written: no dtype, backend, measurement or verified, a shorter policy and
    prediction; what it lacks reads as None (float32, eager)."""
    data = json.loads(GOLDEN[0].read_text())
    for key in ("dtype", "backend", "measurement", "verified"):
        data.pop(key, None)
    data["policy"] = {"name": "step", "alpha": None, "max_remove": 150, "min_gain": 0.03}
    data["predicted"] = {"baseline_ms": 10.0, "pruned_ms": 8.0, "accuracy": None, "accuracy_kind": None}
    data["device"] = {"kind": "cpu", "name": "x", "threads": 2, "clocks_locked": False, "torch": "2.1", "timm": "1.0"}
    loaded = load_schedule(data)
    assert (loaded.dtype, loaded.backend_name, loaded.measurement, loaded.verified) == ("float32", "eager", None, None)
    assert loaded.policy.max_remove == 150 and loaded.policy.reason is None and loaded.predicted.gain is None
    assert loaded.device.to_dict() == data["device"] and loaded.device.threads == 2
    written = loaded.to_dict()
    assert "measurement" not in written and "verified" not in written and "backend" not in written
    assert written["policy"] == {**SchedulePolicy().to_dict(), **data["policy"]}


def test_the_typed_parts_round_trip_with_their_keys_in_order():
    policy = {"name": "utility", "alpha": 0.5, "max_remove": 195, "min_gain": 0.03, "latency_budget_ms": None,
              "min_accuracy": 0.7, "prune_block": 3, "reason": "r", "reason_code": "verified"}
    predicted = {"baseline_ms": 10.0, "pruned_ms": 8.0, "gain": 0.2, "accuracy": 0.8, "accuracy_kind": "top1"}
    measurement = json.loads(GOLDEN[0].read_text())["measurement"]
    fresh = {"unpruned_ms": 10.0, "pruned_ms": 8.0, "speedup": 1.25, "speedup_ci": [1.2, 1.3], "predicted_ms": 8.1,
             "prediction_error": -0.012, "candidates": [{"remove": 56, "pruned_ms": 8.0, "speedup": 1.25}],
             "samples": 30, "rounds": 10, "reason": "measured", "drift": {"reference_tokens": 197},
             "device_fingerprint_hash": "abc"}  # in the order `Verification.record` writes
    gpu_work = {"unpruned_ms": 6.38, "pruned_ms": 3.31, "unpruned_kernels": 167.0, "pruned_kernels": 217.0,
                "wall_ms": 4.96, "busy": 0.667, "gpu_speedup": 1.9275, "launch_bound": True}
    verified = {**fresh, "method_cost_ms": {"56": 0.1234}, "fresh_process": fresh, "gpu_work": gpu_work}
    for part, data in ((SchedulePolicy, policy), (Prediction, predicted), (MeasurementRecord, measurement),
                       (VerificationRecord, fresh), (Verified, verified)):
        assert json.dumps(part.from_dict(data).to_dict()) == json.dumps(data), part.__name__
    loaded = Verified.from_dict(verified)
    assert loaded.speedup_ci == (1.2, 1.3) and loaded.candidates[0]["remove"] == 56
    assert loaded.fresh_process.device_fingerprint_hash == "abc" and loaded.fresh_process.reason == "measured"
    assert loaded.gpu_work == gpu_work
    assert list(Verified.from_dict(verified_record()).to_dict())[-3:] == ["method_cost_ms", "fresh_process", "gpu_work"]


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"speedup": 0}, "'verified.speedup' must be a positive number"),
        ({"pruned_ms": True}, "'verified.pruned_ms' must be a positive number"),
        ({"speedup_ci": [1.2]}, "'verified.speedup_ci' must be"),
        ({"candidates": None}, "needs a 'candidates' list"),
        ({"device_fingerprint_hash": 3}, "needs a 'candidates' list and a 'device_fingerprint_hash'"),
        ({"fresh_process": {"speedup": 1.0}}, "'verified.fresh_process.unpruned_ms' must be a positive number"),
        ({"fresh_process": "yes"}, "'verified.fresh_process' must be an object"),
        ({"gpu_work": [1.0]}, "'verified.gpu_work' must be an object, got list"),
    ],
)
def test_a_bad_verified_object_is_one_schedule_error(changes, message):
    with pytest.raises(ScheduleError, match=message):
        load_schedule(_mutated(verified={**verified_record(), **changes}))
    with pytest.raises(ScheduleError, match="'verified' must be an object"):
        load_schedule(_mutated(verified=[1]))
