"""Each reducer's own cost at a pruning block, measured inside the model at a few (tokens entering, removed).

A cost is the model with n tokens entering block j and the reducer removing r there, less the same model with r
of those tokens dropped after block j, over seeded, shuffled paired rounds, at the last block of the model cut to
its last blocks; ToMe's carry and `later` on the whole model. Every round also times the unpruned model, the
round's speed (`ReducerCost.unit_ms`). Visits run in the curve's runtime where it runs the live model (`IN_PROCESS`).
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
from pomt.measurement.robust import paired_effect
from pomt.measurement.sources import calibrate_reps
from pomt.measurement.timing import fixed_threads, synchronize, time_calls
from pomt.models.geometry import model_geometry
from pomt.models.tokens import dropped_to, last_blocks, truncate_tokens
from pomt.patching import patched
from pomt.patching.blocks import removed_at, token_counts
from pomt.runtimes import IN_PROCESS, build_forward, settles_every_visit
from pomt.verification.verify import Rounds, TimedModel

SHARES = (0.0, 0.25, 0.5)  # removals measured at each count, as shares of its patch tokens (0: one token)
MEASURED_BLOCKS = 2  # the cut model's depth: one plain block, then the last block, where costs are measured
MIN_VISIT_MS = 5.0  # a visit's forwards last about this long (`visit_reps`)
MAX_REPS = 32
COST_ROUNDS = 21  # paired rounds of the costs and of the mixed counts' calibration
SPEED_WINDOW = 5  # rounds over which the unpruned model's time is smoothed into a round's speed
UNPRUNED = "unpruned"  # the whole model, unpatched: each round's speed

Variant = tuple[str, int, int, int]  # (method or "", block, tokens entering it, tokens removed there)


def cost_points(num_tokens: int, prefix_tokens: int, method: str, counts: Sequence[int],
                shares: Sequence[float] = SHARES) -> list[tuple[int, int]]:
    """(tokens entering, removed) pairs to measure: each share of each count's patch tokens, at least one token."""
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


def measure_reducer_costs(timed: TimedModel, methods: Sequence[str], rounds: Rounds = Rounds(COST_ROUNDS), *,
                          counts: Sequence[int] | None = None, points: Sequence[tuple[int, int]] | None = None,
                          later: bool = True) -> dict[str, ReducerCost]:
    """{method: its ReducerCost}, at `cost_points` of `counts` or at the (tokens entering, removed) `points` given;
    `rounds.reps` forwards a visit (None: `visit_reps`); `later`: calibrate what ToMe's later merges save."""
    check_in_process(timed.backend)
    model = timed.model
    geometry = model_geometry(model)
    num_tokens, prefix = geometry.num_tokens, geometry.prefix_tokens
    counts = sorted(set(counts or default_counts(num_tokens, prefix)))
    where = {m: sorted(set(points)) if points is not None else cost_points(num_tokens, prefix, m, counts)
             for m in methods}
    depth = min(MEASURED_BLOCKS, geometry.depth)
    with last_blocks(model, depth):
        cut_reps = visit_reps(timed) if rounds.reps is None else rounds.reps
    whole_reps = visit_reps(timed) if rounds.reps is None else rounds.reps
    variants = _pairs(where, depth - 1)
    contexts = {v: partial(_cut_variant, model, v, num_tokens, depth) for v in variants}
    times = _paired_rounds(timed, {**contexts, UNPRUNED: contextlib.nullcontext}, rounds.rounds,
                           {**dict.fromkeys(variants, cut_reps), UNPRUNED: whole_reps}, rounds.seed)
    unit_ms = float(np.median(times[UNPRUNED]))
    pruning = _differences(at_unit_speed(times, unit_ms))
    results = {method: ReducerCost(method, prefix, {(n, r): ms for (m, _, n, r), ms in pruning.items() if m == method},
                                   unit_ms=unit_ms) for method in methods}
    if "tome" in where and geometry.depth > 1:
        whole = Rounds(rounds.rounds, whole_reps, rounds.seed + 1)
        results["tome"] = _whole_model_tome(timed, results["tome"], where["tome"], whole, later)
    return results


def check_in_process(backend: str) -> None:
    """Raise ValueError unless `backend` runs the live model in this process (`IN_PROCESS`)."""
    if backend not in IN_PROCESS:
        raise ValueError(f"reducer costs are measured where the live model runs ({', '.join(IN_PROCESS)}), "
                         f"not on {backend}")


def at_unit_speed(times: Mapping[Hashable, list[float]], unit_ms: float) -> dict[Hashable, list[float]]:
    """Each round's times divided by the round's speed: the `UNPRUNED` time's running median over `unit_ms`."""
    speed = median_filter(np.asarray(times[UNPRUNED], float), size=SPEED_WINDOW, mode="nearest") / unit_ms
    return {k: (np.asarray(v, float) / speed).tolist() for k, v in times.items()}


def repeat_schedule(num_tokens: int, prefix_tokens: int, depth: int) -> Candidate:
    """Uniform ToMe at the middle of its family's r: the schedule that calibrates `ReducerCost.later`."""
    values = tome_values(num_tokens, prefix_tokens, depth, FAMILY_POINTS)
    return tome_constant(depth, [values[len(values) // 2]])[0]


def _whole_model_tome(timed: TimedModel, cost: ReducerCost, points: Sequence[tuple[int, int]], rounds: Rounds,
                      later: bool) -> ReducerCost:
    """ToMe's cost with its carry (a merge at block 0 against its tokens dropped, less its cost, over D - 1 blocks)
    and, with `later`, uniform ToMe against its counts dropped, less its price, per merge after a merge."""
    model = timed.model
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
    times = at_unit_speed(_paired_rounds(timed, contexts, rounds.rounds, rounds.reps, rounds.seed), cost.unit_ms)
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
    """The counts entering each block of `repeat_schedule`: a layout changing count at every block (`MixedCounts`)."""
    uniform = repeat_schedule(num_tokens, prefix_tokens, depth)
    return tuple(token_counts(num_tokens, prefix_tokens, depth, "tome", uniform.as_dict())[:depth])


def measure_mixed_counts(timed: TimedModel, rounds: Rounds = Rounds(COST_ROUNDS)) -> MixedCounts:
    """`mixed_layout` dropped, against the whole model at each of its counts, in paired rounds (`rounds.reps`
    forwards a visit, None: `visit_reps`): the latency model's calibration of mixed counts."""
    check_in_process(timed.backend)
    model = timed.model
    geometry = model_geometry(model)
    layout = mixed_layout(geometry.num_tokens, geometry.prefix_tokens, geometry.depth)
    reps = visit_reps(timed) if rounds.reps is None else rounds.reps
    counts = sorted(set(layout) - {geometry.num_tokens})
    contexts: dict[Hashable, Callable[[], ContextManager]] = {UNPRUNED: contextlib.nullcontext,
                                                              "mixed": partial(dropped_to, model, layout)}
    contexts.update({n: partial(truncate_tokens, model, n) for n in counts})
    times = _paired_rounds(timed, contexts, rounds.rounds, reps, rounds.seed)
    blocks = np.mean([times[UNPRUNED if n == geometry.num_tokens else n] for n in layout], axis=0)  # per round, / D
    excess = paired_effect(list(blocks), times["mixed"])
    return MixedCounts(layout, excess.ratio, excess.ci, paired_effect(times[UNPRUNED], times["mixed"]).ratio)


def paired_variants(method: str, block: int, tokens: int, remove: int) -> tuple[Variant, Variant]:
    """The variant whose cost is measured and its reference (the block plain, `remove` tokens dropped after it)."""
    return (method, block, tokens, remove), ("", block, tokens, remove)


def _pairs(where: dict[str, list[tuple[int, int]]], block: int) -> list[Variant]:
    """Every variant to time at `block` (each reducer's at each point and its reference; references shared)."""
    pairs = [v for method, points in where.items() for n, r in points for v in paired_variants(method, block, n, r)]
    return list(dict.fromkeys(pairs))


def _differences(times: Mapping[Variant, list[float]]) -> dict[Variant, float]:
    """{reducer's variant: median over rounds of its time less its reference's}."""
    return {v: float(np.median(np.subtract(times[v], times[paired_variants(*v)[1]])))
            for v in times if isinstance(v, tuple) and v[0]}


def visit_reps(timed: TimedModel) -> int:
    """Forwards a visit needs to last MIN_VISIT_MS (at most MAX_REPS), from three eager forwards after one untimed."""
    model, x, device = timed.model, timed.x, timed.device
    with fixed_threads(timed.threads) as used, torch.inference_mode():
        model(x)
        synchronize(device)
        forward_s = float(np.median(time_calls(lambda: model(x), device, 3, used))) / 1e3
    return calibrate_reps(forward_s, MIN_VISIT_MS / 1e3, MAX_REPS)


def _paired_rounds(timed: TimedModel, contexts: Mapping[Hashable, Callable[[], ContextManager]], rounds: int,
                   reps: int | Mapping[Hashable, int], seed: int) -> dict[Hashable, list[float]]:
    """Per variant, one median latency (ms) over its `reps` forwards (one for all, or by variant) per round; every
    round visits all variants in a seeded order, after an untimed forward where needed (`settles_every_visit`)."""
    model, x, device, backend = timed.model, timed.x, timed.device, timed.backend
    reps = reps if isinstance(reps, Mapping) else dict.fromkeys(contexts, reps)
    rng, keys = np.random.default_rng(seed), list(contexts)
    times: dict[Hashable, list[float]] = {k: [] for k in keys}
    settle_always, settled = settles_every_visit(device, backend), set()
    with fixed_threads(timed.threads) as used, torch.inference_mode():
        for _ in range(rounds):
            for i in rng.permutation(len(keys)):
                with contexts[keys[i]](), build_forward(model, x, backend=backend, threads=used) as forward:
                    if settle_always or keys[i] not in settled:
                        forward()  # untimed: a new shape's first forward sets it up
                        synchronize(device)
                        settled.add(keys[i])
                    times[keys[i]].append(float(np.median(time_calls(forward, device, reps[keys[i]], used))))
    return times


def method_cost(timed: TimedModel, block: int, method: str, removals: Sequence[int], rounds: Rounds = Rounds(7),
                unpruned_ms: float | None = None) -> dict[int, float]:
    """{remove: ms} that `method` removing `remove` tokens at `block` costs over those tokens dropped after it, as
    the frontier search prices it (`one_block_cost`); with `unpruned_ms` (the curve's L(N)), at the curve's speed."""
    model = timed.model
    geometry = model_geometry(model)
    n, wanted = geometry.num_tokens, sorted({r for r in removals if r > 0})
    if not wanted:
        return {}
    cost = measure_reducer_costs(timed, [method], rounds, points=[(n, r) for r in wanted], later=False)[method]
    if unpruned_ms is not None:
        cost = cost.at_speed(unpruned_ms)
    return one_block_cost(cost, n, geometry.depth, block, wanted)


def one_block_cost(cost: ReducerCost, num_tokens: int, depth: int, block: int,
                   removals: Sequence[int]) -> dict[int, float]:
    """{remove: ms} of removing `remove` of `num_tokens` at `block` alone: the cost there plus the carry after."""
    after = depth - block - 1
    return {r: cost.prune(num_tokens, r) + after * cost.carry(num_tokens - r) for r in removals}


def cost_function(costs: Mapping[int, float]) -> Callable[[int], float]:
    """Method cost at any removal: linear between the measured removals, held beyond them, 0 at 0."""
    known = sorted(costs)
    if not known:
        return lambda remove: 0.0
    values = [costs[r] for r in known]
    return lambda remove: 0.0 if remove <= 0 else float(np.interp(remove, known, values))
