"""The policy's ranking of removals on a measured curve, what verification measures, and the decision to
remove nothing with its reason."""

import pytest

from pomt.accuracy import AccuracyCurve
from pomt.errors import PolicyError
from pomt.measurement.robust import priced_curve
from pomt.offline.choose import Ranking, nothing, policy_setting, rank, verification_removals
from pomt.offline.config import OfflineConfig

from support.offline_data import GEOMETRY, N, search_result


def test_the_setting_is_the_curve_the_model_and_the_limit():
    search = search_result()
    setting = policy_setting(OfflineConfig(prune_block=2), GEOMETRY, search, None)
    assert setting.curve == priced_curve(search.points, search.steps)  # what every choice prices from
    assert set(setting.curve) == set(range(140, N + 1))
    assert (setting.num_tokens, setting.prefix_tokens, setting.depth, setting.block) == (N, 1, 12, 2)
    assert setting.max_remove == 49 and setting.accuracy is None
    flat = AccuracyCurve({2: 0.5, N: 0.5}, "top1", 10)
    known = policy_setting(OfflineConfig(min_accuracy=0.4), GEOMETRY, search, flat)
    assert known.max_remove == 195 and known.accuracy[150] == 0.5 and known.min_accuracy == 0.4


def test_the_step_policy_lands_below_the_drop_and_verification_checks_both_sides():
    config, search = OfflineConfig(), search_result()
    ranking = rank(config, policy_setting(config, GEOMETRY, search, None), search)
    assert ranking.search is search
    (first,) = ranking.ranked
    assert (first.kept_tokens, first.remove, first.policy, first.code) == (150, N - 150, "step", "step")
    assert first.target is not None and first.target.upper_tokens == 151
    assert verification_removals(ranking.ranked, config.verify_candidates) == [N - 151, N - 150]
    assert verification_removals((), 2) == []


def test_the_budget_policy_removes_the_fewest_tokens_that_meet_the_budget():
    config, search = OfflineConfig(latency_budget_ms=9.0), search_result()
    ranking = rank(config, policy_setting(config, GEOMETRY, search, None), search)
    assert ranking.ranked[0].policy == "budget" and ranking.ranked[0].kept_tokens == 150
    assert all(d.remove > 0 for d in ranking.ranked)


def test_utility_without_accuracy_is_refused():
    config, search = OfflineConfig(policy="utility"), search_result()
    with pytest.raises(PolicyError, match="needs accuracy"):
        rank(config, policy_setting(config, GEOMETRY, search, None), search)


def test_nothing_says_why_in_the_policys_words():
    config, search = OfflineConfig(), search_result(steps=())
    ranking = rank(config, policy_setting(config, GEOMETRY, search, None), search)
    assert ranking.ranked == ()
    decision = nothing(config, ranking)
    assert (decision.remove, decision.kept_tokens, decision.gain, decision.code) == (0, N, 0.0, "no_step")
    assert decision.reason == ("no confirmed step within 49 removed tokens pays at least 3.0% at block 3 "
                               "(0 steps confirmed)")
    assert nothing(config, ranking, "measured slower", "not_faster").reason == "measured slower"
    known = policy_setting(config, GEOMETRY, search, AccuracyCurve({2: 0.5, N: 0.5}, "top1", 10))
    assert nothing(config, Ranking(known, (), search)).code == "no_candidate"  # the utility policy's
