"""`pomt offline` (= `python offline_computation.py`): measure, confirm steps, verify, schedule."""

from __future__ import annotations

import typer

from pomt.cli.app import app
from pomt.cli.options import config_command
from pomt.device.allocator import allocator_words
from pomt.measurement.search import SearchSettings
from pomt.offline import OfflineConfig, OfflineResult, run_offline
from pomt.offline.frontier_pipeline import FrontierRun
from pomt.stats import Proportion
from pomt.workload.prepare import Workload


@app.command("offline")
@config_command(Workload, OfflineConfig, SearchSettings)
def offline_command(workload: Workload, config: OfflineConfig, settings: SearchSettings) -> None:
    """Measure latency against kept tokens in shuffled passes, confirm its steps by paired measurement, choose a
    removal, verify it on the patched model, and save the schedule."""
    print_report(run_offline(workload, config, settings))


def print_report(result: OfflineResult) -> None:
    """A short human report: geometry, measurement and drift, steps judged, choice, verification, files."""
    g, echo = result.geometry, typer.echo
    device = result.device
    echo(f"model      {g.model}  {g.input_size[0]}x{g.input_size[1]} px  batch {result.batch_size}  "
         f"N={g.num_tokens} (prefix {g.prefix_tokens})  depth {g.depth}")
    where = f"replay of {device.replayed_from}, measured on " if device.replayed_from else ""
    allocator = f"  allocator {allocator_words(device.allocator)}" if device.kind == "cpu" \
        and device.allocator is not None else ""
    echo(f"device     {where}{device.name}  threads {device.threads}  clocks_locked={device.clocks_locked}  "
         f"backend {(device.backend or {}).get('name', 'eager')}{allocator}")
    search = result.search
    if search is not None:
        echo(f"latency    {search.visits} visits of {search.reps} forwards ({search.measured} measured now, "
             f"{search.evaluation_ratio:.0%} of the full grid's {search.full_grid_visits}) over "
             f"{len(search.points)} counts in {result.measure_seconds:.0f} s; noise {100 * search.noise:.1f}% a visit")
        if search.drift is not None:
            d = search.drift
            echo(f"drift      reference {d.reference_tokens} tokens read {min(d.reference_ms):.2f}-"
                 f"{max(d.reference_ms):.2f} ms over {len(d.reference_ms)} passes (max/min {d.max_over_min:.2f}"
                 f"{d.one_pass_words()})")
        rejected = search.rejected_candidates
        edges = len(search.screened)
        screened = f"; {edges} aligned edges showed none in their coarse rounds" if edges else ""
        echo(f"steps      {len(search.steps)} confirmed by paired measurement, {len(rejected)} candidates not"
             f"{screened}")
        for s in search.steps:
            low, high = s.paired_ci_pct
            echo(f"  {s.upper_tokens:>5d} -> {s.tokens:<5d} {s.before_ms:9.3f} -> {s.after_ms:9.3f} ms  {s.kind}: "
                 f"{-s.paired_pct:+.1f}% beyond the trend [{-high:+.1f}, {-low:+.1f}], p={s.p_value:.2g}, "
                 f"{s.pairs} pairs")
        for c in rejected:
            echo(f"  {c.high:>5d} -> {c.low:<5d} {c.reason}")
        if (seen := search.detection_sentence()) is not None:
            echo(f"detection  {seen}")
        if result.fresh_steps:
            held = sum(f["held"] for f in result.fresh_steps)
            echo(f"fresh      {len(result.fresh_steps)} confirmed steps within reach measured again in a new "
                 f"process: {held} held there")
    if result.accuracy:
        values = result.accuracy.values
        echo(f"accuracy   {result.accuracy.kind} on {result.accuracy.samples} images: "
             f"{values[max(values)]:.3f} at {max(values)} tokens, {values[min(values)]:.3f} at {min(values)}")
    if result.method_cost:
        costs = ", ".join(f"{c:+.3f} ms removing {r}" for r, c in sorted(result.method_cost.items()))
        echo(f"method     cost at its block over the plain block: {costs}")
    if result.verification is not None:
        v = result.verification
        echo(f"verified   unpruned {v.unpruned_ms:.3f} ms; {v.rounds} rounds of {v.reps} forwards per variant")
        for c in v.candidates:
            predicted = f", predicted {c.predicted_ms:.3f} ms" if c.predicted_ms is not None else ""
            echo(f"  remove {c.remove:>4d}: {c.pruned_ms:9.3f} ms  {c.speedup:.3f}x [{c.speedup_ci[0]:.3f}, "
                 f"{c.speedup_ci[1]:.3f}]{predicted}{'  qualifies' if c.qualifies else ''}")
    if result.fresh_verification is not None:
        v = result.fresh_verification
        echo(f"fresh      the same in a new process: unpruned {v.unpruned_ms:.3f} ms")
        for c in v.candidates:
            echo(f"  remove {c.remove:>4d}: {c.pruned_ms:9.3f} ms  {c.speedup:.3f}x [{c.speedup_ci[0]:.3f}, "
                 f"{c.speedup_ci[1]:.3f}]{'  qualifies' if c.qualifies else ''}")
    if result.frontier is not None:
        frontier_lines(result.frontier)
    if result.decision:
        d = result.decision
        prune = result.schedule.prune if result.schedule is not None else ()
        blocks = sorted(p.block for p in prune)  # a multi-block schedule's removals are listed below
        where = (f"at block {d.block}" if len(blocks) <= 1 else f"at blocks {', '.join(map(str, blocks))}"
                 if len(blocks) <= 4 else f"at {len(blocks)} blocks, {blocks[0]} to {blocks[-1]}")
        echo(f"schedule   remove {d.remove} tokens {where} -> keep {d.kept_tokens}  (policy {d.policy}: {d.reason})")
        echo(f"predicted  {d.baseline_ms:.3f} ms -> {d.predicted_ms:.3f} ms  (gain {100 * d.gain:.1f}%"
             + (f", accuracy {d.accuracy:.3f})" if d.accuracy is not None else ")"))
    if result.schedule is not None and result.frontier is not None and result.schedule.prune:
        echo(f"reducer    {result.schedule.method} removing "
             + ", ".join(f"{p.remove} at block {p.block}" for p in result.schedule.prune))
    measurement = result.schedule.measurement if result.schedule else None
    warning = measurement.warning if measurement else None
    if warning:
        echo(f"warning    {warning}")
    for note in result.notes:
        echo(f"note       {note}")
    for kind, path in result.paths.items():
        echo(f"wrote      {kind:9s} {path}")


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


def frontier_lines(frontier: FrontierRun) -> None:
    """The frontier search in a few lines: what it measured, the unpruned, chosen and best uniform schedules
    with their accuracies on each split and their verified speedups, and where the time went."""
    echo, found = typer.echo, frontier.found
    result, seconds = found.result, found.seconds
    echo(f"frontier   {result.evals} schedules measured on the search split, {len(result.frontier)} on the "
         f"frontier; {found.measured} accuracies measured now, the others read from the journal")
    echo(f"time       latency {seconds['latency']:.0f} s, reducer costs {seconds['reducer_costs']:.0f} s, "
         f"accuracy {seconds['accuracy']:.0f} s")
    record = frontier.schedule.frontier or {}
    unpruned = record.get("unpruned") or {}
    echo(f"  unpruned   search {_proportion(unpruned.get('search'))}; held-out {_proportion(unpruned.get('held_out'))}")
    chosen = record.get("chosen")
    if chosen:
        speed = chosen.get("verified_speedup")
        bound, sure = chosen.get("search_drop_bound_points"), record.get("accuracy_confidence")
        echo(f"  chosen     {chosen['key']} ({chosen['family']}): search {_proportion(chosen['search'])}"
             + (f" (drop at most {bound:.2f} points at {sure:.0%} confidence)" if bound is not None and sure else "")
             + f"; held-out {_proportion(chosen['held_out'], drop=True)}"
             + (f"; verified {speed:.3f}x" if speed else ""))
    uniform = record.get("best_uniform")
    if uniform:
        speed, over = uniform.get("verified_speedup"), uniform.get("speedup_over")
        echo(f"  uniform    {uniform['key']} ({uniform['family']}): search {_proportion(uniform['search'])}; "
             f"held-out {_proportion(uniform['held_out'], drop=True)}" + (f"; verified {speed:.3f}x" if speed else "")
             + (f"; chosen runs {over:.3f}x its speed" if over else ""))
