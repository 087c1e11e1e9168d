"""Each reducer's own cost at a pruning block, measured inside the model at a few (tokens entering, removed).

What both choices charge a reducer for: the frontier search at every pruning block, the step policy at its
one block (`pomt.choice.verify.method_cost`). The model with n tokens entering block j and the reducer
removing r there, against the same model with n tokens entering block j and r of them simply dropped after
it (its block runs plain at n). Every round visits each variant once in a seeded random order (one untimed
forward, then `reps` timed, through `pomt.measurement.timing`); a cost is the median over rounds of patched
minus dropped. Measured at the last block, where nothing after it differs, on the model cut to its last two blocks
(`pomt.models.shortened`: the same difference at a fraction of the forward's jitter). ToMe's proportional
attention in the blocks after its first merge is measured as the same difference one block earlier (the
merge plus one block of proportional attention) less the cost at the last block. The smallest removal (one
token) is always among the points: a reducer's fixed cost (scores, sorting, matching) shows there, before
the MLP's saving on the tokens removed offsets it.

A visit times `reps` forwards and keeps their median; by default about as many as make a visit last MIN_VISIT_MS
(`visit_reps`, at most MAX_REPS). One forward a visit was enough where the cut model runs for several ms, not
where it runs for half of one: on the digits case at batch 1 (deit_tiny at 112 px) one run of seven rounds
read costs of -0.8 to +1.0 ms, where the other runs read 0 to 0.35, priced uniform ToMe at 0.47x the
unpruned model's speed (it measured 0.99x) and sent the whole search after schedules that then measured
slower than the unpruned model.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from pomt.choice.schedule_latency import ReducerCost
from pomt.measurement.sources import calibrate_reps
from pomt.measurement.timing import fixed_threads, synchronize, time_calls
from pomt.models.geometry import model_geometry
from pomt.models.shortened import last_blocks
from pomt.models.tokens import truncate_tokens
from pomt.patching import patched
from pomt.patching.plan import removed_at

SHARES = (0.0, 0.25, 0.5)  # removals measured at each count, as shares of its patch tokens (0: one token)
MEASURED_BLOCKS = 2  # the cut model's depth: the last block, and the one before it for ToMe's carry
MIN_VISIT_MS = 5.0  # a visit's forwards last about this long (`visit_reps`)
MAX_REPS = 32

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
    rounds: int = 7,
    reps: int | None = None,
    seed: int = 0,
    points: Sequence[tuple[int, int]] | None = None,
) -> dict[str, ReducerCost]:
    """{method: its ReducerCost} measured on input `x` (see the module docstring), at each share of each count
    (`cost_points`), or at the (tokens entering, removed) `points` given; `reps` forwards a visit (None: as
    many as `visit_reps` asks)."""
    geometry = model_geometry(model)
    num_tokens, prefix = geometry.num_tokens, geometry.prefix_tokens
    counts = sorted(set(counts or default_counts(num_tokens, prefix)))
    for n in [*counts, *(n for n, _ in points or ())]:
        geometry.check_tokens(n)
    where = {m: sorted(set(points)) if points is not None else cost_points(num_tokens, prefix, m, counts, shares)
             for m in methods}
    depth = min(MEASURED_BLOCKS, geometry.depth)
    with last_blocks(model, depth):
        if reps is None:
            reps = visit_reps(model, x, device, threads)
        return _measure(model, x, where, depth, num_tokens, prefix, device, threads, rounds, reps, seed)


def visit_reps(model: nn.Module, x: torch.Tensor, device: str, threads: int | None) -> int:
    """Forwards a visit needs to last MIN_VISIT_MS (`calibrate_reps`, at most MAX_REPS), from the median of
    three forwards of `model` (the cut model, unpatched) after one untimed."""
    with fixed_threads(threads) as used, torch.inference_mode():
        model(x)
        synchronize(device)
        forward_s = float(np.median(time_calls(lambda: model(x), device, 3, used))) / 1e3
    return calibrate_reps(forward_s, MIN_VISIT_MS / 1e3, MAX_REPS)


def _measure(model: nn.Module, x: torch.Tensor, where: dict[str, list[tuple[int, int]]], depth: int,
             num_tokens: int, prefix: int, device: str, threads: int | None, rounds: int, reps: int,
             seed: int) -> dict[str, ReducerCost]:
    methods = list(where)
    pairs: list[tuple[Variant, Variant]] = []
    for method in methods:
        blocks = (depth - 1, depth - 2) if method == "tome" and depth > 1 else (depth - 1,)
        for n, remove in where[method]:
            pairs += [((method, block, n, remove), ("", block, n, remove)) for block in blocks]
    variants = list(dict.fromkeys(v for pair in pairs for v in pair))  # plain references are shared
    times = _paired_rounds(model, x, variants, num_tokens, depth, device, threads,
                           rounds, reps, seed)
    cost = {patched: float(np.median(np.subtract(times[patched], times[plain]))) for patched, plain in pairs}
    results = {}
    for method in methods:
        pruning = {(n, r): ms for (m, block, n, r), ms in cost.items() if m == method and block == depth - 1}
        carried: dict[int, list[float]] = {}
        for (m, block, n, r), ms in cost.items():
            if m == method and block == depth - 2:
                carried.setdefault(n - r, []).append(ms - pruning[(n, r)])
        carrying = {n: float(np.mean(values)) for n, values in carried.items()}
        results[method] = ReducerCost(method, prefix, pruning, carrying)
    return results


def _paired_rounds(model: nn.Module, x: torch.Tensor, variants: Sequence[Variant], num_tokens: int, depth: int,
                   device: str, threads: int | None, rounds: int, reps: int, seed: int) -> dict[Variant, list[float]]:
    """Per variant, one median latency (ms) per round; every round visits all variants in a seeded order."""
    rng = np.random.default_rng(seed)
    times: dict[Variant, list[float]] = {v: [] for v in variants}
    with fixed_threads(threads) as used, torch.inference_mode():
        for _ in range(rounds):
            for i in rng.permutation(len(variants)):
                with _variant(model, variants[i], num_tokens, depth):
                    model(x)  # untimed: the first forward of a new shape sets it up
                    synchronize(device)
                    times[variants[i]].append(float(np.median(time_calls(lambda: model(x), device, reps, used))))
    return times
