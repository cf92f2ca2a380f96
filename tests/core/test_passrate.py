"""Per-task pass-rate estimates: hand-computed Beta-Binomial values, decay, priors, state."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.core.passrate import (
    UNIFORM_PRIOR,
    PassRateEstimate,
    fit_population_prior,
    fit_prior_to_informative_share,
    informativeness,
    plugin_informativeness,
    prob_all_equal,
)


def test_uniform_posterior_informativeness_is_one_minus_two_over_n_plus_one():
    # p ~ Beta(1, 1): E[p^n] = E[(1-p)^n] = 1 / (n + 1); n = 16 -> 1 - 2/17
    assert informativeness(np.array([1.0]), np.array([1.0]), 16)[0] == pytest.approx(15 / 17, abs=1e-12)


def test_beta_2_1_all_equal_probabilities_by_hand():
    # density 2p: E[p^2] = 1/2, E[(1-p)^2] = 2 * (1/2 - 2/3 + 1/4) = 1/6
    correct, wrong = prob_all_equal(np.array([2.0]), np.array([1.0]), 2)
    assert correct[0] == pytest.approx(0.5, abs=1e-12)
    assert wrong[0] == pytest.approx(1 / 6, abs=1e-12)
    assert informativeness(np.array([2.0]), np.array([1.0]), 2)[0] == pytest.approx(1 / 3, abs=1e-12)


def test_single_rollout_groups_are_never_informative():
    assert informativeness(np.array([3.0, 0.5]), np.array([2.0, 0.5]), 1).tolist() == [0.0, 0.0]


def test_plugin_informativeness_by_hand():
    # p = 0.5, n = 2: 1 - 1/4 - 1/4
    assert plugin_informativeness(np.array([0.5, 1.0]), 2).tolist() == [0.5, 0.0]


def test_non_positive_beta_parameter_names_its_index():
    with pytest.raises(ValueError, match="at index 1"):
        prob_all_equal(np.array([1.0, 0.0]), np.array([1.0, 1.0]), 4)


def _betabinom_interior(a: float, b: float, n: int) -> float:
    """P(0 < k < n) for k ~ BetaBinomial(n, a, b), summed from the pmf C(n,k) B(k+a, n-k+b) / B(a, b)."""

    def lbeta(x, y):
        return math.lgamma(x) + math.lgamma(y) - math.lgamma(x + y)

    return sum(math.comb(n, k) * math.exp(lbeta(k + a, n - k + b) - lbeta(a, b)) for k in range(1, n))


@settings(max_examples=60, deadline=None)
@given(
    a=st.floats(0.05, 200.0), b=st.floats(0.05, 200.0), n=st.integers(1, 40),
)
def test_predictive_informativeness_equals_beta_binomial_interior_mass(a, b, n):
    got = informativeness(np.array([a]), np.array([b]), n)[0]
    assert got == pytest.approx(_betabinom_interior(a, b, n), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(a=st.floats(0.05, 200.0), b=st.floats(0.05, 200.0), n=st.integers(1, 40))
def test_predictive_never_exceeds_plugin_at_posterior_mean(a, b, n):
    # Jensen: p**n is convex, so E[p**n] >= mean**n (and likewise for 1 - p)
    predictive = informativeness(np.array([a]), np.array([b]), n)[0]
    assert predictive <= plugin_informativeness(np.array([a / (a + b)]), n)[0] + 1e-12


def test_method_of_moments_prior_by_hand():
    # x = (0.2, 0.8), m = 10: mu = 0.5, Var(x) = 0.09, h = 0.1,
    # Var(p) = (0.09 - 0.25 * 0.1) / 0.9 = 0.0722..., a0 + b0 = 0.25 / Var(p) - 1 = 2.4615...
    a0, b0 = fit_population_prior(np.array([2.0, 8.0]), np.array([10.0, 10.0]))
    assert a0 == pytest.approx(0.5 * (0.25 / (0.065 / 0.9) - 1), rel=1e-12)
    assert b0 == pytest.approx(a0, rel=1e-12)


def test_method_of_moments_prior_clips_a_bernoulli_spread():
    # x = (0, 1) with m = 4: Var(p) = 0.25 = mu (1 - mu), strength 0 -> clipped to 0.2
    assert fit_population_prior(np.array([0.0, 4.0]), np.array([4.0, 4.0])) == pytest.approx((0.1, 0.1))


def test_method_of_moments_prior_is_uniform_without_two_tasks():
    assert fit_population_prior(np.array([3.0, 0.0]), np.array([4.0, 0.0])) == UNIFORM_PRIOR


def test_informative_share_prior_recovers_uniform():
    # mean 0.5 and share 15/17 (Beta(1, 1) at n = 16) -> strength 2 within the grid step
    a0, b0 = fit_prior_to_informative_share(0.5, 15 / 17, 16)
    assert a0 == pytest.approx(1.0, rel=0.01) and b0 == pytest.approx(1.0, rel=0.01)


def test_informative_share_prior_clips_to_strength_range():
    assert sum(fit_prior_to_informative_share(0.5, 0.0, 16)) == pytest.approx(0.05)
    assert sum(fit_prior_to_informative_share(0.5, 1.0, 16)) == pytest.approx(1000.0)


def test_evidence_halves_every_half_life():
    est = PassRateEstimate(2, half_life=2.0)
    est.observe(np.array([0]), np.array([3]), np.array([4]), np.array([True]), np.array([0]))
    c = est.counts(2)
    assert (c["successes"][0], c["failures"][0]) == pytest.approx((1.5, 0.5))
    est.observe(np.array([0]), np.array([1]), np.array([4]), np.array([True]), np.array([4]))
    c = est.counts(4)  # old evidence x 0.25, new evidence x 1
    assert (c["successes"][0], c["failures"][0]) == pytest.approx((0.75 + 1.0, 0.25 + 3.0))


def test_late_group_of_an_older_version_enters_decayed():
    est = PassRateEstimate(1, half_life=2.0)
    est.observe(np.array([0]), np.array([4]), np.array([4]), np.array([False]), np.array([4]))
    est.observe(np.array([0]), np.array([0]), np.array([4]), np.array([False]), np.array([2]))
    c = est.counts(4)
    assert (c["successes"][0], c["failures"][0]) == pytest.approx((4.0, 2.0))


def test_repeated_task_in_one_call_adds_both_groups():
    est = PassRateEstimate(3, half_life=None)
    est.observe(np.array([1, 1]), np.array([1, 2]), np.array([4, 4]), np.array([True, True]), np.array([0, 0]))
    c = est.counts(0)
    assert (c["successes"][1], c["failures"][1]) == (3.0, 5.0)


def test_discount_scales_only_the_given_tasks():
    est = PassRateEstimate(2, half_life=None)
    est.observe(np.array([0, 1]), np.array([2, 2]), np.array([4, 4]), np.array([True, True]), np.array([0, 0]))
    est.discount(np.array([0]), 0.25)
    c = est.counts(0)
    assert c["successes"].tolist() == [0.5, 2.0]


def _whole_array_observe(s, f, version, t, c, m, v, half_life):
    """The update over every task at once (decay factor 0.5 ** 0 = 1 for a task of no group):
    the reference that ``observe``, which touches only the groups' tasks, must equal bit for bit."""
    new_version = version.copy()
    np.maximum.at(new_version, t, v)
    decay = (lambda age: 0.5 ** (np.maximum(age, 0) / half_life)) if half_life else (lambda age: np.ones(np.shape(age)))
    keep = np.where(version >= 0, decay(new_version - version), 0.0)
    w = decay(new_version[t] - v)
    s, f = s * keep, f * keep
    np.add.at(s, t, w * c)
    np.add.at(f, t, w * (m - c))
    return s, f, new_version


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([None, 2.0, 16.0]), st.lists(st.lists(st.tuples(st.integers(0, 9), st.integers(0, 4), st.integers(0, 6)),
                                                             min_size=1, max_size=12), min_size=1, max_size=8))
def test_observe_equals_the_update_over_every_task(half_life, calls):
    est = PassRateEstimate(10, half_life=half_life)
    s, f, version = np.zeros(10), np.zeros(10), np.full(10, -1)
    for groups in calls:
        t, correct, v = (np.array(col, dtype=np.int64) for col in zip(*groups))
        m = np.full(t.size, 4)
        est.observe(t, correct, m, correct % 2 == 1, v)
        s, f, version = _whole_array_observe(s, f, version, t, correct.astype(float), m.astype(float), v, half_life)
        assert est.successes.tobytes() == s.tobytes() and est.failures.tobytes() == f.tobytes()
        assert est.version.tolist() == version.tolist()


def test_unseen_task_gets_the_prior_fitted_to_first_groups():
    # four tasks seen once: pass rates 0, 1, 0.5, 0.5; first groups informative: no, no, yes, yes
    est = PassRateEstimate(5, half_life=None)
    est.observe(np.arange(4), np.array([0, 4, 2, 2]), np.full(4, 4), np.array([False, False, True, True]), np.zeros(4))
    a0, b0 = est.prior(0, 4)
    assert a0 / (a0 + b0) == pytest.approx(0.5)
    assert est.informativeness(0, 4)[4] == pytest.approx(0.5, abs=0.01)  # the share of informative first groups
    alpha, beta = est.posterior(0, 4)
    assert (alpha[4], beta[4]) == (a0, b0)
    assert (alpha[1], beta[1]) == pytest.approx((a0 + 4, b0))


def test_moments_option_fits_kleinmans_prior_to_the_counts():
    est = PassRateEstimate(3, half_life=None, prior="moments")
    est.observe(np.array([0, 1]), np.array([2, 8]), np.array([10, 10]), np.array([True, True]), np.zeros(2))
    assert est.prior(0, 10) == fit_population_prior(np.array([2.0, 8.0, 0.0]), np.array([10.0, 10.0, 0.0]))


def test_unknown_prior_option_is_refused():
    with pytest.raises(ValueError, match="prior: expected"):
        PassRateEstimate(3, prior="mle")


def test_prior_is_uniform_before_two_tasks_are_seen():
    est = PassRateEstimate(3)
    est.observe(np.array([0]), np.array([4]), np.array([4]), np.array([False]), np.array([0]))
    assert est.prior(0, 4) == UNIFORM_PRIOR


def test_state_round_trip_restores_every_array():
    est = PassRateEstimate(4, half_life=3.0)
    est.observe(np.array([0, 2]), np.array([1, 3]), np.array([4, 4]), np.array([True, True]), np.array([1, 2]))
    copy = PassRateEstimate(4, half_life=3.0)
    copy.load_state_dict(est.state_dict())
    np.testing.assert_array_equal(copy.informativeness(5, 4), est.informativeness(5, 4))
    for name, arr in est.state_dict().items():
        np.testing.assert_array_equal(copy.state_dict()[name], arr)


def test_state_of_another_task_count_is_refused():
    est = PassRateEstimate(4)
    with pytest.raises(ValueError, match="passrate.successes: expected 3 tasks"):
        PassRateEstimate(3).load_state_dict(est.state_dict())


def test_unseen_task_is_predicted_from_its_tags_tasks():
    # tag "easy": 4 tasks all correct (first groups of 8); tag "mid": 4 tasks at 4/8, all informative.
    # The population prior would call an unseen task informative half the time; the tag's prior
    # predicts the unseen easy task (index 4) as never informative and the unseen mid task (9) as
    # always (its tag's first groups: share 1).
    tags = ["easy"] * 5 + ["mid"] * 5
    est = PassRateEstimate(10, half_life=None, tags=tags)
    seen = np.array([0, 1, 2, 3, 5, 6, 7, 8])
    correct = np.array([8, 8, 8, 8, 4, 4, 4, 4])
    est.observe(seen, correct, np.full(8, 8), correct < 8, np.zeros(8, dtype=np.int64))
    pred = est.informativeness(0, 8)
    a_pop, b_pop = est.prior(0, 8)
    pop = informativeness(np.array([a_pop]), np.array([b_pop]), 8)[0]
    assert pop == pytest.approx(0.5, abs=0.01)  # the population's share of informative first groups
    assert pred[4] < 0.01
    assert pred[9] > 0.95
    row = est.row(4, 0, 8)
    assert row["tag"] == "easy" and row["prior_alpha"] / (row["prior_alpha"] + row["prior_beta"]) > 0.99


def test_a_tag_with_too_few_seen_tasks_uses_the_population_prior():
    est = PassRateEstimate(6, half_life=None, tags=["a"] * 3 + ["b"] * 3)
    est.observe(np.array([0, 1, 3]), np.array([8, 8, 0]), np.full(3, 8), np.zeros(3, dtype=bool), np.zeros(3, dtype=np.int64))
    a0, b0 = est.priors(0, 8)
    assert (a0[2], b0[2]) == pytest.approx(est.prior(0, 8))


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["informative_share", "moments"]),
       st.lists(st.tuples(st.sampled_from(["observe", "discount", "half_life", "load", "read"]), st.integers(0, 7),
                          st.integers(0, 4), st.integers(0, 5)), min_size=1, max_size=14))
def test_kept_priors_equal_a_fresh_fit_after_every_change(prior, ops):
    # the priors are kept between changes; whatever changes, they equal a fit from scratch
    tags = ["a", "a", "a", "b", "b", "b", "c", "c"]
    est = PassRateEstimate(8, half_life=4.0, prior=prior, tags=tags)
    for op, task, correct, version in ops:
        if op == "observe":
            est.observe(np.array([task]), np.array([correct]), np.array([4]), np.array([0 < correct < 4]), np.array([version]))
        elif op == "discount":
            est.discount(np.array([task]), 0.5)
        elif op == "half_life":
            est.half_life = float(version + 1)
        elif op == "load":
            other = PassRateEstimate(8, half_life=4.0, prior=prior, tags=tags)
            other.observe(np.array([task]), np.array([correct]), np.array([4]), np.array([True]), np.array([0]))
            est.load_state_dict({k: v.copy() for k, v in other.state_dict().items()})
        kept = est.priors(version, 4)
        fresh = est._fit_priors(version, 4)
        assert kept[0].tobytes() == fresh[0].tobytes() and kept[1].tobytes() == fresh[1].tobytes()


def test_kept_priors_are_read_only():
    est = PassRateEstimate(3, tags=["a", "a", "b"])
    a0, _ = est.priors(0, 4)
    with pytest.raises(ValueError):
        a0[0] = 1.0
