"""GiGPO maths (algos/gigpo.py): hand-computed examples, edge cases and bad input."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from algos.gigpo import (
    GiGPOConfig,
    InvalidStepError,
    anchor_group_ids,
    broadcast_to_tokens,
    discounted_returns,
    encode_keys,
    episode_advantages,
    gigpo_advantages,
    gigpo_advantages_coded,
    multi_step_grpo_advantages,
    similarity_anchor_ids,
)
from algos.groups import normalise_in_groups

EPS = 1e-6


def cfg(**kw) -> GiGPOConfig:
    return GiGPOConfig(**kw)


# --------------------------------------------------------------------------- returns


def test_returns_follow_step_index_not_row_order():
    # one trajectory, rows given as steps 2, 0, 1; rewards by step: [0, 0, 1], gamma 0.5
    R = discounted_returns([1.0, 0.0, 0.0], ["t", "t", "t"], [2, 0, 1], gamma=0.5)
    np.testing.assert_array_equal(R, [1.0, 0.25, 0.5])


def test_returns_with_different_lengths_and_gamma_one():
    # traj a: [1, 2, 3] -> [6, 5, 3]; traj b: [4] -> [4]
    R = discounted_returns([1, 2, 3, 4], ["a", "a", "a", "b"], [0, 1, 2, 0], gamma=1.0)
    np.testing.assert_array_equal(R, [6.0, 5.0, 3.0, 4.0])


def test_returns_gamma_zero_are_rewards():
    R = discounted_returns([1.0, 2.0, 3.0], [0, 0, 0], [0, 1, 2], gamma=0.0)
    np.testing.assert_array_equal(R, [1.0, 2.0, 3.0])


def test_returns_fifty_steps_match_recursion():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=50)
    expect, run = np.zeros(50), 0.0
    for t in reversed(range(50)):
        run = rewards[t] + 0.95 * run
        expect[t] = run
    R = discounted_returns(rewards, np.zeros(50, int), np.arange(50), gamma=0.95)
    np.testing.assert_allclose(R, expect, rtol=0, atol=1e-12)


def test_returns_small_gamma_long_trajectory_does_not_overflow():
    # gamma^-(T-1) would overflow for 0.1 ** -999: falls back to the recursion
    r = np.zeros(1000)
    r[-1] = 1.0
    R = discounted_returns(r, np.zeros(1000, int), np.arange(1000), gamma=0.1)
    assert R[-1] == 1.0 and R[-2] == pytest.approx(0.1) and np.all(np.isfinite(R))


# --------------------------------------------------------------------------- episode advantage

# task "a": trajectory 0 has 3 steps (total 1), trajectories 1 and 2 have 2 and 1 steps (total 0)
EP_TASK = ["a"] * 6
EP_TRAJ = [0, 0, 0, 1, 1, 2]
EP_REW = [0.0, 0.0, 1.0, 0.0, 0.0, 0.0]


def test_episode_advantage_std_counts_each_trajectory_once():
    # totals [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3)
    adv, tot = episode_advantages(EP_REW, EP_TASK, EP_TRAJ, norm="std")
    s = math.sqrt(1 / 3)
    np.testing.assert_allclose(adv, [(2 / 3) / (s + EPS)] * 3 + [(-1 / 3) / (s + EPS)] * 3, atol=1e-12)
    np.testing.assert_array_equal(tot, [1, 1, 1, 0, 0, 0])


def test_episode_advantage_none_counts_each_trajectory_once():
    adv, _ = episode_advantages(EP_REW, EP_TASK, EP_TRAJ, norm="none")
    np.testing.assert_allclose(adv, [2 / 3] * 3 + [-1 / 3] * 3, atol=1e-15)


def test_episode_advantage_step_weighting_uses_step_rows():
    # rows [1, 1, 1, 0, 0, 0]: mean 1/2, unbiased std sqrt(6 * 0.25 / 5)
    adv, _ = episode_advantages(EP_REW, EP_TASK, EP_TRAJ, norm="std", weighting="step")
    s = math.sqrt(0.3)
    np.testing.assert_allclose(adv, [0.5 / (s + EPS)] * 3 + [-0.5 / (s + EPS)] * 3, atol=1e-12)
    adv_none, _ = episode_advantages(EP_REW, EP_TASK, EP_TRAJ, norm="none", weighting="step")
    np.testing.assert_allclose(adv_none, [0.5] * 3 + [-0.5] * 3, atol=1e-15)


def test_episode_advantage_single_trajectory_is_zero():
    adv, _ = episode_advantages([1.0, 2.0], ["a", "a"], [0, 0], norm="std")
    np.testing.assert_array_equal(adv, [0.0, 0.0])


def test_episode_groups_are_per_task():
    # task a: totals [1, 0]; task b: totals [5, 5] -> b gets 0 despite a's spread
    adv, _ = episode_advantages([1, 0, 5, 5], ["a", "a", "b", "b"], [0, 1, 2, 3], norm="none")
    np.testing.assert_array_equal(adv, [0.5, -0.5, 0.0, 0.0])


# --------------------------------------------------------------------------- step advantage

# Task "a", gamma 0.5. Trajectory 0 visits s0 twice (steps 0 and 2), rewards [0, 0, 0, 1]
# -> returns [0.125, 0.25, 0.5, 1]; trajectory 1 visits s0 then s3, rewards [0, 0] -> [0, 0].
REP = {
    "task_ids": ["a"] * 6,
    "run_ids": [0, 0, 0, 0, 1, 1],
    "steps": [0, 1, 2, 3, 0, 1],
    "rewards": [0, 0, 0, 1, 0, 0],
    "state_hashes": ["s0", "s1", "s0", "s2", "s0", "s3"],
}


def test_step_advantage_repeated_visits_none():
    out = gigpo_advantages(**REP, config=cfg(gamma=0.5, norm="none"))
    np.testing.assert_array_equal(out.returns, [0.125, 0.25, 0.5, 1.0, 0.0, 0.0])
    mean = (0.125 + 0.5 + 0.0) / 3
    np.testing.assert_allclose(out.step, [0.125 - mean, 0, 0.5 - mean, 0, -mean, 0], atol=1e-15)
    np.testing.assert_array_equal(out.anchor_sizes, [3, 1, 3, 1, 3, 1])


def test_step_advantage_repeated_visits_std():
    out = gigpo_advantages(**REP, config=cfg(gamma=0.5, norm="std"))
    dev = np.array([-1 / 12, 7 / 24, -5 / 24])  # s0 members minus mean 5/24
    std = math.sqrt((dev**2).sum() / 2)
    a = dev / (std + EPS)
    np.testing.assert_allclose(out.step, [a[0], 0, a[1], 0, a[2], 0], atol=1e-12)


def test_singleton_anchor_group_gives_zero():
    out = gigpo_advantages(["a", "a"], [0, 1], [0, 0], [1.0, 0.0], ["x", "y"], config=cfg(norm="none"))
    np.testing.assert_array_equal(out.step, [0.0, 0.0])
    np.testing.assert_array_equal(out.anchor_sizes, [1, 1])


def test_identical_returns_give_exactly_zero():
    # three trajectories with reward 0.1 from one state: a naive mean (0.1*3/3) is off by 1 ulp
    out = gigpo_advantages(["a"] * 3, [0, 1, 2], [0, 0, 0], [0.1] * 3, ["s"] * 3, config=cfg(norm="std"))
    assert np.all(out.step == 0.0) and np.all(out.episode == 0.0)


def test_equal_suffixes_of_different_lengths_give_exactly_zero():
    # s1 is reached at step 1 of run 0 and step 2 of run 1; both have return 0.95 * 1 there
    out = gigpo_advantages(
        ["a"] * 7,
        [0, 0, 0, 1, 1, 1, 1],
        [0, 1, 2, 0, 1, 2, 3],
        [0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0],
        ["s0", "s1", "g", "s0", "s2", "s1", "g"],
        config=cfg(norm="std"),
    )
    s1 = out.step[[1, 5]]
    assert out.returns[1] == out.returns[5] == 0.95
    np.testing.assert_array_equal(s1, [0.0, 0.0])


def test_two_tasks_sharing_a_state_are_not_mixed():
    # both tasks start from state "start"; task a returns [1, 0], task b returns [0, 0]
    out = gigpo_advantages(
        ["a", "a", "b", "b"], [0, 1, 0, 1], [0, 0, 0, 0], [1.0, 0.0, 0.0, 0.0], ["start"] * 4, config=cfg(norm="none")
    )
    np.testing.assert_array_equal(out.step, [0.5, -0.5, 0.0, 0.0])
    assert len(set(out.anchor_ids.tolist())) == 2


def test_combined_advantage_is_episode_plus_omega_step():
    out = gigpo_advantages(**REP, config=cfg(gamma=0.5, norm="none", omega=0.5))
    # episode totals: run 0 -> 1, run 1 -> 0 => A_E = +-0.5
    np.testing.assert_array_equal(out.episode, [0.5] * 4 + [-0.5] * 2)
    np.testing.assert_allclose(out.advantages, out.episode + 0.5 * out.step, atol=0)


def test_shuffled_rows_give_bitwise_identical_results():
    rng = np.random.default_rng(1)
    tasks, runs, steps, rewards, hashes = [], [], [], [], []
    for t in range(4):
        for run in range(5):
            for s in range(int(rng.integers(1, 9))):
                tasks.append(f"t{t}")
                runs.append(run)
                steps.append(s)
                rewards.append(float(rng.choice([0.0, 0.1, 1.0])))
                hashes.append(f"h{int(rng.integers(0, 4))}")
    arrays = [np.array(x) for x in (tasks, runs, steps, rewards, hashes)]
    ref = gigpo_advantages(*arrays)
    perm = rng.permutation(len(tasks))
    shuf = gigpo_advantages(*(a[perm] for a in arrays))
    for name in ("advantages", "episode", "step", "returns", "anchor_sizes"):
        np.testing.assert_array_equal(getattr(shuf, name), getattr(ref, name)[perm], err_msg=name)


def _naive_gigpo(tasks, runs, steps, rewards, hashes, gamma, norm, eps=EPS):
    """Dict-and-loop reference, written independently of the vectorised code."""
    traj = defaultdict(list)
    for i in range(len(tasks)):
        traj[(tasks[i], runs[i])].append((steps[i], i))
    ret, total = [0.0] * len(tasks), {}
    for key, rows in traj.items():
        run = 0.0
        for _, i in sorted(rows, reverse=True):
            run = rewards[i] + gamma * run
            ret[i] = run
        total[key] = sum(rewards[i] for _, i in rows)

    def norm_fn(x, xs):
        if len(xs) < 2:
            return 0.0
        m = sum(xs) / len(xs)
        if norm == "none":
            return x - m
        return (x - m) / (math.sqrt(sum((v - m) ** 2 for v in xs) / (len(xs) - 1)) + eps)

    by_task = defaultdict(list)
    for (t, _), v in total.items():
        by_task[t].append(v)
    by_anchor = defaultdict(list)
    for i in range(len(tasks)):
        by_anchor[(tasks[i], hashes[i])].append(ret[i])
    ep = [norm_fn(total[(tasks[i], runs[i])], by_task[tasks[i]]) for i in range(len(tasks))]
    st = [norm_fn(ret[i], by_anchor[(tasks[i], hashes[i])]) for i in range(len(tasks))]
    return np.array(ep), np.array(st)


@pytest.mark.parametrize("norm", ["std", "none"])
def test_matches_naive_reference_on_random_batch(norm):
    rng = np.random.default_rng(2)
    rows = [
        (f"t{t}", run, s, float(rng.choice([0.0, 0.5, 1.0])), f"h{int(rng.integers(0, 5))}")
        for t in range(6)
        for run in range(4)
        for s in range(int(rng.integers(1, 12)))
    ]
    tasks, runs, steps, rewards, hashes = (list(c) for c in zip(*rows))
    out = gigpo_advantages(tasks, runs, steps, rewards, hashes, config=cfg(gamma=0.9, norm=norm))
    ep, st = _naive_gigpo(tasks, runs, steps, rewards, hashes, 0.9, norm)
    np.testing.assert_allclose(out.episode, ep, atol=1e-9)
    np.testing.assert_allclose(out.step, st, atol=1e-9)


def test_coded_entry_point_hand_computed():
    # group 0: run 0 steps (rewards 0, 1) from states 5, 6; run 1 one step (reward 0) from state 5.
    # gamma 0.5, F_norm 1: R = [0.5, 1] and [0]; episode totals 1 and 0 -> A_E = +-0.5;
    # anchor (0, 5) holds returns 0.5 and 0 -> A_S = +-0.25; (0, 6) is alone -> 0.
    out = gigpo_advantages_coded([0, 0, 0], [0, 0, 1], [0, 1, 0], [0.0, 1.0, 0.0], [5, 6, 5],
                                 config=cfg(gamma=0.5, norm="none"))
    np.testing.assert_array_equal(out.returns, [0.5, 1.0, 0.0])
    np.testing.assert_array_equal(out.episode, [0.5, 0.5, -0.5])
    np.testing.assert_array_equal(out.step, [0.25, 0.0, -0.25])
    np.testing.assert_array_equal(out.advantages, [0.75, 0.5, -0.75])
    np.testing.assert_array_equal(out.anchor_sizes, [2, 1, 2])


@pytest.mark.parametrize("norm", ["std", "none"])
def test_coded_entry_point_equals_gigpo_advantages_on_the_keys_the_codes_stand_for(norm):
    rng = np.random.default_rng(3)
    rows = [
        (f"t{t}", run, s, float(rng.normal()), f"h{int(rng.integers(0, 4))}", bool(rng.random() < 0.1))
        for t in range(7) for run in range(5) for s in range(int(rng.integers(1, 10)))
    ]
    perm = rng.permutation(len(rows))
    tasks, runs, steps, rewards, hashes, invalid = (np.array(c)[perm] for c in zip(*rows))
    c = cfg(gamma=0.9, norm=norm, omega=0.7, invalid_action_penalty=0.2)
    ref = gigpo_advantages(tasks, runs, steps, rewards, hashes, config=c, invalid=invalid)
    # codes numbered in order of first appearance, not sorted: the numbers must not depend on labels
    g_codes = {k: i for i, k in enumerate(dict.fromkeys(tasks.tolist()))}
    s_codes = {k: i for i, k in enumerate(dict.fromkeys(hashes.tolist()))}
    got = gigpo_advantages_coded([g_codes[t] for t in tasks], runs, steps, rewards, [s_codes[h] for h in hashes],
                                 config=c, invalid=invalid)
    for name in ("advantages", "episode", "step", "returns", "episode_returns", "anchor_sizes"):
        np.testing.assert_allclose(getattr(got, name), getattr(ref, name), rtol=0, atol=1e-9, err_msg=name)
    ep, st = _naive_gigpo(tasks.tolist(), runs.tolist(), steps.tolist(), (rewards - 0.2 * invalid).tolist(),
                          hashes.tolist(), 0.9, norm)
    np.testing.assert_allclose(got.episode, ep, atol=1e-9)
    np.testing.assert_allclose(got.step, st, atol=1e-9)


def test_coded_entry_point_names_the_group_of_a_bad_step():
    with pytest.raises(InvalidStepError, match=r"reward: non-finite value nan at row 1 \(task 'alfworld/3', run 0, step 1\)"):
        gigpo_advantages_coded([0, 0], [0, 0], [0, 1], [0.0, float("nan")], [0, 1], group_names=["alfworld/3"])
    with pytest.raises(InvalidStepError, match=r"duplicate step 0 of task 'alfworld/3' run 2"):
        gigpo_advantages_coded([0, 0], [2, 2], [0, 0], [0.0, 1.0], [0, 1], group_names=["alfworld/3"])
    with pytest.raises(ValueError, match="similarity_threshold needs state texts"):
        gigpo_advantages_coded([0], [0], [0], [0.0], [0], config=cfg(similarity_threshold=0.9))


def test_encode_keys_of_dense_and_sparse_integer_codes():
    # already dense codes are their own ids; sparse or negative ones are ranked
    np.testing.assert_array_equal(encode_keys(np.array([2, 0, 1, 0]))[0], [2, 0, 1, 0])
    np.testing.assert_array_equal(encode_keys(np.array([7, 3, 7, -1]))[0], [2, 1, 2, 0])
    np.testing.assert_array_equal(encode_keys(np.array([1, 1, 2]))[0], [0, 0, 1])
    ids, k = encode_keys(np.array([1, 0, 1, 0]), np.array([9, 9, 4, 9]))  # (1,9) (0,9) (1,4) (0,9)
    np.testing.assert_array_equal(ids, [2, 0, 1, 0])
    assert k == 3


def test_invalid_action_penalty_lowers_reward():
    out = gigpo_advantages(
        ["a", "a"], [0, 1], [0, 0], [0.0, 0.0], ["s", "s"], invalid=[True, False],
        config=cfg(norm="none", invalid_action_penalty=0.1),
    )
    np.testing.assert_allclose(out.returns, [-0.1, 0.0])
    np.testing.assert_allclose(out.step, [-0.05, 0.05])


def test_broadcast_to_tokens_numpy_and_torch():
    adv = np.array([1.5, -2.0])
    mask = np.array([[1, 1, 0], [0, 1, 1]])
    np.testing.assert_array_equal(broadcast_to_tokens(adv, mask), [[1.5, 1.5, 0], [0, -2.0, -2.0]])
    out = broadcast_to_tokens(adv, torch.tensor(mask, dtype=torch.bool))
    assert out.dtype == torch.float32
    assert torch.equal(out, torch.tensor([[1.5, 1.5, 0], [0, -2.0, -2.0]]))


def test_normalise_in_groups_none_centres_only():
    np.testing.assert_array_equal(normalise_in_groups([1.0, 3.0, 7.0], [0, 0, 1], norm="none"), [-1.0, 1.0, 0.0])


# --------------------------------------------------------------------------- similarity


def test_similarity_grouping_is_order_independent_components():
    # "a b c d" ~ "a b c e" ~ "a b f e" by token Jaccard >= 0.6 (3/5): a chain, one group
    texts = ["a b c d", "x y z w", "a b f e", "a b c e"]
    ids, sizes = similarity_anchor_ids(["t"] * 4, texts, threshold=0.6, similarity="jaccard")
    assert ids[0] == ids[2] == ids[3] != ids[1]
    np.testing.assert_array_equal(sizes, [3, 1, 3, 3])
    perm = [3, 1, 0, 2]
    ids_p, _ = similarity_anchor_ids(["t"] * 4, [texts[i] for i in perm], threshold=0.6, similarity="jaccard")
    np.testing.assert_array_equal(ids_p, ids[perm])


def test_similarity_grouping_never_crosses_tasks():
    ids, _ = similarity_anchor_ids(["a", "b"], ["same text", "same text"], threshold=0.9)
    assert ids[0] != ids[1]


def test_similarity_ratio_through_config():
    out = gigpo_advantages(
        ["a", "a"], [0, 1], [0, 0], [1.0, 0.0], ["h1", "h2"],
        state_texts=["grid: S F F G step 1", "grid: S F F G step 2"],
        config=cfg(norm="none", similarity_threshold=0.9),
    )
    np.testing.assert_array_equal(out.step, [0.5, -0.5])


def test_exact_anchor_group_ids_sizes():
    ids, sizes = anchor_group_ids(["a", "a", "b"], ["h", "h", "h"])
    assert ids[0] == ids[1] != ids[2]
    np.testing.assert_array_equal(sizes, [2, 2, 1])


# --------------------------------------------------------------------------- bad input


def test_missing_state_hash_is_refused():
    with pytest.raises(InvalidStepError, match=r"env_state_hash.*None.*task 'a', run 1, step 0"):
        gigpo_advantages(["a", "a"], [0, 1], [0, 0], [0.0, 0.0], ["s", None])
    with pytest.raises(InvalidStepError, match=r"env_state_hash.*''"):
        gigpo_advantages(["a"], [0], [0], [0.0], [""])


def test_duplicate_task_run_step_is_refused():
    with pytest.raises(InvalidStepError, match=r"duplicate step 1 of task 'a' run 0"):
        gigpo_advantages(["a"] * 3, [0, 0, 0], [0, 1, 1], [0.0, 0.0, 1.0], ["s", "t", "u"])


def test_non_finite_reward_is_refused():
    with pytest.raises(InvalidStepError, match=r"reward: non-finite value nan at row 1 \(task 'a', run 0, step 1\)"):
        gigpo_advantages(["a", "a"], [0, 0], [0, 1], [0.0, float("nan")], ["s", "t"])


def test_step_gap_is_refused():
    with pytest.raises(InvalidStepError, match=r"steps: task 'a' run 0 jumps from step 0 to 2"):
        gigpo_advantages(["a", "a"], [0, 0], [0, 2], [0.0, 1.0], ["s", "t"])


def test_length_mismatch_is_refused():
    with pytest.raises(InvalidStepError, match=r"lengths"):
        gigpo_advantages(["a", "a"], [0, 1], [0, 0], [0.0], ["s", "t"])


@pytest.mark.parametrize("gamma", [-0.1, 1.5])
def test_gamma_out_of_range_is_refused(gamma):
    with pytest.raises(ValidationError, match="gamma"):
        GiGPOConfig(gamma=gamma)
    with pytest.raises(ValueError, match=rf"gamma must be in \[0, 1\], got {gamma}"):
        discounted_returns([0.0], [0], [0], gamma=gamma)


def test_unknown_norm_is_refused():
    with pytest.raises(ValidationError, match="norm"):
        GiGPOConfig(norm="l2")
    with pytest.raises(ValueError, match=r"norm must be 'std' or 'none', got 'l2'"):
        normalise_in_groups([1.0], [0], norm="l2")


def test_config_defaults_are_the_papers():
    c = GiGPOConfig()
    assert (c.gamma, c.omega, c.norm, c.eps, c.episode_weighting) == (0.95, 1.0, "std", 1e-6, "trajectory")


# --------------------------------------------------------------------------- end-to-end job


def test_job_with_memory_index_matches_pure_function():
    from orchestrator.jobs.gigpo import GiGPOJobConfig, run_gigpo_job

    r = run_gigpo_job(GiGPOJobConfig(tasks=4, n=4, max_steps=6, workers=2, seed=3), return_experiences=True)
    assert (r["backend"], r["tasks"], r["trajectories"]) == ("memory", 4, 16)
    assert r["steps"] == len(r["experiences"]) and r["max_abs_diff_vs_pure"] <= 1e-9
    assert 0.0 <= r["anchor_group_fraction"] <= 1.0 and set(r["timings"]) >= {"rollout_s", "advantage_s", "total_s"}


def test_job_with_redis_index_and_three_workers(redis_url, redis_namespace):
    from orchestrator.jobs.gigpo import GiGPOJobConfig, run_gigpo_job

    r = run_gigpo_job(
        GiGPOJobConfig(tasks=6, n=4, max_steps=8, workers=3, seed=1, redis_url=redis_url, prefix=redis_namespace, invalid_prob=0.1)
    )
    assert r["backend"] == "redis" and r["max_abs_diff_vs_pure"] <= 1e-9
    # every task's first state is one anchor group of size >= n, so the fraction is positive
    assert r["anchor_group_fraction"] > 0


def test_job_config_refuses_one_worker_and_engine_without_policy():
    from orchestrator.jobs.gigpo import GiGPOJobConfig, GiGPOJobError, run_gigpo_job

    with pytest.raises(ValidationError, match="workers"):
        GiGPOJobConfig(workers=1)
    with pytest.raises(GiGPOJobError, match="policy='engine' needs an act callable"):
        run_gigpo_job(GiGPOJobConfig(policy="engine"))


def test_job_with_act_callable_writes_summary(tmp_path):
    from orchestrator.envs.policies import random_act
    from orchestrator.jobs.gigpo import GiGPOJobConfig, run_gigpo_job

    calls = []
    inner = random_act(5)

    def act(prompts, choices):
        calls.append(len(prompts))
        return inner(prompts, choices)

    r = run_gigpo_job(GiGPOJobConfig(tasks=2, n=3, max_steps=4, policy="engine", out_dir=tmp_path), act=act)
    assert calls and calls[0] == 6 and r["steps"] == sum(calls)
    assert (tmp_path / "gigpo.json").exists()


# ------------------------------------------------------------------ multi-step GRPO (the baseline)
def test_multi_step_grpo_broadcasts_each_last_step_reward_normalised_in_its_task():
    # task a: runs 0, 1, 2 end with rewards 1, 0, 0 (earlier steps' rewards are ignored);
    # mean 1/3, sample std sqrt(1/3): run 0 -> (2/3) / sqrt(1/3) = 1.1547, runs 1, 2 -> -0.57735.
    # task b has one run: Trinity scores it against mean 0, std 1 -> 2 / (1 + 1e-6).
    task = ["a", "a", "a", "a", "a", "a", "b"]
    run = [0, 0, 1, 2, 2, 2, 0]
    step = [0, 1, 0, 0, 1, 2, 0]
    reward = [0.5, 1.0, 0.0, 0.3, 0.0, 0.0, 2.0]
    adv = multi_step_grpo_advantages(task, run, step, reward)
    third = math.sqrt(1 / 3)
    expected = [(2 / 3) / (third + 1e-6)] * 2 + [(-1 / 3) / (third + 1e-6)] * 4 + [2 / (1 + 1e-6)]
    np.testing.assert_allclose(adv, expected, rtol=1e-12)


def test_multi_step_grpo_equals_omega_zero_gigpo_when_only_the_last_step_is_rewarded():
    task = ["a"] * 5 + ["b"] * 4
    run = [0, 0, 1, 2, 2, 0, 1, 1, 2]
    step = [0, 1, 0, 0, 1, 0, 0, 1, 0]
    reward = [0, 1, 0, 0, 1, 0, 0, 1, 0]
    hashes = [f"h{s}" for s in step]
    ours = gigpo_advantages(task, run, step, reward, hashes, config=GiGPOConfig(omega=0.0))
    np.testing.assert_allclose(multi_step_grpo_advantages(task, run, step, reward), ours.advantages, rtol=1e-12)


def test_multi_step_grpo_rejects_a_nan_reward_naming_task_run_and_step():
    with pytest.raises(InvalidStepError, match=r"non-finite value nan at row 1 \(task 'a', run 0, step 1\)"):
        multi_step_grpo_advantages(["a", "a"], [0, 0], [0, 1], [0.0, float("nan")])


def test_a_task_whose_runs_span_too_many_model_versions_is_refused_naming_task_run_and_step():
    cfg = GiGPOConfig(max_version_spread=1)
    args = (["a", "a", "a", "b"], [0, 0, 1, 0], [0, 1, 0, 0], [0.0, 1.0, 0.0, 1.0], ["s0", "s1", "s0", "t0"])
    with pytest.raises(InvalidStepError, match=r"task 'a' run 1 step 0 was produced by model version 3, 2 versions before"):
        gigpo_advantages(*args, config=cfg, model_versions=[5, 5, 3, 0])
    ok = gigpo_advantages(*args, config=cfg, model_versions=[5, 5, 4, 0])  # spread 1 within task a; b alone
    np.testing.assert_array_equal(ok.advantages, gigpo_advantages(*args).advantages)
