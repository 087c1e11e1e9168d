"""Trace files: reading with validation, durable appends, resuming after a kill, injected steps."""

import json

import pytest

from pomt.errors import TraceError
from pomt.formats.trace import (
    COLUMNS,
    TraceWriter,
    Visit,
    check_trace_geometry,
    group_visits,
    inject_steps,
    read_trace,
    sidecar_path,
)

from conftest import DATA
from support.trace_data import linear_levels, synthetic_trace

META = {"model": "deit_tiny_patch16_224", "batch_size": 1, "input_size": [224, 224], "num_tokens": 197,
        "prefix_tokens": 1}
SETTINGS = {"passes": 2, "seed": 0}


def write(tmp_path, visits, name="t.csv", settings=SETTINGS):
    writer = TraceWriter(tmp_path / name, META, settings)
    stored = [writer.add(v) for v in visits]
    return writer, stored


@pytest.mark.parametrize(("name", "passes", "reps"), [
    ("deit_tiny_bs1_shuffled", 6, 3), ("deit_small_bs1_shuffled", 5, 2), ("deit_small_bs4_sequential", 2, 1),
])
def test_the_shared_traces_load_as_visits(name, passes, reps):
    trace = read_trace(DATA / f"{name}.csv")
    assert {v.pass_index for v in trace.visits} == set(range(passes))
    assert {len(v.samples_ms) for v in trace.visits} == {reps}
    assert trace.num_tokens == 197 and trace.prefix_tokens == 1
    assert trace.samples() == len((DATA / f"{name}.csv").read_text().splitlines()) - 1


def test_written_visits_read_back_exactly(tmp_path):
    visits = list(synthetic_trace(linear_levels(), counts=[2, 50, 197], passes=2).visits)
    writer, stored = write(tmp_path, visits)
    trace = read_trace(writer.path)
    assert list(trace.visits) == stored  # what a run keeps in memory is what its file holds
    assert [v.tokens for v in trace.visits] == [v.tokens for v in visits]
    for original, back in zip(visits, trace.visits, strict=True):
        assert back.samples_ms == pytest.approx(original.samples_ms, abs=1e-4)
    meta = json.loads(sidecar_path(writer.path).read_text())
    assert meta["settings"] == SETTINGS and meta["model"] == META["model"]
    assert writer.path.read_text().splitlines()[0] == ",".join(COLUMNS)


def test_resume_continues_after_a_kill_mid_line(tmp_path):
    visits = list(synthetic_trace(linear_levels(), counts=[2, 50, 197], passes=3).visits)
    writer, _ = write(tmp_path, visits[:4])
    with writer.path.open("a") as handle:
        handle.write("50,1,0,12.3")  # killed while writing a row
    resumed = TraceWriter(writer.path, META, SETTINGS, resume=True)
    assert len(resumed.visits) == 4
    for visit in visits[4:]:
        resumed.add(visit)
    assert len(read_trace(writer.path).visits) == len(visits)
    assert "12.3\n" not in writer.path.read_text()


def test_a_run_without_resume_replaces_an_old_trace(tmp_path):
    """A second run over the same output starts its trace afresh (one header, only its own visits)."""
    old = list(synthetic_trace(linear_levels(), counts=[2, 50, 197], passes=2).visits)
    write(tmp_path, old)
    new = list(synthetic_trace(linear_levels(), counts=[2, 197], passes=1).visits)
    writer, stored = write(tmp_path, new)
    assert writer.path.read_text().count(",".join(COLUMNS)) == 1
    assert list(read_trace(writer.path).visits) == stored


def test_resume_refuses_other_settings_and_foreign_files(tmp_path):
    writer, _ = write(tmp_path, synthetic_trace(linear_levels(), counts=[2, 197], passes=1).visits)
    with pytest.raises(TraceError, match=r"passes=2 \(now 3\)"):
        TraceWriter(writer.path, META, {**SETTINGS, "passes": 3}, resume=True)
    foreign = tmp_path / "other.csv"
    foreign.write_text("tokens,pass,rep,t_s,ms\n2,0,0,0.0,1.0\n")
    sidecar_path(foreign).write_text(json.dumps(META))
    with pytest.raises(TraceError, match="not a resumable"):
        TraceWriter(foreign, META, SETTINGS, resume=True)


def test_truncate_forgets_the_visits_after(tmp_path):
    visits = list(synthetic_trace(linear_levels(), counts=[2, 50, 197], passes=2).visits)
    writer, _ = write(tmp_path, visits)
    writer.truncate(2)
    assert len(writer.visits) == 2
    assert len(read_trace(writer.path).visits) == 2
    writer.add(visits[5])
    assert read_trace(writer.path).visits[-1].tokens == visits[5].tokens


def test_a_new_visit_starts_at_rep_zero_or_a_new_count():
    rows = [(5, 0, 0, 0.0, 1.0), (5, 0, 1, 0.1, 1.1), (5, 0, 0, 0.2, 1.2), (6, 0, 1, 0.3, 1.3)]
    assert [(v.tokens, v.samples_ms) for v in group_visits(rows)] == [(5, (1.0, 1.1)), (5, (1.2,)), (6, (1.3,))]


@pytest.mark.parametrize(("body", "fragment"), [
    ("tokens,ms\n5,1.0\n", "header"),
    ("tokens,pass,rep,t_s,ms\n5,0,0,0.0,fast\n", "not a number"),
    ("tokens,pass,rep,t_s,ms\n5,0,0,0.0,-1\n", "ms > 0"),
    ("tokens,pass,rep,t_s,ms\n5,0,0,0.0\n", "expected 5 values"),
    ("tokens,pass,rep,t_s,ms\n300,0,0,0.0,1.0\n", "outside [2, 197]"),
    ("tokens,pass,rep,t_s,ms\n", "no measurements"),
])
def test_malformed_traces_are_one_trace_error(tmp_path, body, fragment):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    sidecar_path(path).write_text(json.dumps(META))
    with pytest.raises(TraceError, match=fragment.replace("[", r"\[")):
        read_trace(path)


@pytest.mark.parametrize(("sidecar", "fragment"), [
    (None, "sidecar not found"),
    ("{not json", "corrupt trace sidecar"),
    (json.dumps({"model": "x"}), "lacks batch_size"),
    (json.dumps({**META, "prefix_tokens": 300}), "invalid"),
])
def test_bad_sidecars_are_one_trace_error(tmp_path, sidecar, fragment):
    path = tmp_path / "t.csv"
    path.write_text("tokens,pass,rep,t_s,ms\n5,0,0,0.0,1.0\n")
    if sidecar is not None:
        sidecar_path(path).write_text(sidecar)
    with pytest.raises(TraceError, match=fragment):
        read_trace(path)


def test_geometry_mismatch_names_both():
    trace = read_trace(DATA / "deit_tiny_bs1_shuffled.csv")
    check_trace_geometry(trace, 197, 1, "deit_tiny")
    with pytest.raises(TraceError, match="N=197.*N=785"):
        check_trace_geometry(trace, 785, 1, "deit_tiny at 448")


def test_injected_steps_scale_every_sample_above_them():
    trace = synthetic_trace(linear_levels(), counts=[10, 50, 100, 197], passes=1, noise=0.0)
    injected = inject_steps(trace, {50: 1.1, 100: 0.8})
    factor = {v.tokens: b.samples_ms[0] / v.samples_ms[0] for v, b in zip(trace.visits, injected.visits, strict=True)}
    assert factor == pytest.approx({10: 1.0, 50: 1.0, 100: 1.1, 197: 1.1 * 0.8})
    assert injected.meta["injected"] == {"50": 1.1, "100": 0.8}
    assert isinstance(injected.visits[0], Visit)
