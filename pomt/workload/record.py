"""`pomt record`: a dense latency trace of one workload on this machine, for the curve bank.

Every grid count is visited in `passes` shuffled passes, the reference N `reference_visits` times in each; each
multiple of `align` right beside the count below it, or with `chain` every count beside a neighbour, so that a
replay can serve those pairs back to back. Every timed forward is kept in `<stem>.record.csv`, the device
fingerprint in its sidecar; `--resume` continues a killed recording. The trace is analysed as the bank's ground
truth is (`steps_in_trace`) and drawn; `offline_computation.py --replay` runs the offline computation on it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from pomt.checks import check_options, check_output_file
from pomt.formats.trace import Visit
from pomt.io import clear_stale
from pomt.measurement.design import Measurer, aligned_units, chained_units, checked_grid
from pomt.measurement.drift import Drift, corrected_values, drift, pool_visits, relative_noise
from pomt.measurement.search import SearchSettings
from pomt.measurement.sources import MeasurementRun
from pomt.measurement.steps import Step, steps_in_trace
from pomt.options import ADVANCED, MEASUREMENT, option
from pomt.plots import OfflinePlot, plot_offline
from pomt.workload.prepare import Workload, journalled, live_run, open_journal, prepare


@dataclass(frozen=True)
class RecordSettings:
    """How deep a recording goes; each field is also the CLI option of its name."""

    passes: int = option(12, "Shuffled passes over every count (a replay serves each recorded visit once).", min=2,
                         panel=MEASUREMENT)
    reps: int | None = option(None, "Timed forwards per visit (default: about --visit-s of timing).", min=1,
                              panel=MEASUREMENT)
    visit_s: float = option(0.1, "Seconds of timing a visit aims at, when --reps is not given.", panel=ADVANCED)
    reference_visits: int = option(3, "Visits of the reference (N) in each pass: a search visits it in every one of "
                                      "its many short passes, so a replayed search needs more of it.", min=1,
                                   panel=MEASUREMENT)
    align: int = option(8, "Each multiple of it is visited right beside the count below, in alternating order, as "
                           "an adaptive search's coarse scan does, so a replay serves those pairs as they were "
                           "measured live (0: every count on its own).", min=0, panel=ADVANCED)
    chain: bool = option(False, "Visit every count right beside a neighbour, the pairs shifted by one count every "
                                "other pass, so every two neighbouring counts are back to back in half the passes "
                                "and a replay serves any adjacent pair as a search measures it live (in place of "
                                "--align's pairs).", panel=MEASUREMENT)
    min_step: float = option(0.05, "Smallest step the summary reports (fraction, beyond the trend).", min=0,
                             panel=MEASUREMENT)

    def check(self) -> RecordSettings:
        """Raise for settings outside their ranges, and for those a search would refuse alike."""
        check_options(self)
        SearchSettings(passes=self.passes, reps=self.reps, visit_s=self.visit_s, align=self.align).check()
        return self


@dataclass
class Recording:
    """What a recording wrote and what its trace shows."""

    paths: dict[str, Path]
    visits: int
    measured: int
    samples: int
    seconds: float
    noise: float
    drift: Drift | None
    steps: list[Step]


def dense_trace(measuring: MeasurementRun, grid: list[int], reference: int, settings: RecordSettings, *, seed: int = 0,
                progress: bool = True) -> tuple[list[Visit], int]:
    """(every visit, timed forwards per visit) of the dense design (see the module docstring); nothing judged."""
    grid = checked_grid(grid, reference)
    measurer = Measurer(measuring, reference, seed=seed, total=settings.passes * len(grid), progress=progress)
    measurer.calibrate(settings.reps, settings.visit_s)
    if settings.chain:
        for number in range(settings.passes):
            measurer.measure_units(chained_units(grid, number), 1, settings.reference_visits)
    else:
        measurer.measure_units(aligned_units(grid, reference, settings.align), settings.passes,
                               settings.reference_visits)
    measurer.close()
    return measurer.visits(), measurer.reps


def record(workload: Workload, settings: RecordSettings) -> Recording:
    """Record the workload's dense trace, settings checked before anything is built; Ctrl-C raises `Interrupted`."""
    settings.check()
    workload.check()
    prepared = prepare(workload)
    with journalled(prepared):
        folder, stem = Path(workload.output_dir), f"{prepared.setup.stem}.record"
        clear_stale(folder, stem)
        for suffix in (".csv", ".json", ".png"):
            check_output_file(folder / f"{stem}{suffix}", "output file")
        journal = open_journal(workload, prepared, "record", "whole model, tokens truncated after embedding",
                               {"passes": settings.passes, "reps": settings.reps, "visit_s": settings.visit_s,
                                "reference_visits": settings.reference_visits, "align": settings.align,
                                "chain": settings.chain})
        measuring = live_run(workload, prepared, journal)
        started = time.perf_counter()
        n = prepared.geometry.num_tokens
        visits, reps = dense_trace(measuring, prepared.grid, n, settings, seed=workload.seed,
                                   progress=workload.progress)
        seconds = time.perf_counter() - started
        seen = drift(visits, n)
        journal.update_meta(passes=settings.passes, reps=reps, stride=workload.grid_token_stride,
                            align=0 if settings.chain else settings.align, chain=settings.chain,
                            drift=None if seen is None else seen.to_dict())
        steps = steps_in_trace(visits, min_step=settings.min_step)
        title = (f"{prepared.geometry.model} on {prepared.setup.fingerprint.name}, batch {prepared.setup.batch_size}"
                 f": {settings.passes} shuffled passes")
        plot = plot_offline(folder / f"{stem}.png",
                            OfflinePlot(title, pool_visits(visits, n), corrected_values(visits), steps, drift=seen))
        return Recording(paths={"trace": journal.path, "sidecar": journal.path.with_suffix(".json"), "plot": plot},
                         visits=measuring.visits, measured=measuring.measured,
                         samples=sum(len(v.samples_ms) for v in visits), seconds=seconds,
                         noise=relative_noise(corrected_values(visits)), drift=seen, steps=steps)
