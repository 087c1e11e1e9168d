"""Each reducer's own cost at a pruning block, measured inside the model at a few (tokens entering, removed).

What both choices charge a reducer for: the frontier search at every pruning block, the step policy at its one block
(`pomt.verification.verify.method_cost`). The model with n tokens entering block j and the reducer removing r there,
against the same model with n tokens entering block j and r of them simply dropped after it (its block runs plain at
n). Every round visits each variant once in a seeded random order (`reps` timed forwards through
`pomt.measurement.timing`, after an untimed one where the runtime needs it); a cost is the median over rounds of
patched minus dropped. Measured at the last block, where nothing after it differs, on the model cut to its last two
blocks (`pomt.models.shortened`: the same difference at a fraction of the forward's jitter). The smallest removal
(one token) is always among the points: a reducer's fixed cost (scores, sorting, matching) shows there, before the
MLP's saving on the tokens removed offsets it.

ToMe is also measured on the whole model, in one more set of paired rounds:
- its proportional attention in the blocks after its first merge (its carry): ToMe merging r of n tokens at
  block 0 against the same n tokens with r dropped after block 0, less the merge's own cost at the last block,
  spread over the D - 1 blocks after it. Measured on the cut model (the merge one block earlier, less the cost
  at the last block: a difference of two small differences) it read -0.02 to -0.29 ms a block at batch 1 on
  the digits case from one run to the next, charged at 11 blocks, and priced `tome:0=8` 1.17-1.22x where it
  measured 1.04x; on the whole model it reads 0 to -0.03 ms a block there.
- what its merges right after a merge save (`ReducerCost.later`, ms a merge): uniform ToMe (`repeat_schedule`)
  against the same counts dropped, less what the costs above price it at, over its merges that follow a merge
  (all but the first).
  A merge measured alone on the cut model costs more than one that follows other merges (on deit_tiny at
  112 px by 0.03-0.12 ms at batch 1 and, noisily, 0.18-0.57 ms at batch 16, from run to run); without `later`
  schedules that merge at every block were priced 4-15% slower than they ran (`benchmarks/prediction_error.py
  --part multi`).

Every visit runs in the runtime the curve was measured on, where that runtime runs the live model (`IN_PROCESS`):
eager, or its forward captured as a CUDA graph in the variant's context and replayed. On a GPU a reducer's
kernels cost host time that hides behind the GPU's work in some schedules and not in others, so costs measured
eager do not price a schedule served as a graph; before they were measured there, the frontier priced
schedules on CUDA graphs from the curve alone, and on an H200 (deit_base, batch 64, float16) its ToMe schedules
ran up to 50% slower than predicted (docs/results/h200-2026-11-30.md).

A visit times `reps` forwards and keeps their median; by default about as many as make a visit last MIN_VISIT_MS
(`visit_reps`, at most MAX_REPS). One forward a visit was enough where the cut model runs for several ms, not
where it runs for half of one: on the digits case at batch 1 (deit_tiny at 112 px) one run of seven rounds
read costs of -0.8 to +1.0 ms, where the other runs read 0 to 0.35, priced uniform ToMe at 0.47x the
unpruned model's speed (it measured 0.99x) and sent the whole search after schedules that then measured
slower than the unpruned model.

Every round also visits the unpruned whole model (`UNPRUNED`): its time, smoothed over SPEED_WINDOW rounds,
is the round's speed. Each round's times are divided by it before the differences are taken, so the machine's
drift within the rounds cancels, and the costs are stated at the median speed, whose unpruned latency they carry
(`ReducerCost.unit_ms`) so that the latency model charges them at its curve's speed. On the digits case at batch
1, a 12-block ToMe schedule's reducer cost was priced 0.72 ms and measured 1.20 ms paired with its curve, the
machine a fifth slower than when its costs were measured. Seven rounds priced that schedule's cost at 0.77-1.09 ms
from one measurement to the next in one process, 21 rounds (COST_ROUNDS) at 1.05-1.20 ms.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from dataclasses import replace
from functools import partial

import numpy as np
import torch
from scipy.ndimage import median_filter
from torch import nn

from pomt.frontier.candidates import FAMILY_POINTS, Candidate, tome_constant, tome_values
from pomt.frontier.latency import MixedCounts, ReducerCost, cut_before
from pomt.measurement.paired import paired_effect
from pomt.measurement.sources import calibrate_reps
from pomt.measurement.timing import fixed_threads, synchronize, time_calls
from pomt.models.geometry import model_geometry
from pomt.models.shortened import last_blocks
from pomt.models.tokens import dropped_to, truncate_tokens
from pomt.patching import patched
from pomt.patching.plan import removed_at, token_counts
from pomt.runtimes import IN_PROCESS, Backend, build_forward, settles_every_visit

SHARES = (0.0, 0.25, 0.5)  # removals measured at each count, as shares of its patch tokens (0: one token)
MEASURED_BLOCKS = 2  # the cut model's depth: one plain block, then the last block, where costs are measured
MIN_VISIT_MS = 5.0  # a visit's forwards last about this long (`visit_reps`)
MAX_REPS = 32
COST_ROUNDS = 21  # paired rounds of the costs (module docstring)
# of the mixed counts' calibration: its layout against the mean of its counts' visits in the same round, about the
# precision the two-variant pair (layout against unpruned) had at twice the rounds; charged only where significant
MIXED_ROUNDS = COST_ROUNDS
SPEED_WINDOW = 5  # rounds over which the unpruned model's time is smoothed into a round's speed
UNPRUNED = "unpruned"  # the whole model, unpatched: each round's speed

Variant = tuple[str, int, int, int]  # (method or "", block, tokens entering it, tokens removed there)


def cost_points(num_tokens: int, prefix_tokens: int, method: str, counts: Sequence[int],
                shares: Sequence[float] = SHARES) -> list[tuple[int, int]]:
    """(tokens entering, removed) pairs to measure: each share of each count's patch tokens, at least one
    token, within what the method can remove there."""
    points = set()
    for n in counts:
        patches = n - prefix_tokens
        for share in shares:
            remove = max(1, round(share * patches))
            remove = removed_at(method, patches, min(remove, patches - 1)) if patches > 1 else 0
            if remove:
                points.add((n, remove))
    return sorted(points)


def default_counts(num_tokens: int, prefix_tokens: int) -> tuple[int, int]:
    """N and about half of it: the range a schedule's pruning blocks receive."""
    return num_tokens, prefix_tokens + max(2, (num_tokens - prefix_tokens) // 2)


@contextlib.contextmanager
def _cut_variant(model: nn.Module, variant: Variant, num_tokens: int, depth: int) -> Iterator[None]:
    """`variant` on the model cut to its last `depth` blocks (its block numbered in the cut model)."""
    with last_blocks(model, depth), _variant(model, variant, num_tokens, depth):
        yield


@contextlib.contextmanager
def _variant(model: nn.Module, variant: Variant, num_tokens: int, depth: int) -> Iterator[None]:
    method, block, tokens, remove = variant
    with contextlib.ExitStack() as stack:
        if tokens < num_tokens:
            stack.enter_context(truncate_tokens(model, tokens, at_block=block))
        if method:
            stack.enter_context(patched(model, method, {block: remove}))
        elif block + 1 < depth:
            stack.enter_context(truncate_tokens(model, tokens - remove, at_block=block + 1))
        yield


def measure_reducer_costs(
    model: nn.Module,
    x: torch.Tensor,
    methods: Sequence[str],
    counts: Sequence[int] | None = None,
    shares: Sequence[float] = SHARES,
    *,
    device: str = "cpu",
    threads: int | None = None,
    rounds: int = COST_ROUNDS,
    reps: int | None = None,
    seed: int = 0,
    points: Sequence[tuple[int, int]] | None = None,
    later: bool = True,
    backend: str = Backend.EAGER.value,
) -> dict[str, ReducerCost]:
    """{method: its ReducerCost} measured on input `x` (see the module docstring), at each share of each count
    (`cost_points`), or at the (tokens entering, removed) `points` given; `reps` forwards a visit (None: as
    many as `visit_reps` asks). `later`: calibrate what ToMe's merges after the first save (only schedules
    that merge at several blocks need it). `backend`: the runtime timed, one of `IN_PROCESS`."""
    check_in_process(backend)
    geometry = model_geometry(model)
    num_tokens, prefix = geometry.num_tokens, geometry.prefix_tokens
    counts = sorted(set(counts or default_counts(num_tokens, prefix)))
    for n in [*counts, *(n for n, _ in points or ())]:
        geometry.check_tokens(n)
    where = {m: sorted(set(points)) if points is not None else cost_points(num_tokens, prefix, m, counts, shares)
             for m in methods}
    depth = min(MEASURED_BLOCKS, geometry.depth)
    with last_blocks(model, depth):
        cut_reps = visit_reps(model, x, device, threads) if reps is None else reps
    whole_reps = visit_reps(model, x, device, threads) if reps is None else reps
    variants = _pairs(where, depth - 1)
    contexts = {v: partial(_cut_variant, model, v, num_tokens, depth) for v in variants}
    times = _paired_rounds(model, x, {**contexts, UNPRUNED: contextlib.nullcontext}, device, threads, rounds,
                           {**dict.fromkeys(variants, cut_reps), UNPRUNED: whole_reps}, seed, backend)
    unit_ms = float(np.median(times[UNPRUNED]))
    pruning = _differences(at_unit_speed(times, unit_ms))
    results = {}
    for method in methods:
        at_last = {(n, r): ms for (m, _, n, r), ms in pruning.items() if m == method}
        results[method] = ReducerCost(method, prefix, at_last, unit_ms=unit_ms)
    if "tome" in where and geometry.depth > 1:
        results["tome"] = _whole_model_tome(model, x, results["tome"], where["tome"], device, threads, rounds,
                                            whole_reps, seed + 1, later, backend)
    return results


def check_in_process(backend: str) -> None:
    """Raise ValueError unless `backend` runs the live model in this process (`IN_PROCESS`): the costs are
    measured on the model patched and cut in place, which a static program exported per count is not."""
    if backend not in IN_PROCESS:
        raise ValueError(f"reducer costs are measured where the live model runs ({', '.join(IN_PROCESS)}), "
                         f"not on {backend}")


def at_unit_speed(times: Mapping[Hashable, list[float]], unit_ms: float) -> dict[Hashable, list[float]]:
    """Each round's times divided by the round's speed: the `UNPRUNED` model's time, a running median over
    SPEED_WINDOW rounds, over `unit_ms` (module docstring)."""
    speed = median_filter(np.asarray(times[UNPRUNED], float), size=SPEED_WINDOW, mode="nearest") / unit_ms
    return {k: (np.asarray(v, float) / speed).tolist() for k, v in times.items()}


def repeat_schedule(num_tokens: int, prefix_tokens: int, depth: int) -> Candidate:
    """Uniform ToMe at the middle of its family's r (`pomt.frontier.candidates`): the schedule whose whole-model
    cost calibrates what merges after the first save (`ReducerCost.later`)."""
    values = tome_values(num_tokens, prefix_tokens, depth, FAMILY_POINTS)
    return tome_constant(depth, [values[len(values) // 2]])[0]


def _whole_model_tome(model: nn.Module, x: torch.Tensor, cost: ReducerCost, points: Sequence[tuple[int, int]],
                      device: str, threads: int | None, rounds: int, reps: int, seed: int,
                      later: bool, backend: str) -> ReducerCost:
    """ToMe's cost with its carry and (with `later`) what later merges save, measured on the whole model (see
    the module docstring)."""
    geometry = model_geometry(model)
    depth, num_tokens, prefix = geometry.depth, geometry.num_tokens, geometry.prefix_tokens
    variants = _pairs({"tome": list(points)}, 0)
    contexts = {v: partial(_variant, model, v, num_tokens, depth) for v in variants}
    contexts[UNPRUNED] = contextlib.nullcontext
    uniform = repeat_schedule(num_tokens, prefix, depth)
    counts = token_counts(num_tokens, prefix, depth, "tome", uniform.as_dict())
    merges = [b for b in range(depth) if counts[b + 1] < counts[b]]
    following = sum(cut_before(counts, b) for b in merges)  # merges right after a merge: what `later` prices
    later = later and following > 0
    if later:
        contexts |= {"uniform": partial(patched, model, "tome", uniform.as_dict()),
                     "uniform dropped": partial(dropped_to, model, counts[:depth])}
    times = at_unit_speed(_paired_rounds(model, x, contexts, device, threads, rounds, reps, seed, backend),
                          cost.unit_ms)
    carried: dict[int, list[float]] = {}
    for (_, _, n, r), ms in _differences({v: times[v] for v in variants}).items():
        carried.setdefault(n - r, []).append((ms - cost.prune(n, r)) / (depth - 1))
    cost = replace(cost, carrying={n: float(np.mean(values)) for n, values in carried.items()})
    if not later:
        return cost
    priced = sum(cost.at_block(counts[b], counts[b] - counts[b + 1], b > merges[0]) for b in range(depth))
    measured = float(np.median(np.subtract(times["uniform"], times["uniform dropped"])))
    return replace(cost, later=(measured - priced) / following)


def mixed_layout(num_tokens: int, prefix_tokens: int, depth: int) -> tuple[int, ...]:
    """The counts entering each block of uniform ToMe (`repeat_schedule`): a layout that changes its count at
    every block, whose excess over its blocks' sum calibrates `MixedCounts`."""
    uniform = repeat_schedule(num_tokens, prefix_tokens, depth)
    return tuple(token_counts(num_tokens, prefix_tokens, depth, "tome", uniform.as_dict())[:depth])


def measure_mixed_counts(model: nn.Module, x: torch.Tensor, *, device: str = "cpu", threads: int | None = None,
                         rounds: int = MIXED_ROUNDS, reps: int | None = None, seed: int = 0,
                         backend: str = Backend.EAGER.value) -> MixedCounts:
    """`mixed_layout`'s counts dropped (no reducer), the whole model at each of its counts and the unpruned model,
    in `rounds` paired rounds of `reps` forwards a visit (None: `visit_reps`) in `backend` (one of `IN_PROCESS`):
    the layout over its blocks' sum round by round, the latency model's calibration of mixed counts
    (`pomt.frontier.latency`, Mixed counts)."""
    check_in_process(backend)
    geometry = model_geometry(model)
    layout = mixed_layout(geometry.num_tokens, geometry.prefix_tokens, geometry.depth)
    reps = visit_reps(model, x, device, threads) if reps is None else reps
    counts = sorted(set(layout) - {geometry.num_tokens})
    contexts: dict[Hashable, Callable[[], ContextManager]] = {UNPRUNED: contextlib.nullcontext,
                                                              "mixed": partial(dropped_to, model, layout)}
    contexts.update({n: partial(truncate_tokens, model, n) for n in counts})
    times = _paired_rounds(model, x, contexts, device, threads, rounds, reps, seed, backend)
    blocks = np.mean([times[UNPRUNED if n == geometry.num_tokens else n] for n in layout], axis=0)  # per round, / D
    excess = paired_effect(list(blocks), times["mixed"])
    return MixedCounts(layout, excess.ratio, excess.ci, paired_effect(times[UNPRUNED], times["mixed"]).ratio)


def paired_variants(method: str, block: int, tokens: int, remove: int) -> tuple[Variant, Variant]:
    """The variant whose cost is measured and its reference: `method` removing `remove` of the `tokens`
    entering `block`, against those tokens running the block plain and `remove` of them dropped after it."""
    return (method, block, tokens, remove), ("", block, tokens, remove)


def _pairs(where: dict[str, list[tuple[int, int]]], block: int) -> list[Variant]:
    """Every variant to time at `block` (each reducer's at each point and its reference; references shared)."""
    pairs = [v for method, points in where.items() for n, r in points for v in paired_variants(method, block, n, r)]
    return list(dict.fromkeys(pairs))


def _differences(times: Mapping[Variant, list[float]]) -> dict[Variant, float]:
    """{reducer's variant: median over rounds of its time less its reference's}."""
    return {v: float(np.median(np.subtract(times[v], times[paired_variants(*v)[1]])))
            for v in times if isinstance(v, tuple) and v[0]}


def visit_reps(model: nn.Module, x: torch.Tensor, device: str, threads: int | None) -> int:
    """Forwards a visit needs to last MIN_VISIT_MS (`calibrate_reps`, at most MAX_REPS), from the median of
    three forwards of `model` as it stands (cut or whole, unpatched) after one untimed."""
    with fixed_threads(threads) as used, torch.inference_mode():
        model(x)
        synchronize(device)
        forward_s = float(np.median(time_calls(lambda: model(x), device, 3, used))) / 1e3
    return calibrate_reps(forward_s, MIN_VISIT_MS / 1e3, MAX_REPS)


def _paired_rounds(model: nn.Module, x: torch.Tensor, contexts: Mapping[Hashable, Callable[[], ContextManager]],
                   device: str, threads: int | None, rounds: int, reps: int | Mapping[Hashable, int],
                   seed: int, backend: str = Backend.EAGER.value) -> dict[Hashable, list[float]]:
    """Per variant, one median latency (ms) over its `reps` forwards (one number for all, or by variant) per
    round; every round visits all variants (`model` inside each one's context, run in `backend`: eager, or
    captured there as a CUDA graph and replayed) in a seeded order, each visit after an untimed forward where
    the runtime needs one (`settles_every_visit`: on the CPU, eager, at a variant's first visit only)."""
    reps = reps if isinstance(reps, Mapping) else dict.fromkeys(contexts, reps)
    rng, keys = np.random.default_rng(seed), list(contexts)
    times: dict[Hashable, list[float]] = {k: [] for k in keys}
    settle_always, settled = settles_every_visit(device, backend), set()
    with fixed_threads(threads) as used, torch.inference_mode():
        for _ in range(rounds):
            for i in rng.permutation(len(keys)):
                with contexts[keys[i]](), build_forward(model, x, backend=backend, device=device,
                                                         threads=used) as forward:
                    if settle_always or keys[i] not in settled:
                        forward()  # untimed: a new shape's first forward sets it up
                        synchronize(device)
                        settled.add(keys[i])
                    times[keys[i]].append(float(np.median(time_calls(forward, device, reps[keys[i]], used))))
    return times


def method_cost(
    model: nn.Module,
    x: torch.Tensor,
    block: int,
    method: str,
    removals: Sequence[int],
    device: str = "cpu",
    threads: int | None = None,
    rounds: int = 7,
    reps: int | None = None,
    seed: int = 0,
    unpruned_ms: float | None = None,
    backend: str = "eager",
) -> dict[int, float]:
    """{remove: ms} that `method` removing `remove` tokens at `block` costs over the same model with those
    tokens simply dropped after that block: its own cost at the N tokens the block receives, plus, for ToMe,
    its proportional attention in every block after. Measured and priced as the frontier search prices a
    schedule (`pomt.frontier.reducer_costs`, `ReducerCost`): the cost at the block on the model cut to its last
    blocks, where the difference is not buried in the other blocks' jitter (through the whole model two runs
    disagreed by up to 1.2 ms a point on deit_tiny at batch 16); ToMe's carry on the whole model, spread over
    the blocks after the merge. With `unpruned_ms` (the curve's L(N)), in ms at the curve's speed
    (`ReducerCost.at_speed`). `backend`: the runtime timed (eager or cudagraph, `pomt.runtimes.IN_PROCESS`)."""
    geometry = model_geometry(model)
    n, wanted = geometry.num_tokens, sorted({r for r in removals if r > 0})
    if not wanted:
        return {}
    cost = measure_reducer_costs(model, x, [method], points=[(n, r) for r in wanted], device=device,
                                 threads=threads, rounds=rounds, reps=reps, seed=seed, later=False,
                                 backend=backend)[method]
    if unpruned_ms is not None:
        cost = cost.at_speed(unpruned_ms)
    return one_block_cost(cost, n, geometry.depth, block, wanted)


def one_block_cost(cost: ReducerCost, num_tokens: int, depth: int, block: int,
                   removals: Sequence[int]) -> dict[int, float]:
    """{remove: ms} of a schedule that removes `remove` of the `num_tokens` at `block` alone: the reducer's cost
    there plus (ToMe) its proportional attention in each of the blocks after it."""
    after = depth - block - 1
    return {r: cost.prune(num_tokens, r) + after * cost.carry(num_tokens - r) for r in removals}


def cost_function(costs: Mapping[int, float]) -> Callable[[int], float]:
    """Method cost at any removal: linear between the measured removals, held beyond them, 0 at 0."""
    known = sorted(costs)
    if not known:
        return lambda remove: 0.0
    values = [costs[r] for r in known]
    return lambda remove: 0.0 if remove <= 0 else float(np.interp(remove, known, values))
