"""Replaying every trace of the bank gives the schedule JSON and curve CSV recorded in `tests/data/golden`: a
refactoring must not change an answer, nor the order of its keys. Timestamps aside, and paths compared by file
name. Written by 6e122db before the layout change; rewritten when the level-shift windows (issue 29) added the
detection limit and spent visits on two traces, and when the windows stopped fitting a slope of their own
(lower limits, one more step on two traces), and when power passes came before the candidates within a
narrow reach and the windows grew to 20 counts (2026-11-27: lower limits on 13 of 16 traces, steps outside the
policy's reach found less often), and when the detection object gained the counts' scatter, and when the
policies priced from the curve shrunk toward its trend (2026-11-29: predicted latencies only), every choice unchanged,
and when the replay moved each visit to its clock (steps on 11 traces, one choice: tests/data/README.md), and when
a window's shift needed its pinned pair to reach the minimum step (a 2.5% step fewer on one trace), and when a
count's later visits on the CPU, eager, took no untimed forward (2026-11-30: every CPU trace's numbers, one choice,
a false 37-token prune gone: tests/data/README.md), and when the detection object gained what stopped the power
passes and the scatter shown to be more than chance (2026-11-30: those keys alone), and when the power passes no
longer stopped on a pass that barely lowered the limit (2026-11-30: `stopped` on three traces, "no gain" -> "budget",
the same visits), and when the detection object gained its target and a `no_step` reason the target missed
(2026-11-30: those alone), and when that reason said the visits the target would take as a floor (the same day,
its wording alone), and when the windows took in the counts below the reach (2026-11-30: limits and regions, one
choice: tests/data/README.md), and when a paired step had to clear the minimum step by a standard error (2026-11-30:
steps on three traces, no choice: tests/data/README.md)."""

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
def test_a_replay_gives_the_answer_it_gave_before_the_layout_change(trace, tmp_path):
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
