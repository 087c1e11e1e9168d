"""Policies against hand-computed answers on a tiny synthetic model.

Setting: N = 10 tokens, P = 1 prefix token, depth D = 4, overhead C = 2 ms. The curve L(n) has a
6 ms step between 8 and 7 tokens. One block costs b(n) = (L(n) - 2) / 4, so b(10) = 5, b(9) = 4.75,
b(8) = 4.5, b(7) = 3. Pruning at block 0 makes the prediction equal L(n) itself.
"""

import pytest

from pomt.errors import CurveError, GridError, PatchError, PolicyError
from pomt.policy import choose_budget, choose_step, choose_utility, predict_latency, utility_values
from pomt.steps import Step

CURVE = {10: 22.0, 9: 21.0, 8: 20.0, 7: 14.0, 6: 13.5, 5: 13.0, 4: 12.5, 3: 12.0, 2: 11.5}
SETTING = {"num_tokens": 10, "prefix_tokens": 1, "depth": 4, "overhead_ms": 2.0}
STEP = Step(tokens=7, upper_tokens=8, before_ms=20.0, after_ms=14.0, drop_ms=6.0, drop_pct=30.0,
            significance=10.0, kind="drop")
ACCURACY = {10: 0.80, 8: 0.79, 7: 0.78, 5: 0.70, 2: 0.40}


def test_predict_latency():
    # no pruning: C + 4 b(10) = 2 + 20 = 22 = L(10)
    assert predict_latency(CURVE, 10, 4, [], 2.0) == pytest.approx(22.0)
    # remove 3 at block 1: 2 + 1 b(10) + 3 b(7) = 2 + 5 + 9 = 16
    assert predict_latency(CURVE, 10, 4, [(1, 3)], 2.0) == pytest.approx(16.0)
    # cumulative: 1 at block 1, 2 more at block 2: 2 + b(10) + b(9) + 2 b(7) = 2 + 5 + 4.75 + 6 = 17.75
    assert predict_latency(CURVE, 10, 4, [(1, 1), (2, 2)], 2.0) == pytest.approx(17.75)
    # with no overhead: b(n) = L(n)/4; remove 3 at block 2: (22 + 22 + 14 + 14) / 4 = 18
    assert predict_latency(CURVE, 10, 4, [(2, 3)]) == pytest.approx(18.0)


def test_predict_latency_interpolates_unmeasured_counts():
    sparse = {2: 11.5, 7: 14.0, 8: 20.0, 10: 22.0}  # L(9) = (20 + 22) / 2 = 21, as in CURVE
    assert predict_latency(sparse, 10, 4, [(1, 1), (2, 2)], 2.0) == pytest.approx(17.75)


def test_predict_latency_errors():
    with pytest.raises(PatchError, match="prune block 4 is outside the model's blocks 0..3"):
        predict_latency(CURVE, 10, 4, [(4, 1)])
    with pytest.raises(GridError):
        predict_latency(CURVE, 10, 4, [(1, 10)])  # nothing left
    with pytest.raises(CurveError):
        predict_latency({5: 1.0, 10: 2.0}, 10, 4, [(1, 7)])  # 3 tokens: below the measured range


def test_step_policy_lands_below_the_step():
    d = choose_step(CURVE, [STEP], block=1, max_remove=8, min_gain=0.03, **SETTING)
    # remove 3 at block 1: predicted 16 ms (see above); gain (22 - 16) / 22 = 0.2727
    assert (d.remove, d.kept_tokens, d.block, d.policy) == (3, 7, 1, "step")
    assert d.predicted_ms == pytest.approx(16.0)
    assert d.baseline_ms == pytest.approx(22.0)
    assert d.gain == pytest.approx(6 / 22)
    assert "step at 8 -> 7" in d.reason
    assert d.accuracy is None


def test_step_policy_removes_nothing_when_no_step_pays():
    d = choose_step(CURVE, [STEP], block=1, max_remove=8, min_gain=0.30, **SETTING)  # 27% < 30%
    assert (d.remove, d.kept_tokens, d.predicted_ms, d.gain) == (0, 10, 22.0, 0.0)
    assert "no step" in d.reason


def test_step_policy_respects_max_remove():
    d = choose_step(CURVE, [STEP], block=1, max_remove=2, min_gain=0.03, **SETTING)  # needs 3
    assert d.remove == 0


def test_step_policy_respects_min_accuracy():
    # A(7) = 0.78 (measured)
    d = choose_step(CURVE, [STEP], block=1, max_remove=8, min_gain=0.03, accuracy=ACCURACY,
                    min_accuracy=0.785, **SETTING)
    assert d.remove == 0 and d.accuracy == pytest.approx(0.80)
    d = choose_step(CURVE, [STEP], block=1, max_remove=8, min_gain=0.03, accuracy=ACCURACY,
                    min_accuracy=0.78, **SETTING)
    assert d.remove == 3 and d.accuracy == pytest.approx(0.78)


def test_step_policy_skips_a_non_monotone_trap():
    # 9 tokens are faster (18 ms) than 6 tokens (20 ms) although 8 and 7 are slower: landing below the
    # drop at 7 -> 6 would keep fewer tokens for more time than keeping 9.
    trap = {10: 22.0, 9: 18.0, 8: 26.0, 7: 25.0, 6: 20.0, 5: 19.5, 4: 19.0, 3: 18.5, 2: 18.0}
    drop_6 = Step(tokens=6, upper_tokens=7, before_ms=25.0, after_ms=20.0, drop_ms=5.0, drop_pct=20.0,
                  significance=9.0, kind="drop")
    rise_8 = Step(tokens=8, upper_tokens=9, before_ms=18.0, after_ms=26.0, drop_ms=-8.0, drop_pct=-44.4,
                  significance=12.0, kind="rise")
    assert choose_step(trap, [drop_6, rise_8], block=0, max_remove=8, min_gain=0.03, **SETTING).remove == 0
    drop_9 = Step(tokens=9, upper_tokens=10, before_ms=22.0, after_ms=18.0, drop_ms=4.0, drop_pct=18.2,
                  significance=8.0, kind="drop")
    d = choose_step(trap, [drop_6, rise_8, drop_9], block=0, max_remove=8, min_gain=0.03, **SETTING)
    assert d.kept_tokens == 9 and d.predicted_ms == pytest.approx(18.0)  # block 0: predicted = L(9)


def test_utility_values_and_errors():
    u = utility_values(CURVE, ACCURACY, alpha=0.5, num_tokens=10, depth=4, block=0, overhead_ms=2.0)
    assert u[7] == pytest.approx(0.5 * (1 - 14 / 22) + 0.5 * 0.78 / 0.80)
    with pytest.raises(PolicyError):
        choose_utility(CURVE, {}, alpha=0.5, block=0, max_remove=8, **SETTING)
    with pytest.raises(PolicyError):
        choose_utility(CURVE, ACCURACY, alpha=1.5, block=0, max_remove=8, **SETTING)
    with pytest.raises(PolicyError, match="best is 0.8"):
        choose_utility(CURVE, ACCURACY, alpha=0.5, block=0, max_remove=8, min_accuracy=0.9, **SETTING)


def test_utility_policy():
    kwargs = {"block": 0, "max_remove": 8, **SETTING}
    # alpha = 1: latency only, the fastest count (2 tokens, 11.5 ms)
    assert choose_utility(CURVE, ACCURACY, alpha=1.0, **kwargs).kept_tokens == 2
    # alpha = 0: accuracy only, the most accurate (10 tokens); ties would go to more tokens
    assert choose_utility(CURVE, ACCURACY, alpha=0.0, **kwargs).remove == 0
    # alpha = 0.5: U(n) = 0.5 (1 - L(n)/22) + 0.5 A(n)/0.8, A interpolated:
    #   U(8) = 0.0455 + 0.4938 = 0.5392, U(7) = 0.1818 + 0.4875 = 0.6693,
    #   U(6) = 0.1932 + 0.4625 = 0.6557 (A(6) = 0.74), U(5) = 0.2045 + 0.4375 = 0.6420 -> n* = 7
    d = choose_utility(CURVE, ACCURACY, alpha=0.5, **kwargs)
    assert (d.kept_tokens, d.remove, d.policy) == (7, 3, "utility")
    assert d.accuracy == pytest.approx(0.78)
    # max_remove = 2 leaves 8..10: U(8) = 0.5392 beats U(9) = 0.5196 and U(10) = 0.5
    assert choose_utility(CURVE, ACCURACY, alpha=0.5, block=0, max_remove=2, **SETTING).kept_tokens == 8
    # min_accuracy 0.785 leaves 8..10 (A(8) = 0.79)
    assert choose_utility(CURVE, ACCURACY, alpha=0.5, min_accuracy=0.785, **kwargs).kept_tokens == 8


def test_budget_policy_removes_the_fewest():
    kwargs = {"block": 0, "max_remove": 8, **SETTING}
    assert choose_budget(CURVE, latency_budget_ms=14.0, **kwargs).kept_tokens == 7  # L(7) = 14
    assert choose_budget(CURVE, latency_budget_ms=13.2, **kwargs).kept_tokens == 5  # L(5) = 13
    assert choose_budget(CURVE, latency_budget_ms=30.0, **kwargs).remove == 0
    # at block 1 removing 3: 16 ms (see test_predict_latency)
    assert choose_budget(CURVE, latency_budget_ms=16.0, block=1, max_remove=8, **SETTING).remove == 3


def test_budget_policy_errors():
    kwargs = {"block": 0, "max_remove": 8, **SETTING}
    with pytest.raises(PolicyError, match="best predicted 11.500 ms at 2 tokens"):
        choose_budget(CURVE, latency_budget_ms=11.0, **kwargs)
    # accuracy >= 0.75 allows 10..7 only (A(6) = 0.74): the best is 14 ms at 7 tokens
    with pytest.raises(PolicyError, match="best predicted 14.000 ms at 7 tokens"):
        choose_budget(CURVE, latency_budget_ms=13.2, accuracy=ACCURACY, min_accuracy=0.75, **kwargs)


@pytest.mark.parametrize(
    ("bad", "error"),
    [({"block": 4, "max_remove": 3}, PatchError), ({"block": -1, "max_remove": 3}, PatchError),
     ({"block": 0, "max_remove": -1}, GridError)],
)
def test_setting_errors(bad, error):
    with pytest.raises(error):
        choose_step(CURVE, [STEP], min_gain=0.03, **bad, **SETTING)
    with pytest.raises(error):
        choose_budget(CURVE, latency_budget_ms=14.0, **bad, **SETTING)
    with pytest.raises(error):
        choose_utility(CURVE, ACCURACY, alpha=0.5, **bad, **SETTING)


def test_max_remove_is_capped_to_keep_a_patch_token():
    # N - P - 1 = 8 at most: the budget can reach 2 tokens but never 1
    d = choose_budget(CURVE, latency_budget_ms=11.5, block=0, max_remove=100, **SETTING)
    assert d.kept_tokens == 2


def test_decision_to_dict():
    d = choose_step(CURVE, [STEP], block=1, max_remove=8, min_gain=0.03, **SETTING)
    assert d.to_dict()["remove"] == 3
