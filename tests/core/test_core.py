"""The orchestrator state machine on scripted scenarios (no Ray)."""

import json

import numpy as np
import pytest

from algos.dapo import InvalidGroupError
from orchestrator.core.machine import OrchestratorCore, ReplenishCapError
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group, UnknownTaskError

TASKS = [f"t{i}" for i in range(10)]
MIXED, CORRECT, WRONG = [1.0, -1.0], [1.0, 1.0], [-1.0, -1.0]


def group(task, rewards, version=0, purpose="initial"):
    rollouts = [Experience(eid=ExperienceId(task=task, run=i), reward=r, metrics={"accuracy": float(r > 0)}) for i, r in enumerate(rewards)]
    return Group(task_id=task, rollouts=rollouts, model_version=version, purpose=purpose)


def core(**policy):
    return OrchestratorCore(ResamplingPolicy(**{"target_groups": 2, "group_size": 2, **policy}), TASKS, seed=0)


def held_invariant(c):
    s = c.stats()
    return s.groups_submitted == s.groups_emitted + s.groups_padded + s.groups_dropped + s.groups_held


def test_batch_has_exactly_target_groups_and_surplus_carries_over():
    c = core()
    c.submit([group("t0", MIXED), group("t1", MIXED), group("t2", MIXED)])
    batch = c.try_emit()
    assert [g.task_id for g in batch.groups] == ["t0", "t1"]
    assert c.try_emit() is None
    c.submit([group("t3", MIXED)])
    assert [g.task_id for g in c.try_emit().groups] == ["t2", "t3"]
    assert held_invariant(c)


def test_dropped_groups_counted_by_reason():
    c = core()
    c.submit([group("t0", CORRECT), group("t1", WRONG), group("t2", MIXED), group("t3", WRONG)])
    s = c.stats()
    assert s.classified_by_reason["all_correct"] == 1
    assert s.classified_by_reason["all_wrong"] == 2
    assert s.classified_by_reason["informative"] == 1
    assert s.groups_held == 3  # 1 carried + 2 padding candidates (target_groups = 2)
    assert s.groups_dropped == 1 and s.dropped_by_reason["all_correct"] == 1
    assert held_invariant(c)


def test_plan_sizes_round_by_predicted_keep_rate():
    c = OrchestratorCore(ResamplingPolicy(target_groups=4, group_size=2), [f"t{i}" for i in range(30)], seed=0)
    plan = c.plan_round()  # no history: p = 1/2 -> ceil(4 / 0.5) = 8
    assert plan.purpose == "initial" and len(plan.task_ids) == 8
    c.submit([group(t, MIXED if t in ("t0",) else WRONG) for t in TASKS[:8]])
    # p = (1 + 1) / (8 + 2) = 0.2, missing 3 -> ceil(3 / 0.2) = 15
    plan = c.plan_round()
    assert plan.purpose == "replenish" and plan.round == 1 and len(plan.task_ids) == 15


def test_a_round_holds_a_task_once_when_its_draw_wraps_into_the_next_epoch():
    # 10 tasks: round 0 takes 8 of epoch 0; round 1 asks for 15 (keep rate 0.2, 3 missing): the 2
    # left in epoch 0 (t8, t1), then epoch 1's order (t9, t1, ...) up to t1, which the round holds
    c = core(target_groups=4)
    epoch0 = [TASKS[i] for i in np.random.default_rng([0, 0]).permutation(10)]
    epoch1 = [TASKS[i] for i in np.random.default_rng([0, 1]).permutation(10)]
    assert (epoch0[8:], epoch1[:2]) == (["t8", "t1"], ["t9", "t1"])
    first = c.plan_round().task_ids
    c.submit([group(t, MIXED if t == first[0] else WRONG) for t in first])
    assert c.plan_round().task_ids == ["t8", "t1", "t9"]
    assert c.plan_round().task_ids[0] == "t1"  # the next round starts where that draw stopped


def test_plan_respects_min_keep_rate_and_max_tasks():
    c = core(target_groups=4, min_keep_rate=0.8, max_tasks_per_round=3)
    assert len(c.plan_round().task_ids) == 3  # ceil(4 / 0.8) = 5, capped at 3


def test_same_tasks_rerolls_dropped_tasks_first():
    c = core(replenish="same_tasks", min_keep_rate=1.0)
    first = c.plan_round()
    c.submit([group(first.task_ids[0], WRONG), group(first.task_ids[1], MIXED)])
    plan = c.plan_round()
    assert plan.task_ids == [first.task_ids[0]]


def test_same_tasks_does_not_reroll_a_task_in_cooldown():
    c = core(replenish="same_tasks", min_keep_rate=1.0, skip_after_all_wrong=1)
    first = c.plan_round()
    c.submit([group(first.task_ids[0], WRONG), group(first.task_ids[1], MIXED)])
    plan = c.plan_round()
    assert len(plan.task_ids) == 1 and plan.task_ids != [first.task_ids[0]]


def test_cap_pad_fills_with_dropped_groups_marked_padding():
    c = core(max_replenish_rounds=1)
    c.plan_round()
    c.submit([group("t0", MIXED), group("t1", WRONG)])
    assert not c.cap_reached()
    c.plan_round()
    c.submit([group("t2", CORRECT)])
    assert c.cap_reached()
    batch = c.close_at_cap()
    assert [(g.task_id, g.padding) for g in batch.groups] == [("t0", False), ("t2", True)]
    assert batch.groups[1].rollouts[0].info["dso_loss_weight"] == 0.0
    assert not batch.partial and batch.rounds == 1
    s = c.stats()
    assert (s.groups_emitted, s.groups_padded, s.groups_dropped, s.groups_held) == (1, 1, 1, 0)
    assert s.rollouts_wasted == 4 and s.cap_hits == 1


def test_padding_flags_copies_and_leaves_the_held_rollouts_as_accepted():
    c = core(max_replenish_rounds=0)
    c.plan_round()
    wrong = group("t1", WRONG)
    accepted = list(wrong.rollouts)
    c.submit([group("t0", MIXED), wrong])
    batch = c.close_at_cap()
    assert [r.info for r in batch.groups[1].rollouts] == [{"dso_padding": True, "dso_loss_weight": 0.0}] * 2
    assert [r.info for r in accepted] == [{}, {}]  # the state store may be pickling these meanwhile


def test_cap_partial_emits_smaller_flagged_batch():
    c = core(max_replenish_rounds=1, on_cap="partial")
    c.plan_round()
    c.submit([group("t0", MIXED)])
    c.plan_round()
    c.submit([group("t1", WRONG)])
    batch = c.close_at_cap()
    assert batch.partial and [g.task_id for g in batch.groups] == ["t0"]
    assert held_invariant(c)


def test_cap_raise_keeps_open_batch():
    c = core(max_replenish_rounds=1, on_cap="raise")
    c.plan_round()
    c.submit([group("t0", MIXED)])
    c.plan_round()
    c.submit([group("t1", WRONG)])
    with pytest.raises(ReplenishCapError, match="batch 0 has 1 of 2 informative groups after 1 replenish rounds"):
        c.close_at_cap()
    assert c.stats().groups_held == 2
    c.set_policy(c.policy.updated({"max_replenish_rounds": 2}))
    assert not c.cap_reached()


def test_skip_after_consecutive_all_correct_with_cooldown():
    c = OrchestratorCore(ResamplingPolicy(target_groups=1, group_size=2, skip_after_all_correct=2, cooldown_epochs=1), ["a", "b"], seed=0)
    c.submit([group("a", CORRECT)])
    c.submit([group("a", CORRECT)])
    # a was skipped in epoch 0: it sits out epoch 1 and returns in epoch 2.
    assert c.history.skip_until_epoch[0] == 2
    picks = c.select_tasks(4)  # epoch 0: b only (a was just skipped); epoch 1: b; epoch 2: both
    assert picks[:2] == ["b", "b"] and sorted(picks[2:]) == ["a", "b"]


def test_skip_selection_over_epochs():
    c = OrchestratorCore(ResamplingPolicy(target_groups=1, group_size=2, skip_after_all_wrong=1, cooldown_epochs=2), ["a", "b"], seed=0)
    c.submit([group("a", WRONG)])  # seen in epoch 0: a sits out epochs 1 and 2 (and the rest of 0)
    picks = c.select_tasks(5)  # epochs 0, 1, 2: only b; epoch 3: both
    assert picks[:3] == ["b", "b", "b"] and sorted(picks[3:]) == ["a", "b"]


def test_all_tasks_cooling_down_still_terminates():
    c = OrchestratorCore(ResamplingPolicy(target_groups=1, group_size=2, skip_after_all_wrong=1, cooldown_epochs=1), ["a"], seed=0)
    c.submit([group("a", WRONG)])
    assert c.select_tasks(1) == ["a"]  # epoch 1 is skipped, epoch 2 offers it again
    assert c.epoch == 3  # took a from epoch 2, which is then exhausted


def test_stale_carry_over_is_dropped():
    c = core(max_staleness=1)
    c.submit([group("t0", MIXED, version=0), group("t1", MIXED, version=0), group("t2", MIXED, version=0)])
    c.try_emit()
    c.set_model_version(2)
    c.submit([group("t3", MIXED, version=2)])
    assert c.try_emit() is None
    s = c.stats()
    assert s.dropped_by_reason["stale"] == 1 and s.groups_carried == 1
    assert held_invariant(c)


def test_state_dict_round_trip_mid_batch():
    c = core(max_replenish_rounds=3, skip_after_all_wrong=1)
    c.plan_round()
    c.submit([group("t0", MIXED), group("t1", WRONG), group("t2", MIXED), group("t3", MIXED)])
    c.try_emit()
    c.plan_round()
    state = json.loads(json.dumps(c.state_dict()))
    d = OrchestratorCore(ResamplingPolicy(), TASKS, seed=0)
    d.load_state_dict(state)
    assert d.stats() == c.stats()
    assert d.plan_round() == c.plan_round()
    c.submit([group("t5", MIXED)])
    d.submit([group("t5", MIXED)])
    assert [g.task_id for g in d.try_emit().groups] == [g.task_id for g in c.try_emit().groups] == ["t3", "t5"]


def test_history_welford_and_pass_rate():
    c = core()
    c.submit([group("t0", [1.0, -1.0])])
    c.submit([group("t0", [1.0, 1.0])])
    h = c.task_stats("t0")
    # rewards 1, -1, 1, 1: mean 0.5, unbiased variance ((0.25 + 2.25 + 0.25 + 0.25) / 3) = 1.0
    assert h.mean == pytest.approx(0.5) and h.variance == pytest.approx(1.0)
    assert h.pass_rate == 0.75 and h.groups == 2 and h.consec_all_correct == 1


def test_groups_of_one_task_in_one_submission_merge_in_submission_order():
    # t0 three times in one call, t1 once between them: the consecutive counts follow the order
    c = core()
    c.submit([group("t0", [1.0, -1.0]), group("t0", [1.0, 1.0]), group("t1", [1.0, 1.0]), group("t0", [1.0, 1.0])])
    d = core()
    d.submit([group("t0", [1.0, 1.0]), group("t0", [1.0, 1.0]), group("t0", [1.0, -1.0])])
    assert (c.task_stats("t0").groups, c.task_stats("t0").consec_all_correct) == (3, 2)
    assert (d.task_stats("t0").groups, d.task_stats("t0").consec_all_correct) == (3, 0)
    assert c.task_stats("t0").mean == pytest.approx(4 / 6) and c.task_stats("t1").consec_all_correct == 1


def test_judge_metric_ignores_shaped_reward():
    c = core(filter={"judge": "accuracy"})
    g = group("t0", [0.7, 1.0])  # both correct, one carries an overlong penalty
    c.submit([g])
    assert g.reason == "all_correct"


@pytest.mark.parametrize(
    "bad, match",
    [
        (group("nope", MIXED), "task_id: unknown task 'nope'"),
        (group("t0", [1.0, float("nan")]), r"reward: non-finite value nan in run 1 of task 't0'"),
        (group("t0", [1.0, -1.0, 1.0]), "group of task 't0' has 3 rollouts, expected group_size=2"),
        (Group(task_id="t0", rollouts=[]), "group of task 't0' is empty"),
    ],
)
def test_bad_groups_rejected_and_nothing_changes(bad, match):
    c = core()
    c.submit([group("t9", MIXED)])
    before = json.dumps(c.state_dict())
    with pytest.raises((InvalidGroupError, UnknownTaskError), match=match):
        c.submit([group("t1", MIXED), bad])
    assert json.dumps(c.state_dict()) == before


def test_duplicate_run_ids_rejected():
    g = group("t0", MIXED)
    g.rollouts[1].eid.run = 0
    with pytest.raises(InvalidGroupError, match="eid.run: duplicate run id 0 in group of task 't0'"):
        core().submit([g])


def test_missing_judged_metric_rejected():
    g = group("t0", MIXED)
    del g.rollouts[1].metrics["accuracy"]
    with pytest.raises(InvalidGroupError, match=r"metrics\['accuracy'\]: missing in run 1 of task 't0'"):
        core(filter={"judge": "accuracy"}).submit([g])


def test_invalid_policy_names_field_and_value():
    with pytest.raises(InvalidPolicyError, match=r"target_groups: .* \(got 0\)"):
        ResamplingPolicy.parse({"target_groups": 0})
    with pytest.raises(InvalidPolicyError, match=r"filter: .*band must satisfy lo < hi, got \(0.9, 0.1\)"):
        ResamplingPolicy().updated({"filter": {"band": [0.9, 0.1]}})
