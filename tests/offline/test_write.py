"""The write stage: a decision assembled as its schedule (the removal, the policy's record, the prediction, the
device) and the records a schedule carries (how its curve was measured, what the patched model measured)."""

from __future__ import annotations

import json
from pathlib import Path

from pomt.accuracy import AccuracyCurve
from pomt.device import Fingerprint, fingerprint_hash
from pomt.formats.schedule import load_schedule
from pomt.measurement.drift import Drift
from pomt.measurement.search import SearchSettings
from pomt.offline.choose import Evidence, build_schedule, policy_setting, rank
from pomt.offline.config import OfflineConfig
from pomt.offline.measure import Latency
from pomt.offline.verify import Verdict
from pomt.offline.write import Findings, final_schedule, measurement_record, verified_record
from pomt.policies import Decision
from pomt.verification.verify import CandidateResult, Verification

from support.offline_data import DROP, GEOMETRY, LIVE, N, make_run, search_result

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


CONFIG, SETTINGS = OfflineConfig(), SearchSettings()
RANKING = rank(CONFIG, policy_setting(CONFIG, GEOMETRY, search_result(), None), search_result())
FRESH = ({"low": 150, "high": 151, "held": True, "paired_pct": 20.0},)
CHOSEN = CandidateResult(47, 8.123456, 1.2345678, (1.2, 1.27), 1e-5, True, 8.5)
HERE = Verification(10.0, (CHOSEN,), CHOSEN, "measured 1.235x", 10, 3, None)


def test_the_measurement_record_says_how_the_curve_was_measured():
    latency = Latency(search_result(), 12.0, Path("x.trace.csv"), FRESH)
    record = measurement_record(make_run(), CONFIG, SETTINGS, latency, RANKING.ranked[0])
    assert record.design.startswith("shuffled passes") and record.search == "adaptive"
    assert (record.passes, record.coarse_passes, record.align) == (SETTINGS.passes, SETTINGS.coarse_passes,
                                                                   SETTINGS.align)
    assert (record.reps, record.visits, record.full_grid_visits, record.budget_visits) == (3, 120, 232, 400)
    assert record.evaluation_ratio == round(120 / 232, 4) and record.noise_pct == 1.235 and record.confirmed == 1
    assert record.rejected == [{"low": 180, "high": 181, "reason": "none at 181 -> 180"}]
    assert record.screened_edges == [[175, 176]] and record.fresh_process_steps == list(FRESH)
    assert record.drift is None and record.warning is None
    assert record.replay is None and record.trace == "deit_small_patch16_224_cpu_bs4_is224.trace.csv"


def test_a_full_search_on_a_replay_records_no_coarse_passes_and_the_trace_it_read():
    drifting = search_result(drift=Drift(N, 1.3, (10.0, 13.0)))
    record = measurement_record(make_run(Path("t.csv")), OfflineConfig(search="full"), SETTINGS,
                                Latency(drifting, 1.0), RANKING.ranked[0])
    assert (record.coarse_passes, record.align, record.fresh_process_steps) == (None, None, None)
    assert record.replay == "t.csv" and record.trace is None
    assert record.drift["drift_pct"] == 30.0 and "drifted 30.0%" in record.warning


def test_the_verified_record_joins_both_processes_and_the_method_cost():
    assert verified_record(LIVE, Verdict(RANKING.ranked[0])) is None
    fresh = Verification(10.1, (CHOSEN,), CHOSEN, "fresh", 10, 3, None)
    verdict = Verdict(RANKING.ranked[0], HERE, fresh, {47: 0.123456, 46: -0.02})
    record = verified_record(LIVE, verdict)
    assert record.device_fingerprint_hash == fingerprint_hash(LIVE) == record.fresh_process.device_fingerprint_hash
    assert (record.speedup, record.speedup_ci, record.pruned_ms) == (1.2346, (1.2, 1.27), 8.1235)
    assert record.method_cost_ms == {"47": 0.1235, "46": -0.02} and record.fresh_process.reason == "fresh"
    here = fingerprint_hash(LIVE)
    assert record.to_dict() == {**HERE.record(here).to_dict(), "method_cost_ms": record.method_cost_ms,
                                "fresh_process": fresh.record(here).to_dict(), "gpu_work": None}
    alone = verified_record(LIVE, Verdict(RANKING.ranked[0], HERE))
    assert alone.method_cost_ms is None and alone.fresh_process is None


def test_the_final_schedule_reports_every_finding_and_loads_back():
    latency = Latency(search_result(), 1.0, Path("x.trace.csv"))
    findings = Findings(latency, None, RANKING, Verdict(RANKING.ranked[0], HERE))
    schedule = final_schedule(make_run(), CONFIG, SETTINGS, findings)
    assert schedule.removal == {3: 47} and schedule.measurement.visits == 120 and schedule.verified.speedup == 1.2346
    assert [s["tokens"] for s in schedule.steps] == [150]
    assert load_schedule(schedule.to_dict()).to_dict() == schedule.to_dict()
