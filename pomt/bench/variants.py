"""The variants a benchmark compares: the unpruned model, a schedule, and reducers with their amounts.

A `Reduction` says what to do (method and {block: remove}); `build_variant` does it to a deep copy of
the base model, so every variant is its own module called as `model(x)`. With `--match flops`, each
reducer's amount is chosen so its FLOPs come as close as they can to the schedule's.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from pomt.bench.flops import count_flops, match_amount, meta_copy
from pomt.checks import METHODS, check_method, check_prune_block
from pomt.deploy.apply import apply_schedule
from pomt.errors import PatchError
from pomt.formats.schedule import Schedule
from pomt.models.geometry import Geometry, model_geometry
from pomt.patching import patch, token_counts, unpatch
from pomt.patching.tome import max_merge

BASELINE = "none"
SCHEDULE = "schedule"
VALID_METHODS = (BASELINE, *METHODS)
MATCH_TOLERANCE = 0.02


@dataclass(frozen=True)
class Reduction:
    """One variant's recipe: `method` (None: unpruned) removing removal[b] tokens at block b."""

    name: str
    method: str | None
    removal: dict[int, int] = field(default_factory=dict)

    @property
    def amount(self) -> str:
        """Human-readable amount: "-56@3" for pruning at block 3, "r=8" for ToMe with the same r in
        every block it merges in ("r=1@9-11" when that starts later than block 0), else its merge count."""
        if not self.removal:
            return ""
        values = set(self.removal.values())
        blocks = sorted(self.removal)
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


def variant_methods(methods: str | Sequence[str]) -> list[str]:
    """The methods to compare (a sequence, or comma-separated), each checked, deduplicated, with the
    unpruned baseline first."""
    if isinstance(methods, str):
        methods = [method.strip() for method in methods.split(",") if method.strip()]
    checked = [check_method(method, VALID_METHODS) for method in dict.fromkeys(methods)]
    return [BASELINE] + [method for method in checked if method != BASELINE]


def tome_removal(merges: int, depth: int) -> dict[int, int]:
    """ToMe merges for a fine-grained amount: r = merges // depth per block, one more in the last
    merges % depth blocks. FLOPs fall with every merge, and a late merge saves little, so FLOP matching
    can land much closer than uniform r alone."""
    r, extra = divmod(merges, depth)
    per_block = {block: r + (1 if block >= depth - extra else 0) for block in range(depth)}
    return {block: count for block, count in per_block.items() if count}


def plan_reductions(
    methods: Sequence[str],
    geometry: Geometry,
    remove: int | None = None,
    r: int | None = None,
    prune_block: int = 3,
    keep_rate: float | None = None,
    schedule: Schedule | None = None,
    amounts_later: bool = False,
) -> list[Reduction]:
    """Reductions for `methods` with explicit amounts (or the schedule's removal), schedule variant included.

    Pruning methods remove `remove` tokens (or all but `keep_rate` of the patch tokens) at `prune_block`;
    without either they copy the schedule's removal. ToMe merges `r` tokens per block. With
    `amounts_later` (FLOP matching fills them in), reducers get no amount here.
    """
    reductions = []
    for method in variant_methods(methods):
        if method == BASELINE:
            reductions.append(Reduction(BASELINE, None))
        elif amounts_later:
            reductions.append(Reduction(method, method))
        elif method == "tome":
            if r is None:
                raise PatchError("method tome needs --r (tokens merged per block), or a --schedule to match")
            reductions.append(Reduction(method, method, {b: r for b in range(geometry.depth)} if r else {}))
        else:
            removal = _token_removal(method, geometry, remove, prune_block, keep_rate, schedule)
            reductions.append(Reduction(method, method, removal))
    if schedule is not None:
        reductions.insert(1, Reduction(SCHEDULE, schedule.method, dict(schedule.removal)))
    for reduction in reductions:
        _token_counts(geometry, reduction)  # raises PatchError for a removal the model cannot take
    return reductions


def _token_removal(
    method: str,
    geometry: Geometry,
    remove: int | None,
    block: int,
    keep_rate: float | None,
    schedule: Schedule | None,
) -> dict[int, int]:
    check_prune_block(block, geometry.depth, "--prune-block")
    if keep_rate is not None:
        if not 0 < keep_rate <= 1:
            raise PatchError(f"--keep-rate must lie in (0, 1], got {keep_rate}")
        remove = geometry.patch_tokens - max(1, round(keep_rate * geometry.patch_tokens))
    if remove is None:
        if schedule is None:
            raise PatchError(f"method {method} needs --remove N, --keep-rate or a --schedule")
        return dict(schedule.removal)
    if remove < 0:
        raise PatchError(f"--remove must be >= 0, got {remove}")
    return {block: remove} if remove else {}


FlopsFn = Callable[[str | None, Mapping[int, int]], float]


def flops_function(base: nn.Module, example: torch.Tensor) -> FlopsFn:
    """FLOPs of the base model on `example` under (method, removal), counted on a weightless copy
    (`meta_copy`); a method whose forward needs real data (`random`'s seeded generator) on a real copy."""
    copies: dict[str, tuple[nn.Module, torch.Tensor]] = {}

    def count_on(kind: str, method: str | None, removal: Mapping[int, int]) -> float:
        if kind not in copies:
            meta = kind == "meta"
            copies[kind] = (meta_copy(base), example.to("meta")) if meta else (copy.deepcopy(base), example)
        model, x = copies[kind]
        unpatch(model)
        if method and removal:
            patch(model, method, dict(removal))
        return float(count_flops(model, x))

    def counted(method: str | None, removal: Mapping[int, int]) -> float:
        try:
            return count_on("meta", method, removal)
        except (RuntimeError, NotImplementedError):  # an op the meta device cannot run
            return count_on("real", method, removal)

    return counted


def match_flops(
    reductions: Sequence[Reduction], geometry: Geometry, flops_at: FlopsFn, prune_block: int = 3
) -> list[Reduction]:
    """Replace each reducer's amount so its FLOPs match the schedule variant's (closest reachable)."""
    target_reduction = next((red for red in reductions if red.name == SCHEDULE), None)
    if target_reduction is None:
        raise PatchError("--match flops needs a --schedule to match")
    check_prune_block(prune_block, geometry.depth, "--prune-block")
    target = flops_at(target_reduction.method, target_reduction.removal)
    matched = []
    for reduction in reductions:
        if reduction.method is None or reduction.name == SCHEDULE:
            matched.append(reduction)
            continue
        method = reduction.method
        if method == "tome":

            def removal_of(amount: int) -> dict[int, int]:
                return tome_removal(amount, geometry.depth)

            high = geometry.depth * max_merge(geometry.num_tokens, geometry.prefix_tokens)
        else:

            def removal_of(amount: int) -> dict[int, int]:
                return {prune_block: amount} if amount else {}

            high = geometry.patch_tokens - 1
        memo: dict[int, float] = {}

        def at(amount: int, removal_of=removal_of, method=method, memo=memo) -> float:
            if amount not in memo:
                memo[amount] = flops_at(method, removal_of(amount))
            return memo[amount]

        best = match_amount(at, target, 0, high)
        error = abs(at(best) - target) / target
        if error > MATCH_TOLERANCE:
            warnings.warn(
                f"{reduction.name} cannot match the schedule's FLOPs within "
                f"{MATCH_TOLERANCE:.0%} (closest is {error:.1%} off)",
                stacklevel=2,
            )
        matched.append(Reduction(reduction.name, method, removal_of(best)))
    return matched


def build_variant(
    base: nn.Module,
    reduction: Reduction,
    schedule: Schedule | None = None,
    batch_size: int | None = None,
    seed: int = 0,
) -> Variant:
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
    return token_counts(
        geometry.num_tokens, geometry.prefix_tokens, geometry.depth, reduction.method, reduction.removal
    )
