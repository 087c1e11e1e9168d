"""Replaying every trace of the bank gives the schedule JSON and curve CSV recorded in `tests/data/golden`: a
refactoring must not change an answer, nor the order of its keys (timestamps aside, paths compared by file name).
A change meant to change answers rewrites the golden files and says in its commit what changed."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from pomt.cli import main

from conftest import DATA

GOLDEN = DATA / "golden"
TRACES = sorted(p.name.removesuffix(".schedule.json") for p in GOLDEN.glob("*.schedule.json"))


def comparable(schedule: dict) -> dict:
    """The schedule without its creation time, with the replayed trace's path reduced to its file name."""
    data = json.loads(json.dumps(schedule))
    data.pop("created", None)
    if "replayed_from" in data["device"]:
        data["device"]["replayed_from"] = Path(data["device"]["replayed_from"]).name
    if (data.get("measurement") or {}).get("replay"):
        data["measurement"]["replay"] = Path(data["measurement"]["replay"]).name
    return data


def test_the_bank_has_golden_replays():
    assert len(TRACES) == len(list(DATA.glob("*.json"))) >= 14


@pytest.mark.slow
@pytest.mark.parametrize("trace", TRACES)
def test_a_replay_gives_its_golden_answer(trace, tmp_path):
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
        main(["offline", "--replay", str(DATA / f"{trace}.csv"), "--output-dir", str(tmp_path), "--no-progress"])
        raise SystemExit(0)
    assert exit_.value.code in (0, None)
    written = next(tmp_path.glob("*.schedule.json"))
    expected = json.loads((GOLDEN / f"{trace}.schedule.json").read_text())
    assert comparable(json.loads(written.read_text())) == comparable(expected)
    assert json.dumps(comparable(json.loads(written.read_text()))) == json.dumps(comparable(expected))  # key order
    curve = next(tmp_path.glob("*.curve.csv"))
    assert curve.read_text() == (GOLDEN / f"{trace}.curve.csv").read_text()
