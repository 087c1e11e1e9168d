"""A schedule assembled from a decision: the removal, the policy's record, the prediction, the device."""

import json
from pathlib import Path

from pomt.accuracy import AccuracyCurve
from pomt.device import Fingerprint
from pomt.formats.schedule import load_schedule
from pomt.offline.assemble import Evidence, build_schedule
from pomt.offline.config import OfflineConfig
from pomt.policies import Decision

from offline_data import DROP, LIVE, N, make_run

STEP = Decision(remove=47, block=3, kept_tokens=150, baseline_ms=10.123456, predicted_ms=8.765432, gain=0.1341234567,
                accuracy=None, policy="step", reason="lands below the step", code="step")


def test_a_live_schedule_carries_the_decision_the_policy_and_the_device():
    schedule = build_schedule(make_run(), OfflineConfig(min_accuracy=0.5), STEP, Evidence(steps=(DROP,)))
    assert (schedule.model, schedule.batch_size, schedule.num_tokens, schedule.depth) == (
        "deit_small_patch16_224", 4, N, 12)
    assert schedule.removal == {3: 47} and schedule.kept_tokens == 150 and schedule.method == "pomt"
    assert schedule.policy.to_dict() == {
        "name": "step", "alpha": None, "max_remove": 49, "min_gain": 0.03, "latency_budget_ms": None,
        "min_accuracy": 0.5, "prune_block": 3, "reason": "lands below the step", "reason_code": "step"}
    assert schedule.predicted.to_dict() == {"baseline_ms": 10.1235, "pruned_ms": 8.7654, "gain": 0.13412,
                                            "accuracy": None, "accuracy_kind": None}
    assert schedule.steps == [json.loads(json.dumps(schedule.steps[0]))] and schedule.steps[0]["tokens"] == 150
    assert schedule.device is LIVE and schedule.curve == "deit_small_patch16_224_cpu_bs4_is224.curve.csv"
    assert schedule.dtype == "bfloat16" and schedule.backend == {"name": "eager", "version": "2.5"}
    assert schedule.measurement is None and schedule.verified is None
    assert load_schedule(schedule.to_dict()).to_dict() == schedule.to_dict()


def test_utility_with_accuracy_records_alpha_the_wider_limit_and_the_accuracy_kind():
    accuracy = AccuracyCurve({2: 0.4, N: 0.8}, "agreement", 50)
    decision = Decision(remove=60, block=3, kept_tokens=137, baseline_ms=10.0, predicted_ms=8.0, gain=0.2,
                        accuracy=0.7, policy="utility", reason="U(n) is highest", code="utility")
    schedule = build_schedule(make_run(), OfflineConfig(alpha=0.25), decision, Evidence(accuracy=accuracy))
    assert (schedule.policy.alpha, schedule.policy.max_remove) == (0.25, 195)
    assert (schedule.predicted.accuracy, schedule.predicted.accuracy_kind) == (0.7, "agreement")
    assert schedule.steps == []


def test_a_replayed_schedule_has_the_traces_dtype_and_no_backend():
    recorded = Fingerprint.from_dict({"kind": "cpu", "name": "x", "threads": 1, "torch": "2.5", "timm": None,
                                      "replayed_from": "t.csv"})
    nothing = Decision(remove=0, block=3, kept_tokens=N, baseline_ms=10.0, predicted_ms=10.0, gain=0.0,
                       accuracy=None, policy="step", reason="no step", code="no_step")
    schedule = build_schedule(make_run(Path("t.csv"), recorded), OfflineConfig(), nothing)
    assert schedule.prune == () and schedule.dtype == "float32" and schedule.backend is None
    assert schedule.curve == "deit_small_patch16_224_replay_bs4_is224.curve.csv"
    assert schedule.to_dict()["device"] == recorded.to_dict()
    half = Fingerprint.from_dict({**recorded.to_dict(), "backend": {"name": "onnxruntime"}, "dtype": "float16"})
    replayed = build_schedule(make_run(Path("t.csv"), half), OfflineConfig(), nothing)
    assert replayed.dtype == "float16" and replayed.backend is None
