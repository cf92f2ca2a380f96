"""Screening: verdict, emitted group shape, counters and budget, the route check, and its bias."""

import numpy as np
import pytest

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.passrate import informative_after_unanimous_screen
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group
from orchestrator.rollout.screening import (
    ScreeningUnsupportedError,
    check_route,
    continue_mask,
    keep_probability,
    kept_group_mean,
    screened_generate,
)
from orchestrator.rollout.scripted import BernoulliRolloutSource, ScriptedTasks


def test_a_screen_continues_only_when_its_values_differ():
    values = np.array([[1.0, 1.0], [0.0, 0.0], [1.0, 0.0]])
    assert continue_mask(values).tolist() == [False, False, True]


def test_screen_rollouts_must_be_below_group_size():
    with pytest.raises(InvalidPolicyError, match="screen_options.rollouts"):
        ResamplingPolicy.parse({"group_size": 4, "screen_rollouts": 4})


def test_screening_is_refused_through_trinity():
    with pytest.raises(ScreeningUnsupportedError, match="screen: 'rollouts' .*Trinity"):
        check_route("rollouts", "trinity")
    check_route("none", "trinity")
    check_route("rollouts", "standalone")


def test_screened_round_emits_full_groups_and_stops_the_settled_ones():
    rates = {"easy": 1.0, "hard": 0.0, "mid": 0.5, "mid2": 0.5}
    src = BernoulliRolloutSource(rates, seed=0)
    tasks = [ScriptedTasks(list(rates)).get(t) for t in rates]
    res = screened_generate(src, tasks, 8, 2, np.array([True, True, True, False]), judge="accuracy",
                            correct_threshold=1.0, model_version=0, round_tag="b0r0")
    ids = [g.task_id for g in res.groups]
    assert "easy" not in ids and "hard" not in ids and "mid2" in ids  # mid2 was not screened
    assert all(len(g.rollouts) == 8 for g in res.groups)
    for g in res.groups:
        assert [e.eid.run for e in g.rollouts] == list(range(8))
        assert {e.eid.round_tag for e in g.rollouts} == {"b0r0"}
    assert res.stopped_task_ids == ["easy", "hard"] and res.stopped_correct.tolist() == [2, 0]
    assert res.screened == 3


def test_core_counts_stopped_screens_and_returns_their_unspent_budget():
    c = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=8, screen_rollouts=2, max_rollouts=80),
                         [f"t{i}" for i in range(10)], seed=0)
    plan = c.plan_round()
    planned = c.counters["rollouts_planned"]
    assert c.screen_plan(plan.task_ids).screen.all()  # no history: every task is screened
    c.record_screens(len(plan.task_ids), plan.task_ids[:2], np.array([2, 0]), np.array([2, 2]))
    s = c.stats()
    assert (s.screens, s.screens_stopped, s.rollouts_screen_stopped) == (len(plan.task_ids), 2, 4)
    assert s.rollouts_total == 4  # only the stopped screens so far
    assert c.counters["rollouts_planned"] == planned - 2 * 6
    assert c.task_stats(plan.task_ids[0]).estimate.evidence_rollouts == 2


def test_stopped_screens_size_the_next_round():
    # 8 tasks screened: 6 stopped, 2 completed and informative -> p = (2 + 1) / (2 + 6 + 2) = 0.3;
    # 2 groups missing of 4 -> ceil(2 / 0.3) = 7 tasks (counting only completed screens, (2 + 1) / (2 + 2): 3)
    c = OrchestratorCore(ResamplingPolicy(target_groups=4, group_size=4, screen_rollouts=2), [f"t{i}" for i in range(20)], seed=0)
    plan = c.plan_round()
    assert len(plan.task_ids) == 8  # no history: p = 1/2
    c.record_screens(8, plan.task_ids[:6], np.array([2, 0, 2, 0, 2, 0]), np.array([2] * 6))
    c.submit([Group(task_id=t, model_version=0, purpose="initial",
                    rollouts=[Experience(eid=ExperienceId(task=t, run=i), reward=r, metrics={"accuracy": float(r > 0)})
                              for i, r in enumerate([1.0, -1.0, 1.0, -1.0])]) for t in plan.task_ids[6:]])
    assert c.predicted_keep_rate() == pytest.approx(0.3)
    assert len(c.plan_round().task_ids) == 7


def test_a_task_predicted_informative_skips_the_screen():
    c = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=8, screen_rollouts=2, screen_skip_above=0.0),
                         ["a", "b"], seed=0)
    assert not c.screen_plan(["a", "b"]).screen.any()


def test_screening_bias_by_hand():
    # p = 0.8, n = 8, k = 2: a screen keeps with 1 - 0.64 - 0.04 = 0.32 (the filter: 1 - 0.8**8 - 0.2**8);
    # a kept screen has exactly one correct of 2, the 6 others 0.8 each: mean (1 + 4.8) / 8 = 0.725
    assert keep_probability(0.8, 8, 2) == pytest.approx(0.32)
    assert keep_probability(0.8, 8) == pytest.approx(1 - 0.8**8 - 0.2**8)
    assert kept_group_mean(0.8, 8, 2) == pytest.approx(0.725)
    assert kept_group_mean(0.8, 8) == pytest.approx((0.8 - 0.8**8) / (1 - 0.8**8 - 0.2**8))  # 0.7597


def test_screening_bias_measured():
    # Monte Carlo of groups of 8 at p = 0.8: kept by the filter vs kept by a screen of 2.
    # Per-member advantage (reward - group mean, 0/1 rewards): the filter gives every member 0 on
    # average; the screen gives the 2 screened members -0.225 and the 6 others +0.075 (by hand:
    # 0.5 - 0.725 and 0.8 - 0.725).
    rng = np.random.default_rng(0)
    x = (rng.random((400_000, 8)) < 0.8).astype(np.float64)
    s = x.sum(axis=1)
    filt = (s > 0) & (s < 8)
    scr = x[:, :2].sum(axis=1) == 1
    assert x[filt].mean() == pytest.approx(kept_group_mean(0.8, 8), abs=2e-3)
    assert x[scr].mean() == pytest.approx(0.725, abs=2e-3)
    adv_f = x[filt] - x[filt].mean(axis=1, keepdims=True)
    adv_s = x[scr] - x[scr].mean(axis=1, keepdims=True)
    assert np.abs(adv_f.mean(axis=0)).max() < 3e-3
    assert adv_s[:, :2].mean() == pytest.approx(-0.225, abs=3e-3)
    assert adv_s[:, 2:].mean() == pytest.approx(0.075, abs=3e-3)


def test_a_trinity_run_config_asking_for_screens_is_refused():
    from orchestrator.trinity.attach import AttachConfig

    with pytest.raises(ScreeningUnsupportedError, match="screen: 'rollouts'"):
        AttachConfig(policy={"group_size": 8, "screen_rollouts": 2}).resampling_policy()


def test_screening_can_be_switched_on_by_a_policy_change():
    c = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=8), ["a", "b"], seed=0)
    assert not c.screen_plan(["a"]).screen.any()
    c.set_policy(c.policy.updated({"screen_rollouts": 3}))
    assert c.screen_plan(["a"]).screen.all()


def test_the_cap_never_releases_an_empty_batch_when_every_screen_stopped():
    c = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=8, screen_rollouts=2, max_replenish_rounds=1),
                         [f"t{i}" for i in range(10)], seed=0)
    for _ in range(3):  # past the cap, every screen stopped: nothing is held
        plan = c.plan_round()
        c.record_screens(len(plan.task_ids), plan.task_ids, np.zeros(len(plan.task_ids)), np.full(len(plan.task_ids), 2))
    assert not c.cap_reached()


def test_chance_of_an_informative_group_after_a_unanimous_screen_by_hand():
    # Beta(1, 1), n = 8, k = 2: after 2 correct Beta(3, 1), E[p**6] = B(9, 1) / B(3, 1) = 3/9: 2/3;
    # Beta(2, 1): after 2 correct Beta(4, 1), E[p**6] = (1/10) / (1/4) = 0.4: 0.6;
    # after 2 wrong Beta(2, 3), E[(1-p)**6] = B(2, 9) / B(2, 3) = (1/90) / (1/12): 1 - 12/90
    after_correct, after_wrong = informative_after_unanimous_screen(np.array([1.0, 2.0]), np.array([1.0, 1.0]), 8, 2)
    assert after_correct == pytest.approx([2 / 3, 0.6])
    assert after_wrong == pytest.approx([2 / 3, 1 - 12 / 90])


def test_a_screen_as_large_as_the_group_is_refused_naming_k():
    with pytest.raises(ValueError, match=r"k: screen rollouts must be in \[1, n\) = \[1, 8\), got 8"):
        informative_after_unanimous_screen(np.ones(1), np.ones(1), 8, 8)


def test_an_all_correct_screen_is_completed_where_the_posterior_says_go():
    rates = {"easy": 1.0, "hard": 0.0}
    src = BernoulliRolloutSource(rates, seed=0)
    tasks = [ScriptedTasks(list(rates)).get(t) for t in rates]
    res = screened_generate(src, tasks, 8, 2, np.array([True, True]), judge="accuracy", correct_threshold=1.0,
                            model_version=0, round_tag="b0r0", go_if_correct=np.array([True, True]),
                            go_if_wrong=np.array([False, False]))
    assert [g.task_id for g in res.groups] == ["easy"] and len(res.groups[0].rollouts) == 8
    assert [e.eid.run for e in res.groups[0].rollouts] == list(range(8))
    assert res.stopped_task_ids == ["hard"] and res.stopped_correct.tolist() == [0]


def test_the_core_completes_unanimous_screens_only_above_the_policy_threshold():
    # no evidence yet: the prior is Beta(1, 1), so either unanimous screen of 2 of 8 leaves 2/3
    policy = ResamplingPolicy(target_groups=2, group_size=8, screen_rollouts=2)
    c = OrchestratorCore(policy, ["a", "b"], seed=0)
    def go(plan):
        return np.concatenate([plan.go_if_correct, plan.go_if_wrong])

    assert not go(c.screen_plan(["a", "b"])).any()  # default 1: SPEED-RL's rule
    c.set_policy(policy.updated({"screen_continue_above": 0.6}))
    assert go(c.screen_plan(["a", "b"])).all()
    c.set_policy(policy.updated({"screen_continue_above": 0.7}))
    assert not go(c.screen_plan(["a", "b"])).any()


@pytest.mark.parametrize(("continue_above", "rollouts", "stopped"), [(1.0, 2, 1), (0.6, 8, 0)])
def test_the_actor_rolls_a_unanimous_screen_on_only_where_the_policy_says(continue_above, rollouts, stopped):
    # one task solved for certain, one epoch: one screen of 2, all correct. Without evidence the
    # prior is Beta(1, 1) and the completed group would be informative with chance 2/3: at 0.6
    # the actor completes it (8 rollouts, dropped as all correct), at 1 it stops the screen (2)
    import asyncio

    from orchestrator.core.machine import DataExhaustedError
    from orchestrator.service.actor import Orchestrator

    orch = Orchestrator({"target_groups": 1, "group_size": 8, "max_epochs": 1, "screen_rollouts": 2,
                         "screen_continue_above": continue_above},
                        ScriptedTasks(["easy"]), BernoulliRolloutSource({"easy": 1.0}, seed=0))
    with pytest.raises(DataExhaustedError):
        asyncio.run(orch.next_batch())
    s = orch.get_stats()
    assert (s.screens, s.screens_stopped, s.rollouts_total) == (1, stopped, rollouts)
