"""The versioned schedule JSON: one loader that validates, one writer that writes atomically."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pomt.checks import check_method, check_prune_block, check_removals
from pomt.device.fingerprint import Fingerprint
from pomt.errors import PatchError, ScheduleError
from pomt.formats.schedule_parts import MeasurementRecord, Prediction, SchedulePolicy, Verified
from pomt.io import atomic_write_json
from pomt.models.geometry import Geometry
from pomt.runtimes import BACKENDS, DTYPES
from pomt.runtimes.backend import first_line

FORMAT = "pomt.schedule"
VERSION = 1
REQUIRED = (
    "format", "version", "model", "input_size", "batch_size", "num_tokens", "prefix_tokens", "depth",
    "method", "prune", "kept_tokens", "policy", "predicted", "steps", "device", "curve", "created",
)


@dataclass(frozen=True)
class BlockRemoval:
    """Remove `remove` tokens at block `block` (0-based)."""

    block: int
    remove: int


@dataclass(frozen=True)
class Schedule:
    """A validated pruning schedule (format version 1)."""

    model: str
    input_size: tuple[int, int]
    batch_size: int
    num_tokens: int
    prefix_tokens: int
    depth: int
    method: str
    prune: tuple[BlockRemoval, ...]
    policy: SchedulePolicy = field(default_factory=SchedulePolicy)
    predicted: Prediction = field(default_factory=Prediction)
    steps: list = field(default_factory=list)
    device: Fingerprint = field(default_factory=Fingerprint)
    curve: str | None = None
    created: str = ""
    dtype: str = "float32"
    backend: dict | None = None
    measurement: MeasurementRecord | None = None  # how the curve was measured: passes, visits, drift, steps judged
    verified: Verified | None = None  # the patched model measured against the unpruned one (pomt.verification.verify)
    frontier: dict | None = None  # the frontier search that chose it: its file, accuracies, the uniform it beat

    @property
    def backend_name(self) -> str:
        """The runtime the curve was measured on; schedules without a `backend` object are eager."""
        return (self.backend or {}).get("name", "eager")

    @property
    def kept_tokens(self) -> int:
        return self.num_tokens - sum(item.remove for item in self.prune)

    @property
    def removal(self) -> dict[int, int]:
        """{block: tokens removed there}, the form `pomt.patching` takes."""
        return {item.block: item.remove for item in self.prune if item.remove > 0}

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "model": self.model, "input_size": list(self.input_size),
            "batch_size": self.batch_size, "dtype": self.dtype, "num_tokens": self.num_tokens,
            "prefix_tokens": self.prefix_tokens, "depth": self.depth, "method": self.method,
            "prune": [asdict(item) for item in self.prune], "kept_tokens": self.kept_tokens,
            "policy": self.policy.to_dict(), "predicted": self.predicted.to_dict(), "steps": self.steps,
            "device": self.device.to_dict(), "curve": self.curve, "created": self.created or utc_now(),
            **({"backend": self.backend} if self.backend is not None else {}),
            **({"measurement": self.measurement.to_dict()} if self.measurement is not None else {}),
            **({"verified": self.verified.to_dict()} if self.verified is not None else {}),
            **({"frontier": self.frontier} if self.frontier is not None else {}),
        }

    def check_geometry(self, geometry: Geometry) -> None:
        """Raise ScheduleError when the model's N, prefix, depth or input size differ from the schedule's."""
        ours = (self.num_tokens, self.prefix_tokens, self.depth)
        theirs = (geometry.num_tokens, geometry.prefix_tokens, geometry.depth)
        if ours != theirs:
            raise ScheduleError(
                f"schedule for {self.model} (N={ours[0]}, prefix={ours[1]}, depth={ours[2]}) does not match "
                f"{geometry.model} (N={theirs[0]}, prefix={theirs[1]}, depth={theirs[2]})"
            )
        if tuple(self.input_size) != tuple(geometry.input_size):
            size = "x".join(map(str, self.input_size))
            raise ScheduleError(f"schedule for {self.model} is for {size} px inputs, {geometry.model} takes "
                                f"{'x'.join(map(str, geometry.input_size))} px (N={geometry.num_tokens} alike)")


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int(data: Mapping, key: str, minimum: int = 0) -> int:
    value = data.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ScheduleError(f"schedule field '{key}' must be an integer >= {minimum}, got {value!r}")
    return value


def _mapping(data: Mapping, key: str) -> dict:
    value = data.get(key)
    if not isinstance(value, dict):
        raise ScheduleError(f"schedule field '{key}' must be an object, got {type(value).__name__}")
    return value


def _shared(check, *args):
    """One of `pomt.checks` on a schedule's field: a schedule's every problem is a ScheduleError."""
    try:
        return check(*args)
    except PatchError as exc:
        raise ScheduleError(f"schedule: {exc}") from None


def schedule_from_dict(data: Mapping) -> Schedule:
    """Validate a decoded schedule and build it; every problem is one ScheduleError line."""
    if not isinstance(data, Mapping) or data.get("format") != FORMAT:
        raise ScheduleError(f"not a pomt schedule (field 'format' must be '{FORMAT}')")
    version = data.get("version")
    if isinstance(version, bool) or version != VERSION:
        newer = isinstance(version, int) and version > VERSION
        why = "written by a newer pomt; upgrade pomt" if newer else "unsupported"
        raise ScheduleError(f"schedule version {version!r} is {why} (this pomt reads version {VERSION})")
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise ScheduleError(f"schedule is missing field(s): {', '.join(missing)}")
    if not isinstance(data["model"], str) or not data["model"].strip():
        raise ScheduleError(f"schedule field 'model' must be a timm model name, got {data['model']!r}")
    curve = data["curve"]
    if curve is not None and (not isinstance(curve, str) or (curve and Path(curve).name in ("", ".", ".."))):
        raise ScheduleError(f"schedule field 'curve' must be a file name or null, got {data['curve']!r}")
    num_tokens, prefix = _int(data, "num_tokens", 2), _int(data, "prefix_tokens", 0)
    depth = _int(data, "depth", 1)
    if prefix >= num_tokens:
        raise ScheduleError(f"schedule has prefix_tokens {prefix} >= num_tokens {num_tokens}")
    size = data["input_size"]
    if isinstance(size, int):
        size = [size, size]
    if not (isinstance(size, list) and len(size) == 2 and
            all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in size)):
        raise ScheduleError(f"schedule field 'input_size' must be [height, width], got {size!r}")
    _shared(check_method, data["method"])
    if not isinstance(data["prune"], list):
        raise ScheduleError("schedule field 'prune' must be a list of {block, remove}")
    prune = []
    for item in data["prune"]:
        if not isinstance(item, Mapping):
            raise ScheduleError("schedule field 'prune' must be a list of {block, remove}")
        block = _shared(check_prune_block, _int(item, "block"), depth, "block")
        prune.append(BlockRemoval(block, _int(item, "remove")))
    blocks = [item.block for item in prune]
    if blocks != sorted(set(blocks)):
        raise ScheduleError("schedule 'prune' blocks must be strictly increasing")
    _shared(check_removals, data["method"], {item.block: item.remove for item in prune}, num_tokens, prefix, depth)
    removed = sum(item.remove for item in prune)
    kept = _int(data, "kept_tokens", 1)
    if kept != num_tokens - removed:
        raise ScheduleError(f"schedule kept_tokens {kept} != num_tokens {num_tokens} - removed {removed}")
    policy, predicted, device = (_mapping(data, key) for key in ("policy", "predicted", "device"))
    if not isinstance(data["steps"], list):
        raise ScheduleError("schedule field 'steps' must be a list")
    return Schedule(
        model=str(data["model"]), input_size=(size[0], size[1]), batch_size=_int(data, "batch_size", 1),
        num_tokens=num_tokens, prefix_tokens=prefix, depth=depth, method=data["method"], prune=tuple(prune),
        policy=SchedulePolicy.from_dict(policy), predicted=Prediction.from_dict(predicted), steps=list(data["steps"]),
        device=Fingerprint.from_dict(device), curve=data["curve"], created=str(data["created"]), dtype=_dtype(data),
        backend=_backend(data), measurement=_measurement(data),
        verified=None if data.get("verified") is None else Verified.from_dict(data["verified"]),
        frontier=None if data.get("frontier") is None else _mapping(data, "frontier"),
    )


def _dtype(data: Mapping) -> str:
    value = data.get("dtype", "float32")
    if value not in DTYPES:
        raise ScheduleError(f"schedule field 'dtype' must be one of {', '.join(DTYPES)}, got {value!r}")
    return value


def _backend(data: Mapping) -> dict | None:
    """The optional `backend` object ({"name", "version", ...}); absent means eager."""
    if "backend" not in data or data["backend"] is None:
        return None
    value = _mapping(data, "backend")
    if value.get("name") not in BACKENDS:
        raise ScheduleError(f"schedule field 'backend.name' must be one of {', '.join(BACKENDS)}, got "
                            f"{value.get('name')!r}")
    version = value.get("version")
    if version is not None and not isinstance(version, str):
        raise ScheduleError(f"schedule field 'backend.version' must be a string, got {version!r}")
    return dict(value)


def _measurement(data: Mapping) -> MeasurementRecord | None:
    """The optional `measurement` object (absent in schedules of an older pomt)."""
    return None if data.get("measurement") is None else MeasurementRecord.from_dict(_mapping(data, "measurement"))


def load_schedule(source: str | Path | Mapping | Schedule) -> Schedule:
    """Read and validate a schedule from a path, a decoded dict, or pass a Schedule through."""
    if isinstance(source, Schedule):
        return source
    if isinstance(source, Mapping):
        return schedule_from_dict(source)
    if not isinstance(source, (str, os.PathLike)):
        raise ScheduleError(f"a schedule is a file path, a decoded dict or a Schedule, not {type(source).__name__}")
    path = Path(source)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScheduleError(f"schedule file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise ScheduleError(f"corrupt schedule {path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ScheduleError(f"cannot read schedule {path}: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ScheduleError(f"corrupt schedule {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:  # a number of thousands of digits, arrays nested thousands deep
        raise ScheduleError(f"corrupt schedule {path}: not a schedule's JSON ({first_line(exc)})") from None
    return schedule_from_dict(data)


def save_schedule(schedule: Schedule, path: str | Path) -> Path:
    """Write the schedule JSON atomically."""
    return atomic_write_json(path, schedule.to_dict())
