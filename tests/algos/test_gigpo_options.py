"""GiGPO options that restore the reference's (verl-agent's) behaviour, each tested both ways by hand."""

from __future__ import annotations

import pytest

from algos.gigpo import (
    GiGPOConfig,
    InvalidStepError,
    anchor_group_ids,
    episode_advantages,
    gigpo_advantages,
    similarity_anchor_ids,
)
from algos.groups import normalise_in_groups

EPS = 1e-6


def test_singleton_episode_zero_by_default():
    adv, _ = episode_advantages([2.0], ["t"], [0], norm="std", eps=EPS)
    assert adv.tolist() == [0.0]


def test_singleton_episode_raw_is_return_over_one_plus_eps():
    # verl-agent: mean 0, std 1 -> (2 - 0) / (1 + eps)
    adv, _ = episode_advantages([2.0], ["t"], [0], norm="std", eps=EPS, singleton="raw")
    assert adv.tolist() == [2.0 / (1.0 + EPS)]


def test_singleton_episode_raw_without_std_is_the_return():
    adv, _ = episode_advantages([1.5, 0.5], ["t", "t"], [0, 0], norm="none", singleton="raw")
    assert adv.tolist() == [2.0, 2.0]  # one trajectory of two steps, total 2


def test_singleton_raw_leaves_larger_groups_alone():
    # task u has returns 1 and 3 -> centred -1, +1 (norm none); task t is a singleton with return 5
    adv, _ = episode_advantages([5.0, 1.0, 3.0], ["t", "u", "u"], [0, 1, 2], norm="none", singleton="raw")
    assert adv.tolist() == [5.0, -1.0, 1.0]


# one trajectory, steps 0 and 1, rewards 0 and 1, step 1 invalid; penalty 0.1, gamma 0.5
def _penalised(timing):
    cfg = GiGPOConfig(gamma=0.5, invalid_action_penalty=0.1, penalty_timing=timing, norm="none")
    return gigpo_advantages(["t", "t"], [0, 0], [0, 1], [0.0, 1.0], ["a", "b"], config=cfg, invalid=[False, True])


def test_penalty_before_returns_reaches_earlier_steps():
    # rewards 0, 0.9 -> R = [0.5 * 0.9, 0.9]
    assert _penalised("before_returns").returns.tolist() == pytest.approx([0.45, 0.9], abs=1e-15)


def test_penalty_after_returns_hits_the_invalid_step_only():
    # R from 0, 1 = [0.5, 1]; then the invalid step loses 0.1 -> [0.5, 0.9]
    assert _penalised("after_returns").returns.tolist() == pytest.approx([0.5, 0.9], abs=1e-15)


def test_penalty_counts_in_the_episode_return_either_way():
    assert _penalised("after_returns").episode_returns.tolist() == pytest.approx([0.9, 0.9])
    assert _penalised("before_returns").episode_returns.tolist() == pytest.approx([0.9, 0.9])


# Jaccard: J(X, Y) = 3/4, J(Y, Z) = 4/5, J(X, Z) = 3/5; threshold 0.7 links X-Y and Y-Z only
X, Y, Z = "a b c", "a b c d", "a b c d e"


def test_similarity_components_join_a_chain():
    ids, sizes = similarity_anchor_ids(["t"] * 3, [X, Z, Y], threshold=0.7, similarity="jaccard")
    assert sizes.tolist() == [3, 3, 3]


def test_similarity_greedy_follows_row_order():
    # X founds a cluster, Z is not similar to X -> its own, Y joins X's (the first that fits)
    ids, sizes = similarity_anchor_ids(["t"] * 3, [X, Z, Y], threshold=0.7, similarity="jaccard", grouping="greedy")
    assert ids[0] == ids[2] != ids[1]
    assert sizes.tolist() == [2, 1, 2]


def test_similarity_greedy_other_order_gives_one_cluster():
    # Y first: X (3/4) and Z (4/5) both join Y's cluster
    _, sizes = similarity_anchor_ids(["t"] * 3, [Y, X, Z], threshold=0.7, similarity="jaccard", grouping="greedy")
    assert sizes.tolist() == [3, 3, 3]


def test_population_std_option():
    # [1, 3]: centred -1, +1; population std 1, sample std sqrt(2)
    pop = normalise_in_groups([1.0, 3.0], [0, 0], std="population", eps=EPS)
    sam = normalise_in_groups([1.0, 3.0], [0, 0], eps=EPS)
    assert pop.tolist() == pytest.approx([-1 / (1 + EPS), 1 / (1 + EPS)], abs=1e-15)
    assert sam.tolist() == pytest.approx([-1 / (2**0.5 + EPS), 1 / (2**0.5 + EPS)], abs=1e-15)


def test_anchor_hash_must_be_str_or_bytes():
    with pytest.raises(InvalidStepError, match="str or bytes.*dict.*state_hash"):
        anchor_group_ids(["t", "t"], [{"x": 1}, "a"])


def test_anchor_bytes_hash_equals_its_hex_string():
    _, sizes = anchor_group_ids(["t", "t"], [b"\x01\xff", "01ff"])
    assert sizes.tolist() == [2, 2]
