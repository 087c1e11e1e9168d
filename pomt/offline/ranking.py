"""The removals a policy ranks on the measured curve (`pomt.policies`), best first, and the decision
to remove nothing with its reason."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pomt.accuracy import AccuracyCurve
from pomt.errors import PolicyError
from pomt.measurement.priced_curve import priced_curve
from pomt.measurement.search import SearchResult
from pomt.models.geometry import Geometry
from pomt.offline.config import OfflineConfig, max_remove, policy_name
from pomt.policies import Decision, Setting, rank_budget, rank_step, rank_utility


@dataclass(frozen=True)
class Ranking:
    """The setting the policy ranked in, its candidates that remove something (best first), and the
    search it ranked from."""

    setting: Setting
    ranked: tuple[Decision, ...]
    search: SearchResult


def policy_setting(config: OfflineConfig, geometry: Geometry, search: SearchResult,
                   accuracy: AccuracyCurve | None) -> Setting:
    """The curve, the model's geometry, where it prunes and how much it may remove, A(n) where known."""
    accuracy_at = accuracy.at(p.tokens for p in search.points) if accuracy else None
    return Setting(
        curve=priced_curve(search.points, search.steps), num_tokens=geometry.num_tokens,
        prefix_tokens=geometry.prefix_tokens, depth=geometry.depth, block=config.prune_block,
        max_remove=max_remove(config, geometry, accuracy_at is not None),
        accuracy=accuracy_at, min_accuracy=config.min_accuracy,
    )


def rank(config: OfflineConfig, setting: Setting, search: SearchResult) -> Ranking:
    """The policy's candidates that remove something, best first (see `pomt.policies`)."""
    policy = policy_name(config, setting.accuracy is not None)
    if policy == "utility":
        if setting.accuracy is None:
            raise PolicyError("the utility policy needs accuracy: give --dataset-root or --accuracy-curve")
        ranked = [d for d in rank_utility(setting, config.alpha) if d.remove > 0]
    elif policy == "budget":
        ranked = [d for d in rank_budget(setting, config.latency_budget_ms) if d.remove > 0]
    else:
        ranked = rank_step(setting, search.steps, config.min_gain)
    return Ranking(setting, tuple(ranked), search)


def nothing(config: OfflineConfig, ranking: Ranking, reason: str | None = None, code: str | None = None) -> Decision:
    """The decision to remove nothing, with the policy's reason unless given."""
    setting = ranking.setting
    policy = policy_name(config, setting.accuracy is not None)
    if reason is None:
        confirmed = len(ranking.search.steps)
        reason = (f"no confirmed step within {setting.limit} removed tokens pays at least {config.min_gain:.1%} at "
                  f"block {setting.block} ({confirmed} step{'s' if confirmed != 1 else ''} confirmed)")
        if (seen := ranking.search.detection_sentence()) is not None:
            reason += f"; {seen}"
        code = "no_step" if policy == "step" else "no_candidate"
    return setting.nothing(policy, reason, code)


def verification_removals(ranked: Sequence[Decision], count: int) -> list[int]:
    """What verification measures: the best-ranked removals, and the other side of the step the first one
    lands below (its higher count kept), so the step is checked on the patched model too."""
    removals = [d.remove for d in ranked[:count]]
    target = ranked[0].target if ranked else None
    if target is not None:
        removals.append(ranked[0].remove - (target.upper_tokens - target.tokens))
    return sorted({r for r in removals if r > 0})
