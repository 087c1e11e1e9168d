"""Stage 2, measure: the run made concrete (the live workload with its journal, or a trace with `--replay`), the
latency curve searched over kept-token counts, the confirmed steps within reach measured again in a fresh process,
and A(n) (read from `--accuracy-curve`, or measured on the `--dataset-root` sample in a worker process)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from torch import nn
from torch.utils.data import Dataset

from pomt import accuracy as acc
from pomt.device.fingerprint import Fingerprint
from pomt.errors import GridError, SettingError
from pomt.formats.trace import check_trace_geometry, read_trace
from pomt.measurement.confirmation import Confirmation, confirmed_steps
from pomt.measurement.robust import PairedEffect
from pomt.measurement.search import LatencySearch, SearchResult, SearchScope, SearchSettings
from pomt.measurement.sources import MeasurementRun, ReplaySource
from pomt.measurement.steps import Step
from pomt.models.geometry import Geometry, model_geometry
from pomt.models.registry import architecture, create_model, normalise_input_size, resolve_model_name
from pomt.offline.config import OfflineConfig, Request, check_pruning, needs_accuracy_model, sample_size
from pomt.verification.fresh import FreshWorker, StepJob, step_holds, step_rounds_in_fresh_process
from pomt.verification.verify import Rounds
from pomt.workload.prepare import (
    Prepared,
    RunSetup,
    Workload,
    live_run,
    open_journal,
    prepare,
    settings_keys,
    workload_grid,
)


@dataclass(frozen=True)
class Run:
    """A prepared run and where its latency comes from (None: nowhere, as for --accuracy-only; `replay`: a trace)."""

    prepared: Prepared
    measuring: MeasurementRun | None
    replay: Path | None = None

    @property
    def setup(self) -> RunSetup:
        return self.prepared.setup

    @property
    def geometry(self) -> Geometry:
        return self.prepared.geometry


def prepare_run(workload: Workload, config: OfflineConfig, settings: SearchSettings) -> Run:
    """The run `--replay` asks for, else the live one."""
    return prepare_replay(workload, config) if config.replay is not None else prepare_live(workload, config, settings)


def prepare_live(workload: Workload, config: OfflineConfig, settings: SearchSettings) -> Run:
    """Set up measuring on this machine: the workload, weights only when accuracy is measured, the journal."""
    pretrained = config.pretrained
    if pretrained is None:
        pretrained = needs_accuracy_model(config) and config.checkpoint is None
    prepared = prepare(workload, pretrained=pretrained, checkpoint=config.checkpoint)
    check_pruning(config, prepared.geometry)
    if config.accuracy_only:
        return Run(prepared, None)
    journal = open_journal(workload, prepared, "trace", "whole model, tokens truncated after embedding",
                           {"search": config.search, **settings_keys(settings)})
    return Run(prepared, live_run(workload, prepared, journal))


def prepare_replay(workload: Workload, config: OfflineConfig) -> Run:
    """Set up analysing a recorded trace: the model it names (for its geometry), the trace's own counts."""
    trace = read_trace(config.replay)
    meta = trace.meta
    name = resolve_model_name(meta["model"])
    check_replayed_workload(workload, meta, name)
    model = create_model(name, tuple(meta["input_size"]))
    geometry = model_geometry(model)
    check_trace_geometry(trace, geometry.num_tokens, geometry.prefix_tokens, name)
    check_pruning(config, geometry)
    setup = RunSetup(name, "replay", replayed_fingerprint(meta, config.replay), int(meta["batch_size"]),
                     geometry.input_size)
    if geometry.num_tokens not in trace.counts:
        raise GridError(f"trace {config.replay} has no visit at N = {geometry.num_tokens}, the reference")
    grid = [n for n in workload_grid(workload, geometry) if n in set(trace.counts)]
    return Run(Prepared(setup, geometry, grid, model, None), MeasurementRun(ReplaySource(trace)), config.replay)


def check_replayed_workload(workload: Workload, meta: dict, name: str) -> None:
    """Raise SettingError where the workload asks for another model, batch, input size, device kind, thread count,
    dtype or runtime than the trace's (a setting left at its default asks nothing)."""
    recorded, default = meta.get("device") if isinstance(meta.get("device"), dict) else {}, Workload()
    asked = {
        "--model": (None if workload.model is None else architecture(workload.model), architecture(name)),
        "--batch-size": (workload.batch_size, int(meta["batch_size"])),
        "--input-size": (normalise_input_size(workload.input_size), tuple(meta["input_size"])),
        "--device": (None if workload.device == default.device else workload.device.split(":")[0].strip().lower(),
                     recorded.get("kind") or "cpu"),
        "--threads": (workload.threads, recorded.get("threads", meta.get("threads"))),
        "--dtype": (None if workload.dtype == default.dtype else workload.dtype, meta.get("dtype", default.dtype)),
        "--backend": (None if workload.backend == default.backend else workload.backend,
                      meta.get("backend", default.backend)),
    }
    clashes = [f"{flag} {mine if not isinstance(mine, tuple) else 'x'.join(map(str, mine))} (the trace's: "
               f"{theirs if not isinstance(theirs, tuple) else 'x'.join(map(str, theirs))})"
               for flag, (mine, theirs) in asked.items() if None not in (mine, theirs) and mine != theirs]
    if clashes:
        raise SettingError(f"--replay analyses the recorded workload, not {', '.join(clashes)}: leave those out, "
                           "or measure anew without --replay")


def replayed_fingerprint(meta: dict, path: Path) -> Fingerprint:
    """The fingerprint a trace's sidecar recorded (the few facts of an older sidecar without one)."""
    recorded = meta.get("device") if isinstance(meta.get("device"), dict) else {
        "kind": "cpu", "name": meta.get("cpu"), "threads": meta.get("threads"), "torch": meta.get("torch"),
        "timm": meta.get("timm"),
    }
    return Fingerprint.from_dict({**recorded, "replayed_from": str(path)})


@dataclass(frozen=True)
class Latency:
    """The search's result, its seconds, its journal (None on a replay), and the fresh checks of its steps."""

    search: SearchResult
    seconds: float
    trace: Path | None = None
    fresh_steps: tuple[dict, ...] = ()


def measure_latency(request: Request, run: Run, reach: int) -> Latency:
    """Search the run's grid; candidate steps at `reach` kept tokens or more are examined first."""
    workload, config, settings = request.workload, request.config, request.settings
    started = time.perf_counter()
    scope = SearchScope(run.prepared.grid, run.geometry.num_tokens, adaptive=config.search == "adaptive",
                        focus_from=reach)
    search = LatencySearch(run.measuring, scope, settings, seed=workload.seed, progress=workload.progress).run()
    seconds = time.perf_counter() - started
    journal = run.measuring.journal
    if journal is None:
        return Latency(search, seconds)
    journal.update_meta(passes=settings.passes, reps=search.reps,
                        drift=None if search.drift is None else search.drift.to_dict())
    return Latency(search, seconds, journal.path)


def check_steps_in_fresh_process(workload: Workload, settings: SearchSettings, latency: Latency, reach: int) -> Latency:
    """The latency with its confirmed steps at `reach` kept tokens or more checked in a fresh process (recorded)."""
    search = latency.search
    within = [c for c in search.candidates if c.accepted and c.effect is not None and c.low >= reach]
    if not within:
        return latency
    job = StepJob(workload, tuple((c.low, c.high) for c in within), Rounds(settings.confirm_rounds, search.reps,
                                                                          workload.seed))
    rounds = step_rounds_in_fresh_process(job)
    records, verdicts = [], {}
    for c in within:
        fresh, held = step_holds(c.effect, rounds[(c.low, c.high)], settings.step_alpha, settings.min_step)
        records.append(fresh_record(c, fresh, held))
        if not held:
            verdicts[(c.low, c.high)] = here_only(c, fresh)
    if verdicts:
        candidates = [verdicts.get((c.low, c.high), c) for c in search.candidates]
        search = replace(search, candidates=candidates, steps=confirmed_steps(search.points, candidates))
    return replace(latency, search=search, fresh_steps=tuple(records))


def fresh_record(step: Confirmation, fresh: PairedEffect, held: bool) -> dict:
    """What the schedule's measurement records of one step's check: both effects, and whether it held."""
    here_pct, fresh_pct = step.effect.saving_pct[0], fresh.saving_pct
    return {"low": step.low, "high": step.high, "held": held, "paired_pct": round(here_pct, 3),
            "fresh_pct": round(fresh_pct[0], 3), "fresh_ci_pct": [round(fresh_pct[1][0], 3), round(fresh_pct[1][1], 3)],
            "fresh_p_value": float(f"{fresh.p_value:.3g}"), "rounds": fresh.pairs}


def here_only(step: Confirmation, fresh: PairedEffect) -> Confirmation:
    """The step rejected: confirmed here, not in the fresh process."""
    low, high = fresh.saving_pct[1]
    return replace(step, accepted=False, kind="none",
                   reason=(f"{step.reason}, here only: in a fresh process {-fresh.saving_pct[0]:+.1f}% "
                           f"[{-high:+.1f}, {-low:+.1f}] (p = {fresh.p_value:.2g}, {fresh.pairs} rounds)"))


Sample = tuple[Dataset, str]  # the seeded sample of the dataset folder, and its kind (top-1 or agreement)


def given_accuracy(config: OfflineConfig, run: Run) -> acc.AccuracyCurve | None:
    """The curve `--accuracy-curve` names, checked against the model's token range; None without one."""
    if config.accuracy_curve is None:
        return None
    return acc.load_accuracy_curve(config.accuracy_curve, (run.geometry.min_tokens, run.geometry.num_tokens))


def accuracy_sample(workload: Workload, config: OfflineConfig, run: Run) -> Sample | None:
    """The seeded sample A(n) is measured on, its labels checked; None where this run measures no A(n)."""
    if not (needs_accuracy_model(config) or config.accuracy_only) or config.dataset_root is None:
        return None
    model, geometry = run.prepared.model, run.geometry
    transform = acc.eval_transform(model, geometry.input_size)
    dataset, kind = acc.open_image_folder(config.dataset_root, transform, agreement=config.agreement)
    acc.check_labels(dataset, kind, model, config.dataset_root)
    return acc.seeded_subset(dataset, sample_size(config, len(dataset)), workload.seed), kind


def estimate_accuracy(workload: Workload, config: OfflineConfig, run: Run, sample: Sample,
                      steps: Sequence[Step] = ()) -> acc.AccuracyCurve:
    """A(n) on the sample (at evenly spread counts and both sides of each step), random pruning after embedding."""
    geometry, (subset, kind) = run.geometry, sample
    extra = [s.tokens for s in steps] + [s.upper_tokens for s in steps]
    counts = acc.accuracy_token_counts(geometry.min_tokens, geometry.num_tokens, config.accuracy_points, extra)
    device = run.setup.device if run.replay is None else "cpu"
    job = AccuracyJob(run.prepared.model, subset, config.accuracy_batch_size, counts, kind, device, workload.seed,
                      workload.progress)
    with FreshWorker() as worker:  # not in the timing process (`pomt.frontier.calibration`)
        return worker.run_copied(_measure_there, job)


@dataclass(frozen=True)
class AccuracyJob:
    """What the worker measuring A(n) needs: the model, the sample, the counts and how."""

    model: nn.Module
    sample: Dataset
    batch_size: int
    counts: list[int]
    kind: str
    device: str
    seed: int
    progress: bool


def _measure_there(job: AccuracyJob) -> acc.AccuracyCurve:
    images = acc.Images(acc.image_loader(job.sample, job.batch_size), job.kind, job.device, job.progress)
    return acc.measure_accuracy(job.model, images, job.counts, seed=job.seed)
