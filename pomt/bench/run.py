"""Benchmark orchestration: build the variants, measure them side by side, collect one row each.

All variants are timed in one interleaved run (`pomt.measurement.timing.interleaved`), each a deep copy called as
`model(x)` on the same input; FLOPs, accuracy, memory, power and the profile are taken per variant.
A sweep repeats this for every (batch size, input size) cell.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from pomt.bench.accuracy import DEFAULT_SAMPLES, accuracy_data, add_accuracy
from pomt.bench.compare import compare
from pomt.bench.flops import count_flops
from pomt.bench.latency_match import Match, Timing, match_latency
from pomt.bench.predict import Predictor, predictor
from pomt.bench.resources import peak_memory, power_and_energy
from pomt.bench.variants import (
    BASELINE,
    SCHEDULE,
    VALID_METHODS,
    Variant,
    build_variant,
    flops_function,
    match_flops,
    plan_reductions,
    variant_methods,
)
from pomt.checks import check_options, check_threads
from pomt.device import clock_snapshot
from pomt.device.allocator import ALLOCATOR_HELP, ALLOCATORS
from pomt.errors import DatasetError, ScheduleError, SettingError
from pomt.formats.schedule import Schedule, load_schedule
from pomt.measurement.profile import profile_forward
from pomt.measurement.timing import fixed_threads, interleaved
from pomt.models.registry import MAX_INPUT_SIZE
from pomt.options import SEED_MAX, option
from pomt.runtimes import BACKENDS, DTYPES, Backend, backend_info, build_forward, parse_backend
from pomt.workload.prepare import Workload, prepare
from pomt.workload.setup import RunSetup, output_stem, prepare_run

MATCHES = ("auto", "latency", "flops", "none")


@dataclass(frozen=True)
class BenchConfig:
    """What to benchmark and how; each field is also the CLI option of its name (`pomt.options`)."""

    model: str | None = option(None, "timm name or alias (default: the schedule's model).")
    schedule: Path | str | Schedule | None = option(None, "Schedule JSON to compare with the unpruned model.")
    methods: str | tuple[str, ...] = option(
        BASELINE, f"Comma-separated variants: {', '.join(VALID_METHODS)} (none is always run)."
    )
    remove: int | None = option(None, "Tokens removed at --prune-block (pomt/topk/l2norm/random).", min=0)
    r: int | None = option(None, "ToMe: tokens merged per block.", min=0)
    prune_block: int = option(3, "Block that prunes (0-based).", min=0)
    keep_rate: float | None = option(None, "Instead of --remove: patch tokens kept, in (0, 1].", min=0, max=1)
    match: str = option("auto", "How the reducers' amounts are set against a --schedule: latency (tuned to its "
                                "measured latency here), flops, or none (the amounts given); auto: latency when "
                                "a schedule is given without --remove/--r/--keep-rate, else none.",
                        choices=MATCHES)
    match_rounds: int = option(10, "--match latency: paired rounds per probed setting.", min=2)
    batch_size: int | None = option(None, "Batch size (default: the schedule's, else 1).", min=1)
    input_size: int | tuple[int, int] | None = option(None, "Input size in pixels (default: schedule's/model's).",
                                                      min=1, max=MAX_INPUT_SIZE)
    device: str = option("auto", "auto, cpu, cuda, cuda:N or mps.")
    threads: int | None = option(None, "CPU threads (default: torch's).", min=1)
    allocator: str = option("steady", ALLOCATOR_HELP, choices=ALLOCATORS)
    dtype: str | None = option(None, "Model and input dtype (default: the schedule's, else float32; bfloat16 on "
                                     "CPU, float16 on CUDA).", choices=DTYPES)
    backend: str | None = option(None, "Runtime every variant is timed on (default: the schedule's, else eager; "
                                       "a static program per variant).", choices=BACKENDS)
    rounds: int = option(30, "Interleaved timing rounds (one sample per variant each).", min=1)
    calls_per_round: int = option(1, "Back-to-back forwards per sample.", min=1)
    warmup: int = option(3, "Warm-up forwards per variant.", min=0)
    dataset_root: Path | str | None = option(None, "ImageFolder for top-1 accuracy.")
    agreement: bool = option(False, "Accuracy as agreement with the unpruned model, --dataset-root's labels "
                                    "ignored (for images whose classes are not the model's).")
    accuracy_samples: int = option(DEFAULT_SAMPLES, "Images for accuracy (top-1 or agreement on random inputs), "
                                                    "as many as the offline computation's by default; 0: skip.",
                                   min=0)
    checkpoint: Path | str | None = option(None, "Local weights (state dict or timm checkpoint).")
    pretrained: bool = option(False, "Fetch timm's pretrained weights.", negatable=True)
    require_locked_clocks: bool = option(False, "Refuse to measure unless clocks are locked.")
    profile: bool = option(True, "Count ops/kernels with torch.profiler.", negatable=True)
    power_seconds: float = option(2.0, "Seconds per variant of power sampling (GPU).", min=0)
    seed: int = option(0, "Seed for inputs and random pruning.", min=0, max=SEED_MAX)

    def check(self) -> BenchConfig:
        """Raise for settings outside their ranges (`pomt.checks.check_options`) before anything is built."""
        check_options(self)
        check_threads(self.threads)
        if self.keep_rate is not None and not self.keep_rate > 0:
            raise SettingError(f"--keep-rate must lie in (0, 1], got {self.keep_rate:g}")
        if self.keep_rate is not None and self.remove is not None:
            raise SettingError("--remove and --keep-rate both say how many tokens to remove: give one")
        if isinstance(self.methods, str) and not self.methods.replace(",", "").strip():
            raise SettingError(f"--methods names no variant ({self.methods!r}); give one or more of "
                               f"{', '.join(VALID_METHODS)}")
        if self.dataset_root is not None and not Path(self.dataset_root).is_dir():
            raise DatasetError(f"dataset folder not found: {self.dataset_root}")
        return self


@dataclass
class BenchResult:
    """One benchmark: a row per variant and the run's metadata."""

    run: RunSetup
    rows: list[dict]
    meta: dict = field(default_factory=dict)

    @property
    def stem(self) -> str:
        return self.run.stem


@dataclass(frozen=True)
class _Setup:
    """The configuration, its schedule and the run they resolve to (a sweep changes the run per cell)."""

    config: BenchConfig
    schedule: Schedule | None
    run: RunSetup
    match: str = "none"

    def workload(self) -> Workload:
        """The run as a workload: what `pomt.workload.prepare.prepare` builds the model and input from."""
        config, run = self.config, self.run
        return Workload(model=run.model, batch_size=run.batch_size, input_size=run.input_size, device=run.device,
                        threads=config.threads, allocator=config.allocator, dtype=config.dtype,
                        backend=config.backend, require_locked_clocks=config.require_locked_clocks, seed=config.seed)


def resolve(config: BenchConfig) -> _Setup:
    """Validate the configuration and resolve the run before any model is built."""
    config.check()
    variant_methods(config.methods)
    schedule = load_schedule(config.schedule) if config.schedule is not None else None
    if config.model is None and schedule is None:
        raise ScheduleError("give --model or a --schedule (whose model is used)")
    match = resolve_match(config, schedule is not None)
    if config.dtype is None:  # a schedule is measured in the dtype it was made for unless told otherwise
        config = replace(config, dtype=schedule.dtype if schedule is not None else "float32")
    if config.backend is None:  # and on its runtime: a schedule verified as CUDA graphs ran 0.86x eager on an H200
        config = replace(config, backend=schedule.backend_name if schedule is not None else Backend.EAGER.value)
    batch = config.batch_size if config.batch_size is not None else (schedule.batch_size if schedule else 1)
    size = config.input_size if config.input_size is not None else (schedule.input_size if schedule else None)
    run = prepare_run(config.model or schedule.model, config.device, config.threads, batch, size,
                      config.require_locked_clocks, config.allocator)
    return _Setup(config, schedule, run, match)


def resolve_match(config: BenchConfig, has_schedule: bool) -> str:
    """latency, flops or none: what `config.match` means with or without a schedule (see its help)."""
    if config.match not in MATCHES:
        raise SettingError(f"--match must be one of {', '.join(MATCHES)}, got {config.match!r}")
    given = [flag for flag, value in (("--remove", config.remove), ("--r", config.r),
                                      ("--keep-rate", config.keep_rate)) if value is not None]
    if config.match == "auto":
        return "latency" if has_schedule and not given else "none"
    if config.match != "none" and not has_schedule:
        raise ScheduleError(f"--match {config.match} needs a --schedule whose {config.match} the reducers match")
    if config.match != "none" and given:
        raise SettingError(f"--match {config.match} sets every reducer's amount: leave out {', '.join(given)}")
    return config.match


def run_benchmark(config: BenchConfig, progress: bool | None = None) -> BenchResult:
    """Benchmark the configured variants at one batch size and input size."""
    return _run_cell(resolve(config), progress)


def _run_cell(setup: _Setup, progress: bool | None, schedule_here: bool = True) -> BenchResult:
    config, schedule = setup.config, setup.schedule if schedule_here else None
    prepared = prepare(setup.workload(), config.pretrained, config.checkpoint, run=setup.run)
    run, base, geometry, x = prepared.setup, prepared.model, prepared.geometry, prepared.x
    del prepared  # no reference to the base model but `base`, deleted once its copies, the variants, are built
    device, batch, size, backend = run.device, run.batch_size, run.input_size, parse_backend(config.backend)
    if schedule is not None:  # another model's schedule: apply_schedule warns, once
        schedule.check_geometry(geometry)
    predicted = predictor(schedule, config.schedule, geometry) if schedule is not None else None

    match = setup.match if schedule is not None else "none"
    reductions = plan_reductions(config.methods, geometry, config.remove, config.r, config.prune_block,
                                 config.keep_rate, schedule, amounts_later=match != "none")
    flops_at = flops_function(base, x[:1]) if match != "none" else None
    if match == "flops":
        reductions = match_flops(reductions, geometry, flops_at, config.prune_block)
    matches: list[Match] = []
    if match == "latency":
        target = build_variant(base, next(r for r in reductions if r.name == SCHEDULE), schedule, batch,
                               config.seed).model
        timing = Timing(device, config.threads, config.backend, config.match_rounds, max(1, config.warmup),
                        config.seed)
        reductions, matches = match_latency(base, x, reductions, target, geometry, flops_at, timing,
                                            config.prune_block, progress)
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
        data = accuracy_data(config.accuracy_samples, config.dataset_root, config.agreement, variants[0].model, size,
                             batch, config.seed)
        notes: list[str] = []
        with contextlib.ExitStack() as programs:
            forwards = {v.name: programs.enter_context(build_forward(v.model, x, backend=backend, device=device,
                                                                     threads=threads, cache_key="latency"))
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
        # last: a process that ran the accuracy passes timed pruned models 1.5-3% slower after (hosted_calibration)
        accuracy_kind, samples, right = add_accuracy(rows, variants, config.accuracy_samples, data, device, batch,
                                                     config.seed, progress)
        bar.update()
    _add_timing(rows, timing.stats, batch)
    for row in rows.values():
        row["accuracy_kind"] = accuracy_kind
    for m in matches:
        rows[m.name].update(setting=m.setting, match_ratio=m.chosen.ratio, match_ci_low=m.chosen.ci[0],
                            match_ci_high=m.chosen.ci[1])
    meta = {
        "model": run.model,
        "device": device,
        "fingerprint": run.fingerprint.to_dict(),
        "threads": threads,
        "rounds": config.rounds,
        "calls_per_round": config.calls_per_round,
        "warmup": config.warmup,
        "batch_size": batch,
        "input_size": list(size),
        "geometry": geometry.to_dict(),
        "schedule": str(config.schedule) if isinstance(config.schedule, (str, Path)) else None,
        "accuracy_kind": accuracy_kind,
        "accuracy_samples": samples,
        "match": match,
        "matches": [m.to_dict() for m in matches],
        "comparisons": [c.to_dict() for c in compare(list(rows.values()), samples, right)],
        "dtype": config.dtype,
        "backend": backend_info(backend),
        "clocks": {"before": before, "after": after},
        "notes": sorted(set(notes)),
    }
    return BenchResult(run, list(rows.values()), meta)


def _forward(variant: Variant, x: torch.Tensor):
    model = variant.model
    return lambda: model(x)


def _static_row(variant: Variant, x: torch.Tensor, run: RunSetup, predicted: Predictor | None) -> dict:
    """The columns that need no timing: identity, tokens, FLOPs per image, parameters, predicted ratio."""
    reduction, batch, size = variant.reduction, run.batch_size, run.input_size
    params = sum(p.numel() for p in variant.model.parameters())
    return {
        "model": run.architecture,
        "method": variant.name,
        "batch_size": batch,
        "input_size": size[0],
        "tokens_kept": variant.tokens_kept,
        "predicted_ratio": None if predicted is None else predicted(reduction.method, reduction.removal),
        "gflops": count_flops(variant.model, x) / batch / 1e9,
        "params_m": params / 1e6,
        "clocks_locked": run.fingerprint.clocks_locked,
        "reducer": reduction.method or "",
        "amount": reduction.amount,
        "removal": {str(k): v for k, v in sorted(reduction.removal.items())},
    }


def _add_timing(rows: dict[str, dict], stats: dict, batch: int) -> None:
    baseline = stats[BASELINE].median_ms
    reference = stats[SCHEDULE].median_ms if SCHEDULE in stats else None
    for name, row in rows.items():
        s = stats[name]
        row.update(
            latency_ms=s.median_ms,
            latency_iqr_ms=s.iqr_ms,
            latency_min_ms=s.min_ms,
            latency_p10_ms=s.p10_ms,
            samples=s.samples,
            throughput_ips=batch * 1e3 / s.median_ms,
            speedup=baseline / s.median_ms,
            speedup_min=stats[BASELINE].min_ms / s.min_ms,
            latency_vs_schedule=s.median_ms / reference if reference else None,
        )
        ratio = row.pop("predicted_ratio", None)
        predicted = stats[BASELINE].median_ms * ratio if ratio else None  # this run's speed, drift cancels
        row["predicted_ms"] = predicted
        row["measured_over_predicted"] = s.median_ms / predicted if predicted else None
        row["predicted_error_pct"] = 100 * (s.median_ms - predicted) / predicted if predicted else None


def _add_resources(
    row: dict, variant: Variant, x: torch.Tensor, device: str, config: BenchConfig, notes: list[str]
) -> None:
    forward = _forward(variant, x)
    memory = peak_memory(forward, variant.model, device)
    row.update(peak_mem_mb=memory.peak_mb, peak_mem_kind=memory.kind)
    power = power_and_energy(forward, device, x.shape[0], config.power_seconds)
    row.update(power_w=power.power_w, energy_j_per_img=power.energy_j_per_img)
    if power.power_w is None:
        notes.append(power.note)
    if config.profile:
        summary = profile_forward(forward, device)
        row.update(
            ops_per_forward=summary.ops_per_forward,
            device_time_ms=summary.device_time_ms,
            profiled_wall_ms=summary.profiled_wall_ms,
            profile_kind=summary.kind,
        )
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


def run_sweep(
    config: BenchConfig, batch_sizes: Sequence[int], input_sizes: Sequence[int], progress: bool | None = None
) -> SweepResult:
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
        warnings.warn(
            f"the schedule applies at input size {schedule.input_size[0]} only; other cells leave it out",
            stacklevel=2,
        )
    cells: dict[tuple[int, int], BenchResult] = {}
    bar = tqdm(runs.items(), desc="sweep", unit="cell", disable=None if progress is None else not progress)
    for (batch, size), run in bar:
        bar.set_postfix(batch=batch, size=size)
        here = schedule is not None and run.input_size == tuple(schedule.input_size)
        cells[(batch, size)] = _run_cell(replace(setup, run=run), progress, schedule_here=here)
    return SweepResult(setup.run, batch_sizes, input_sizes, cells)
