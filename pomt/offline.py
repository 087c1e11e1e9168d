"""The offline computation: measure L(n), find steps, estimate A(n), choose a removal, write the schedule.

One function per stage; `run_offline` strings them together for the CLI and `offline_computation.py`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from pomt import accuracy as acc
from pomt.checks import METHODS, check_method, check_prune_block
from pomt.device import clock_snapshot
from pomt.errors import DatasetError, GridError, PolicyError
from pomt.geometry import Geometry, model_geometry
from pomt.io import atomic_write_csv
from pomt.measure import LatencyPoint, measure_point
from pomt.models import create_model
from pomt.options import option
from pomt.plots import plot_offline
from pomt.policy import POLICIES, Decision, choose_budget, choose_step, choose_utility, utility_values
from pomt.run_setup import RunSetup, prepare_run
from pomt.schedule import BlockRemoval, Schedule, save_schedule, utc_now
from pomt.search import PointStore, adaptive_search, full_search, remeasure_spikes, steps_of_points, token_grid
from pomt.steps import StepReport
from pomt.tokens import truncate_tokens

CURVE_COLUMNS = (
    "tokens", "median_ms", "iqr_ms", "samples", "accuracy", "accuracy_interpolated",
    "min_ms", "p10_ms", "threads", "device",
)


SEARCHES = ("adaptive", "full")


@dataclass(frozen=True)
class OfflineConfig:
    """Everything one offline run needs; each field is also the CLI option of its name (`pomt.options`)."""

    model: str = option("deit_base", "timm model name or alias.")
    batch_size: int = option(4, "Batch size the schedule is for.")
    input_size: int | tuple[int, int] | None = option(None, "Input size in pixels (default: the model's).")
    device: str = option("auto", "auto (cuda if present, else cpu), cpu, cuda[:N], mps.")
    threads: int | None = option(None, "CPU threads, fixed and recorded (default: torch's).")
    grid_token_start: int | None = option(None, "First kept-token count (default N).")
    grid_token_stop: int | None = option(None, "Last kept-token count (default P+1).")
    grid_token_stride: int = option(1, "Grid step in tokens.")
    search: str = option("adaptive", "Coarse grid refined at steps (adaptive), or every count.", choices=SEARCHES)
    coarse_stride: int | None = option(None, "Adaptive search's first-pass stride.")
    significance: float = option(5.0, "Steps must exceed this many noise units.")
    min_run_s: float = option(0.2, "Seconds of timing per latency point (at least).")
    dataset_root: Path | None = option(
        None, "ImageFolder for accuracy (top-1), or a folder of images (agreement with the unpruned model)."
    )
    checkpoint: Path | None = option(None, "Local checkpoint (state dict or timm file).")
    pretrained: bool | None = option(
        None, "Pretrained weights (default: only when accuracy is measured and no checkpoint is given).",
        negatable=True,
    )
    accuracy_samples: int = option(500, "Images in the seeded accuracy sample.")
    accuracy_points: int = option(12, "Token counts at which A(n) is measured.")
    accuracy_batch_size: int = option(32, "Images per forward while measuring accuracy.", min=1)
    alpha: float = option(0.5, "Utility weight of latency against accuracy.")
    policy: str | None = option(
        None, "Default: budget with a budget, utility with accuracy, else step.", choices=POLICIES
    )
    latency_budget_ms: float | None = option(None, "Latency the schedule must meet.")
    min_accuracy: float | None = option(None, "Lowest acceptable A(n), in [0, 1].")
    max_remove: int | None = option(None, "Most tokens the schedule may remove.")
    min_gain: float = option(0.03, "Least predicted gain (fraction) worth pruning for.")
    prune_block: int = option(3, "Block (0-based) where tokens are removed.")
    method: str = option("pomt", "Reducer the schedule is applied with.", choices=METHODS)
    output_dir: Path = option(Path("bin"), "Where outputs are written.")
    resume: bool = option(False, "Continue a killed search; measure only what is missing.")
    require_locked_clocks: bool = option(False, "Refuse to measure unless clocks are locked.")
    latency_only: bool = option(False, "Measure latency only (no accuracy).")
    accuracy_only: bool = option(False, "Estimate accuracy only; write its CSV.")
    accuracy_curve: Path | None = option(None, "Accuracy CSV from an --accuracy-only run.")
    seed: int = option(0, "Seed for the accuracy sample and random pruning.")
    progress: bool = option(True, "Show progress bars.", negatable=True)


@dataclass
class OfflineResult:
    """What a run found and wrote."""

    geometry: Geometry
    device: dict
    points: list[LatencyPoint] = field(default_factory=list)
    report: StepReport | None = None
    accuracy: acc.AccuracyCurve | None = None
    decision: Decision | None = None
    overhead_ms: float = 0.0
    paths: dict[str, Path] = field(default_factory=dict)
    measure_seconds: float = 0.0
    measured_points: int = 0


def validate(config: OfflineConfig) -> None:
    """Reject bad settings before anything is resolved or built (`prepare_run` checks the rest)."""
    check_method(config.method)
    if config.search not in SEARCHES:
        raise GridError(f"unknown search {config.search!r}; choose one of {', '.join(SEARCHES)}")
    if config.latency_only and config.accuracy_only:
        raise PolicyError("--latency-only and --accuracy-only exclude each other")
    if config.policy is not None and config.policy not in POLICIES:
        raise PolicyError(f"unknown policy {config.policy!r}; choose one of {', '.join(POLICIES)}")
    if config.policy == "budget" and config.latency_budget_ms is None:
        raise PolicyError("the budget policy needs --latency-budget-ms")
    if not 0.0 <= config.alpha <= 1.0:
        raise PolicyError(f"--alpha must lie in [0, 1], got {config.alpha}")
    if config.accuracy_samples < 1:
        raise PolicyError(f"--accuracy-samples must be at least 1, got {config.accuracy_samples}")
    if config.dataset_root is not None and not Path(config.dataset_root).is_dir():
        raise DatasetError(f"dataset folder not found: {config.dataset_root}")


def needs_accuracy_model(config: OfflineConfig) -> bool:
    return config.dataset_root is not None and not config.latency_only and config.accuracy_curve is None


def build_model(config: OfflineConfig, setup: RunSetup) -> nn.Module:
    """The model at the run's input size on its device; weights only when accuracy is measured here."""
    pretrained = config.pretrained
    if pretrained is None:
        pretrained = needs_accuracy_model(config) and config.checkpoint is None
    model = create_model(setup.model, setup.input_size, pretrained=pretrained, checkpoint=config.checkpoint)
    return model.to(setup.device)


def overhead_latency(
    model: nn.Module, x: torch.Tensor, device: str, threads: int | None, min_run_s: float
) -> float:
    """Latency (ms) of the model with its blocks removed: embedding + head, which pruning never saves."""
    blocks = model.blocks
    model.blocks = type(blocks)()  # swapped out for the measurement, no copy of the weights
    try:
        return measure_point(lambda: model(x), 0, device=device, threads=threads, min_run_s=min_run_s).median_ms
    finally:
        model.blocks = blocks


def latency_measure(
    model: nn.Module, x: torch.Tensor, device: str, threads: int | None, min_run_s: float
) -> Callable[[int], LatencyPoint]:
    """A function n → LatencyPoint of one full forward with n tokens through every block."""

    def measure(n: int) -> LatencyPoint:
        with truncate_tokens(model, n):
            return measure_point(
                lambda: model(x), n, device=device, threads=threads, min_run_s=min_run_s, warmup=1,
                snapshot=lambda: clock_snapshot(device),
            )

    return measure


def latency_grid(config: OfflineConfig, geometry: Geometry) -> list[int]:
    """The token counts to search, checked against the model (prune block and range too)."""
    check_prune_block(config.prune_block, geometry.depth, "--prune-block")
    if config.max_remove is not None and not 0 <= config.max_remove <= geometry.patch_tokens - 1:
        raise GridError(f"--max-remove {config.max_remove} is outside [0, {geometry.patch_tokens - 1}]")
    return token_grid(
        config.grid_token_start if config.grid_token_start is not None else geometry.num_tokens,
        config.grid_token_stop if config.grid_token_stop is not None else geometry.min_tokens,
        config.grid_token_stride,
        min_tokens=geometry.min_tokens,
        max_tokens=geometry.num_tokens,
    )


def search_latency(
    config: OfflineConfig, model: nn.Module, geometry: Geometry, device: str, grid: list[int], store: PointStore
) -> list[LatencyPoint]:
    """Full or adaptive search over the token grid, resuming from the store."""
    x = torch.randn(config.batch_size, 3, *geometry.input_size, device=device)
    measure = latency_measure(model, x, device, config.threads, config.min_run_s)
    if config.search == "full":
        points = full_search(measure, grid, store=store, progress=config.progress)
        points = remeasure_spikes(points, measure, k=config.significance, store=store)
    else:
        points = adaptive_search(
            measure, grid, coarse_stride=config.coarse_stride, k=config.significance, store=store,
            progress=config.progress,
        )
    return [points[n] for n in sorted(points)]


def estimate_accuracy(
    config: OfflineConfig, model: nn.Module, geometry: Geometry, device: str, extra_counts: list[int]
) -> acc.AccuracyCurve:
    """A(n) on a seeded, bounded sample of the dataset folder with random pruning after embedding."""
    dataset, kind = acc.open_image_folder(config.dataset_root, acc.eval_transform(model, geometry.input_size))
    subset = acc.seeded_subset(dataset, config.accuracy_samples, config.seed)
    counts = acc.accuracy_token_counts(geometry.min_tokens, geometry.num_tokens, config.accuracy_points, extra_counts)
    loader = acc.image_loader(subset, config.accuracy_batch_size)
    return acc.measure_accuracy(model, loader, counts, kind, device=device, seed=config.seed,
                                progress=config.progress)


def decide(
    config: OfflineConfig,
    geometry: Geometry,
    points: list[LatencyPoint],
    report: StepReport,
    accuracy: Mapping[int, float] | None,
    overhead_ms: float,
) -> Decision:
    """Apply the chosen policy (budget if a budget is given, utility with accuracy, else step)."""
    curve = {p.tokens: p.median_ms for p in points}
    if geometry.num_tokens not in curve:
        raise GridError(f"the latency grid must include N = {geometry.num_tokens} (the unpruned baseline)")
    max_remove = geometry.patch_tokens - 1 if config.max_remove is None else config.max_remove
    common = dict(
        num_tokens=geometry.num_tokens, prefix_tokens=geometry.prefix_tokens, depth=geometry.depth,
        block=config.prune_block, max_remove=max_remove, overhead_ms=overhead_ms,
    )
    policy = config.policy or ("budget" if config.latency_budget_ms is not None else
                               "utility" if accuracy is not None else "step")
    if policy == "utility":
        if accuracy is None:
            raise PolicyError("the utility policy needs accuracy: give --dataset-root or --accuracy-curve")
        return choose_utility(curve, accuracy, alpha=config.alpha, min_accuracy=config.min_accuracy, **common)
    if policy == "budget":
        return choose_budget(curve, latency_budget_ms=config.latency_budget_ms, accuracy=accuracy,
                             min_accuracy=config.min_accuracy, **common)
    return choose_step(curve, report.steps, min_gain=config.min_gain, accuracy=accuracy,
                       min_accuracy=config.min_accuracy, **common)


def build_schedule(
    config: OfflineConfig,
    geometry: Geometry,
    decision: Decision,
    report: StepReport,
    accuracy: acc.AccuracyCurve | None,
    fingerprint: dict,
    curve_name: str,
) -> Schedule:
    prune = (BlockRemoval(decision.block, decision.remove),) if decision.remove > 0 else ()
    return Schedule(
        model=geometry.model,
        input_size=geometry.input_size,
        batch_size=config.batch_size,
        num_tokens=geometry.num_tokens,
        prefix_tokens=geometry.prefix_tokens,
        depth=geometry.depth,
        method=config.method,
        prune=prune,
        policy={
            "name": decision.policy,
            "alpha": config.alpha if decision.policy == "utility" else None,
            "max_remove": geometry.patch_tokens - 1 if config.max_remove is None else config.max_remove,
            "min_gain": config.min_gain,
            "latency_budget_ms": config.latency_budget_ms,
            "min_accuracy": config.min_accuracy,
            "prune_block": config.prune_block,
            "reason": decision.reason,
        },
        predicted={
            "baseline_ms": round(decision.baseline_ms, 4),
            "pruned_ms": round(decision.predicted_ms, 4),
            "gain": round(decision.gain, 5),
            "accuracy": decision.accuracy,
            "accuracy_kind": accuracy.kind if accuracy else None,
        },
        steps=[_rounded(step.to_dict()) for step in report.steps],
        device=fingerprint,
        curve=curve_name,
        created=utc_now(),
    )


def _rounded(row: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}


def curve_rows(points: list[LatencyPoint], accuracy: acc.AccuracyCurve | None) -> list[dict]:
    values = accuracy.at(p.tokens for p in points) if accuracy else {}
    rows = []
    for point in points:
        row = _rounded(point.to_row())
        if accuracy:
            row["accuracy"] = round(values[point.tokens], 6)
            row["accuracy_interpolated"] = point.tokens not in accuracy.values
        rows.append(row)
    return rows


def run_offline(config: OfflineConfig) -> OfflineResult:
    """Run every stage the configuration asks for and write the outputs; see the module docstring."""
    validate(config)
    setup = prepare_run(config.model, config.device, config.threads, config.batch_size, config.input_size,
                        config.require_locked_clocks)
    device, fingerprint, stem = setup.device, setup.fingerprint, setup.stem
    model = build_model(config, setup)
    geometry = model_geometry(model)
    grid = latency_grid(config, geometry)
    out = Path(config.output_dir)
    result = OfflineResult(geometry=geometry, device=fingerprint)

    if config.accuracy_curve is not None:
        result.accuracy = acc.load_accuracy_curve(
            config.accuracy_curve, (geometry.min_tokens, geometry.num_tokens)
        )
    if config.accuracy_only:
        if config.dataset_root is None:
            raise PolicyError("--accuracy-only needs --dataset-root")
        result.accuracy = estimate_accuracy(config, model, geometry, device, [])
        result.paths["accuracy"] = acc.save_accuracy_curve(out / f"{stem}.accuracy.csv", result.accuracy)
        return result

    store_path = out / f"{stem}.points.jsonl"
    if not config.resume:
        store_path.unlink(missing_ok=True)
    store = PointStore(store_path, {
        "model": geometry.model, "batch_size": config.batch_size, "input_size": list(geometry.input_size),
        "device": device, "device_name": fingerprint.get("name"), "threads": fingerprint.get("threads"),
    })
    started = time.perf_counter()
    before = len(store.records())
    result.points = search_latency(config, model, geometry, device, grid, store)
    x = torch.randn(config.batch_size, 3, *geometry.input_size, device=device)
    result.overhead_ms = overhead_latency(model, x, device, config.threads, config.min_run_s)
    result.measure_seconds = time.perf_counter() - started
    result.measured_points = len(store.records()) - before
    result.report = steps_of_points(result.points, config.significance)

    if needs_accuracy_model(config):
        extra = [s.tokens for s in result.report.steps] + [s.upper_tokens for s in result.report.steps]
        result.accuracy = estimate_accuracy(config, model, geometry, device, extra)
        result.paths["accuracy"] = acc.save_accuracy_curve(out / f"{stem}.accuracy.csv", result.accuracy)

    accuracy_at = result.accuracy.at(p.tokens for p in result.points) if result.accuracy else None
    result.decision = decide(config, geometry, result.points, result.report, accuracy_at, result.overhead_ms)
    curve_name = f"{stem}.curve.csv"
    result.paths["curve"] = atomic_write_csv(out / curve_name, curve_rows(result.points, result.accuracy),
                                             CURVE_COLUMNS)
    schedule = build_schedule(config, geometry, result.decision, result.report, result.accuracy,
                              fingerprint, curve_name)
    result.paths["schedule"] = save_schedule(schedule, out / f"{stem}.schedule.json")
    utility = None
    if accuracy_at is not None:
        utility = utility_values(
            {p.tokens: p.median_ms for p in result.points}, accuracy_at, alpha=config.alpha,
            num_tokens=geometry.num_tokens, depth=geometry.depth, block=config.prune_block,
            overhead_ms=result.overhead_ms,
        )
    result.paths["plot"] = plot_offline(
        out / f"{stem}.png",
        f"{geometry.model} on {fingerprint.get('name', device)}, batch {config.batch_size}, "
        f"{geometry.input_size[0]}x{geometry.input_size[1]} px",
        result.points,
        result.report.steps,
        result.decision.kept_tokens,
        accuracy=result.accuracy.values if result.accuracy else None,
        accuracy_kind=result.accuracy.kind if result.accuracy else None,
        utility=utility,
    )
    result.paths["points"] = store_path
    return result
