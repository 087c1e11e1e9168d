"""Verification in a fresh process: a removal ships only where it qualified in both processes."""

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pomt.device import Fingerprint
from pomt.formats.schedule import BlockRemoval, Schedule
from pomt.formats.trace import Visit
from pomt.measurement.robust import paired_effect
from pomt.measurement.sources import MeasurementRun, ReplaySource
from pomt.models.geometry import model_geometry
from pomt.models.registry import create_model
from pomt.verification.fresh import FreshJob, held_in_both, placement_hint, step_holds, verify_in_fresh_process
from pomt.verification.verify import Criterion, Rounds, verify
from pomt.workload.prepare import Workload

from support.tiny_data import MODEL, SIZE
from support.trace_data import N, synthetic_trace


def measured(latency: dict[int, float]):
    """A verification of removals 3 and 5 on a replayed device at the given latencies."""
    trace = synthetic_trace(lambda k: latency[k], counts=list(latency), passes=14, noise=0.005,
                            drift=lambda t: 1.0 + 0.2 * math.sin(t / 5))
    return verify(MeasurementRun(ReplaySource(trace)), N, dict.fromkeys([3, 5]), Rounds(10, 3), progress=False)


def test_a_removal_ships_only_where_it_qualified_in_both_processes():
    """The process that found the step: 3 removed is 8% faster. A fresh one: 3 removed gains nothing, 5
    removed is 9% faster in both (deit_small bs4 on the VM: the drop by N sits at a different count in each
    process, while five tokens below N is faster in all)."""
    here = measured({N: 20.0, N - 3: 18.4, N - 5: 18.3})
    fresh = measured({N: 20.0, N - 3: 19.9, N - 5: 18.2})
    assert here.chosen is not None and here.chosen.remove == 3
    chosen, reason = held_in_both(here, fresh, Criterion(min_gain=0.03, min_step=0.03))
    assert chosen is not None and chosen.remove == 5
    assert reason.startswith("in a fresh process: measured")


def test_nothing_ships_when_the_fresh_process_has_no_gain():
    here = measured({N: 20.0, N - 3: 18.4, N - 5: 19.9})
    fresh = measured({N: 20.0, N - 3: 19.95, N - 5: 19.9})
    chosen, reason = held_in_both(here, fresh, Criterion(min_gain=0.03, min_step=0.03))
    assert chosen is None and "no candidate is measurably faster" in reason


def test_the_fresh_process_rebuilds_the_workload_and_measures_the_patched_model(tmp_path):
    geometry = model_geometry(create_model(MODEL, input_size=SIZE))
    schedule = Schedule(model=geometry.model, input_size=geometry.input_size, batch_size=2,
                        num_tokens=geometry.num_tokens, prefix_tokens=geometry.prefix_tokens, depth=geometry.depth,
                        method="pomt", prune=(BlockRemoval(1, 20),))
    workload = Workload(model=MODEL, batch_size=2, input_size=SIZE, threads=1, output_dir=tmp_path, progress=False)
    job = FreshJob(workload, {geometry.num_tokens - 20: schedule}, Rounds(3, 2, workload.seed),
                   Criterion(min_gain=0.03, min_step=0.03, alpha=0.01))
    found = verify_in_fresh_process(job)
    assert [c.remove for c in found.candidates] == [20] and found.rounds == 3
    (candidate,) = found.candidates
    assert candidate.pruned_ms > 0 and candidate.speedup_ci[0] <= candidate.speedup <= candidate.speedup_ci[1]


def test_a_cpu_user_under_the_default_allocator_is_told_about_placement():
    assert "--allocator steady" in placement_hint(Fingerprint(kind="cpu", allocator={}))
    assert placement_hint(Fingerprint(kind="cpu", allocator={"MALLOC_MMAP_THRESHOLD_": "1073741824"})) is None
    assert placement_hint(Fingerprint(kind="cuda", allocator={})) is None


def rounds_of(low_ms: list[float], high_ms: list[float]) -> list[tuple[Visit, Visit]]:
    return [(Visit(10, i, 2.0 * i, (a,)), Visit(11, i, 2.0 * i + 1.0, (b,)))
            for i, (a, b) in enumerate(zip(low_ms, high_ms, strict=True))]


def test_a_step_holds_in_a_fresh_process_only_when_it_shows_there_in_the_same_direction():
    """Confirmed here: 10 tokens 8% faster than 11 beyond a trend that predicts 1%. Fresh readings: the step
    again; no step; the other way; a real but tiny 1% (significant, under half the 3% minimum); and 2.8%
    from noisy rounds, significant one-sided only (the direction is known before the rounds: 192 -> 191 of
    deit_small bs4 read +2.7% [+1.0, +4.5] fresh and was turned away by the two-sided test)."""
    offset = math.log(0.99)
    here = paired_effect([20.0] * 6, [18.3, 18.5, 18.4, 18.2, 18.4, 18.3], offset=offset)
    noise = np.array([0.003, -0.002, 0.001, -0.003, 0.002, -0.001])
    wide = np.array([0.012, -0.008, 0.004, -0.012, 0.008, -0.004])

    def holds(low_ms: float, spread: np.ndarray = noise) -> bool:
        return step_holds(here, rounds_of(list(low_ms * (1 + spread)), list(20.0 * (1 - spread))), alpha=0.01,
                          min_step=0.03)[1]

    assert holds(18.4) and not holds(19.8) and not holds(21.0)
    assert not holds(19.6)  # 1% beyond the trend, however significant
    fresh = step_holds(here, rounds_of(list(19.25 * (1 + wide)), list(20.0 * (1 - wide))), 0.01, 0.03)[0]
    assert 0.01 < fresh.p_value < 0.02 and holds(19.25, wide)


KILLED_PARENT = """
import os, sys, time
from pomt.verification.fresh import FreshWorker

def worker_pid(_):
    return os.getpid()

if __name__ == "__main__":
    worker = FreshWorker()
    print(worker.run(worker_pid, None), flush=True)
    worker.run(time.sleep, 600)  # busy there when this process is killed
"""


def test_a_worker_busy_when_its_parent_is_killed_dies_with_it(tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(KILLED_PARENT)
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True)
    try:
        worker = int(parent.stdout.readline())
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        for _ in range(300):  # the kill is delivered at once; the wait only covers a loaded machine
            if not Path(f"/proc/{worker}").exists() or "Z" in Path(f"/proc/{worker}/stat").read_text().split()[2]:
                break
            time.sleep(0.1)
        else:
            os.kill(worker, signal.SIGKILL)
            raise AssertionError("the worker outlived its killed parent")
    finally:
        parent.kill()
