"""Semantics of the state machine, each on a hand-computed scenario (no Ray)."""

from __future__ import annotations

import json
import math

import pytest

from algos.dapo import InvalidGroupError
from orchestrator.core.machine import OrchestratorCore, rollout_lags, trajectory_rollouts
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group

TASKS = [f"t{i}" for i in range(6)]


def rollout(task, run, reward, *, version=None, metrics=None, step=0, tag=""):
    info = {} if version is None else {"model_version": version}
    return Experience(eid=ExperienceId(task=task, run=run, step=step, round_tag=tag), reward=reward, info=info, metrics=metrics or {})


def group(task, rewards, *, versions=None, accuracy=False, version=0):
    versions = versions or [None] * len(rewards)
    rs = [
        rollout(task, i, r, version=v, metrics={"accuracy": float(r > 0)} if accuracy else None)
        for i, (r, v) in enumerate(zip(rewards, versions))
    ]
    return Group(task_id=task, rollouts=rs, model_version=version)


def core(tasks=TASKS, **policy):
    return OrchestratorCore(ResamplingPolicy(**{"target_groups": 2, "group_size": 2, **policy}), tasks, seed=0)


def invariant(c):
    s = c.stats()
    return s.groups_submitted == s.groups_emitted + s.groups_padded + s.groups_dropped + s.groups_held


# ---------------------------------------------------------------- what the filter judges
def test_auto_judge_uses_the_unshaped_accuracy():
    # both correct (accuracy 1), one reward shaped by an overlong penalty: not informative
    g = group("t0", [0.7, 1.0], accuracy=True)
    core().submit([g])
    assert g.reason == "all_correct"


def test_auto_judge_falls_back_to_the_reward_without_accuracy():
    g = group("t0", [0.7, 1.0])
    core().submit([g])
    assert g.reason == "informative"


def test_explicit_reward_judge_sees_the_shaping():
    g = group("t0", [0.7, 1.0], accuracy=True)
    core(filter={"judge": "reward"}).submit([g])
    assert g.reason == "informative"


def test_std_tol_zero_is_exact_in_the_core():
    g = group("t0", [0.35] * 7)
    core(group_size=7, filter={"std_tol": 0.0}).submit([g])
    assert g.reason == "zero_variance"


def test_filter_disabled_keeps_an_all_equal_group():
    g = group("t0", [1.0, 1.0])
    c = core(filter={"enabled": False})
    c.submit([g])
    assert g.reason == "informative" and c.stats().groups_carried == 1


# ---------------------------------------------------------------- multi-turn
def test_multi_turn_all_solved_group_is_not_informative():
    # run 0 solves at its 3rd step (step rewards 0, 0, 1), run 1 at its first (1):
    # outcomes 1 and 1 -> all correct; the 4 step rows (0, 0, 1, 1) would have looked informative
    steps = [rollout("t0", 0, r, step=k) for k, r in enumerate([0.0, 0.0, 1.0])] + [rollout("t0", 1, 1.0)]
    g = Group(task_id="t0", rollouts=trajectory_rollouts(steps))
    core().submit([g])
    assert g.reason == "all_correct"


def test_multi_turn_group_judged_per_trajectory_and_counted_per_rollout():
    # run 0: 3 steps, outcome 1; run 1: 1 step, outcome 0 -> informative, 2 rollouts (not 4 rows)
    steps = [rollout("t0", 0, r, step=k) for k, r in enumerate([0.0, 0.0, 1.0])] + [rollout("t0", 1, 0.0)]
    g = Group(task_id="t0", rollouts=trajectory_rollouts(steps))
    c = core()
    c.submit([g])
    assert g.reason == "informative"
    assert c.stats().rollouts_initial == 2


def test_trajectory_rollout_keeps_steps_and_oldest_version():
    steps = [rollout("t0", 0, 0.0, step=1, version=3), rollout("t0", 0, 1.0, step=0, version=2)]
    (r,) = trajectory_rollouts(steps)
    assert r.reward == 1.0 and r.info["num_steps"] == 2 and r.info["model_version"] == 2
    assert [s.eid.step for s in r.info["steps"]] == [0, 1]


# ---------------------------------------------------------------- group validity
def test_mask_keeps_a_group_with_one_nan_member():
    g = group("t0", [1.0, float("nan"), -1.0])
    c = core(group_size=3, group_validity="mask", min_valid_group_size=2)
    c.submit([g])
    assert g.reason == "informative"
    assert g.rollouts[1].info["dso_masked"] == "invalid" and g.rollouts[1].info["dso_loss_weight"] == 0.0
    assert c.stats().rollouts_masked == 1 and invariant(c)


def test_masking_an_invalid_member_leaves_the_submitted_rollout_as_it_was():
    g = group("t0", [1.0, float("nan"), -1.0])
    submitted = list(g.rollouts)
    core(group_size=3, group_validity="mask", min_valid_group_size=2).submit([g])
    assert submitted[1].info == {} and g.rollouts[1].info["dso_masked"] == "invalid"
    assert g.rollouts[0] is submitted[0] and g.rollouts[1] is not submitted[1]


def test_mask_judges_the_valid_members_only():
    # valid members 1, 1 -> all correct, although the NaN member would have been "wrong"
    g = group("t0", [1.0, float("nan"), 1.0])
    core(group_size=3, group_validity="mask").submit([g])
    assert g.reason == "all_correct"


def test_mask_below_min_valid_rejects_through_the_direct_api():
    c = core(group_size=3, group_validity="mask", min_valid_group_size=3)
    with pytest.raises(InvalidGroupError, match="2 usable rollouts of 3, below min_valid_group_size=3"):
        c.submit([group("t0", [1.0, float("nan"), -1.0])])
    assert c.stats().groups_submitted == 0


def test_mask_accepts_a_partial_group():
    g = Group(task_id="t0", rollouts=[rollout("t0", 0, 1.0), rollout("t0", 2, -1.0)])
    c = core(group_size=3, group_validity="mask")
    c.submit([g])
    assert g.reason == "informative" and c.stats().rollouts_initial == 2


def test_reject_refuses_a_partial_group():
    g = Group(task_id="t0", rollouts=[rollout("t0", 0, 1.0), rollout("t0", 2, -1.0)])
    with pytest.raises(InvalidGroupError, match="has 2 rollouts, expected group_size=3"):
        core(group_size=3).submit([g])


def test_on_invalid_drop_keeps_the_other_groups():
    good, bad = group("t0", [1.0, -1.0]), group("t1", [1.0, float("nan")])
    c = core()
    c.submit([good, bad], on_invalid="drop")
    s = c.stats()
    assert (good.reason, bad.reason) == ("informative", "invalid")
    assert s.dropped_by_reason["invalid"] == 1 and s.groups_carried == 1 and invariant(c)


def test_masked_member_leaves_the_trained_reward():
    # group 1: 1, -1, (NaN masked); group 2: 1, -1, 3 -> trained rewards 1, -1, 1, -1, 3: mean 0.6
    c = core(group_size=3, group_validity="mask")
    c.submit([group("t0", [1.0, -1.0, float("nan")]), group("t1", [1.0, -1.0, 3.0])])
    batch = c.try_emit()
    assert batch is not None
    assert c.stats().mean_reward_trained == pytest.approx(0.6)


# ---------------------------------------------------------------- filter-only, cross-field checks
def test_filter_only_closes_after_the_initial_round():
    c = core(replenish="none", on_cap="partial")
    c.plan_round()
    c.submit([group("t0", [1.0, -1.0]), group("t1", [-1.0, -1.0])])
    assert c.cap_reached()
    batch = c.close_at_cap()
    assert [g.task_id for g in batch.groups] == ["t0"] and batch.partial and batch.rounds == 0


def test_group_size_one_with_filtering_is_refused():
    with pytest.raises(InvalidPolicyError, match="group_size: 1 with filter.enabled"):
        ResamplingPolicy.parse({"group_size": 1})


def test_group_size_one_without_filtering_is_allowed():
    assert ResamplingPolicy.parse({"group_size": 1, "filter": {"enabled": False}}).group_size == 1


def test_min_valid_above_group_size_is_refused():
    with pytest.raises(InvalidPolicyError, match=r"min_valid_group_size \(5\) must be <= group_size \(4\)"):
        ResamplingPolicy.parse({"group_size": 4, "group_validity": "mask", "min_valid_group_size": 5})


# ---------------------------------------------------------------- staleness
def _carried(versions, model_version, **policy):
    c = core(group_size=3, target_groups=1, **policy)
    c.set_model_version(model_version)
    g = group("t0", [1.0, -1.0, 1.0], versions=versions)
    c.submit([g])
    return c, g, c.try_emit()


def test_lag_equal_to_max_staleness_is_fresh():
    # model version 3, rollouts of version 2: lag 1 == max_staleness 1
    _, _, batch = _carried([2, 2, 2], 3, max_staleness=1)
    assert batch is not None


def test_lag_above_max_staleness_is_stale():
    c, _, batch = _carried([1, 1, 1], 3, max_staleness=1)
    assert batch is None and c.stats().dropped_by_reason["stale"] == 1


def test_oldest_member_decides():
    # two fresh members (3) and one of version 1 (lag 2 > 1): the group is dropped
    c, g, batch = _carried([3, 3, 1], 3, max_staleness=1)
    assert batch is None and c.stats().dropped_by_reason["stale"] == 1 and invariant(c)


def test_stale_member_masked_by_policy():
    # lags 0, 0, 2 -> member 2 masked; 1 and -1 remain (still informative)
    c, g, batch = _carried([3, 3, 1], 3, max_staleness=1, stale_members="mask")
    assert batch is not None and batch.groups[0].rollouts[2].info["dso_masked"] == "stale"
    assert rollout_lags(batch).tolist() == [0, 0]


def test_stale_masking_flags_copies_and_leaves_the_held_rollouts_as_accepted():
    c = core(group_size=3, target_groups=1, max_staleness=1, stale_members="mask")
    c.set_model_version(3)
    g = group("t0", [1.0, -1.0, 1.0], versions=[3, 3, 1])
    accepted = list(g.rollouts)
    c.submit([g])
    batch = c.try_emit()
    assert batch.groups[0].rollouts[2].info["dso_masked"] == "stale" and "dso_masked" not in accepted[2].info
    assert batch.groups[0].rollouts[:2] == accepted[:2]


def test_stale_masking_that_leaves_no_contrast_drops_the_group():
    # rewards 1, -1, 1 with the -1 member stale: 1, 1 remain -> no longer informative
    c, _, batch = _carried([3, 1, 3], 3, max_staleness=1, stale_members="mask")
    assert batch is None and c.stats().dropped_by_reason["stale"] == 1


def test_only_the_stale_group_leaves_a_mixed_carry_pool_and_the_others_keep_their_order():
    c = core(group_size=3, target_groups=2, max_staleness=1)
    c.set_model_version(3)
    groups = [group(t, [1.0, -1.0, 1.0], versions=v) for t, v in (("t0", [3, 3, 3]), ("t1", [3, 1, 3]), ("t2", [2, 3, 3]))]
    c.submit(groups)
    batch = c.try_emit()
    assert [g.task_id for g in batch.groups] == ["t0", "t2"]
    assert c.stats().dropped_by_reason["stale"] == 1


def test_requeued_stale_task_comes_first():
    c, g, _ = _carried([1, 1, 1], 3, max_staleness=1, requeue_stale=True)
    assert c.plan_round().task_ids[0] == "t0"


def test_lags_measured_against_the_version_at_assembly():
    c = core(group_size=2, target_groups=1)
    c.submit([group("t0", [1.0, -1.0], versions=[0, 1])])
    c.set_model_version(4)
    batch = c.try_emit()
    assert batch.model_version == 4 and rollout_lags(batch).tolist() == [4, 3]


# ---------------------------------------------------------------- end of data
def test_max_epochs_stops_the_task_order():
    c = core(tasks=["a", "b"], max_epochs=1)
    assert sorted(c.select_tasks(5)) == ["a", "b"]
    assert c.exhausted() and c.plan_round().task_ids == []


def test_rollout_budget_caps_the_plan():
    # budget 5 rollouts, 2 per task: 2 tasks, then nothing (1 rollout left < group_size)
    c = core(max_rollouts=5, min_keep_rate=0.1, target_groups=8)
    assert len(c.plan_round().task_ids) == 2
    assert c.exhausted() and c.select_tasks(3) == []


def test_finish_emits_the_kept_groups_as_a_last_partial_batch():
    c = core(tasks=["a", "b"], max_epochs=1, on_cap="partial")
    c.plan_round()
    c.submit([group("a", [1.0, -1.0]), group("b", [1.0, 1.0])])
    batch = c.finish()
    assert [g.task_id for g in batch.groups] == ["a"] and batch.partial and invariant(c)


def test_finish_with_nothing_kept_returns_none_and_drops_the_rest():
    c = core(tasks=["a", "b"], max_epochs=1)
    c.plan_round()
    c.submit([group("a", [1.0, 1.0])])
    assert c.finish() is None
    assert c.stats().groups_held == 0 and invariant(c)


# ---------------------------------------------------------------- metrics
def test_per_batch_rewards_all_kept_trained_and_coverage():
    # round: t0 [1, -1] kept, t1 [1, 1] dropped, t2 [1, -1] kept -> batch of t0, t2
    # all: (0 + 2 + 0) / 6; kept: 0 / 4; trained: 0 / 4; coverage 4 / 6
    c = core()
    c.submit([group("t0", [1.0, -1.0]), group("t1", [1.0, 1.0]), group("t2", [1.0, -1.0])])
    c.try_emit()
    last = c.stats().last_batch
    assert last.mean_reward_all == pytest.approx(2 / 6)
    assert last.mean_reward_kept == 0.0 and last.mean_reward_trained == 0.0
    assert last.coverage == pytest.approx(4 / 6)


def test_per_batch_window_restarts_after_a_release():
    c = core(target_groups=1)
    c.submit([group("t0", [1.0, -1.0])])
    c.try_emit()
    c.submit([group("t1", [3.0, -1.0]), group("t2", [1.0, 1.0])])
    c.try_emit()
    # second window: all (2 + 2) / 4 = 1, kept (3 - 1) / 2 = 1, coverage 2 / 4
    last = c.stats().last_batch
    assert (last.mean_reward_all, last.mean_reward_kept, last.coverage) == (1.0, 1.0, 0.5)


def test_trained_reward_and_coverage_undefined_before_any_batch():
    s = core().stats()
    assert s.mean_reward_trained is None and s.coverage is None and s.last_batch is None


def test_all_dropped_batch_has_no_kept_or_trained_reward():
    c = core(max_replenish_rounds=1, on_cap="partial")
    c.plan_round()
    c.submit([group("t0", [1.0, 1.0])])
    c.plan_round()
    c.plan_round()
    c.close_at_cap()
    last = c.stats().last_batch
    assert last.mean_reward_kept is None and last.mean_reward_trained is None and last.coverage == 0.0


def test_old_checkpoint_without_new_keys_resumes():
    c = core()
    c.submit([group("t0", [1.0, -1.0])])
    state = json.loads(json.dumps(c.state_dict()))
    for key in ("requeue", "window", "last_batch"):
        del state[key]
    del state["counters"]["rollouts_masked"]
    del state["classified_by_reason"]["invalid"]
    d = core()
    d.load_state_dict(state)
    d.submit([group("t1", [1.0, float("nan")])], on_invalid="drop")
    assert d.stats().dropped_by_reason["invalid"] == 1 and not math.isnan(d.stats().mean_reward_all)


def test_unknown_policy_key_lists_the_valid_fields():
    with pytest.raises(InvalidPolicyError, match=r"max_stalenes: Extra inputs .*valid fields: .*max_staleness"):
        ResamplingPolicy.parse({"max_stalenes": 1})


def test_unknown_filter_key_lists_the_filter_fields():
    with pytest.raises(InvalidPolicyError, match=r"valid filter.fields: .*std_tol"):
        ResamplingPolicy.parse({"filter": {"std_toll": 0}})


def test_a_masked_stale_member_is_counted_once():
    # member 2 masked as stale at the first assembly; a second assembly must not count it again
    c = core(group_size=3, target_groups=2, max_staleness=1, stale_members="mask")
    c.set_model_version(3)
    c.submit([group("t0", [1.0, -1.0, 1.0], versions=[3, 3, 1])])
    assert c.try_emit() is None and c.try_emit() is None
    assert c.stats().rollouts_masked == 1 and c.stats().groups_carried == 1


def test_newest_member_advances_the_model_version():
    c = core()
    c.submit([group("t0", [1.0, -1.0], versions=[2, 7])])
    assert c.stats().model_version == 7


def test_group_size_cannot_change_while_groups_are_held_and_can_once_none_is():
    c = core(target_groups=2)
    c.submit([group("t0", [1.0, -1.0])])  # informative, carried: the batch needs 2
    with pytest.raises(ValueError, match=r"group_size: cannot change from 2 to 4 while 1 groups are held .* groups_held is 0"):
        c.set_policy(c.policy.updated({"group_size": 4}))
    assert c.policy.group_size == 2
    c.submit([group("t1", [1.0, -1.0])])
    assert c.try_emit() is not None and c.stats().groups_held == 0  # the batch is full and released: nothing held
    c.set_policy(c.policy.updated({"group_size": 4}))
    assert c.policy.group_size == 4


# ---------------------------------------------------------------- validity: None rewards, the sink, the filter switch
def test_mask_masks_a_member_without_a_reward():
    g = group("t0", [1.0, None, -1.0])
    c = core(group_size=3, group_validity="mask", min_valid_group_size=2)
    c.submit([g])
    assert g.reason == "informative" and g.valid.tolist() == [True, False, True]
    assert g.rollouts[1].info["dso_masked"] == "invalid" and math.isnan(g.rewards[1])


def test_reject_refuses_a_member_without_a_reward_naming_it():
    with pytest.raises(InvalidGroupError, match=r"reward: missing \(None\) in run 1 of task 't0'"):
        core(group_size=3).submit([group("t0", [1.0, None, -1.0])])


def test_the_sink_stores_a_masked_infinite_reward_as_null_and_keeps_it_in_info(tmp_path):
    from orchestrator.service.sink import SQLiteSink

    c = core(group_size=3, target_groups=1, group_validity="mask", min_valid_group_size=2)
    c.submit([group("t0", [1.0, math.inf, -1.0])])
    sink = SQLiteSink(tmp_path / "b.db")
    sink.write(c.try_emit())
    rows = sink.read_batch(0)
    assert [r["reward"] for r in rows] == [1.0, None, -1.0]
    assert rows[1]["info"]["dso_reward"] == "inf" and "dso_reward" not in rows[0]["info"]
    # the usable members' baseline: mean 0, sample std sqrt(2); the masked member 0
    a = 1.0 / (math.sqrt(2.0) + 1e-6)
    assert [r["advantage"] for r in rows] == pytest.approx([a, 0.0, -a])


def test_filter_off_with_fresh_tasks_replenish_is_refused_naming_both_fields():
    with pytest.raises(InvalidPolicyError, match=r"replenish: 'fresh_tasks' with filter.enabled: false"):
        ResamplingPolicy.parse({"filter": {"enabled": False}, "replenish": "fresh_tasks"})


def test_filter_off_without_a_replenish_setting_replenishes_nothing():
    assert ResamplingPolicy.parse({"filter": {"enabled": False}}).replenish == "none"
    assert ResamplingPolicy.parse({"filter": {"enabled": False}, "replenish": "same_tasks"}).replenish == "same_tasks"
