"""The schedule's objects besides its pruning: policy, prediction, measurement and verification. Each reads and
writes its JSON object with the same keys in the same order; objects written by an older pomt may lack keys (None)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from pomt.errors import ScheduleError


def _json(part: Any) -> dict:
    """A flat part's JSON object: its fields in order."""
    return {f.name: getattr(part, f.name) for f in fields(part)}


def _read(cls: type, data: Mapping) -> Any:
    """A flat part from its JSON object, absent keys as None and unknown keys left out."""
    return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class SchedulePolicy:
    """The policy that chose the removal, with its settings and its reason (`pomt.policies`)."""

    name: str | None = None
    alpha: float | None = None
    max_remove: int | None = None
    min_gain: float | None = None
    latency_budget_ms: float | None = None
    min_accuracy: float | None = None
    prune_block: int | None = None
    reason: str | None = None
    reason_code: str | None = None

    def to_dict(self) -> dict:
        return _json(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> SchedulePolicy:
        return _read(cls, data)


@dataclass(frozen=True)
class Prediction:
    """Latency (and accuracy) the curve predicts for the unpruned and the pruned model."""

    baseline_ms: float | None = None
    pruned_ms: float | None = None
    gain: float | None = None
    accuracy: float | None = None
    accuracy_kind: str | None = None

    def to_dict(self) -> dict:
        return _json(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> Prediction:
        return _read(cls, data)


@dataclass(frozen=True)
class MeasurementRecord:
    """How the curve was measured and its steps judged; the nested lists and objects are free-form."""

    design: str | None = None
    search: str | None = None
    passes: int | None = None
    coarse_passes: int | None = None
    reps: int | None = None
    visits: int | None = None
    full_grid_visits: int | None = None
    evaluation_ratio: float | None = None
    budget_visits: int | None = None
    noise_pct: float | None = None
    drift: dict | None = None
    confirmed: int | None = None
    rejected: list[dict] | None = None
    fresh_process_steps: list[dict] | None = None
    align: int | None = None
    screened_edges: list[list[int]] | None = None
    detection_limit_pct: float | None = None  # the smallest step within reach the run would have found (80%)
    # that limit by region ({"reach", "limit_pct", "regions": [[lo, hi, pct]]}), the counts' scatter, the --detect
    # target and what stopped the power passes short of it (`pomt.measurement.windows.WindowScan.to_dict`)
    detection: dict | None = None
    warning: str | None = None  # the drift warning, when drift could explain an effect
    replay: str | None = None
    trace: str | None = None

    def to_dict(self) -> dict:
        return _json(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> MeasurementRecord:
        return _read(cls, data)


VERIFIED_NUMBERS = ("unpruned_ms", "pruned_ms", "speedup")


def _finite(value: Any) -> bool:
    """A JSON number that is one: not a boolean, not NaN, not infinite (Python's json reads NaN and Infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _whole(key: Any) -> bool:
    """A JSON object's key that spells a whole number (a token count)."""
    return isinstance(key, str) and key.strip().isdigit()


def _checked(data: Any, where: str) -> Mapping:
    """A verification object as the loader accepts it; every problem is one ScheduleError line."""
    if not isinstance(data, Mapping):
        raise ScheduleError(f"schedule field '{where}' must be an object, got {type(data).__name__}")
    for key in VERIFIED_NUMBERS:
        if not _finite(data.get(key)) or data[key] <= 0:
            raise ScheduleError(f"schedule field '{where}.{key}' must be a positive number, got {data.get(key)!r}")
    interval = data.get("speedup_ci")
    if not (isinstance(interval, list) and len(interval) == 2 and all(_finite(v) for v in interval)):
        raise ScheduleError(f"schedule field '{where}.speedup_ci' must be [low, high], got {interval!r}")
    costs = data.get("method_cost_ms")
    costs_ok = isinstance(costs, Mapping) and all(_whole(r) and _finite(c) for r, c in costs.items())
    if costs is not None and not costs_ok:
        raise ScheduleError(f"schedule field '{where}.method_cost_ms' must map tokens removed to milliseconds, "
                            f"got {costs!r}")
    if not isinstance(data.get("candidates"), list) or not isinstance(data.get("device_fingerprint_hash"), str):
        raise ScheduleError(f"schedule field '{where}' needs a 'candidates' list and a 'device_fingerprint_hash'")
    return data


@dataclass(frozen=True, kw_only=True)
class VerificationRecord:
    """One verification of the patched model against the unpruned one: the shipped candidate's figures and all."""

    unpruned_ms: float
    pruned_ms: float
    speedup: float
    speedup_ci: tuple[float, float]
    predicted_ms: float | None = None
    prediction_error: float | None = None
    candidates: tuple[dict, ...] = ()
    samples: int | None = None
    rounds: int | None = None
    reason: str | None = None
    drift: dict | None = None
    device_fingerprint_hash: str

    def to_dict(self) -> dict:
        values = {f.name: getattr(self, f.name) for f in fields(VerificationRecord)}
        return {**values, "speedup_ci": list(self.speedup_ci), "candidates": list(self.candidates)}

    @classmethod
    def from_dict(cls, data: Any, where: str = "verified") -> VerificationRecord:
        """Validated: positive figures, an interval, the candidates and the device's hash (ScheduleError)."""
        data = _checked(data, where)
        values = {f.name: data.get(f.name) for f in fields(VerificationRecord)}
        return cls(**{**values, "speedup_ci": tuple(data["speedup_ci"]), "candidates": tuple(data["candidates"])})


@dataclass(frozen=True, kw_only=True)
class Verified(VerificationRecord):
    """The schedule's `verified` object: both processes' verifications, the method's cost, the GPU work."""

    method_cost_ms: dict[str, float] | None = None
    fresh_process: VerificationRecord | None = None
    gpu_work: dict | None = None

    def to_dict(self) -> dict:
        fresh = None if self.fresh_process is None else self.fresh_process.to_dict()
        return {**super().to_dict(), "method_cost_ms": self.method_cost_ms, "fresh_process": fresh,
                "gpu_work": self.gpu_work}

    @classmethod
    def from_dict(cls, data: Any, where: str = "verified") -> Verified:
        here = VerificationRecord.from_dict(data, where)
        fresh = data.get("fresh_process")
        gpu_work = data.get("gpu_work")
        if gpu_work is not None and not isinstance(gpu_work, dict):
            raise ScheduleError(f"schedule field '{where}.gpu_work' must be an object, got {type(gpu_work).__name__}")
        return cls.of(here, data.get("method_cost_ms"),
                      None if fresh is None else VerificationRecord.from_dict(fresh, f"{where}.fresh_process"),
                      gpu_work)

    @classmethod
    def of(cls, here: VerificationRecord, method_cost_ms: dict[str, float] | None,
           fresh_process: VerificationRecord | None, gpu_work: dict | None = None) -> Verified:
        """The record of this process's verification with the method's cost, the fresh one's and the GPU work."""
        values = {f.name: getattr(here, f.name) for f in fields(VerificationRecord)}
        return cls(**values, method_cost_ms=method_cost_ms, fresh_process=fresh_process, gpu_work=gpu_work)
