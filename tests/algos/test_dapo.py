"""DAPO maths on small hand-computed inputs."""

import numpy as np
import pytest
import torch

from algos.dapo import (
    LOSS_AGG_MODES,
    GroupReason,
    InvalidGroupError,
    aggregate_loss,
    batch_loss_counts,
    batch_share_loss,
    classify_groups,
    clip_higher_policy_loss,
    group_advantages,
    overlong_penalty,
)

R = GroupReason


def test_classify_binary_groups():
    values = np.array([[1, 1, 1], [-1, -1, -1], [1, -1, 1], [0.5, 0.5, 0.5]])
    keep, reason = classify_groups(values)
    assert keep.tolist() == [False, False, True, False]
    assert reason.tolist() == [R.ALL_CORRECT, R.ALL_WRONG, R.INFORMATIVE, R.ZERO_VARIANCE]


def test_classify_float_noise_counts_as_equal():
    # 0.1 + 0.2 != 0.3 in float64; verl's `std > 0` would call this group informative.
    values = np.array([[0.1 + 0.2, 0.3, 0.3]])
    assert np.std(values) > 0
    keep, reason = classify_groups(values)
    assert reason.tolist() == [R.ZERO_VARIANCE]
    assert not keep[0]


def test_classify_std_just_above_tolerance_is_informative():
    # population std of [0, 2e-6] is 1e-6 exactly at the tolerance -> equal; 3e-6 -> 1.5e-6 > tol.
    keep, reason = classify_groups(np.array([[0.5, 0.5 + 2e-6], [0.5, 0.5 + 3e-6]]), std_tol=1e-6)
    assert reason.tolist() == [R.ZERO_VARIANCE, R.INFORMATIVE]


def test_classify_singleton():
    keep, reason = classify_groups(np.array([[1.0], [0.0]]))
    assert reason.tolist() == [R.SINGLETON, R.SINGLETON]
    assert not keep.any()


def test_classify_band_pass_edges_are_open():
    # means: 0.25, 0.5, 0.75 with band (0.25, 0.75): both edges excluded.
    values = np.array([[0, 0, 0, 1], [0, 1, 0, 1], [1, 1, 1, 0]], dtype=float)
    keep, reason = classify_groups(values, band=(0.25, 0.75))
    assert reason.tolist() == [R.OUT_OF_BAND, R.INFORMATIVE, R.OUT_OF_BAND]


def test_classify_rejects_nan_naming_index():
    with pytest.raises(InvalidGroupError, match=r"nan.*\(1, 2\)"):
        classify_groups(np.array([[1, 0, 1], [1, 0, np.nan]]))


def test_classify_rejects_bad_band():
    with pytest.raises(ValueError, match="band"):
        classify_groups(np.ones((1, 2)), band=(0.5, 0.5))


def test_overlong_penalty_interval_boundaries():
    # L_max = 20, L_cache = 4: zero up to 16, ramp (16 - L)/4 on (16, 20], -1 beyond.
    lengths = np.array([0, 16, 17, 18, 20, 21, 100])
    got = overlong_penalty(lengths, max_response_length=20, cache_length=4)
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5, -1.0, -1.0, -1.0]


def test_overlong_penalty_factor_scales():
    got = overlong_penalty(np.array([18]), max_response_length=20, cache_length=4, penalty_factor=0.5)
    assert got.tolist() == [-0.25]


def test_overlong_cache_equal_to_max_is_allowed():
    got = overlong_penalty(np.array([0, 5, 10]), max_response_length=10, cache_length=10)
    assert got.tolist() == [0.0, -0.5, -1.0]


@pytest.mark.parametrize("cache", [0, -1, 11])
def test_overlong_rejects_cache_outside_range(cache):
    with pytest.raises(ValueError, match=r"cache_length: must be (a finite whole number > 0|<= max_response_length=10), got"):
        overlong_penalty(np.array([1]), max_response_length=10, cache_length=cache)


def test_group_advantages_std_unbiased():
    # group 0: [1, 0, 0, 1] mean 0.5, unbiased std sqrt(1/3) = 0.57735
    # group 1: [2, 2] -> zero; group 2: [5] singleton -> zero
    rewards = torch.tensor([1.0, 0.0, 2.0, 0.0, 1.0, 2.0, 5.0])
    ids = torch.tensor([0, 0, 1, 0, 0, 1, 2])
    adv = group_advantages(rewards, ids, eps=0.0)
    a = 0.5 / np.sqrt(1 / 3)
    np.testing.assert_allclose(adv.numpy(), [a, -a, 0, -a, a, 0, 0], rtol=1e-12)
    assert adv.dtype == torch.float64


def test_group_advantages_none_norm_centres_only():
    adv = group_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([7, 7, 7]), norm="none")
    assert adv.tolist() == [1.0, -1.0, 0.0]


def test_group_advantages_equal_rewards_exactly_zero():
    # 0.1 * 3 sums to 0.30000000000000004: a plain mean leaves a 1e-17 residue that 1/eps
    # would blow up to ~1e-11.
    adv = group_advantages(torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64), torch.tensor([0, 0, 0]))
    assert adv.tolist() == [0.0, 0.0, 0.0]


def test_group_advantages_rejects_inf_naming_group():
    with pytest.raises(InvalidGroupError, match=r"inf at index 1 \(group 4\)"):
        group_advantages(torch.tensor([0.0, float("inf")]), torch.tensor([3, 4]))


def test_group_advantages_rejects_unknown_norm():
    with pytest.raises(ValueError, match="norm"):
        group_advantages(torch.zeros(2), torch.zeros(2, dtype=torch.long), norm="mad")


def _loss(ratio, adv, **kw):
    lp = torch.log(torch.tensor([ratio], dtype=torch.float64))[None]
    return clip_higher_policy_loss(lp, torch.zeros_like(lp), torch.tensor([[adv]], dtype=torch.float64), torch.ones_like(lp), **kw)


def test_clip_higher_positive_advantage_clips_at_1_28():
    loss, frac = _loss(1.5, 2.0)
    assert float(loss) == pytest.approx(-2.0 * 1.28)
    assert float(frac) == 1.0


def test_clip_higher_inside_range_is_unclipped():
    loss, frac = _loss(1.25, 2.0)  # 1.25 < 1.28: clip-higher lets it through, PPO's 1.2 would not
    assert float(loss) == pytest.approx(-2.5)
    assert float(frac) == 0.0


def test_clip_low_negative_advantage():
    loss, _ = _loss(0.5, -1.0)  # max(0.5, 0.8) = 0.8
    assert float(loss) == pytest.approx(0.8)


def test_dual_clip_bounds_negative_advantage():
    loss, _ = _loss(5.0, -1.0, dual_clip=3.0)  # max(5, 1.28) = 5 -> min(5, 3) = 3
    assert float(loss) == pytest.approx(3.0)
    loss, _ = _loss(5.0, -1.0)
    assert float(loss) == pytest.approx(5.0)


def test_token_mean_weights_tokens_not_sequences():
    # seq A: 3 tokens of loss -1 each (ratio 1, A=1); seq B: 1 token of loss -3 (A=3).
    lp = torch.zeros(2, 3, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, 1.0], [3.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, _ = clip_higher_policy_loss(lp, lp, adv, mask)
    assert float(loss) == pytest.approx((-3 - 3) / 4)  # sequence-mean would give -2.0


# ------------------------------------------------------------------ semantics: aggregation, validity, std conventions


def test_classify_std_tol_zero_is_exact_equality():
    # seven equal rewards of 0.35 have a float64 std of ~5.6e-17: still all equal under std_tol=0
    assert np.std(np.full(7, 0.35)) > 0
    _, reason = classify_groups(np.full((1, 7), 0.35), std_tol=0.0)
    assert reason.tolist() == [R.ZERO_VARIANCE]


def test_classify_std_tol_zero_keeps_one_ulp_difference():
    row = [0.35] * 6 + [float(np.nextafter(0.35, 1.0))]
    keep, reason = classify_groups(np.array([row]), std_tol=0.0)
    assert reason.tolist() == [R.INFORMATIVE]


def test_classify_valid_mask_judges_valid_members_only():
    values = np.array([[1.0, np.nan, -1.0], [1.0, 1.0, np.nan], [1.0, np.nan, np.nan]])
    valid = ~np.isnan(values)
    _, reason = classify_groups(values, valid=valid)
    assert reason.tolist() == [R.INFORMATIVE, R.ALL_CORRECT, R.SINGLETON]


def test_group_advantages_population_std():
    # [1, -1]: centred +-1; population std 1 (sample std would be sqrt 2)
    adv = group_advantages(torch.tensor([1.0, -1.0]), torch.tensor([0, 0]), std="population", eps=1e-6)
    assert adv.tolist() == pytest.approx([1 / (1 + 1e-6), -1 / (1 + 1e-6)], abs=1e-15)


def test_group_advantages_sample_std_is_default():
    adv = group_advantages(torch.tensor([1.0, -1.0]), torch.tensor([0, 0]), eps=1e-6)
    assert adv.tolist() == pytest.approx([1 / (2**0.5 + 1e-6), -1 / (2**0.5 + 1e-6)], abs=1e-15)


def test_group_advantages_masked_member_out_of_baseline():
    # valid rewards [1, -1, 3]: mean 1, centred [0, -2, 2], sample std 2; the masked NaN gets 0
    r = torch.tensor([1.0, float("nan"), -1.0, 3.0])
    adv = group_advantages(r, torch.zeros(4, dtype=torch.int64), valid=torch.tensor([True, False, True, True]), eps=1e-6)
    assert adv.tolist() == pytest.approx([0.0, 0.0, -2 / (2 + 1e-6), 2 / (2 + 1e-6)], abs=1e-15)


LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0], [5.0, 5.0, 0.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])


def test_aggregate_token_mean():
    # tokens: 1+2+3 + 4 + 5+5 = 20 over 6 tokens
    assert float(aggregate_loss(LOSS, MASK, "token-mean")) == pytest.approx(20 / 6)


def test_aggregate_seq_mean_token_mean():
    # per-sequence means 2, 4, 5 -> 11 / 3
    assert float(aggregate_loss(LOSS, MASK, "seq-mean-token-mean")) == pytest.approx(11 / 3)


def test_aggregate_seq_mean_token_sum_norm():
    # token sums 6, 4, 10 -> 20 / (3 sequences * L = 4)
    assert float(aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm_length=4)) == pytest.approx(20 / 12)


def test_aggregate_sum_norm_needs_length():
    with pytest.raises(ValueError, match="norm_length"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm")


def test_aggregate_rejects_unknown_mode_listing_valid():
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        aggregate_loss(LOSS, MASK, "seq-mean")


@pytest.mark.parametrize(
    ("mode", "whole"),
    [("token-mean", 20 / 6), ("seq-mean-token-mean", 11 / 3), ("seq-mean-token-sum-norm", 20 / 12)],
)
def test_aggregate_exact_across_uneven_micro_batches(mode, whole):
    # micro-batches of 1 and 2 sequences, each given the whole batch's N = 6 tokens and B = 3
    parts = [(LOSS[:1], MASK[:1]), (LOSS[1:], MASK[1:])]
    total = sum(
        float(aggregate_loss(lm, m, mode, global_tokens=6, global_seqs=3, norm_length=4)) for lm, m in parts
    )
    assert total == pytest.approx(whole, abs=1e-12)


def test_clip_higher_loss_uses_aggregation_mode():
    # ratio 1 everywhere, advantage 1: per-token loss -1; seq-mean-token-sum-norm with L=4:
    # token sums -3 and -1 over (2 sequences * 4) = -0.5
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    loss, _ = clip_higher_policy_loss(
        lp, lp, torch.ones(2, 3), mask, loss_agg_mode="seq-mean-token-sum-norm", norm_length=4
    )
    assert float(loss) == pytest.approx(-0.5)


# padding: two all-zero rows (a padding group's sequences) appended to LOSS / MASK
PADDED_LOSS = torch.cat([LOSS, torch.full((2, 3), 9.0, dtype=torch.float64)])
PADDED_MASK = torch.cat([MASK, torch.zeros(2, 3, dtype=MASK.dtype)])


@pytest.mark.parametrize(("mode", "whole"), [("seq-mean-token-mean", 11 / 3), ("seq-mean-token-sum-norm", 20 / 12)])
def test_aggregate_padding_sequences_do_not_count_in_the_divisor(mode, whole):
    # per-sequence means 2, 4, 5 (and two empty rows): 11 / 3, as without the padding rows
    assert float(aggregate_loss(PADDED_LOSS, PADDED_MASK, mode, norm_length=4)) == pytest.approx(whole)


@pytest.mark.parametrize(("mode", "whole"), [("seq-mean-token-mean", 11 / 5), ("seq-mean-token-sum-norm", 20 / 20)])
def test_aggregate_count_convention_counts_every_row(mode, whole):
    # Trinity 0.6's aggregate_loss: 11 / 5 sequences; token sums 20 / (5 x L = 4)
    assert float(aggregate_loss(PADDED_LOSS, PADDED_MASK, mode, norm_length=4, empty_seqs="count")) == pytest.approx(whole)


def test_aggregate_a_batch_closed_at_the_cap_is_not_scaled_by_the_kept_share():
    # k = 3 kept sequences, K = 5 with padding: micro-batches [kept 3] and [padding 2], B counted as 3
    parts = [(PADDED_LOSS[:3], PADDED_MASK[:3]), (PADDED_LOSS[3:], PADDED_MASK[3:])]
    total = sum(float(aggregate_loss(lm, m, "seq-mean-token-mean", global_seqs=3)) for lm, m in parts)
    assert total == pytest.approx(11 / 3)


def test_aggregate_refuses_global_tokens_below_the_micro_batch_own():
    # the example: global_tokens=1 on a 3-token batch returned 3.0
    with pytest.raises(ValueError, match=r"global_tokens: 1 is below this micro-batch's own 3 response tokens"):
        aggregate_loss(torch.ones(1, 3), torch.ones(1, 3), "token-mean", global_tokens=1)


def test_aggregate_refuses_global_seqs_below_the_micro_batch_own():
    with pytest.raises(ValueError, match=r"global_seqs: 2 is below this micro-batch's own 3 sequences"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-mean", global_seqs=2)


def test_classify_refuses_a_nan_std_tol():
    # NaN compared false everywhere: all-equal groups looked informative
    with pytest.raises(ValueError, match=r"std_tol: must be a finite number >= 0, got nan"):
        classify_groups(np.array([[1.0, 1.0]]), std_tol=float("nan"))


def test_classify_refuses_a_non_finite_band_end():
    with pytest.raises(ValueError, match=r"band\[1\]: must be a finite number, got inf"):
        classify_groups(np.array([[1.0, 0.0]]), band=(0.0, float("inf")))


def test_overlong_refuses_a_nan_length_naming_it():
    # NaN compared false in both branches and fell through to -1
    with pytest.raises(ValueError, match=r"response_lengths: length nan at index \(1,\) is not a finite number >= 0"):
        overlong_penalty(np.array([3.0, float("nan")]), max_response_length=10, cache_length=4)


def test_overlong_refuses_a_nan_factor():
    with pytest.raises(ValueError, match=r"penalty_factor: must be a finite number >= 0, got nan"):
        overlong_penalty(np.array([3]), max_response_length=10, cache_length=4, penalty_factor=float("nan"))


@pytest.mark.parametrize("name", ["eps_high", "dual_clip"])
def test_clip_higher_refuses_a_nan_bound(name):
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match=rf"{name}: must be a finite number"):
        clip_higher_policy_loss(lp, lp, torch.ones(1, 2), torch.ones(1, 2), **{name: float("nan")})


# --------------------------------------------------------------------- batch_share_loss
def test_batch_loss_counts_counts_rows_sequences_with_tokens_and_tokens():
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    assert batch_loss_counts(mask).tolist() == [3.0, 2.0, 3.0]


def test_batch_share_of_a_micro_batch_by_hand():
    """Whole batch: rows [1, 2] (2 tokens), [4] (1 token), two padding rows: counts 4 rows,
    2 sequences, 3 tokens. The micro-batch of the first row alone: token-mean (1 + 2) / 3 = 1;
    seq-mean-token-mean, skip: 1.5 / 2 = 0.75; count: 1.5 / 4 = 0.375; sum-norm (L = 2), skip:
    3 / (2 * 2) = 0.75."""
    loss = torch.tensor([[1.0, 2.0]])
    mask = torch.tensor([[1, 1]])
    counts = torch.tensor([[4.0, 2.0, 3.0]])
    assert float(batch_share_loss(loss, mask, "token-mean", counts)) == pytest.approx(1.0)
    assert float(batch_share_loss(loss, mask, "seq-mean-token-mean", counts)) == pytest.approx(0.75)
    assert float(batch_share_loss(loss, mask, "seq-mean-token-mean", counts, empty_seqs="count")) == pytest.approx(0.375)
    assert float(batch_share_loss(loss, mask, "seq-mean-token-sum-norm", counts, norm_length=2)) == pytest.approx(0.75)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("empty", ["skip", "count"])
def test_batch_shares_of_any_split_add_up_to_the_whole_batch_loss(mode, empty):
    torch.manual_seed(0)
    loss = torch.randn(6, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]])
    counts = batch_loss_counts(mask).expand(6, 3)
    whole = aggregate_loss(loss, mask, mode, norm_length=4, empty_seqs=empty)
    for cuts in ([0, 6], [0, 1, 2, 3, 4, 5, 6], [0, 2, 5, 6]):
        shares = sum(batch_share_loss(loss[a:b], mask[a:b], mode, counts[a:b], norm_length=4, empty_seqs=empty)
                     for a, b in zip(cuts, cuts[1:]))
        assert float(shares) == pytest.approx(float(whole), rel=1e-12)


def test_batch_share_refuses_counts_below_what_the_rows_hold():
    with pytest.raises(ValueError, match="row 0 holds 2 of what its batch counts as 1"):
        batch_share_loss(torch.ones(1, 2), torch.ones(1, 2), "token-mean", torch.tensor([[1.0, 1.0, 1.0]]))
    with pytest.raises(ValueError, match=r"counts: expected shape \(1, 3\)"):
        batch_share_loss(torch.ones(1, 2), torch.ones(1, 2), "token-mean", torch.tensor([1.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        batch_share_loss(torch.ones(1, 2), torch.ones(1, 2), "token-mean", torch.tensor([[1.0, float("nan"), 2.0]]))
