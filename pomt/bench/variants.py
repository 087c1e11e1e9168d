"""The variants a benchmark compares: the unpruned model, a schedule, and reducers with their amounts.

A `Reduction` says what to do (method and {block: remove}); `build_variant` does it to a deep copy of the base
model, so every variant is its own module called as `model(x)`. With `--match flops`, each reducer's amount is
chosen so its FLOPs come as close as they can to the schedule's.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

from torch import nn

from pomt.bench.config import BASELINE, SCHEDULE, BenchConfig
from pomt.bench.costs import FlopsFn, match_amount
from pomt.checks import check_prune_block
from pomt.deploy.apply import apply_schedule
from pomt.errors import PatchError
from pomt.formats.schedule import Schedule
from pomt.models.geometry import Geometry, model_geometry
from pomt.patching import patch, token_counts
from pomt.patching.tome import max_merge

MATCH_TOLERANCE = 0.02
AT_ONE_BLOCK = ("pomt", "topk", "l2norm", "random")  # the reducers that remove at --prune-block


@dataclass(frozen=True)
class Reduction:
    """One variant's recipe: `method` (None: unpruned) removing removal[b] tokens at block b."""

    name: str
    method: str | None
    removal: dict[int, int] = field(default_factory=dict)

    @property
    def amount(self) -> str:
        """Human-readable amount: "-56@3" for pruning at block 3, "r=8" for ToMe with the same r in every block it
        merges in ("r=1@9-11" when that starts later than block 0), else its merge count."""
        if not self.removal:
            return ""
        values, blocks = set(self.removal.values()), sorted(self.removal)
        contiguous = blocks == list(range(blocks[0], blocks[-1] + 1))
        if self.method == "tome" and len(values) == 1 and contiguous:
            return f"r={values.pop()}" + (f"@{blocks[0]}-{blocks[-1]}" if blocks[0] else "")
        if self.method == "tome":
            return f"{sum(self.removal.values())} merges"
        return " ".join(f"-{remove}@{block}" for block, remove in sorted(self.removal.items()))


@dataclass
class Variant:
    """A reduction applied to its own deep copy of the model."""

    reduction: Reduction
    model: nn.Module
    tokens_kept: int

    @property
    def name(self) -> str:
        return self.reduction.name


def tome_removal(merges: int, depth: int) -> dict[int, int]:
    """ToMe merges for a fine-grained amount: r = merges // depth per block, one more in the last merges % depth
    blocks, so FLOP matching can land much closer than uniform r alone."""
    r, extra = divmod(merges, depth)
    per_block = {block: r + (1 if block >= depth - extra else 0) for block in range(depth)}
    return {block: count for block, count in per_block.items() if count}


def plan_reductions(methods: Sequence[str], geometry: Geometry, config: BenchConfig, schedule: Schedule | None = None,
                    amounts_later: bool = False) -> list[Reduction]:
    """Reductions for `methods` (the baseline first, the schedule variant second) with the amounts `config` gives:
    pruning at `config.prune_block` (else the schedule's removal), ToMe `config.r` per block; with `amounts_later`
    (matching fills them in), none."""
    if any(method in AT_ONE_BLOCK for method in methods):
        check_prune_block(config.prune_block, geometry.depth, "--prune-block")
    reductions = []
    for method in methods:
        if method == BASELINE:
            reductions.append(Reduction(BASELINE, None))
        elif amounts_later:
            reductions.append(Reduction(method, method))
        elif method == "tome":
            if config.r is None:
                raise PatchError("method tome needs --r (tokens merged per block), or a --schedule to match")
            removal = dict.fromkeys(range(geometry.depth), config.r) if config.r else {}
            reductions.append(Reduction(method, method, removal))
        else:
            reductions.append(Reduction(method, method, _token_removal(method, geometry, config, schedule)))
    if schedule is not None:
        reductions.insert(1, Reduction(SCHEDULE, schedule.method, dict(schedule.removal)))
    for reduction in reductions:
        _token_counts(geometry, reduction)  # raises PatchError for a removal the model cannot take
    return reductions


def _token_removal(method: str, geometry: Geometry, config: BenchConfig, schedule: Schedule | None) -> dict[int, int]:
    remove = config.remove
    if config.keep_rate is not None:
        remove = geometry.patch_tokens - max(1, round(config.keep_rate * geometry.patch_tokens))
    if remove is None:
        if schedule is None:
            raise PatchError(f"method {method} needs --remove N, --keep-rate or a --schedule")
        return dict(schedule.removal)
    return {config.prune_block: remove} if remove else {}


def match_flops(reductions: Sequence[Reduction], geometry: Geometry, flops_at: FlopsFn, prune_block: int = 3
                ) -> list[Reduction]:
    """Replace each reducer's amount so its FLOPs match the schedule variant's (closest reachable)."""
    target_reduction = next(red for red in reductions if red.name == SCHEDULE)
    target = flops_at(target_reduction.method, target_reduction.removal)
    matched = []
    for reduction in reductions:
        if reduction.method is None or reduction.name == SCHEDULE:
            matched.append(reduction)
            continue
        method = reduction.method
        g = geometry
        high = g.depth * max_merge(g.num_tokens, g.prefix_tokens) if method == "tome" else g.patch_tokens - 1

        def removal_of(amount: int, method=method) -> dict[int, int]:
            if method == "tome":
                return tome_removal(amount, geometry.depth)
            return {prune_block: amount} if amount else {}

        @functools.cache
        def at(amount: int, removal_of=removal_of, method=method) -> float:
            return flops_at(method, removal_of(amount))

        best = match_amount(at, target, 0, high)
        error = abs(at(best) - target) / target
        if error > MATCH_TOLERANCE:
            warnings.warn(f"{reduction.name} cannot match the schedule's FLOPs within {MATCH_TOLERANCE:.0%} "
                          f"(closest is {error:.1%} off)", stacklevel=2)
        matched.append(Reduction(reduction.name, method, removal_of(best)))
    return matched


def build_variant(base: nn.Module, reduction: Reduction, schedule: Schedule | None = None,
                  batch_size: int | None = None, seed: int = 0) -> Variant:
    """Deep-copy the base model and patch the copy as the reduction says."""
    model = copy.deepcopy(base)
    if reduction.name == SCHEDULE and schedule is not None:
        apply_schedule(model, schedule, batch_size=batch_size)
    elif reduction.method and reduction.removal:
        patch(model, reduction.method, reduction.removal, seed=seed)
    return Variant(reduction, model.eval(), _token_counts(model_geometry(model), reduction)[-1])


def _token_counts(geometry: Geometry, reduction: Reduction) -> list[int]:
    """Tokens entering each block under the reduction, then the count leaving the last one."""
    if not reduction.method or not reduction.removal:
        return [geometry.num_tokens] * (geometry.depth + 1)
    g = geometry
    return token_counts(g.num_tokens, g.prefix_tokens, g.depth, reduction.method, reduction.removal)
