"""The offline computation: a latency curve measured so that drift cancels, its steps confirmed by paired
measurement, A(n), a removal chosen by a policy that charges the method's own cost, the patched model
verified against the unpruned one on this device, and the schedule written.

Stages, one function each: `prepare_live` / `prepare_replay` (the run, the model, the grid and where
latency comes from: this machine through the journal `<stem>.trace.csv`, or a recorded trace with
`--replay`), `pomt.measurement.search.LatencySearch.run`, `estimate_accuracy`, `rank` (policies, with
`pomt.choice.verify.method_cost`), `pomt.choice.verify.verify` (journal `<stem>.verify.csv`), the same again in a fresh
process (`pomt.choice.fresh`, `--no-verify-fresh` skips it; not journalled: a resumed run repeats it), `write_outputs`.
`run_offline` strings them together for the CLI and `offline_computation.py`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from pomt.checks import METHODS, check_method, check_prune_block
from pomt.choice import accuracy as acc
from pomt.choice.fresh import (
    FreshJob,
    StepJob,
    held_in_both,
    placement_hint,
    step_holds,
    step_rounds_in_fresh_process,
    verify_in_fresh_process,
)
from pomt.choice.policy import POLICIES, Decision, Setting, rank_budget, rank_step, rank_utility, utility_values
from pomt.choice.verify import (
    CandidateResult,
    Verification,
    choose,
    cost_function,
    method_cost,
    schedule_forward_at,
    verify,
)
from pomt.device import fingerprint_hash
from pomt.errors import DatasetError, GridError, PolicyError, TraceError
from pomt.formats.curve import rounded, write_curve
from pomt.formats.schedule import BlockRemoval, Schedule, save_schedule, utc_now
from pomt.formats.trace import check_trace_geometry, read_trace
from pomt.measurement.confirmation import confirmed_steps
from pomt.measurement.drift import corrected_values
from pomt.measurement.search import LatencySearch, SearchResult, SearchSettings
from pomt.measurement.sources import LiveSource, ReplaySource, Session, journal_end_s
from pomt.models.geometry import Geometry, model_geometry
from pomt.models.registry import create_model, resolve_model_name
from pomt.options import option
from pomt.plots import plot_offline
from pomt.runtimes import Backend
from pomt.workload.prepare import Prepared, Workload, live_session, open_journal, prepare, settings_keys, workload_grid
from pomt.workload.setup import RunSetup

SEARCHES = ("adaptive", "full")
BLIND_SHARE = 0.25  # of the patch tokens: the most a schedule removes by default when accuracy is unknown


@dataclass(frozen=True)
class OfflineConfig:
    """What the offline computation does with a workload (`pomt.workload.prepare.Workload`) besides measuring it
    (`SearchSettings`); each field is also the CLI option of its name (`pomt.options`)."""

    search: str = option("adaptive", "Coarse grid refined at candidate steps (adaptive), or every count.",
                         choices=SEARCHES)
    replay: Path | None = option(None, "Analyse a recorded trace (CSV with its JSON sidecar) instead of measuring; "
                                       "model, batch and input size are the trace's.")
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
    max_remove: int | None = option(None, "Most tokens the schedule may remove (default: all but one with an "
                                          "accuracy estimate; a quarter of the patch tokens without one, since "
                                          "pruning more would be a guess about accuracy, not latency).")
    min_gain: float = option(0.03, "Least speedup (fraction) worth pruning for, predicted and measured.")
    prune_block: int = option(3, "Block (0-based) where tokens are removed.")
    method: str = option("pomt", "Reducer the schedule is applied with.", choices=METHODS)
    verify: bool = option(True, "Measure the patched model against the unpruned one before shipping.",
                          negatable=True)
    verify_rounds: int = option(10, "Rounds of the verification (every candidate once per round).", min=3)
    verify_candidates: int = option(2, "Best-ranked removals verified (plus the other side of a targeted step).",
                                    min=1)
    verify_fresh: bool = option(True, "Measure the confirmed steps within reach, and the removals that qualified, "
                                      "once more in a fresh process (a step near N can sit elsewhere there); "
                                      "keep only what holds in both.",
                                negatable=True)
    latency_only: bool = option(False, "Measure latency only (no accuracy).")
    accuracy_only: bool = option(False, "Estimate accuracy only; write its CSV.")
    accuracy_curve: Path | None = option(None, "Accuracy CSV from an --accuracy-only run.")


@dataclass
class OfflineResult:
    """What a run found and wrote."""

    geometry: Geometry
    device: dict
    batch_size: int  # the run's: a replay's is its trace's, whatever --batch-size says
    search: SearchResult | None = None
    accuracy: acc.AccuracyCurve | None = None
    decision: Decision | None = None
    verification: Verification | None = None
    fresh_verification: Verification | None = None  # the same candidates measured in a new process
    fresh_steps: list[dict] = field(default_factory=list)  # the steps within reach, checked in a new process
    method_cost: dict[int, float] = field(default_factory=dict)
    schedule: Schedule | None = None
    paths: dict[str, Path] = field(default_factory=dict)
    measure_seconds: float = 0.0
    notes: list[str] = field(default_factory=list)


@dataclass
class Run:
    """A prepared run: the workload made concrete, and where its latency comes from."""

    prepared: Prepared
    session: Session | None
    replay: Path | None = None

    @property
    def setup(self) -> RunSetup:
        return self.prepared.setup

    @property
    def geometry(self) -> Geometry:
        return self.prepared.geometry


def validate(config: OfflineConfig, settings: SearchSettings) -> None:
    """Reject bad settings before anything is resolved or built (`prepare_run` checks the rest)."""
    check_method(config.method)
    settings.check()
    if config.search not in SEARCHES:
        raise GridError(f"unknown search {config.search!r}; choose one of {', '.join(SEARCHES)}")
    if config.latency_only and config.accuracy_only:
        raise PolicyError("--latency-only and --accuracy-only exclude each other")
    if config.replay is not None and config.accuracy_only:
        raise PolicyError("--replay analyses latency; --accuracy-only measures none")
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


def check_pruning(config: OfflineConfig, geometry: Geometry) -> None:
    """The pruning block and the removal limit, against the model."""
    check_prune_block(config.prune_block, geometry.depth, "--prune-block")
    if config.max_remove is not None and not 0 <= config.max_remove <= geometry.patch_tokens - 1:
        raise GridError(f"--max-remove {config.max_remove} is outside [0, {geometry.patch_tokens - 1}]")


def max_remove(config: OfflineConfig, geometry: Geometry, accuracy_known: bool) -> int:
    """The most tokens a schedule may remove: the setting, else all but one patch token when accuracy is
    known, else a quarter of the patch tokens (`BLIND_SHARE`)."""
    if config.max_remove is not None:
        return config.max_remove
    return geometry.patch_tokens - 1 if accuracy_known else int(BLIND_SHARE * geometry.patch_tokens)


def needs_accuracy_model(config: OfflineConfig) -> bool:
    return config.dataset_root is not None and not config.latency_only and config.accuracy_curve is None


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
    return Run(prepared, live_session(workload, prepared, journal))


def prepare_replay(workload: Workload, config: OfflineConfig) -> Run:
    """Set up analysing a recorded trace: the model it names (for its geometry), the trace's own counts."""
    trace = read_trace(config.replay)
    meta = trace.meta
    name = resolve_model_name(meta["model"])
    model = create_model(name, tuple(meta["input_size"]))
    geometry = model_geometry(model)
    check_trace_geometry(trace, geometry.num_tokens, geometry.prefix_tokens, name)
    check_pruning(config, geometry)
    recorded = meta.get("device") if isinstance(meta.get("device"), dict) else {
        "kind": "cpu", "name": meta.get("cpu"), "threads": meta.get("threads"), "torch": meta.get("torch"),
        "timm": meta.get("timm"),
    }
    setup = RunSetup(name, "replay", {**recorded, "replayed_from": str(config.replay)}, int(meta["batch_size"]),
                     geometry.input_size)
    if geometry.num_tokens not in trace.counts:
        raise GridError(f"trace {config.replay} has no visit at N = {geometry.num_tokens}, the reference")
    grid = [n for n in workload_grid(workload, geometry) if n in set(trace.counts)]
    return Run(Prepared(setup, geometry, grid, model, None), Session(ReplaySource(trace)), config.replay)


def estimate_accuracy(workload: Workload, config: OfflineConfig, run: Run, extra: list[int]) -> acc.AccuracyCurve:
    """A(n) on a seeded, bounded sample of the dataset folder with random pruning after embedding."""
    model, geometry = run.prepared.model, run.geometry
    dataset, kind = acc.open_image_folder(config.dataset_root, acc.eval_transform(model, geometry.input_size))
    subset = acc.seeded_subset(dataset, config.accuracy_samples, workload.seed)
    counts = acc.accuracy_token_counts(geometry.min_tokens, geometry.num_tokens, config.accuracy_points, extra)
    loader = acc.image_loader(subset, config.accuracy_batch_size)
    device = run.setup.device if run.replay is None else "cpu"
    return acc.measure_accuracy(model, loader, counts, kind, device=device, seed=workload.seed,
                                progress=workload.progress)


def policy_name(config: OfflineConfig, accuracy_known: bool) -> str:
    return config.policy or ("budget" if config.latency_budget_ms is not None else
                             "utility" if accuracy_known else "step")


def rank(config: OfflineConfig, setting: Setting, search: SearchResult) -> list[Decision]:
    """The policy's candidates that remove something, best first (see `pomt.choice.policy`)."""
    policy = policy_name(config, setting.accuracy is not None)
    if policy == "utility":
        if setting.accuracy is None:
            raise PolicyError("the utility policy needs accuracy: give --dataset-root or --accuracy-curve")
        return [d for d in rank_utility(setting, config.alpha) if d.remove > 0]
    if policy == "budget":
        return [d for d in rank_budget(setting, config.latency_budget_ms) if d.remove > 0]
    return rank_step(setting, search.steps, config.min_gain)


def nothing(setting: Setting, config: OfflineConfig, search: SearchResult, reason: str | None = None,
            code: str | None = None) -> Decision:
    """The decision to remove nothing, with the policy's reason unless given."""
    policy = policy_name(config, setting.accuracy is not None)
    if reason is None:
        confirmed = len(search.steps)
        reason = (f"no confirmed step within {setting.limit} removed tokens pays at least {config.min_gain:.1%} at "
                  f"block {setting.block} ({confirmed} step{'s' if confirmed != 1 else ''} confirmed)")
        code = "no_step" if policy == "step" else "no_candidate"
    return setting.nothing(policy, reason, code)


def verification_removals(ranked: list[Decision], count: int) -> list[int]:
    """What verification measures: the best-ranked removals, and the other side of the step the first one
    lands below (its higher count kept), so the step is checked on the patched model too."""
    removals = [d.remove for d in ranked[:count]]
    target = ranked[0].target if ranked else None
    if target is not None:
        removals.append(ranked[0].remove - (target.upper_tokens - target.tokens))
    return sorted({r for r in removals if r > 0})


def build_schedule(workload: Workload, config: OfflineConfig, run: Run, decision: Decision, search: SearchResult,
                   accuracy: acc.AccuracyCurve | None, measurement: dict | None = None,
                   verified: dict | None = None) -> Schedule:
    geometry = run.geometry
    prune = (BlockRemoval(decision.block, decision.remove),) if decision.remove > 0 else ()
    return Schedule(
        model=geometry.model,
        input_size=geometry.input_size,
        batch_size=run.setup.batch_size,
        num_tokens=geometry.num_tokens,
        prefix_tokens=geometry.prefix_tokens,
        depth=geometry.depth,
        method=config.method,
        prune=prune,
        policy={
            "name": decision.policy,
            "alpha": config.alpha if decision.policy == "utility" else None,
            "max_remove": max_remove(config, geometry, accuracy is not None),
            "min_gain": config.min_gain,
            "latency_budget_ms": config.latency_budget_ms,
            "min_accuracy": config.min_accuracy,
            "prune_block": config.prune_block,
            "reason": decision.reason,
            "reason_code": decision.code,
        },
        predicted={
            "baseline_ms": round(decision.baseline_ms, 4),
            "pruned_ms": round(decision.predicted_ms, 4),
            "gain": round(decision.gain, 5),
            "accuracy": decision.accuracy,
            "accuracy_kind": accuracy.kind if accuracy else None,
        },
        steps=[rounded(step.to_dict()) for step in search.steps],
        device=run.setup.fingerprint,
        curve=f"{run.setup.stem}.curve.csv",
        created=utc_now(),
        dtype=workload.dtype if run.replay is None else str(run.setup.fingerprint.get("dtype", "float32")),
        backend=run.setup.fingerprint.get("backend") if run.replay is None else None,
        measurement=measurement,
        verified=verified,
    )


def measurement_record(search: SearchResult, run: Run, decision: Decision, config: OfflineConfig,
                       settings: SearchSettings, fresh_steps: list[dict]) -> dict:
    """How the curve was measured and judged, for the schedule (the drift warning included)."""
    effects = [abs(s.paired_pct) for s in search.steps] + ([100 * decision.gain] if decision.remove else [])
    return {
        "design": "shuffled passes, reference in every pass, drift-corrected pooling, paired step confirmation",
        "search": config.search,
        "passes": settings.passes,
        "coarse_passes": settings.coarse_passes if config.search == "adaptive" else None,
        "reps": search.reps,
        "visits": search.visits,
        "full_grid_visits": search.full_grid_visits,
        "evaluation_ratio": round(search.evaluation_ratio, 4),
        "budget_visits": search.budget_visits,
        "noise_pct": round(100 * search.noise, 3),
        "drift": None if search.drift is None else search.drift.to_dict(),
        "confirmed": len(search.steps),
        "rejected": [{"low": c.low, "high": c.high, "reason": c.reason} for c in search.rejected_candidates],
        "fresh_process_steps": fresh_steps or None,
        "align": settings.align if config.search == "adaptive" else None,
        "screened_edges": [[c.low, c.high] for c in search.screened],
        "warning": search.drift_exceeds(effects),
        "replay": None if run.replay is None else str(run.replay),
        "trace": None if run.replay is not None else f"{run.setup.stem}.trace.csv",
    }


def verify_decision(workload: Workload, config: OfflineConfig, settings: SearchSettings, run: Run,
                    setting: Setting, ranked: list[Decision], search: SearchResult, result: OfflineResult) -> Decision:
    """Measure the method's cost, rank again with it, verify the best candidates; the decision to ship."""
    prepared, n = run.prepared, run.geometry.num_tokens
    removals = verification_removals(ranked, config.verify_candidates)
    if workload.backend == Backend.EAGER.value:
        result.method_cost = method_cost(prepared.model, prepared.x, config.prune_block, config.method, removals,
                                         run.setup.device, workload.threads)
        setting = replace(setting, method_cost=cost_function(result.method_cost))
        ranked = rank(config, setting, search)
        removals = verification_removals(ranked, config.verify_candidates)
    else:
        result.notes.append(f"method cost not measured on {workload.backend} (eager blocks only); verification "
                            "measures the patched model there")
    if not ranked:
        return nothing(setting, config, search, f"with its own cost at block {config.prune_block} measured, no "
                       f"removal is predicted to pay at least {config.min_gain:.1%}", "method_cost")
    schedules = {n - r: build_schedule(workload, config, run, replace(ranked[0], remove=r, kept_tokens=n - r),
                                       search, None) for r in removals}
    what = (f"whole model patched through apply_schedule ({config.method} at block {config.prune_block}); "
            "tokens = tokens kept")
    keys = {"removals": removals, "rounds": config.verify_rounds, "reps": search.reps}
    try:
        journal = open_journal(workload, prepared, "verify", what, keys)
    except TraceError:  # resumed, but the method's cost (measured anew) changed the candidates: verify afresh
        journal = open_journal(replace(workload, resume=False), prepared, "verify", what, keys)
        result.notes.append("the verification started afresh: its candidates changed since the killed run")
    forward_at = schedule_forward_at(prepared.model, prepared.x, schedules, backend=workload.backend,
                                     device=run.setup.device, threads=workload.threads,
                                     cache_dir=Path(workload.output_dir) / prepared.cache_dir)
    session = Session(LiveSource(forward_at, run.setup.device, workload.threads, start_s=journal_end_s(journal)),
                      journal)
    baseline = setting.baseline
    result.verification = verify(
        session, n, removals, reps=search.reps, rounds=config.verify_rounds,
        predicted_ratio={r: setting.predicted(n - r) / baseline for r in removals}, min_gain=config.min_gain,
        min_step=settings.min_step, alpha=settings.step_alpha, seed=workload.seed, progress=workload.progress,
    )
    result.paths["verify"] = journal.path
    chosen = result.verification.chosen
    if chosen is None:
        return nothing(setting, config, search, result.verification.reason, "not_faster")
    fresh_reason = ""
    if config.verify_fresh:
        chosen, fresh_reason = reverify_in_fresh_process(workload, config, settings, search, schedules, result)
        if chosen is None:
            return nothing(setting, config, search, f"verified here, not {fresh_reason}", "not_in_fresh_process")
    by_remove = {d.remove: d for d in ranked}
    beside = f"the other side of the step the policy's first choice targets ({ranked[0].reason})"
    decision = by_remove.get(chosen.remove) or setting.decision(n - chosen.remove, ranked[0].policy, beside,
                                                                ranked[0].code)
    verified = "; ".join(filter(None, [decision.reason, f"verified: {result.verification.reason}", fresh_reason]))
    return replace(decision, reason=verified, code="verified")


def here_only_note(result: OfflineResult) -> str | None:
    """The allocator advice (`placement_hint`) where steps within reach, or the removal, held in this process
    but not in the fresh one; None where none failed there or the advice does not apply."""
    steps = [f for f in result.fresh_steps if not f["held"]]
    what = [f"{len(steps)} of {len(result.fresh_steps)} steps within reach"] if steps else []
    removal_here_only = (result.fresh_verification is not None and result.verification is not None
                         and result.verification.chosen is None)
    if removal_here_only:
        what.append("the removal")
    return placement_hint(result.device, " and ".join(what)) if what else None


def reverify_in_fresh_process(workload: Workload, config: OfflineConfig, settings: SearchSettings,
                              search: SearchResult, schedules: dict[int, Schedule],
                              result: OfflineResult) -> tuple[CandidateResult | None, str]:
    """Measure the candidates that qualified here once more in a fresh process (`pomt.choice.fresh`); the one that
    qualified in both to ship (None: none did) and the fresh verdict. `result.verification` is narrowed to
    the shipped candidate (or to none), so the schedule's `verified` speaks of what ships."""
    here = result.verification
    qualified = [c.remove for c in here.candidates if c.qualifies]
    n = result.geometry.num_tokens
    job = FreshJob(workload, {n - r: schedules[n - r] for r in qualified}, search.reps, config.verify_rounds,
                   config.min_gain, settings.min_step, settings.step_alpha)
    result.fresh_verification = verify_in_fresh_process(job)
    chosen, reason = held_in_both(here, result.fresh_verification, config.min_gain, settings.min_step)
    if chosen is None:
        result.verification = replace(here, chosen=None, reason=f"{here.reason}; not {reason}")
        return None, reason
    mine = next(c for c in here.candidates if c.remove == chosen.remove)
    result.verification = replace(here, chosen=mine, reason=choose([mine], config.min_gain, settings.min_step)[1])
    return chosen, reason


def check_steps_in_fresh_process(workload: Workload, settings: SearchSettings, search: SearchResult, reach: int,
                                 result: OfflineResult) -> SearchResult:
    """The search's result with its confirmed steps at `reach` kept tokens or more (those the step policy
    could land below) measured again in a fresh process (`pomt.choice.fresh`); a step that does not hold there is
    rejected, its reason saying both measurements. `result.fresh_steps` records every check. The other
    policies choose from the curve, not from its steps: their removal is checked in the fresh process by
    the verification alone."""
    within = [c for c in search.candidates if c.accepted and c.effect is not None and c.low >= reach]
    if not within:
        return search
    job = StepJob(workload, tuple((c.low, c.high) for c in within), search.reps, settings.confirm_rounds)
    rounds = step_rounds_in_fresh_process(job)
    verdicts = {}
    for c in within:
        fresh, held = step_holds(c.effect, rounds[(c.low, c.high)], settings.step_alpha, settings.min_step)
        here_pct, fresh_pct = c.effect.saving_pct[0], fresh.saving_pct
        result.fresh_steps.append({"low": c.low, "high": c.high, "held": held, "paired_pct": round(here_pct, 3),
                                   "fresh_pct": round(fresh_pct[0], 3),
                                   "fresh_ci_pct": [round(fresh_pct[1][0], 3), round(fresh_pct[1][1], 3)],
                                   "fresh_p_value": float(f"{fresh.p_value:.3g}"), "rounds": fresh.pairs})
        if not held:
            verdicts[(c.low, c.high)] = replace(
                c, accepted=False, kind="none",
                reason=(f"{c.reason}, here only: in a fresh process {-fresh_pct[0]:+.1f}% "
                        f"[{-fresh_pct[1][1]:+.1f}, {-fresh_pct[1][0]:+.1f}] (p = {fresh.p_value:.2g}, "
                        f"{fresh.pairs} rounds)"))
    if not verdicts:
        return search
    candidates = [verdicts.get((c.low, c.high), c) for c in search.candidates]
    return replace(search, candidates=candidates, steps=confirmed_steps(search.points, candidates))


def run_offline(workload: Workload, config: OfflineConfig | None = None,
                settings: SearchSettings | None = None) -> OfflineResult:
    """Run every stage the configuration asks for and write the outputs; see the module docstring."""
    config, settings = config or OfflineConfig(), settings or SearchSettings()
    validate(config, settings)
    run = prepare_replay(workload, config) if config.replay is not None else prepare_live(workload, config, settings)
    out, stem = Path(workload.output_dir), run.setup.stem
    result = OfflineResult(geometry=run.geometry, device=run.setup.fingerprint, batch_size=run.setup.batch_size)
    if config.accuracy_curve is not None:
        result.accuracy = acc.load_accuracy_curve(config.accuracy_curve, (run.geometry.min_tokens,
                                                                         run.geometry.num_tokens))
    if config.accuracy_only:
        if config.dataset_root is None:
            raise PolicyError("--accuracy-only needs --dataset-root")
        result.accuracy = estimate_accuracy(workload, config, run, [])
        result.paths["accuracy"] = acc.save_accuracy_curve(out / f"{stem}.accuracy.csv", result.accuracy)
        return result

    started = time.perf_counter()
    will_know_accuracy = result.accuracy is not None or needs_accuracy_model(config)
    reach = run.geometry.num_tokens - max_remove(config, run.geometry, will_know_accuracy)
    search = LatencySearch(run.session, run.prepared.grid, run.geometry.num_tokens, settings,
                           adaptive=config.search == "adaptive", seed=workload.seed, focus_from=reach,
                           progress=workload.progress).run()
    result.search = search
    result.measure_seconds = time.perf_counter() - started
    if run.session.journal is not None:
        result.paths["trace"] = run.session.journal.path
        run.session.journal.update_meta(passes=settings.passes, reps=search.reps,
                                        drift=None if search.drift is None else search.drift.to_dict())
    if run.replay is None and config.verify_fresh and policy_name(config, will_know_accuracy) == "step":
        search = result.search = check_steps_in_fresh_process(workload, settings, search, reach, result)

    if needs_accuracy_model(config):
        extra = [s.tokens for s in search.steps] + [s.upper_tokens for s in search.steps]
        result.accuracy = estimate_accuracy(workload, config, run, extra)
        result.paths["accuracy"] = acc.save_accuracy_curve(out / f"{stem}.accuracy.csv", result.accuracy)

    accuracy_at = result.accuracy.at(p.tokens for p in search.points) if result.accuracy else None
    setting = Setting(
        curve={p.tokens: p.latency_ms for p in search.points}, num_tokens=run.geometry.num_tokens,
        prefix_tokens=run.geometry.prefix_tokens, depth=run.geometry.depth, block=config.prune_block,
        max_remove=max_remove(config, run.geometry, accuracy_at is not None),
        accuracy=accuracy_at, min_accuracy=config.min_accuracy,
    )
    ranked = rank(config, setting, search)
    if not ranked:
        decision = nothing(setting, config, search)
    elif run.replay is not None or not config.verify:
        decision = ranked[0]
        result.notes.append("replayed trace: the patched model was not measured, the schedule is unverified"
                            if run.replay is not None else "--no-verify: the schedule is unverified")
    else:
        decision = verify_decision(workload, config, settings, run, setting, ranked, search, result)
    result.decision = decision
    if note := here_only_note(result):
        result.notes.append(note)
    write_outputs(workload, config, settings, run, result, setting)
    return result


def write_outputs(workload: Workload, config: OfflineConfig, settings: SearchSettings, run: Run,
                  result: OfflineResult, setting: Setting) -> None:
    """The curve CSV, the schedule JSON and the PNG, each written atomically."""
    out, stem, search, decision = Path(workload.output_dir), run.setup.stem, result.search, result.decision
    result.paths["curve"] = write_curve(out / f"{stem}.curve.csv", search.points, result.accuracy)
    verified = None
    if result.verification is not None:
        verified = result.verification.record(fingerprint_hash(run.setup.fingerprint))
        verified["method_cost_ms"] = {str(r): round(c, 4) for r, c in result.method_cost.items()} or None
        fresh = result.fresh_verification
        verified["fresh_process"] = None if fresh is None else fresh.record(fingerprint_hash(run.setup.fingerprint))
    measurement = measurement_record(search, run, decision, config, settings, result.fresh_steps)
    result.schedule = build_schedule(workload, config, run, decision, search, result.accuracy, measurement, verified)
    result.paths["schedule"] = save_schedule(result.schedule, out / f"{stem}.schedule.json")
    utility = utility_values(setting, config.alpha) if setting.accuracy is not None else None
    title = (f"{run.geometry.model} on {run.setup.fingerprint.get('name', run.setup.device)}, batch "
             f"{run.setup.batch_size}, {run.geometry.input_size[0]}x{run.geometry.input_size[1]} px")
    if run.replay is not None:
        title += f" (replay of {Path(run.replay).name})"
    result.paths["plot"] = plot_offline(
        out / f"{stem}.png", title, search.points, corrected_values(search.design), search.steps,
        [c for c in search.rejected_candidates if c.effect is not None], decision.kept_tokens,
        drift=search.drift, accuracy=result.accuracy.values if result.accuracy else None,
        accuracy_kind=result.accuracy.kind if result.accuracy else None, utility=utility,
        verified=result.verification,
        here_only=[(f["low"], f["high"]) for f in result.fresh_steps if not f["held"]],
    )


__all__ = ["OfflineConfig", "OfflineResult", "run_offline"]
