"""The state machine with task selection and pass-rate estimates (no Ray)."""

import json

import numpy as np
import pytest

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group

TASKS = [f"t{i}" for i in range(10)]
MIXED, WRONG, CORRECT = [1.0, -1.0], [-1.0, -1.0], [1.0, 1.0]


def group(task, rewards, version=0):
    rollouts = [Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)]
    return Group(task_id=task, rollouts=rollouts, model_version=version)


def core(**policy):
    return OrchestratorCore(ResamplingPolicy(**{"target_groups": 2, "group_size": 2, **policy}), TASKS, seed=0)


def test_informative_round_is_sized_by_the_picked_tasks_predicted_keep_rate():
    c = core(selection="informative")
    # nothing seen: every task has the uniform prior, informativeness 1 - 2 / (n + 1) = 1/3 at n = 2;
    # two groups are missing -> the shortest prefix with 1/3 * k >= 2 is k = 6
    plan = c.plan_round()
    assert len(plan.task_ids) == 6 and len(set(plan.task_ids)) == 6


def test_round_keep_rate_predicted_against_realised():
    c = core(selection="informative")
    plan = c.plan_round()
    c.submit([group(t, MIXED if i < 3 else WRONG) for i, t in enumerate(plan.task_ids)])
    s = c.stats()
    assert s.last_round.predicted_keep_rate == pytest.approx(1 / 3)
    assert s.last_round.realised_keep_rate == 0.5 and s.last_round.tasks == 6
    assert s.rounds_predicted_keep_rate == pytest.approx(1 / 3) and s.rounds_realised_keep_rate == 0.5


def test_round_stays_open_until_all_its_groups_arrive():
    c = core(selection="informative")
    plan = c.plan_round()
    c.submit([group(t, MIXED) for t in plan.task_ids[:5]])
    assert c.stats().last_round is None and c.counters["rounds_completed"] == 0
    c.submit([group(plan.task_ids[5], MIXED)])
    assert c.counters["rounds_completed"] == 1 and c.stats().last_round.realised_keep_rate == 1.0


def test_epoch_position_survives_a_switch_to_informative_and_back():
    c = core()
    reference = core()
    first = c.select_tasks(3)
    assert first == reference.select_tasks(3)
    c.set_policy(c.policy.updated({"selection": "informative"}))
    c.select_tasks(4)
    c.set_policy(c.policy.updated({"selection": "epoch"}))
    assert c.select_tasks(4) == reference.select_tasks(4)


def test_task_stats_show_estimate_and_next_eligible_epoch():
    c = core(skip_after_all_wrong=1, cooldown_epochs=1)
    c.submit([group("t3", WRONG), group("t4", MIXED)])
    row = c.task_stats("t3")
    assert row.next_eligible_epoch == 2 and row.epoch == 0  # epoch + 1 + cooldown_epochs
    est = row.estimate
    assert est.seen and est.evidence_rollouts == 2.0
    # population prior from the first groups: mean pass rate 0.25, informative share 0.5 (t3 no, t4 yes)
    a0, b0 = c.passrate.prior(0, 2)
    assert (est.alpha, est.beta) == pytest.approx((a0, b0 + 2))
    assert a0 / (a0 + b0) == pytest.approx(0.25)
    # a task never seen: share 0.5 is out of reach at mean 0.25 and n = 2, so the strongest prior,
    # whose informativeness tends to 1 - 0.25**2 - 0.75**2 = 0.375
    assert c.task_stats("t9").estimate.predicted_informative == pytest.approx(0.375, abs=0.001)


def test_revisit_countdown_shown_in_informative_mode():
    c = core(selection="informative", selection_revisit_epochs=2)
    picked = c.select_tasks(3)
    row = c.task_stats(picked[0])
    assert row.revisit_due_in_picks == 2 * len(TASKS)  # drawn at pick 3, now at pick 3
    assert c.task_stats(next(t for t in TASKS if t not in picked)).revisit_due_in_picks == 2 * len(TASKS) - 3
    assert core().task_stats("t0").revisit_due_in_picks is None


def test_emitted_tasks_evidence_is_discounted():
    c = core(passrate_trained_discount=0.25, passrate_half_life=None)
    c.submit([group("t0", MIXED), group("t1", MIXED), group("t2", MIXED)])
    batch = c.try_emit()
    assert [g.task_id for g in batch.groups] == ["t0", "t1"]
    counts = c.passrate.counts(0)
    assert counts["successes"][:3].tolist() == [0.25, 0.25, 1.0]  # t2 is carried, not yet trained on


def test_checkpoint_round_trip_mid_epoch_repeats_the_next_plans():
    c = core(selection="informative", target_groups=3)
    for _ in range(2):
        plan = c.plan_round()
        c.submit([group(t, MIXED if int(t[1:]) % 3 else WRONG, version=1) for t in plan.task_ids])
        c.try_emit()
    c.select_tasks(3)  # e.g. a Trinity selector's top-up
    plan = c.plan_round()  # planned, not yet submitted: an open round in the state
    assert c.selection.picks % len(TASKS) != 0  # mid-epoch
    state = json.loads(json.dumps(c.state_dict()))
    restored = core()
    restored.load_state_dict(state)
    assert restored.state_dict() == c.state_dict()
    groups = [group(t, MIXED) for t in plan.task_ids]
    c.submit(groups)
    restored.submit([group(t, MIXED) for t in plan.task_ids])
    assert restored.plan_round() == c.plan_round()
    np.testing.assert_array_equal(restored.predicted_informative(), c.predicted_informative())


def test_version_1_state_loads_into_epoch_selection():
    c = core()
    c.select_tasks(3)
    state = c.state_dict()
    old = {k: v for k, v in state.items() if k not in ("passrate", "selections", "open_rounds", "awaited", "last_round")}
    old.update(version=1, epoch=0, cursor=3)
    restored = core()
    restored.load_state_dict(old)
    assert restored.select_tasks(4) == c.select_tasks(4)


def test_unknown_selection_is_refused_naming_the_field():
    with pytest.raises(InvalidPolicyError, match="selection"):
        ResamplingPolicy.parse({"selection": "greedy"})


def test_informative_selection_stops_at_max_epochs():
    # an informative epoch is as many picks as tasks: max_epochs=1 hands out each of the 10 tasks once
    c = core(selection="informative", max_epochs=1)
    picked = c.select_tasks(25)
    assert sorted(picked) == sorted(TASKS)
    assert c.exhausted() and c.select_tasks(3) == [] and c.plan_round().task_ids == []


def test_masked_members_are_no_evidence_for_the_pass_rate():
    # group_validity=mask: a NaN member is masked; the estimate counts 1 correct of 2 valid rollouts
    c = core(group_size=3, group_validity="mask", min_valid_group_size=2)
    c.submit([group("t0", [1.0, -1.0, float("nan")])])
    est = c.task_stats("t0").estimate
    assert est.evidence_rollouts == pytest.approx(2.0) and est.seen
