"""The answer screen: which scored tasks a round rolls out, its counters and budget, bad scores,
the route and source checks, and the actor rolling only the tasks it keeps."""

import asyncio

import numpy as np
import pytest

from orchestrator.core.machine import DataExhaustedError, OrchestratorCore
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.rollout.screening import ScreeningUnsupportedError
from orchestrator.rollout.scripted import BernoulliRolloutSource, ScriptedRolloutSource, ScriptedTasks


def _core(**policy) -> OrchestratorCore:
    return OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=8, answer_screen=True, **policy),
                            [f"t{i}" for i in range(10)], seed=0)


def test_settled_answers_are_skipped_and_a_coin_flip_answer_is_rolled():
    # n = 8: I(1) = I(0) = 0, I(0.5) = 1 - 2 / 256 = 0.992 -> keep clip((I / 0.5) ** 4, 0, 1) = 0, 0, 1
    c = _core(answer_floor=0.0)
    plan = c.plan_round()
    ids = plan.task_ids[:3]
    keep = c.answer_screen(ids, np.array([1.0, 0.0, 0.5]), "b0r0")
    assert keep.tolist() == [False, False, True]


def test_keep_probability_by_hand():
    # p = 0.95: I = 1 - 0.95**8 - 0.05**8 = 0.336580; keep = (I / 0.5) ** 4 = 0.205339 (the defaults).
    # Over 4,000 draws (tasks of 400 rounds) the share kept is within 4 standard errors (0.026) of it
    c = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=8, answer_screen=True), [f"t{i}" for i in range(10)], seed=0)
    kept = [c.answer_screen([f"t{i}" for i in range(10)], np.full(10, 0.95), f"b{b}r0").mean() for b in range(400)]
    assert np.mean(kept) == pytest.approx(0.205339, abs=0.026)


def test_power_one_keeps_in_proportion_to_the_chance_of_an_informative_group():
    # predicted_skip's rule: keep = I / 0.5 = 0.673159 at p = 0.95; 4 standard errors of 4,000 draws: 0.030
    c = _core(answer_keep_power=1.0)
    kept = [c.answer_screen([f"t{i}" for i in range(10)], np.full(10, 0.95), f"b{b}r0").mean() for b in range(400)]
    assert np.mean(kept) == pytest.approx(0.673159, abs=0.030)


def test_the_floor_keeps_a_settled_task_sometimes():
    c = _core(answer_floor=0.25)
    kept = [c.answer_screen([f"t{i}" for i in range(10)], np.ones(10), f"b{b}r0").mean() for b in range(400)]
    assert np.mean(kept) == pytest.approx(0.25, abs=0.03)


def test_a_skip_costs_no_rollout_and_is_counted():
    c = _core(answer_floor=0.0, max_rollouts=800)
    plan = c.plan_round()
    planned = c.counters["rollouts_planned"]
    c.answer_screen(plan.task_ids[:3], np.array([1.0, 0.0, 0.5]), "b0r0")
    s = c.stats()
    assert (s.answers_scored, s.answer_skips, s.rollouts_total) == (3, 2, 0)
    assert c.counters["rollouts_planned"] == planned - 2 * 8  # back to the max_rollouts budget


def test_skips_size_the_next_round():
    # 4 tasks skipped, nothing submitted: keep rate (0 + 1) / (0 + 4 + 2) = 1/6, 2 groups missing
    # -> ceil(2 * 6) = 12 tasks, capped at max_tasks_per_round
    c = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=8, answer_screen=True, answer_floor=0.0,
                                          max_tasks_per_round=10), [f"t{i}" for i in range(30)], seed=0)
    plan = c.plan_round()
    c.answer_screen(plan.task_ids[:4], np.zeros(4), "b0r0")
    assert c.predicted_keep_rate() == pytest.approx(1 / 6)
    assert len(c.plan_round().task_ids) == 10


@pytest.mark.parametrize("bad", [float("nan"), -0.1, 1.5])
def test_a_bad_score_is_refused_naming_the_task_and_nothing_is_counted(bad):
    c = _core()
    plan = c.plan_round()
    with pytest.raises(ValueError, match=rf"answer_prob: task '{plan.task_ids[1]}' has"):
        c.answer_screen(plan.task_ids[:2], np.array([0.5, bad]), "b0r0")
    assert (c.counters["answers_scored"], c.counters["answer_skips"]) == (0, 0)


def test_a_score_count_unlike_the_tasks_is_refused():
    c = _core()
    with pytest.raises(ValueError, match="answer_prob: expected 2 values"):
        c.answer_screen(["t0", "t1"], np.array([0.5]), "b0r0")


def test_the_actor_rolls_only_the_tasks_the_screen_keeps():
    # 4 tasks solved for certain, 4 never, 4 at 0.5: with floor 0 only the 0.5 tasks are rolled,
    # so the batch of 4 informative groups costs exactly 4 x 8 rollouts
    from orchestrator.service.actor import Orchestrator

    rates = {**{f"easy{i}": 1.0 for i in range(4)}, **{f"hard{i}": 0.0 for i in range(4)}, **{f"mid{i}": 0.5 for i in range(4)}}
    orch = Orchestrator({"target_groups": 4, "group_size": 8, "max_epochs": 1, "answer_screen": True, "answer_floor": 0.0,
                         "max_replenish_rounds": 8, "filter": {"judge": "accuracy"}},
                        ScriptedTasks(list(rates)), BernoulliRolloutSource(rates, seed=0))
    batch = asyncio.run(orch.next_batch())
    s = orch.get_stats()
    assert sorted(g.task_id for g in batch.groups) == [f"mid{i}" for i in range(4)]
    assert s.rollouts_total == 32 and s.answers_scored == s.answer_skips + 4 and s.answer_skips >= 1
    with pytest.raises(DataExhaustedError):
        asyncio.run(orch.next_batch())


def test_a_source_that_cannot_score_is_refused_naming_the_field():
    from orchestrator.service.actor import Orchestrator

    with pytest.raises(InvalidPolicyError, match="screen: 'answer' needs a rollout source that scores answers"):
        Orchestrator({"target_groups": 1, "group_size": 2, "answer_screen": True}, ScriptedTasks(["a"]),
                     ScriptedRolloutSource({"a": [[1.0, -1.0]]}))


def test_the_answer_screen_can_be_switched_on_by_a_policy_change():
    from orchestrator.service.actor import Orchestrator

    orch = Orchestrator({"target_groups": 1, "group_size": 8}, ScriptedTasks(["a"]), BernoulliRolloutSource({"a": 0.5}))
    asyncio.run(orch.set_policy({"answer_screen": True, "answer_keep_at": 0.8}))
    policy = orch.get_policy()["policy"]
    assert (policy["screen"], policy["screen_options"]) == ("answer", {"keep_at": 0.8})


def test_a_trinity_run_config_asking_for_the_answer_screen_is_refused():
    from orchestrator.trinity.attach import AttachConfig

    with pytest.raises(ScreeningUnsupportedError, match="screen: 'answer' is not possible through Trinity"):
        AttachConfig(policy={"group_size": 8, "answer_screen": True}).resampling_policy()


def test_kept_groups_have_the_filters_mean_the_screen_reads_no_rollout():
    # pass rate 0.8, n = 8: the filter keeps a group with chance 1 - 0.8**8 - 0.2**8 = 0.8322 and its
    # kept groups' mean is (0.8 - 0.8**8) / 0.8322 = 0.7597 (DAPO Eq. 11's event); the answer screen
    # decides from p alone, before the group, so its kept groups have the same mean (a screen of 2
    # rollouts gives 0.725 here: docs/results/sampling.md)
    from orchestrator.service.actor import Orchestrator

    rates = {f"t{i}": 0.8 for i in range(50)}
    orch = Orchestrator({"target_groups": 8, "group_size": 8, "max_epochs": 16, "answer_screen": True, "answer_keep_at": 1.0,
                         "filter": {"judge": "accuracy"}},
                        ScriptedTasks(list(rates)), BernoulliRolloutSource(rates, seed=1))
    means = []
    with pytest.raises(DataExhaustedError):
        while True:
            batch = asyncio.run(orch.next_batch())
            means += [np.mean([e.metrics["accuracy"] for e in g.rollouts]) for g in batch.groups if not g.padding]
    s = orch.get_stats()
    assert len(means) > 200 and s.answer_skips > 0.1 * s.answers_scored  # keep = I ** 4 = 0.47: about half skipped
    assert np.mean(means) == pytest.approx(0.7597, abs=0.02)


def test_a_tasks_last_score_is_shown_and_survives_a_checkpoint():
    c = _core(answer_floor=0.0)
    c.set_model_version(3)
    plan = c.plan_round()
    c.answer_screen(plan.task_ids[:2], np.array([0.25, 1.0]), "b0r0")
    row = c.task_stats(plan.task_ids[0])
    assert (row.answer_prob, row.answer_prob_version) == (0.25, 3)
    assert c.task_stats(plan.task_ids[2]).answer_prob is None  # planned, not scored
    again = _core(answer_floor=0.0)
    again.load_state_dict(c.state_dict())
    assert again.task_stats(plan.task_ids[1]).answer_prob == 1.0


def test_a_checkpoint_from_before_the_answer_screen_loads_as_never_scored():
    c = _core()
    state = c.state_dict()
    for key in ("answer_prob", "answer_prob_version"):
        del state["history"][key]
    again = _core()
    again.load_state_dict(state)
    assert again.task_stats("t0").answer_prob is None and again.task_stats("t0").answer_prob_version == -1


def test_the_round_is_topped_up_until_the_kept_tasks_are_expected_to_fill_the_batch():
    # 2 groups missing; 3 planned tasks all solved (I = 0, skipped): 0 expected, no rate yet, so
    # ceil(2 / min_keep_rate 0.1) = 20 more, capped at max_tasks_per_round 8 minus the 3 scored: 5
    c = _core(answer_floor=0.0, max_tasks_per_round=8)
    plan = c.plan_round()
    first = plan.task_ids[:3]
    c.answer_screen(first, np.ones(3), "b0r0")
    more = c.answer_top_up()
    assert len(more) == 5 and not set(more) & set(plan.task_ids)
    c.answer_screen(more, np.full(5, 0.5), "b0r0.1")  # 5 x 0.992 expected >= 2 missing
    assert c.answer_top_up() == []


def test_a_top_up_that_wraps_into_the_next_epoch_draws_no_task_of_the_round_twice():
    # 10 tasks; every scored task is settled (skipped), so the top-ups ask for up to 16 scored in
    # the round: they take the rest of epoch 0 and stop before epoch 1's first task, which the round
    # holds already; that task opens the next round's draw (its place in epoch 1 kept)
    c = _core(answer_floor=0.0, max_tasks_per_round=16)
    plan = c.plan_round()
    drawn = list(plan.task_ids)
    c.answer_screen(drawn, np.ones(len(drawn)), "b0r0")
    while more := c.answer_top_up():
        drawn += more
        c.answer_screen(more, np.ones(len(more)), f"b0r0.{len(drawn)}")
    assert sorted(drawn) == sorted(f"t{i}" for i in range(10))  # each task once, though 16 were asked for
    epoch1 = [f"t{i}" for i in np.random.default_rng([0, 1]).permutation(10)]
    c.submit([])
    assert c.plan_round().task_ids[0] == epoch1[0]


def test_no_top_up_once_the_kept_tasks_are_expected_to_fill_the_batch():
    c = _core(answer_floor=0.0)
    plan = c.plan_round()
    c.answer_screen(plan.task_ids[:3], np.array([0.5, 0.5, 1.0]), "b0r0")  # expected 1.98 < 2: one more
    assert len(c.answer_top_up()) == 1  # rate 1.984 / 3 per task: ceil(0.016 / 0.661) = 1


def test_the_actor_fills_a_batch_in_one_round_when_the_screen_keeps_enough():
    from orchestrator.service.actor import Orchestrator

    rates = {**{f"easy{i}": 1.0 for i in range(4)}, **{f"hard{i}": 0.0 for i in range(4)}, **{f"mid{i}": 0.5 for i in range(4)}}
    orch = Orchestrator({"target_groups": 4, "group_size": 8, "max_epochs": 1, "answer_screen": True, "answer_floor": 0.0,
                         "filter": {"judge": "accuracy"}},
                        ScriptedTasks(list(rates)), BernoulliRolloutSource(rates, seed=0))
    batch = asyncio.run(orch.next_batch())
    assert batch.rounds == 0 and sorted(g.task_id for g in batch.groups) == [f"mid{i}" for i in range(4)]


def test_a_recent_settled_score_is_reused_and_counted_not_rescored():
    # p = 1: I = 0, keep 0 < 1 %: settled. Scored at version 3, asked at version 5 (2 <= 8 versions)
    c = _core()
    c.set_model_version(3)
    c.answer_screen(["t0", "t1"], np.array([1.0, 0.5]), "b0r0")
    c.set_model_version(5)
    reused = c.answer_reused(["t0", "t1", "t2"])
    assert reused[0] == 1.0 and np.isnan(reused[1:]).all()  # t1 (I = 0.99) is not settled; t2 never scored
    keep = c.answer_screen(["t0", "t1"], np.array([reused[0], 0.5]), "b1r0", fresh=np.array([False, True]))
    assert keep.tolist() == [False, True]
    assert (c.counters["answers_scored"], c.counters["answers_reused"]) == (3, 1)
    assert c.task_stats("t0").answer_prob_version == 3 and c.task_stats("t1").answer_prob_version == 5


def test_a_settled_score_older_than_the_reuse_window_is_scored_again():
    c = _core(answer_reuse_versions=8)
    c.answer_screen(["t0"], np.array([0.0]), "b0r0")
    c.set_model_version(8)
    assert c.answer_reused(["t0"])[0] == 0.0
    c.set_model_version(9)
    assert np.isnan(c.answer_reused(["t0"])[0])


def test_no_score_is_reused_with_a_reuse_window_of_zero():
    c = _core(answer_reuse_versions=0)
    c.answer_screen(["t0"], np.array([1.0]), "b0r0")
    assert np.isnan(c.answer_reused(["t0"])[0])


def test_the_actor_scores_settled_tasks_once_per_reuse_window():
    # 4 tasks always solved, 4 never, 4 at 0.5, 12 epochs of version 0 (no weight sync): the 8
    # settled tasks are scored in the first epoch only, then decided from their scores; the 4 at
    # 0.5 are scored every epoch. A round drawn across an epoch boundary can hold a task twice, and
    # both are scored before either score is recorded, so a few settled tasks may be scored again
    from orchestrator.service.actor import Orchestrator

    rates = {**{f"easy{i}": 1.0 for i in range(4)}, **{f"hard{i}": 0.0 for i in range(4)}, **{f"mid{i}": 0.5 for i in range(4)}}
    orch = Orchestrator({"target_groups": 4, "group_size": 8, "max_epochs": 12, "answer_screen": True,
                         "filter": {"judge": "accuracy"}},
                        ScriptedTasks(list(rates)), BernoulliRolloutSource(rates, seed=0))
    with pytest.raises(DataExhaustedError):
        while True:
            asyncio.run(orch.next_batch())
    s = orch.get_stats()
    assert s.answers_scored + s.answers_reused == 12 * 12
    assert 10 * 8 <= s.answers_reused <= 11 * 8 and s.answers_scored >= 8 + 12 * 4
