"""Benchmark orchestration: build the variants, measure them side by side, collect one row each.

All variants are timed in one interleaved run (`pomt.measurement.timing.interleaved`), each a deep copy called as
`model(x)` on the same input; FLOPs, accuracy, memory, power and the profile are taken per variant.
A sweep repeats this for every (batch size, input size) cell.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from pomt.bench.accuracy import accuracy_data, add_accuracy, compare
from pomt.bench.config import BASELINE, SCHEDULE, BenchConfig, Setup, resolve
from pomt.bench.costs import count_flops, flops_function, peak_memory, power_and_energy
from pomt.bench.latency import Match, Predictor, Timing, knob, match_latency, predictor
from pomt.bench.variants import Variant, build_variant, match_flops, plan_reductions
from pomt.device import clock_snapshot
from pomt.errors import ScheduleError
from pomt.measurement.timing import fixed_threads, interleaved, profile_forward
from pomt.runtimes import Backend, ProgramFiles, backend_info, build_forward, parse_backend
from pomt.workload.prepare import RunSetup, output_stem, prepare


@dataclass
class BenchResult:
    """One benchmark: a row per variant and the run's metadata."""

    run: RunSetup
    rows: list[dict]
    meta: dict = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return self.run.stem


def run_benchmark(config: BenchConfig, progress: bool | None = None) -> BenchResult:
    """Benchmark the configured variants at one batch size and input size."""
    return _run_cell(resolve(config), progress)


def _run_cell(setup: Setup, progress: bool | None, schedule_here: bool = True) -> BenchResult:
    config, schedule = setup.config, setup.schedule if schedule_here else None
    prepared = prepare(setup.workload(), config.pretrained, config.checkpoint, run=setup.run)
    run, base, geometry, x = prepared.setup, prepared.model, prepared.geometry, prepared.x
    del prepared  # `base` alone holds the base model, deleted once its copies, the variants, are built
    device, batch, size, backend = run.device, run.batch_size, run.input_size, parse_backend(config.backend)
    if schedule is not None:  # another model's schedule: apply_schedule warns, once
        schedule.check_geometry(geometry)
    predicted = predictor(schedule, config.schedule, geometry) if schedule is not None else None

    match = setup.match if schedule is not None else "none"
    reductions = plan_reductions(setup.methods, geometry, config, schedule, amounts_later=match != "none")
    if match == "flops":
        reductions = match_flops(reductions, geometry, flops_function(base, x[:1]), config.prune_block)
    matches: list[Match] = []
    if match == "latency":
        target = build_variant(base, next(r for r in reductions if r.name == SCHEDULE), schedule, batch, config.seed)
        knobs = {r.name: knob(r.method, geometry, config.prune_block) for r in reductions
                 if r.method is not None and r.name != SCHEDULE}
        timing = Timing(device, config.threads, config.backend, config.match_rounds, max(1, config.warmup), config.seed)
        matches = match_latency(base, x, target, knobs, timing, progress)
        tuned = {m.name: m.reduction for m in matches}
        reductions = [tuned.get(r.name, r) for r in reductions]
        del target

    bar = tqdm(total=2 * len(reductions) + 2, desc=f"{geometry.model} {size[0]}px", unit="stage", leave=False,
               disable=None if progress is None else not progress)
    with fixed_threads(config.threads) as threads, bar:
        variants = []
        for reduction in reductions:
            variants.append(build_variant(base, reduction, schedule, batch, config.seed))
            bar.update()
        del base
        rows = {v.name: _static_row(v, x, run, predicted) for v in variants}
        data = accuracy_data(config, variants[0].model, size, batch)
        notes: list[str] = []
        with contextlib.ExitStack() as programs:
            forwards = {v.name: programs.enter_context(build_forward(v.model, x, backend=backend, threads=threads,
                                                                     files=ProgramFiles(None, "latency")))
                        for v in variants}
            before = clock_snapshot(device)
            timing = interleaved(forwards, device, threads, config.rounds, config.calls_per_round, config.warmup)
            after = clock_snapshot(device)
        if backend != Backend.EAGER:
            notes.append(f"latency timed on {backend.value}; FLOPs, memory, profile and accuracy from the eager model")
        bar.update()
        for variant in variants:
            _add_resources(rows[variant.name], variant, x, device, config, notes)
            bar.update()
        # last: the accuracy passes leave a process timing pruned models slower after them
        accuracy_kind, samples, right = add_accuracy(rows, variants, data, device, progress)
        bar.update()
    _add_timing(rows, timing.stats, batch)
    for row in rows.values():
        row["accuracy_kind"] = accuracy_kind
    for m in matches:
        rows[m.name].update(setting=m.setting, match_ratio=m.chosen.ratio, match_ci_low=m.chosen.ci[0],
                            match_ci_high=m.chosen.ci[1])
    meta = {
        "model": run.model, "device": device, "fingerprint": run.fingerprint.to_dict(), "threads": threads,
        "rounds": config.rounds, "calls_per_round": config.calls_per_round, "warmup": config.warmup,
        "batch_size": batch, "input_size": list(size), "geometry": geometry.to_dict(),
        "schedule": str(config.schedule) if isinstance(config.schedule, (str, Path)) else None,
        "accuracy_kind": accuracy_kind, "accuracy_samples": samples, "match": match,
        "matches": [m.to_dict() for m in matches],
        "comparisons": [c.to_dict() for c in compare(list(rows.values()), samples, right)],
        "dtype": config.dtype, "backend": backend_info(backend), "clocks": {"before": before, "after": after},
        "notes": sorted(set(notes)),
    }
    return BenchResult(run, list(rows.values()), meta)


def _static_row(variant: Variant, x: torch.Tensor, run: RunSetup, predicted: Predictor | None) -> dict:
    """The columns that need no timing: identity, tokens, FLOPs per image, parameters, predicted ratio."""
    reduction, batch, size = variant.reduction, run.batch_size, run.input_size
    params = sum(p.numel() for p in variant.model.parameters())
    return {
        "model": run.architecture, "method": variant.name, "batch_size": batch, "input_size": size[0],
        "tokens_kept": variant.tokens_kept,
        "predicted_ratio": None if predicted is None else predicted(reduction.method, reduction.removal),
        "gflops": count_flops(variant.model, x) / batch / 1e9, "params_m": params / 1e6,
        "clocks_locked": run.fingerprint.clocks_locked, "reducer": reduction.method or "",
        "amount": reduction.amount, "removal": {str(k): v for k, v in sorted(reduction.removal.items())},
    }


def _add_timing(rows: dict[str, dict], stats: dict, batch: int) -> None:
    baseline = stats[BASELINE].median_ms
    reference = stats[SCHEDULE].median_ms if SCHEDULE in stats else None
    for name, row in rows.items():
        s = stats[name]
        row.update(latency_ms=s.median_ms, latency_iqr_ms=s.iqr_ms, latency_min_ms=s.min_ms, latency_p10_ms=s.p10_ms,
                   samples=s.samples, throughput_ips=batch * 1e3 / s.median_ms, speedup=baseline / s.median_ms,
                   speedup_min=stats[BASELINE].min_ms / s.min_ms,
                   latency_vs_schedule=s.median_ms / reference if reference else None)
        ratio = row.pop("predicted_ratio", None)
        predicted = stats[BASELINE].median_ms * ratio if ratio else None  # this run's speed, drift cancels
        row.update(predicted_ms=predicted, measured_over_predicted=s.median_ms / predicted if predicted else None,
                   predicted_error_pct=100 * (s.median_ms - predicted) / predicted if predicted else None)


def _add_resources(row: dict, variant: Variant, x: torch.Tensor, device: str, config: BenchConfig, notes: list[str]
                   ) -> None:
    forward = functools.partial(variant.model, x)
    memory = peak_memory(forward, variant.model, device)
    row.update(peak_mem_mb=memory.peak_mb, peak_mem_kind=memory.kind)
    power = power_and_energy(forward, device, x.shape[0], config.power_seconds)
    row.update(power_w=power.power_w, energy_j_per_img=power.energy_j_per_img)
    if power.power_w is None:
        notes.append(power.note)
    if config.profile:
        summary = profile_forward(forward, device)
        row.update(ops_per_forward=summary.ops_per_forward, device_time_ms=summary.device_time_ms,
                   profiled_wall_ms=summary.profiled_wall_ms, profile_kind=summary.kind)
    else:
        row.update(ops_per_forward=None, device_time_ms=None, profiled_wall_ms=None, profile_kind="")


@dataclass
class SweepResult:
    """Benchmarks over a grid of batch sizes and input sizes."""

    run: RunSetup
    batch_sizes: list[int]
    input_sizes: list[int]
    cells: dict[tuple[int, int], BenchResult]

    @property
    def stem(self) -> str:
        return output_stem(self.run.model, self.run.device, self.batch_sizes, [(s, s) for s in self.input_sizes])


def run_sweep(config: BenchConfig, batch_sizes: Sequence[int], input_sizes: Sequence[int],
              progress: bool | None = None) -> SweepResult:
    """Run the benchmark in every (batch size, input size) cell; a schedule joins only the cells at its
    own input size (elsewhere its token counts do not apply)."""
    setup = resolve(config)
    batch_sizes, input_sizes = list(dict.fromkeys(batch_sizes)), list(dict.fromkeys(input_sizes))
    runs = {(b, s): setup.run.at(b, s) for b in batch_sizes for s in input_sizes}
    schedule = setup.schedule
    if schedule is not None and any((s, s) != schedule.input_size for s in input_sizes):
        if setup.match != "none":
            raise ScheduleError(f"--match {setup.match} needs the schedule's input size {schedule.input_size[0]} "
                                "in every cell")
        warnings.warn(f"the schedule applies at input size {schedule.input_size[0]} only; other cells leave it out",
                      stacklevel=2)
    cells: dict[tuple[int, int], BenchResult] = {}
    bar = tqdm(runs.items(), desc="sweep", unit="cell", disable=None if progress is None else not progress)
    for (batch, size), run in bar:
        bar.set_postfix(batch=batch, size=size)
        here = schedule is not None and run.input_size == tuple(schedule.input_size)
        cells[(batch, size)] = _run_cell(replace(setup, run=run), progress, schedule_here=here)
    return SweepResult(setup.run, batch_sizes, input_sizes, cells)
