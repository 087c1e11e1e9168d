"""Accuracy measured in a fresh process, so that the process that times schedules never runs the accuracy forwards.

Why. A search measures the accuracy of dozens of schedules over its calibration images, batch by batch, all
patched models sharing the unpruned prefix; the same process then times the schedules it chose. On the 2-core
Intel VM (2026-12-01, deit_tiny at 112 px on the digits model, batch 16, paired rounds against the unpruned
model), after one `Calibration.measure` of 15 schedules over 404 images at batch 64 the ToMe schedules ran
1.5-3% slower than the same process had timed them before it, in each of five processes (ToMe decreasing from
6: 1.34-1.36x before, 1.30-1.32x after), and did not recover over the next minute; 60 unpruned batch-64
forwards, 60 patched batch-16 forwards at ten counts, or decoding the images changed nothing. The frontier's
verification came after its search's accuracy, and read its chosen schedule 1.159x where a fresh process read
1.205x. A serving process runs one schedule, not a search's: the accuracy goes to a worker process
(`pomt.verification.fresh.FreshWorker`), started and given the calibration before anything is timed, idle while the
parent times. The calibration travels as a copy (`FreshWorker.run_copied`): a model whose weights the worker
mapped in shared memory ran 40% slower in the parent.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from pomt.frontier.calibration import SEARCH, Calibration
from pomt.frontier.candidates import Candidate
from pomt.stats import Proportion
from pomt.verification.fresh import FreshWorker

_HOSTED: dict[str, Calibration] = {}  # in the worker: the calibration it was given


def _host(calibration: Calibration) -> None:
    """The worker's side of `HostedCalibration`: keep the calibration, time nothing until asked."""
    _HOSTED["calibration"] = calibration


def _measure(job: tuple[list[Candidate], str, float | None]) -> tuple[dict[Candidate, Proportion], int, float]:
    calibration = _HOSTED["calibration"]
    return calibration.measure(*job), calibration.evaluated, calibration.seconds


class HostedCalibration:
    """A `Calibration` whose `measure` runs in a worker process (module docstring); the same answers, journal
    and counters (`evaluated`, `seconds`)."""

    def __init__(self, calibration: Calibration, worker: FreshWorker) -> None:
        self.kind, self.indices = calibration.kind, calibration.indices
        self.evaluated, self.seconds = calibration.evaluated, calibration.seconds
        self._worker = worker
        worker.run_copied(_host, calibration)  # returns once the worker holds it

    def size(self, split: str = SEARCH) -> int:
        return len(self.indices[split])

    def measure(self, candidates: Sequence[Candidate], split: str = SEARCH,
                stop_above: float | None = None) -> dict[Candidate, Proportion]:
        """`Calibration.measure`, in the worker."""
        found, self.evaluated, self.seconds = self._worker.run(_measure, (list(candidates), split, stop_above))
        return found


@contextmanager
def hosted(calibration: Calibration) -> Iterator[HostedCalibration]:
    """`calibration` handed to a new worker process for as long as the block runs."""
    with FreshWorker() as worker:
        yield HostedCalibration(calibration, worker)
