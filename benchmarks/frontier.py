"""The frontier search on a real-data case: pomt's chosen schedule against the fastest certified uniform schedule.

For each batch size the offline computation runs as a user runs it (frontier policy, the case's calibration folder,
the whole folder as its sample): the search explores on the search split, at most `--finalists` finalists are
certified on the held-out images, the fastest verified certified one ships. Then the chosen schedule, every certified
finalist, the fastest certified uniform one and the `--also` schedules are measured against the unpruned model in
the same paired shuffled rounds. Printed, and saved as `<stem>.frontier-bench.json` beside the run's outputs: each
schedule's role, predicted and verified speedup, held-out paired drop (the certification's counts) and verdict, then
the chosen schedule over the fastest certified uniform one. `--also` schedules are measured on both splits in full
(in a worker process, nothing timed there), judged by the same test over every held-out image, never chosen.
Goal: at a certified drop of at most 1 point, the chosen schedule at least 1.10x the fastest certified uniform one at
batch 16, never slower at batch 1; the whole search <= 10 min.
Usage: python benchmarks/frontier.py [--case digits|crops] [--batch-sizes 1 16] [--threads 2] [--drop 1.0]
       [--confidence 0.95] [--finalists 4] [--held-out 0.6] [--max-evals 80] [--budget 0.2]
       [--also tome:0=10,7=15 ...] [--smoke]
       [--device cuda --dtype float16 --model deit_base --input-size 224 --epochs 8 --lr 1e-4] [--backend cudagraph]
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from pomt.cli.app import fail
from pomt.device.allocator import ALLOCATORS
from pomt.device.fingerprint import resolve_device
from pomt.digits import DigitsCase, Recipe
from pomt.errors import PomtError
from pomt.frontier.calibration import HELD_OUT, SEARCH, HostedCalibration, hosted
from pomt.frontier.candidates import Candidate, given_schedules
from pomt.frontier.certify import CERTIFIED, Certification
from pomt.frontier.choice import Evaluated
from pomt.frontier.search import MAX_EVALS
from pomt.io import atomic_write_json
from pomt.measurement.search import SearchSettings
from pomt.measurement.sources import LiveSource, MeasurementRun
from pomt.models.registry import geometry_of, resolve_model_name
from pomt.offline import OfflineConfig, OfflineResult, run_offline
from pomt.offline.choose import as_schedule, prepare_frontier
from pomt.offline.measure import Run, accuracy_sample
from pomt.runtimes import BACKENDS, DTYPES, check_backend
from pomt.stats import CONFIDENCE
from pomt.verification.verify import Rounds, TimedModel, Verification, schedule_forward_at, verify
from pomt.workload.prepare import Prepared, Workload, prepare

SMOKE_SEARCH = SearchSettings(passes=3, visit_s=0.01, confirm_rounds=3)
CASES = ("digits", "crops")  # `pomt.<case>` with FRONTIER, SMALL and `<case>_case(recipe, progress=, device=)`
CHOSEN, UNIFORM, FINALIST, ALSO = "chosen", "uniform", "finalist", "also"
NOT_CERTIFIED = "not certified"
BENCH = "frontier-bench.json"


@dataclass(frozen=True)
class Row:
    """One schedule measured side by side: its roles (comma-joined), its accuracies on both splits, its verdict."""

    role: str
    point: Evaluated
    verdict: str


@dataclass(frozen=True)
class Case:
    """What one batch size measured: the offline run, the rows, their paired verification (candidate i: the i-th
    of `distinct(rows)`; None: nothing to measure), and the seconds each part took."""

    batch: int
    result: OfflineResult
    rows: tuple[Row, ...]
    verification: Verification | None
    seconds: dict[str, float]


def case_module(name: str) -> ModuleType:
    """`pomt.digits` or `pomt.crops`, imported when asked."""
    return importlib.import_module(f"pomt.{name}")


def offline_settings(case: DigitsCase, batch: int, args: argparse.Namespace) -> tuple[Workload, OfflineConfig]:
    """The offline computation's workload and settings: the frontier policy on the case's calibration folder."""
    workload = Workload(model=case.recipe.model, batch_size=batch, input_size=case.recipe.data.size,
                        device=args.device, dtype=args.dtype, backend=args.backend, threads=args.threads,
                        allocator=args.allocator, output_dir=Path(args.output_dir) / f"bs{batch}",
                        progress=args.progress)
    config = OfflineConfig(dataset_root=case.calibration_root, checkpoint=case.checkpoint, policy="frontier",
                           max_accuracy_drop=args.drop, max_evals=args.max_evals,
                           accuracy_samples=case.calibration_images, accuracy_confidence=args.confidence,
                           finalists=args.finalists, held_out=args.held_out, verify_rounds=args.rounds,
                           verify_seconds=0.0 if args.smoke else OfflineConfig.verify_seconds)
    return workload, config


def also_points(result: OfflineResult, calibration: HostedCalibration,
                candidates: Sequence[Candidate]) -> list[Evaluated]:
    """The schedules --also names, priced by the run's latency model and measured on both splits in full."""
    latency = result.frontier.found.latency
    search, held = calibration.measure(candidates, SEARCH), calibration.measure(candidates, HELD_OUT)
    return [Evaluated(c, ALSO, latency.predict(c), search[c], held[c]) for c in candidates]


def verdict_of(certification: Certification | None, point: Evaluated, finalist: bool) -> str:
    """A finalist's verdict; an --also schedule's by the same test over every held-out image; "-": not judged."""
    if certification is None or point.held_out is None:
        return "-"
    test = certification.certifier
    passed = certification.verdict(point) == CERTIFIED if finalist else (
        point.held_out.trials == test.images and test.certified(point.held_out))
    return CERTIFIED if passed else NOT_CERTIFIED


def rows_of(result: OfflineResult, also: Sequence[Evaluated]) -> list[Row]:
    """The chosen schedule, the fastest certified uniform one, the other certified finalists, then the --also ones."""
    found, verdict = result.frontier.found, result.frontier.verdict
    certification = found.certification
    named = [(verdict.chosen, CHOSEN), (verdict.uniform, UNIFORM)]
    named += [(p, f"{FINALIST}:{p.family}") for p in (certification.certified if certification else ())]
    points: dict[Candidate, Evaluated] = {}
    roles: dict[Candidate, list[str]] = {}
    for point, role in named:
        if point is None or (role.startswith(FINALIST) and point.candidate in points):
            continue
        points.setdefault(point.candidate, point)
        roles.setdefault(point.candidate, []).append(role)
    rows = [Row(",".join(roles[c]), p, verdict_of(certification, p, True)) for c, p in points.items()]
    return rows + [Row(ALSO, p, verdict_of(certification, p, False)) for p in also]


def distinct(rows: Sequence[Row]) -> list[Evaluated]:
    """The rows' schedules, each once (an --also schedule may be a finalist): candidate i of the paired rounds."""
    return list({r.point.candidate: r.point for r in rows}.values())


def paired(prepared: Prepared, workload: Workload, result: OfflineResult, points: list[Evaluated],
           rounds: int) -> Verification | None:
    """Every schedule against the unpruned model in the same paired shuffled rounds."""
    if not points:
        return None
    found, n = result.frontier.found, prepared.geometry.num_tokens
    schedules = {n - i: as_schedule(result.schedule, found.latency, p.candidate) for i, p in enumerate(points, 1)}
    timed = TimedModel(prepared.model, prepared.x, prepared.setup.device, workload.threads, workload.backend)
    measuring = MeasurementRun(LiveSource(schedule_forward_at(timed, schedules), timed.device, timed.threads,
                                          backend=timed.backend))
    ratio = {i: p.predicted_ms / found.latency.baseline for i, p in enumerate(points, start=1)}
    return verify(measuring, n, ratio, Rounds(rounds, found.reps, workload.seed), progress=workload.progress)


def run_case(case: DigitsCase, batch: int, args: argparse.Namespace) -> Case:
    """One batch size: the offline run, the --also schedules' accuracies, then the side-by-side measurements."""
    started = time.perf_counter()
    workload, config = offline_settings(case, batch, args)
    search = SMOKE_SEARCH if args.smoke else SearchSettings()
    if args.budget is not None:
        search = replace(search, budget=args.budget)
    result = run_offline(workload, config, search)
    offline_s, started = time.perf_counter() - started, time.perf_counter()
    prepared = prepare(workload, checkpoint=case.checkpoint)
    also = []
    if args.also:  # the run's splits and journal (kept: resumed), in a worker: no accuracy pass where timed
        kept = replace(workload, resume=True)
        run = Run(prepared, None)
        with hosted(prepare_frontier(kept, config, run, accuracy_sample(kept, config, run)).calibration) as hosts:
            also = also_points(result, hosts, args.also)
    also_s, started = time.perf_counter() - started, time.perf_counter()
    rows = rows_of(result, also)
    verification = paired(prepared, workload, result, distinct(rows), args.rounds)
    seconds = dict(result.frontier.found.seconds) | {"offline": offline_s, "also_accuracy": also_s,
                                                      "side_by_side": time.perf_counter() - started}
    return Case(batch, result, tuple(rows), verification, seconds)


def points_of(proportion) -> dict | None:
    """A split's counts with the paired drop and its two-sided 95% interval in points (None: not measured)."""
    if proportion is None:
        return None
    interval = proportion.drop_interval(CONFIDENCE)
    return {**proportion.to_dict(), "drop_points": None if proportion.drop is None else 100 * proportion.drop,
            "drop_ci_points": None if interval is None else [100 * interval[0], 100 * interval[1]]}


def comparison(schedules: Sequence[dict], reason: str) -> dict:
    """The chosen schedule over the fastest certified uniform one (else over the unpruned model), or nothing shipped."""
    def first(role: str) -> dict | None:
        return next((s for s in schedules if role in s["role"].split(",")), None)

    chosen, uniform = first(CHOSEN), first(UNIFORM)
    if chosen is None:
        return {"form": "nothing", "against": None, "ratio": None, "line": f"nothing shipped: {reason}"}
    if uniform is None:
        ratio = chosen["verified_speedup"]
        return {"form": "unpruned", "against": None, "ratio": ratio,
                "line": f"no uniform schedule certified: chosen against the unpruned model {ratio:.3f}x"}
    ratio = chosen["verified_speedup"] / uniform["verified_speedup"]
    same = " (the chosen schedule is that one)" if uniform is chosen else ""
    line = f"chosen / fastest certified uniform ({uniform['key']}): {ratio:.3f}x (verified, same rounds){same}"
    return {"form": "uniform", "against": uniform["key"], "ratio": ratio, "line": line}


def against_uniform(also: dict, uniform: dict | None) -> dict:
    """An --also schedule's verified speedup over the fastest certified uniform one (else the unpruned model's)."""
    if uniform is None:
        ratio = also["verified_speedup"]
        line = f"also {also['key']}: no uniform schedule certified; against the unpruned model {ratio:.3f}x"
    else:
        ratio = also["verified_speedup"] / uniform["verified_speedup"]
        line = (f"also {also['key']} / fastest certified uniform ({uniform['key']}): {ratio:.3f}x "
                "(verified, same rounds)")
    held = also["held_out"]
    line += f"; held-out drop {held['drop_points']:+.2f} points in full: {also['verdict']}" if held else ""
    return {"key": also["key"], "against": None if uniform is None else uniform["key"], "ratio": ratio, "line": line}


def certification_line(certification: Certification | None) -> str:
    """How many finalists certified, on how many held-out images, at what confidence."""
    if certification is None:
        return "certification: none (no drop asked)"
    c = certification.certifier
    return (f"certification: {len(certification.certified)} of {len(certification.finalists)} finalists certified "
            f"on up to {c.images} held-out images (looks at {', '.join(map(str, c.looks))}), drop within "
            f"{100 * c.max_drop:g} points at {c.confidence:.0%} confidence for all together")


def document(item: Case, args: argparse.Namespace) -> dict:
    """What the batch size's report prints, as data: schedules, speedups, drops, verdicts, the comparison."""
    frontier = item.result.frontier
    found, facts = frontier.found, frontier.report.document
    numbers = {p.candidate: i for i, p in enumerate(distinct(item.rows), start=1)}
    measured = {} if item.verification is None else {c.remove: c for c in item.verification.candidates}
    schedules = []
    for row in item.rows:
        speed = measured[numbers[row.point.candidate]]
        schedules.append({"key": row.point.candidate.key, "role": row.role, "family": row.point.family,
                          "predicted_speedup": found.latency.baseline / row.point.predicted_ms,
                          "verified_speedup": speed.speedup, "verified_ci": list(speed.speedup_ci),
                          "search": points_of(row.point.search), "held_out": points_of(row.point.held_out),
                          "verdict": row.verdict})
    uniform = next((s for s in schedules if UNIFORM in s["role"].split(",")), None)
    baseline = found.result.baseline
    return {"case": args.case, "model": facts["model"], "stem": facts["stem"], "batch_size": item.batch,
            "accuracy_kind": facts["accuracy_kind"], "drop_points": args.drop, "confidence": args.confidence,
            "finalists": args.finalists, "evals": found.result.evals, "search_images": facts["search_images"],
            "held_out_images": facts["held_out_images"], "decision": item.result.decision.reason,
            "unpruned": {"search": points_of(baseline.search), "held_out": points_of(baseline.held_out)},
            "schedules": schedules, "comparison": comparison(schedules, item.result.decision.reason),
            "also": [against_uniform(s, uniform) for s in schedules if s["role"] == ALSO],
            "certification": certification_line(found.certification), "notes": list(item.result.notes),
            "seconds": {k: round(v, 2) for k, v in item.seconds.items()}}


def _held(held: dict | None) -> tuple[str, str]:
    if held is None or held["drop_points"] is None:
        return "-", "-"
    low, high = held["drop_ci_points"]
    return (f"{held['drop_points']:+.2f} [{low:+.2f}, {high:+.2f}]",
            f"{held['lost']}/{held['gained']}/{held['images']}")


def lines_of(doc: dict) -> list[str]:
    """The batch size's table and lines (see the module docstring)."""
    unpruned, s = doc["unpruned"], doc["seconds"]
    held = unpruned["held_out"]
    told = "-" if held is None else f"{held['accuracy']:.3f} on {held['images']}"
    lines = [f"\nbatch {doc['batch_size']}: {doc['evals']} schedules measured on {doc['search_images']} search "
             f"images; unpruned {doc['accuracy_kind']} search {unpruned['search']['accuracy']:.3f}, held-out {told}; "
             f"offline decision: {doc['decision']}",
             f"time: offline run {s['offline']:.0f} s (latency {s['latency']:.0f} s, reducer costs "
             f"{s['reducer_costs']:.0f} s, accuracy {s['accuracy']:.0f} s, verification and the rest "
             f"{s['offline'] - s['latency'] - s['reducer_costs'] - s['accuracy']:.0f} s), then --also accuracy "
             f"{s['also_accuracy']:.0f} s and side by side {s['side_by_side']:.0f} s",
             f"  {'schedule':34s} {'role':26s} {'predicted':>9s} {'verified [95% CI]':>24s} "
             f"{'held-out drop pts [95%, paired]':>32s} {'lost/gained/n':>13s}  verdict"]
    for row in doc["schedules"]:
        low, high = row["verified_ci"]
        drop, counts = _held(row["held_out"])
        lines.append(f"  {row['key']:34s} {row['role']:26s} {row['predicted_speedup']:8.3f}x "
                     f"{row['verified_speedup']:8.3f}x [{low:.3f}, {high:.3f}] {drop:>32s} {counts:>13s}  "
                     f"{row['verdict']}")
    lines += [f"  {doc['comparison']['line']}", *(f"  {a['line']}" for a in doc["also"]),
              f"  {doc['certification']}", *(f"  note: {note}" for note in doc["notes"])]
    return lines


def recipe_of(args: argparse.Namespace) -> Recipe:
    """The case's recipe: FRONTIER (SMALL with --smoke), with the model, image size, epochs and learning rate asked."""
    module = case_module(args.case)
    recipe = module.SMALL if args.smoke else module.FRONTIER
    if args.model is not None:
        recipe = replace(recipe, model=resolve_model_name(args.model))
    if args.input_size is not None:
        recipe = replace(recipe, data=replace(recipe.data, size=args.input_size))
    if args.epochs is not None:
        recipe = replace(recipe, epochs=args.epochs)
    return recipe if args.lr is None else replace(recipe, lr=args.lr)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=CASES, default="digits", help="the real-data case (pomt.digits, pomt.crops)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--threads", type=int, default=None, help="CPU threads (default: torch's)")
    parser.add_argument("--allocator", choices=ALLOCATORS, default="steady",
                        help="host allocator of a CPU run (the offline computation's --allocator; inherit: as started)")
    parser.add_argument("--drop", type=float, default=1.0, help="most accuracy lost, points (certified held out)")
    parser.add_argument("--confidence", type=float, default=OfflineConfig.accuracy_confidence,
                        help="confidence of the certification, for all finalists together (the offline default)")
    parser.add_argument("--finalists", type=int, default=OfflineConfig.finalists,
                        help="schedules certified on the held-out images at most (the offline --finalists)")
    parser.add_argument("--held-out", type=float, default=None,
                        help="share of the calibration images held out (default: the offline computation's rule)")
    parser.add_argument("--max-evals", type=int, default=MAX_EVALS,
                        help="schedules whose accuracy the search may measure (the offline --max-evals)")
    parser.add_argument("--budget", type=float, default=None,
                        help="the latency curve's visit budget, a fraction of the full grid (the offline --budget)")
    parser.add_argument("--also", nargs="+", default=[], metavar="SCHEDULE",
                        help="schedules to measure side by side too, e.g. tome:0=10,7=15 (never chosen)")
    parser.add_argument("--rounds", type=int, default=10, help="paired rounds of the verification")
    parser.add_argument("--output-dir", default="bin/frontier-bench")
    parser.add_argument("--progress", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="a tiny case in seconds: proves the script runs")
    parser.add_argument("--device", default="cpu", help="where the model trains, is timed and evaluated")
    parser.add_argument("--dtype", default="float32", choices=DTYPES,
                        help="the offline computation's dtype (float16 on CUDA)")
    parser.add_argument("--backend", default="eager", choices=BACKENDS,
                        help="the runtime latency is measured and verified on (cudagraph: replayed CUDA graphs)")
    parser.add_argument("--model", default=None, help="the case recipe's model (default: the recipe's)")
    parser.add_argument("--input-size", type=int, default=None, help="the case's images' size in pixels")
    parser.add_argument("--epochs", type=int, default=None, help="the recipe's training epochs")
    parser.add_argument("--lr", type=float, default=None, help="the recipe's peak learning rate")
    args = parser.parse_args()
    if args.smoke:  # the tiny held-out split certifies a drop this large (`pomt.frontier.certify.check_certifiable`)
        args.drop, args.max_evals, args.rounds = max(args.drop, 20.0), min(args.max_evals, 26), min(args.rounds, 3)
    return args


def main() -> None:
    args = parse_args()
    try:  # an unknown model, an absent device, a bad setting or an unreadable schedule: one line before training
        args.device, recipe = resolve_device(args.device), recipe_of(args)
        check_backend(args.backend, args.device)
        OfflineConfig(max_accuracy_drop=args.drop, accuracy_confidence=args.confidence, finalists=args.finalists,
                      held_out=args.held_out, max_evals=args.max_evals, verify_rounds=args.rounds).check()
        if args.budget is not None:
            replace(SearchSettings(), budget=args.budget).check()
        if recipe.epochs < 1:
            fail(f"--epochs must be at least 1, got {recipe.epochs}")
        # the geometry on the meta device (nothing stays in memory)
        args.also = given_schedules(args.also, [geometry_of(recipe.model, recipe.data.size)])
    except (PomtError, ImportError) as exc:
        fail(str(exc))
    started = time.perf_counter()
    case = getattr(case_module(args.case), f"{args.case}_case")(recipe, progress=args.progress, device=args.device)
    print(f"{args.case} case: {case.recipe.model} at {case.recipe.data.size} px, {case.calibration_images} "
          f"calibration images, top-1 {case.accuracy:.3f}, trained in {case.train_s:.0f} s on {args.device}"
          f"{' (cached)' if case.reused else ''}; {args.dtype}, {args.backend}; drop <= {args.drop:g} points at "
          f"{args.confidence:.0%} confidence, {args.finalists} finalists at most")
    for batch in args.batch_sizes:
        try:
            item = run_case(case, batch, args)
        except PomtError as exc:
            fail(str(exc))
        doc = document(item, args)
        print("\n".join(lines_of(doc)))
        path = atomic_write_json(Path(args.output_dir) / f"bs{batch}" / f"{doc['stem']}.{BENCH}", doc)
        print(f"  wrote {path}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
