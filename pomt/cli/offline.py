"""`pomt offline` (= `python offline_computation.py`): measure, confirm steps, verify, schedule."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import typer

from pomt.cli.app import app
from pomt.cli.options import config_command
from pomt.device.allocator import allocator_words
from pomt.errors import SettingError
from pomt.measurement.search import SearchSettings
from pomt.offline import OfflineConfig, OfflineResult, run_offline
from pomt.offline.pipeline import FrontierRun
from pomt.offline.split import measure_step, search_step, verify_step
from pomt.options import WORKLOAD, option
from pomt.stats import Proportion
from pomt.verification.verify import Verification
from pomt.workload.prepare import Workload

MAX_LINES = 15  # of the summary printed by default
STEPS_SHOWN = 3  # confirmed steps listed by default, room allowing; --verbose lists all
NOTE_WIDTH = 200  # characters of a note shown by default


@dataclass(frozen=True)
class StepFile:
    """The file a step of the split computation reads, and where `pomt search` measures accuracy."""

    latency_file: Path | None = option(None, "pomt search: the latency file pomt measure wrote on the device.",
                                       panel=WORKLOAD)
    candidates_file: Path | None = option(None, "pomt verify: the candidates file pomt search wrote.", panel=WORKLOAD)
    accuracy_device: str = option("cpu", "pomt search: where accuracy is measured (cpu, cuda; under torchrun each "
                                         "rank takes cuda:LOCAL_RANK).", panel=WORKLOAD)

    def given(self, name: str) -> Path:
        path = getattr(self, name)
        if path is None:
            raise SettingError(f"give --{name.replace('_', '-')}")
        return path


@app.command("measure")
@config_command(Workload, OfflineConfig, SearchSettings)
def measure_command(workload: Workload, config: OfflineConfig, settings: SearchSettings) -> None:
    """Step 1 of 3, on the device: measure the latency curve and the reducers' costs into <stem>.latency.json."""
    path = measure_step(workload, config, settings)
    seconds = json.loads(path.read_text(encoding="utf-8"))["seconds"]["latency"]
    print(f"latency file {path} (latency {seconds:.0f} s); next, anywhere: pomt search --latency-file {path.name} "
          "--dataset-root DIR")


@app.command("search")
@config_command(StepFile, Workload, OfflineConfig)
def search_command(files: StepFile, workload: Workload, config: OfflineConfig) -> None:
    """Step 2 of 3, anywhere (torchrun spreads the images over ranks): the frontier search on a latency file, its
    finalists certified on the held-out images, into <stem>.candidates.json (unverified)."""
    path = search_step(files.given("latency_file"), workload, config, files.accuracy_device)
    if path.is_file():  # rank 0
        found = json.loads(path.read_text(encoding="utf-8"))["found"]
        certified = [k for k in found["to_verify"]]
        print(f"candidates file {path}: {found['result']['evals']} schedules measured, {len(certified)} of "
              f"{len(found['finalists'])} finalists certified ({', '.join(certified) or 'none'}); accuracy "
              f"{found['seconds']['accuracy']:.0f} s; next, on the device: pomt verify --candidates-file {path.name}")


@app.command("verify")
@config_command(StepFile, Workload, OfflineConfig)
def verify_command(files: StepFile, workload: Workload, config: OfflineConfig) -> None:
    """Step 3 of 3, on the device: verify the certified candidates against the unpruned model and write the
    schedule."""
    print_report(verify_step(files.given("candidates_file"), workload, config), config.verbose)


@app.command("offline")
@config_command(Workload, OfflineConfig, SearchSettings)
def offline_command(workload: Workload, config: OfflineConfig, settings: SearchSettings) -> None:
    """Measure latency against kept tokens, confirm its steps, choose a schedule, verify it on the patched
    model, and write it."""
    print_report(run_offline(workload, config, settings), config.verbose)


def print_report(result: OfflineResult, verbose: bool = False) -> None:
    """The run's summary (`report_lines`)."""
    for line in report_lines(result, verbose):
        typer.echo(line)


def report_lines(result: OfflineResult, verbose: bool = False) -> list[str]:
    """What a run found, in at most `MAX_LINES` lines: workload, measurement, steps, the choice with its reason,
    the verification of what ships, the files; confirmed steps and notes as room allows. `verbose`: everything."""
    if verbose:
        lines = _summary(result, True, len(result.search.steps) if result.search else 0)
        return lines + [f"note       {note}" for note in result.notes] + _file_lines(result.paths, True)
    notes = [f"note       {_one_line(note)}" for note in result.notes]
    return fit_summary(_summary(result, False, STEPS_SHOWN), _summary(result, False, 0), notes,
                       _file_lines(result.paths, False))


def fit_summary(lines: list[str], without_steps: list[str], notes: list[str], files: list[str]) -> list[str]:
    """`lines` + `notes` + `files` in at most `MAX_LINES` lines: the steps drop first (`without_steps`), then the
    notes fold into a count after the first ones (notes on what ships come first)."""
    if len(lines) + len(files) + min(len(notes), 1) > MAX_LINES:
        lines = without_steps
    room = max(MAX_LINES - len(lines) - len(files), 1)
    if len(notes) > room:
        notes = [*notes[:room - 1], f"note       {len(notes) - room + 1} more (--verbose)"]
    return lines + notes + files


def _summary(result: OfflineResult, verbose: bool, steps_shown: int) -> list[str]:
    """Every line but the notes and the files."""
    g, device, search, decision = result.geometry, result.device, result.search, result.decision
    lines = [f"model      {g.model}  {g.input_size[0]}x{g.input_size[1]} px  batch {result.batch_size}  "
             f"N={g.num_tokens} (prefix {g.prefix_tokens})  depth {g.depth}"]
    where = f"replay of {device.replayed_from}, measured on " if device.replayed_from else ""
    cpu_allocator = device.kind == "cpu" and device.allocator is not None
    allocator = f"  allocator {allocator_words(device.allocator)}" if cpu_allocator else ""
    lines.append(f"device     {where}{device.name}  threads {device.threads}  clocks_locked={device.clocks_locked}  "
                 f"backend {(device.backend or {}).get('name', 'eager')}{allocator}")
    reason = decision.reason if decision else ""
    if search is not None:
        lines += _latency_lines(result, verbose, reason, steps_shown)
    if result.accuracy:
        values = result.accuracy.values
        lines.append(f"accuracy   {result.accuracy.kind} on {result.accuracy.samples} images: "
                     f"{values[max(values)]:.3f} at {max(values)} tokens, {values[min(values)]:.3f} at {min(values)}")
    if result.method_cost and verbose:
        costs = ", ".join(f"{c:+.3f} ms removing {r}" for r, c in sorted(result.method_cost.items()))
        lines.append(f"method     cost at its block over the plain block: {costs}")
    rows = verbose or result.frontier is None  # the frontier's chosen line carries what verified it
    if result.verification is not None:
        verified = _verification_lines("verified", result.verification, verbose, rows)
        fresh = result.fresh_verification
        if fresh is not None and verbose:
            verified += _verification_lines("fresh", fresh, verbose)
        elif fresh is not None:
            held = sum(c.qualifies for c in fresh.candidates)
            verified[0] += (f"; in a new process: unpruned {fresh.unpruned_ms:.3f} ms, {held} of "
                            f"{len(fresh.candidates)} qualified")
        lines += verified
    if result.frontier is not None:
        lines += frontier_lines(result.frontier, verbose)
    if decision:
        lines += _decision_lines(result)
    warning = result.schedule.measurement.warning if result.schedule and result.schedule.measurement else None
    return lines + ([f"warning    {warning}"] if warning else [])


def _latency_lines(result: OfflineResult, verbose: bool, reason: str, steps_shown: int) -> list[str]:
    """The measurement, its drift, the steps judged and what detection could not see."""
    search, drift = result.search, result.search.drift
    lines = [f"latency    {search.visits} visits of {search.reps} forwards ({search.measured} measured now, "
             f"{search.evaluation_ratio:.0%} of the full grid's {search.full_grid_visits}) over "
             f"{len(search.points)} counts in {result.measure_seconds:.0f} s; noise {100 * search.noise:.1f}% a visit"
             + (f"; drift max/min {drift.max_over_min:.2f}" if drift is not None and not verbose else "")]
    if drift is not None and verbose:
        lines.append(f"drift      reference {drift.reference_tokens} tokens read {min(drift.reference_ms):.2f}-"
                     f"{max(drift.reference_ms):.2f} ms over {len(drift.reference_ms)} passes (max/min "
                     f"{drift.max_over_min:.2f}{drift.one_pass_words()})")
    rejected, edges = search.rejected_candidates, len(search.screened)
    screened = f"; {edges} aligned edges showed none in their coarse rounds" if edges else ""
    folded = "" if verbose or not rejected else ": " + ", ".join(
        f"{count} {why}" for why, count in Counter(reason_head(c.reason) for c in rejected).most_common())
    lines.append(f"steps      {len(search.steps)} confirmed by paired measurement, {len(rejected)} candidates "
                 f"not{folded}{screened}")
    for s in search.steps[:steps_shown]:
        low, high = s.paired_ci_pct
        lines.append(f"  {s.upper_tokens:>5d} -> {s.tokens:<5d} {s.before_ms:9.3f} -> {s.after_ms:9.3f} ms  {s.kind}: "
                     f"{-s.paired_pct:+.1f}% beyond the trend [{-high:+.1f}, {-low:+.1f}], p={s.p_value:.2g}, "
                     f"{s.pairs} pairs")
    if 0 < steps_shown < len(search.steps):
        lines.append(f"  and {len(search.steps) - steps_shown} more steps (--verbose)")
    if verbose:
        lines += [f"  {c.high:>5d} -> {c.low:<5d} {c.reason}" for c in rejected]
    if (seen := search.detection_sentence()) is not None and (verbose or seen not in reason):
        lines.append(f"detection  {seen}")
    if result.fresh_steps:
        held = sum(f["held"] for f in result.fresh_steps)
        lines.append(f"fresh      {len(result.fresh_steps)} confirmed steps within reach measured again in a new "
                     f"process: {held} held there")
    return lines


def reason_head(reason: str) -> str:
    """A rejected candidate's reason without its numbers: what candidates are counted by."""
    head = reason.split(" (", 1)[0]
    return head if head.startswith("not examined") else head.split(":", 1)[0]


def _verification_lines(label: str, v: Verification, verbose: bool, rows: bool = True) -> list[str]:
    """The unpruned latency and the variants measured; by default only the one that ships (else the fastest), none
    without `rows`."""
    where = "" if label == "verified" else "the same in a new process: "
    lines = [f"{label:<10s} {where}unpruned {v.unpruned_ms:.3f} ms; {v.rounds} rounds of {v.reps} forwards per "
             f"variant, {len(v.candidates)} variants"]
    shown = v.candidates if verbose else [v.chosen or max(v.candidates, key=lambda c: c.speedup, default=None)] \
        if rows else []
    for c in filter(None, shown):
        predicted = f", predicted {c.predicted_ms:.3f} ms" if c.predicted_ms is not None else ""
        lines.append(f"  remove {c.remove:>4d}: {c.pruned_ms:9.3f} ms  {c.speedup:.3f}x [{c.speedup_ci[0]:.3f}, "
                     f"{c.speedup_ci[1]:.3f}]{predicted}{'  qualifies' if c.qualifies else ''}")
    return lines


def _decision_lines(result: OfflineResult) -> list[str]:
    """What ships (its removal at each block and its reducer), the prediction, and the reason, once."""
    d = result.decision
    prune = result.schedule.prune if result.schedule is not None else ()
    blocks = sorted(p.block for p in prune)
    where = (f"at block {d.block}" if len(blocks) <= 1 else f"at blocks {', '.join(map(str, blocks))}"
             if len(blocks) <= 4 else f"at {len(blocks)} blocks, {blocks[0]} to {blocks[-1]}")
    accuracy = f", accuracy {d.accuracy:.3f}" if d.accuracy is not None else ""
    reducer = "" if result.frontier is None or not prune else (
        f" with {result.schedule.method} (" + ", ".join(f"{p.remove} at block {p.block}" for p in prune) + ")")
    return [f"schedule   remove {d.remove} tokens {where}{reducer} -> keep {d.kept_tokens}, policy {d.policy}: "
            f"predicted {d.baseline_ms:.3f} -> {d.predicted_ms:.3f} ms (gain {100 * d.gain:.1f}%{accuracy})",
            f"why        {d.reason}"]


def _file_lines(paths: dict[str, Path], verbose: bool) -> list[str]:
    """Every file written (verbose), else the schedule and the count of the others."""
    if verbose or "schedule" not in paths:
        return [f"wrote      {kind:9s} {path}" for kind, path in paths.items()]
    others = [kind for kind in paths if kind != "schedule"]
    rest = f" and {len(others)} more beside it ({', '.join(others)})" if others else ""
    return [f"wrote      {paths['schedule']}{rest}"]


def _one_line(text: str, width: int = NOTE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3].rstrip() + "..."


def _proportion(data: dict | None, drop: bool = False) -> str:
    """An accuracy with its interval and images; with `drop`, where measured paired, its drop from the unpruned
    model with the paired interval (points)."""
    if data is None:
        return "not measured"
    low, high = data["ci"]
    text = f"{data['accuracy']:.3f} [{low:.3f}, {high:.3f}] on {data['images']}"
    interval = Proportion.from_dict(data).drop_interval() if drop else None
    if interval is None:
        return text
    points = 100 * (data["lost"] - data["gained"]) / data["images"]
    return text + f", drop {points:+.2f} points [{100 * interval[0]:+.2f}, {100 * interval[1]:+.2f}] paired"


def frontier_lines(frontier: FrontierRun, verbose: bool = False) -> list[str]:
    """The frontier search: what it measured, where the time went, the chosen and best uniform schedules with
    their accuracies on each split and their verified speedups (verbose: the unpruned one too)."""
    found = frontier.found
    result, seconds = found.result, found.seconds
    lines = [f"frontier   {result.evals} schedules measured on the search split, {len(result.frontier)} on the "
             f"frontier; {found.measured} accuracies measured now, the others read from the cache; time: latency "
             f"{seconds['latency']:.0f} s, reducer costs {seconds['reducer_costs']:.0f} s, accuracy "
             f"{seconds['accuracy']:.0f} s"]
    record = frontier.schedule.frontier or {}
    unpruned = record.get("unpruned") or {}
    if verbose:
        lines.append(f"  unpruned   search {_proportion(unpruned.get('search'))}; held-out "
                     f"{_proportion(unpruned.get('held_out'))}")
    certification = record.get("certification")
    if certification:
        rows = certification["schedules"]
        certified = sum(r["verdict"] == "certified" for r in rows)
        lines.append(f"  certified  {certified} of {len(rows)} finalists on up to {certification['held_out_images']} "
                     f"held-out images: drop within {certification['max_drop_points']:g} points at "
                     f"{certification['confidence']:.0%} for all together")
    chosen = record.get("chosen")
    if chosen:
        speed, bound = chosen.get("verified_speedup"), chosen.get("certified_bound_points")
        held = _proportion(chosen["held_out"], drop=True)
        lines.append(f"  chosen     {chosen['key']} ({chosen['family']}): held-out {held}"
                     + (f", certified at most {bound:.2f} points" if bound is not None else "")
                     + (f"; verified {speed:.3f}x" if speed else ""))
    uniform = record.get("best_uniform")
    if uniform:
        speed, over = uniform.get("verified_speedup"), uniform.get("speedup_over")
        lines.append(f"  uniform    {uniform['key']} ({uniform['family']}): held-out "
                     f"{_proportion(uniform['held_out'], drop=True)}" + (f"; verified {speed:.3f}x" if speed else "")
                     + (f"; chosen runs {over:.3f}x its speed" if over else ""))
    return lines
