"""Schedule files and CSV readers for the benchmark's tests (deit_tiny: patch 16, 12 blocks)."""

from __future__ import annotations

import csv

from pomt.device import Fingerprint
from pomt.formats.schedule import BlockRemoval, Schedule, save_schedule
from pomt.formats.schedule_parts import Prediction

PATCH, DEPTH = 16, 12  # deit_tiny


def write_schedule(
    path,
    removal: dict[int, int],
    input_size: int = 224,
    num_tokens: int | None = None,
    batch: int = 1,
    predicted: dict | None = None,
):
    tokens = num_tokens or (input_size // PATCH) ** 2 + 1
    schedule = Schedule(
        model="deit_tiny_patch16_224",
        input_size=(input_size, input_size),
        batch_size=batch,
        num_tokens=tokens,
        prefix_tokens=1,
        depth=DEPTH,
        method="pomt",
        prune=tuple(BlockRemoval(b, r) for b, r in removal.items()),
        predicted=Prediction.from_dict(predicted or {"baseline_ms": 5.0, "pruned_ms": 4.0}),
        device=Fingerprint(kind="cpu"),
    )
    return save_schedule(schedule, path)


def schedule_file(path, method: str, removal: dict[int, int], size: int = 64):
    tokens = (size // 16) ** 2 + 1
    schedule = Schedule(model="deit_tiny_patch16_224", input_size=(size, size), batch_size=1, num_tokens=tokens,
                        prefix_tokens=1, depth=12, method=method,
                        prune=tuple(BlockRemoval(b, r) for b, r in removal.items()),
                        predicted=Prediction.from_dict({"baseline_ms": 5.0, "pruned_ms": 4.0}),
                        device=Fingerprint(kind="cpu"))
    return save_schedule(schedule, path)


def read_csv(path):
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return reader.fieldnames, list(reader)


def read_rows(path):
    with open(path, newline="") as handle:
        return {row["method"]: row for row in csv.DictReader(handle)}
