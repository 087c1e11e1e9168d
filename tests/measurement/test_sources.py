"""Where samples come from: a live model, a replayed trace, and the journal a resumed run reads."""

import pytest
import torch

from pomt.formats.trace import Trace, TraceWriter, Visit, read_trace
from pomt.measurement.sources import (
    LiveSource,
    MeasurementRun,
    ReplaySource,
    TraceExhausted,
    calibrate_reps,
    live_forwards,
)
from pomt.models.registry import create_model
from pomt.runtimes import settles_every_visit

from support.trace_data import N, linear_levels, synthetic_trace

META = {"model": "deit_tiny", "batch_size": 1, "input_size": [224, 224], "num_tokens": N, "prefix_tokens": 1}


def test_a_live_visit_times_the_model_at_its_token_count():
    model = create_model("test_vit", input_size=96)
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
    source = LiveSource(live_forwards(model, torch.randn(1, 3, 96, 96)), threads=1)
    first = source.visit(10, reps=3, pass_index=4)
    second = source.visit(37, reps=2, pass_index=4)
    assert (first.tokens, first.pass_index, len(first.samples_ms)) == (10, 4, 3)
    assert seen[:4] == [10] * 4  # one untimed forward, then three timed ones, all at 10 tokens
    assert seen[4:] == [37] * 3
    assert all(ms > 0 for ms in first.samples_ms) and second.t_s > first.t_s


@pytest.mark.parametrize(("backend", "untimed"), [("eager", 0), (None, 1)])
def test_a_count_visited_again_on_the_cpu_eager_skips_its_untimed_forward(backend, untimed):
    """On the CPU, eager, what a new shape's first forward sets up is kept by the process: a count's later visits
    are timed at once; a runtime not named settles every visit."""
    model = create_model("test_vit", input_size=96)
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda _m, args: seen.append(args[0].shape[1]))
    source = LiveSource(live_forwards(model, torch.randn(1, 3, 96, 96)), threads=1, backend=backend)
    for tokens in (10, 37, 10, 37):
        source.visit(tokens, reps=2, pass_index=0)
    assert seen == [10] * 3 + [37] * 3 + [10] * (2 + untimed) + [37] * (2 + untimed)


@pytest.mark.parametrize(("device", "backend", "every"), [
    ("cpu", "eager", False), ("cuda", "eager", True), ("cuda:1", "cudagraph", True), ("cpu", "compile", True),
    ("cpu", "onnxruntime", True), ("cpu", "openvino", True),
])
def test_which_runtimes_settle_every_visit(device, backend, every):
    assert settles_every_visit(device, backend) is every


@pytest.mark.parametrize(("device", "settles_again"), [(None, False), ({"kind": "cpu"}, False),
                                                       ({"kind": "cuda"}, True)])
def test_a_replay_paces_a_count_visited_again_as_a_live_run_of_its_runtime(device, settles_again):
    trace = synthetic_trace(linear_levels(), counts=[50, N], passes=4)
    if device is not None:
        trace = Trace(trace.visits, {**trace.meta, "device": device, "backend": "eager"})
    source = ReplaySource(trace)
    first = source.visit(50, reps=3, pass_index=0)
    before = source.clock_s
    again = source.visit(50, reps=3, pass_index=1)
    untimed = sorted(again.samples_ms)[1] if settles_again else 0.0
    assert source.clock_s == pytest.approx(before + (untimed + sum(again.samples_ms)) / 1e3)
    assert first.t_s < again.t_s


def test_replay_serves_the_nearest_unused_visit_and_never_one_twice():
    trace = synthetic_trace(linear_levels(), counts=[50, N], passes=3)
    source = ReplaySource(trace)
    recorded = [v for v in trace.visits if v.tokens == 50]
    served = [source.visit(50, reps=3, pass_index=i) for i in range(3)]
    assert [v.samples_ms for v in served] == [v.samples_ms for v in recorded]  # in time order, each once
    assert [v.pass_index for v in served] == [0, 1, 2]  # the pass the search asked for
    with pytest.raises(TraceExhausted):
        source.visit(50, reps=3, pass_index=3)
    assert source.preferred_reps == 3 and source.counts == [50, N]


def test_a_replay_started_within_the_recording_serves_the_visits_recorded_there_first():
    trace = synthetic_trace(linear_levels(), counts=[50, N], passes=8)
    times = [v.t_s for v in trace.visits]
    middle = min(times) + 0.5 * (max(times) - min(times))
    recorded = [v for v in trace.visits if v.tokens == 50]
    nearest = min(recorded, key=lambda v: abs(v.t_s - middle))
    source = ReplaySource(trace, start=0.5)
    assert source.clock_s == pytest.approx(middle)
    served = source.visit(50, reps=3, pass_index=0)  # told apart by its samples' shape, which a scale keeps
    assert served.samples_ms[1] / served.samples_ms[0] == pytest.approx(nearest.samples_ms[1] / nearest.samples_ms[0])
    assert served.t_s > middle
    assert ReplaySource(trace).clock_s == min(times)


def test_a_seeded_replay_starts_in_the_recordings_first_half_the_same_way_for_a_seed():
    trace = synthetic_trace(linear_levels(), counts=[50, N], passes=8)
    times = [v.t_s for v in trace.visits]
    starts = [ReplaySource.seeded(trace, [seed, 3]).clock_s for seed in range(20)]
    assert all(min(times) <= s <= min(times) + 0.5 * (max(times) - min(times)) for s in starts)
    assert len(set(starts)) == 20 and ReplaySource.seeded(trace, [4, 3]).clock_s == starts[4]


@pytest.mark.parametrize("start", [-0.1, 1.0])
def test_a_replay_start_outside_the_recording_is_refused(start):
    with pytest.raises(ValueError, match="share of the recording's span"):
        ReplaySource(synthetic_trace(linear_levels(), counts=[50, N], passes=2), start=start)


def test_the_replay_clock_follows_what_was_served():
    trace = synthetic_trace(linear_levels(), counts=[50, N], passes=4)
    source = ReplaySource(trace)
    start = source.clock_s
    visit = source.visit(N, reps=3, pass_index=0)
    assert source.clock_s == pytest.approx(start + (sorted(visit.samples_ms)[1] + sum(visit.samples_ms)) / 1e3)


def test_a_pair_of_counts_visited_back_to_back_is_served_from_nearly_one_moment():
    """Recorded: 50 and 51 far apart in pass 0, side by side in pass 1; a unit gets pass 1's pair. Each recorded
    visit is told apart by the shape of its two samples, which moving it to the clock (a scale) keeps."""
    visits = [Visit(50, 0, 0.0, (5.0, 5.5)), Visit(N, 0, 1.0, (9.0, 9.0)), Visit(51, 0, 2.0, (5.1, 5.61)),
              Visit(51, 1, 3.0, (5.1, 6.12)), Visit(50, 1, 3.1, (5.0, 6.0)), Visit(N, 1, 4.0, (9.0, 9.0))]
    trace = Trace(tuple(visits), dict(META))

    def shapes(source):
        served = (source.visit(50, 2, 0), source.visit(51, 2, 0))
        return [round(v.samples_ms[1] / v.samples_ms[0], 2) for v in served]

    assert shapes(ReplaySource(trace)) == [1.1, 1.1]  # pass 0's, nearest the clock
    together = ReplaySource(trace)
    together.begin_unit(0, [50, 51])
    assert shapes(together) == [1.2, 1.2]


def test_a_replayed_visit_runs_at_the_speed_the_machine_had_at_the_replay_clock():
    """The machine halved its speed at 5 s; a visit recorded before then, served after, is served at half
    speed and at the clock's time: as a live run measuring it then would have seen it."""
    def speed(t):
        return 1.0 if t < 5.0 else 2.0

    levels = {N: 10.0, 50: 5.0, 60: 6.0}
    visits = [Visit(n, second, second + offset, (levels[n] * speed(second),) * 3)
              for second in range(10) for n, offset in ((N, 0.0), (50, 0.3), (60, 0.6))]
    source = ReplaySource(Trace(tuple(visits), dict(META)))
    source.clock_s = 6.0
    served = [source.visit(50, 3, 0) for _ in range(10)]
    assert [v.samples_ms[0] for v in served] == pytest.approx([10.0] * 10, rel=0.02)  # the slow half's 5 ms x 2
    assert served[0].t_s > 6.0 and all(b.t_s > a.t_s for a, b in zip(served, served[1:], strict=False))


class Counting:
    """A source over a replayed trace that counts what it is asked for."""

    def __init__(self, trace):
        self.inner, self.calls = ReplaySource(trace), []

    def visit(self, tokens, reps, pass_index):
        self.calls.append(tokens)
        return self.inner.visit(tokens, reps, pass_index)


def test_a_resumed_run_replays_its_journal_before_measuring(tmp_path):
    trace = synthetic_trace(linear_levels(), counts=[10, 20, N], passes=4)
    asks = [(v.tokens, v.pass_index) for v in trace.visits][:8]
    journal = TraceWriter(tmp_path / "j.csv", META, {"seed": 0})
    first = MeasurementRun(Counting(trace), journal)
    for tokens, p in asks[:5]:
        first.visit(tokens, 3, p)  # then the run is killed
    resumed_source = Counting(trace)
    resumed = MeasurementRun(resumed_source, TraceWriter(tmp_path / "j.csv", META, {"seed": 0}, resume=True))
    out = [resumed.visit(tokens, 3, p) for tokens, p in asks]
    assert resumed_source.calls == [t for t, _ in asks[5:]]  # only the visits the journal lacks
    assert resumed.measured == 3 and resumed.visits == 8
    assert len(read_trace(tmp_path / "j.csv").visits) == 8
    assert out[:5] == journal.visits[:5]


def test_a_diverging_resume_drops_the_rest_of_the_journal(tmp_path):
    trace = synthetic_trace(linear_levels(), counts=[10, 20, N], passes=4)
    journal = TraceWriter(tmp_path / "j.csv", META, {"seed": 0})
    measuring = MeasurementRun(ReplaySource(trace), journal)
    for tokens in (10, 20, N):
        measuring.visit(tokens, 3, 1)
    again = MeasurementRun(ReplaySource(trace), TraceWriter(tmp_path / "j.csv", META, {"seed": 0}, resume=True))
    again.visit(10, 3, 1)
    again.visit(N, 3, 1)  # the journal's second visit is 20: from here on it is measured anew
    assert again.measured == 1
    assert [v.tokens for v in read_trace(tmp_path / "j.csv").visits] == [10, N]


@pytest.mark.parametrize(("per_forward", "expected"), [(0.001, 8), (0.03, 3), (0.5, 1), (0.0, 8)])
def test_calibrated_reps(per_forward, expected):
    assert calibrate_reps(per_forward, 0.1) == expected
