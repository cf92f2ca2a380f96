"""The selection registry, GRESO's skip, and skip-rule cooldowns across epochs and selections."""

import re

import numpy as np
import pytest

from orchestrator.core.greso import GresoSelection, keep_probability
from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.core.selection import (
    SELECTIONS,
    SelectionContext,
    TaskSelection,
    register_selection,
)
from orchestrator.core.selections import make_selection
from orchestrator.core.types import Experience, ExperienceId, Group

TASKS = [f"t{i}" for i in range(4)]
CORRECT, MIXED = [1.0, 1.0], [1.0, -1.0]


def group(task, rewards):
    return Group(task_id=task, rollouts=[Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)])


def core(**policy):
    return OrchestratorCore(ResamplingPolicy(**{"target_groups": 2, "group_size": 2, **policy}), TASKS, seed=0)


def test_registry_holds_the_three_modes():
    assert {"epoch", "informative", "greso"} <= set(SELECTIONS)


def test_unknown_mode_is_refused_with_the_registered_names():
    with pytest.raises(InvalidPolicyError, match="selection.*'greedy'"):
        ResamplingPolicy.parse({"selection": "greedy"})
    with pytest.raises(ValueError, match="registered"):
        make_selection("greedy", 4, 0, ResamplingPolicy())


def test_a_new_mode_is_one_class_and_the_core_uses_it():
    @register_selection
    class Reverse(TaskSelection):
        name = "test_reverse"

        def __init__(self, num_tasks, seed=0, options=None):
            super().__init__(num_tasks, seed, options)
            self.n = 0

        @property
        def epoch(self):
            return self.n // self.num_tasks

        def select(self, count, ctx):
            idx = (self.num_tasks - 1 - (self.n + np.arange(count)) % self.num_tasks).astype(np.int64)
            self.picked_epochs = (self.n + np.arange(count)) // self.num_tasks
            self.n += count
            return idx

        def state_dict(self):
            return {"n": self.n}

        def load_state_dict(self, state):
            self.n = state["n"]

    try:
        c = core(selection="test_reverse")
        assert c.select_tasks(3) == ["t3", "t2", "t1"]
        assert c.stats().selection == "test_reverse"
    finally:
        del SELECTIONS["test_reverse"]


def test_greso_keep_probability_by_hand():
    # p_easy ** z after z all-correct groups, p_hard ** z after z all-wrong, 1 otherwise
    p = keep_probability(np.array([2, 0, 0]), np.array([0, 3, 0]), 0.5, 0.8)
    np.testing.assert_allclose(p, [0.25, 0.512, 1.0])


def test_greso_keep_probability_has_the_released_exploration_floor():
    # max(p ** z, 0.01): 0.5 ** 8 = 0.0039 is floored at 0.01, 0.5 ** 6 = 0.0156 is not; no streak: 1
    p = keep_probability(np.array([8, 6, 0]), np.array([0, 0, 0]), 0.5, 0.5, 0.01)
    np.testing.assert_allclose(p, [0.01, 0.015625, 1.0])


def test_greso_defaults_are_the_released_settings():
    sel = GresoSelection(4)
    assert {k: getattr(sel.options, k) for k in ("p_start", "step", "p_min", "p_max", "keep_floor", "target_zero_share")} == \
        {"p_start": 0.5, "step": 0.01, "p_min": 0.05, "p_max": 0.95, "keep_floor": 0.01, "target_zero_share": 0.25}
    assert sel.options.easy_share == pytest.approx(1 / 3) and sel.options.adapt_from_epoch == 1


def test_greso_skips_only_tasks_with_a_zero_variance_streak():
    sel = GresoSelection(200, seed=3)
    streak = np.zeros(200, dtype=np.int64)
    streak[:100] = 4  # kept with 0.5 ** 4 = 1/16
    ctx = SelectionContext(skip_until_epoch=np.zeros(200, dtype=np.int64), informative=np.zeros(200),
                           zero_streak_correct=streak, zero_streak_wrong=np.zeros(200, dtype=np.int64), max_epochs=1)
    picked = sel.select(200, ctx)  # one epoch
    assert set(range(100, 200)) <= set(picked.tolist())  # no streak: never skipped
    streaked = int((picked < 100).sum())
    assert 0 < streaked < 20  # about 100 / 16 = 6
    assert sel.passed_over == 100 - streaked


def greso_at_epoch(epoch, **options):
    c = core(selection="greso", selection_options=options)  # target_groups 2: a batch is 2 informative groups
    c.selection.load_state_dict({**c.selection.state_dict(), "epoch": epoch})
    return c.selection


def test_greso_does_not_adapt_in_the_first_epoch():
    sel = greso_at_epoch(0)
    sel.observe(np.arange(4), np.array([True, True, False, False]), np.array([False, False, True, True]))
    assert (sel.p_easy, sel.p_hard) == (0.5, 0.5)


def test_greso_adapts_once_per_batch_on_all_its_rounds():
    sel = greso_at_epoch(1, target_zero_share=0.5, easy_share=0.5)  # targets: 1/4 all-correct, 1/4 all-wrong
    # round 1: 2 all-correct, 1 informative: the batch is not full (1 of 2), nothing moves
    sel.observe(np.arange(3), np.array([False, False, True]), np.array([True, True, False]))
    assert (sel.p_easy, sel.p_hard) == (0.5, 0.5)
    # round 2: 1 informative (batch full). Over both rounds: 4 groups, 2 all-correct (1/2 >= 1/4:
    # p_easy - 0.01), 0 all-wrong (0 < 1/4: p_hard + 0.01)
    sel.observe(np.array([3]), np.array([True]), np.array([False]))
    assert (sel.p_easy, sel.p_hard) == pytest.approx((0.49, 0.51))
    # next batch: 8 groups, 2 all-correct (exactly the target 1/4: at or above lowers p), 4 all-wrong
    sel.observe(np.arange(8), np.array([True, True, False, False, False, False, False, False]),
                np.array([False, False, True, True, False, False, False, False]))
    assert (sel.p_easy, sel.p_hard) == pytest.approx((0.48, 0.50))


def test_greso_probabilities_stay_under_the_cap_and_over_the_minimum():
    sel = greso_at_epoch(1, p_start=0.95)  # no zero-variance group: both would rise, capped at 0.95
    sel.observe(np.arange(2), np.ones(2, dtype=bool), np.zeros(2, dtype=bool))
    assert (sel.p_easy, sel.p_hard) == (0.95, 0.95)
    sel = greso_at_epoch(1, p_start=0.05)  # only zero-variance groups: both would fall, held at 0.05
    sel.observe(np.arange(6), np.array([True, True, False, False, False, False]), np.array([False, False, True, True, False, False]))
    assert (sel.p_easy, sel.p_hard) == (0.05, 0.05)


def test_greso_session_12_rule_adapts_after_every_round_from_the_start():
    sel = greso_at_epoch(0, keep_floor=0.0, p_max=1.0, adapt_from_epoch=0.0, adapt_per_batch=0.0)
    # all 4 groups all-correct: easy share 1 >= 1/12 -> p_easy falls; hard share 0 -> p_hard rises
    sel.observe(np.arange(4), np.zeros(4, dtype=bool), np.ones(4, dtype=bool))
    assert (sel.p_easy, sel.p_hard) == pytest.approx((0.49, 0.51))


def test_greso_state_round_trip_repeats_the_next_draw():
    pol = ResamplingPolicy(selection="greso", target_groups=2, group_size=2)
    a = OrchestratorCore(pol, [f"t{i}" for i in range(20)], seed=1)
    a.submit([group(f"t{i}", CORRECT) for i in range(10)])
    a.select_tasks(5)
    b = OrchestratorCore(pol, [f"t{i}" for i in range(20)], seed=1)
    b.load_state_dict(a.state_dict())
    assert a.select_tasks(30) == b.select_tasks(30)
    assert a.stats().selection_metrics == b.stats().selection_metrics


def test_greso_refuses_unknown_options():
    with pytest.raises(ValueError, match="selection_options.*bogus"):
        core(selection="greso", selection_options={"bogus": 1.0})


@pytest.mark.parametrize("mode", ["greso", "greso_prior"])
@pytest.mark.parametrize(("key", "value", "allowed"), [("p_min", 0.0, "greater than 0"), ("p_start", 1.5, "less than or equal to 1"),
                                                       ("step", -0.01, "greater than or equal to 0"),
                                                       ("easy_share", 1.5, "less than or equal to 1"),
                                                       ("p_max", 0.0, "greater than 0"), ("keep_floor", 1.5, "less than or equal to 1")])
def test_greso_refuses_out_of_range_options_naming_key_and_value(mode, key, value, allowed):
    with pytest.raises(ValueError, match=rf"selection_options\.{key}: Input should be {re.escape(allowed)} \(got {value}\)"):
        core(selection=mode, selection_options={key: value})


def test_greso_starts_at_the_policys_p_start_and_a_new_p_start_resets_it():
    c = core(selection="greso", selection_options={"p_start": 0.8, "adapt_from_epoch": 0.0})
    assert (c.selection.p_easy, c.selection.p_hard) == (0.8, 0.8)
    # a batch (2 informative groups) of 6 groups, 4 all-correct: 0.79, 0.81
    c.selection.observe(np.arange(6), np.array([True, True, False, False, False, False]), np.array([False, False, True, True, True, True]))
    c.set_policy(c.policy.updated({"selection_options": {"p_start": 0.8, "step": 0.02, "adapt_from_epoch": 0.0}}))  # same p_start: kept
    assert (c.selection.p_easy, c.selection.p_hard) == pytest.approx((0.79, 0.81))
    c.set_policy(c.policy.updated({"selection_options": {"p_start": 0.3}}))
    assert (c.selection.p_easy, c.selection.p_hard) == (0.3, 0.3)


def test_cooldown_counts_from_the_epoch_the_task_was_drawn_in():
    # 4 tasks, one epoch = 4 draws. t drawn last in epoch 0, its group comes back after the order
    # entered epoch 1: it must sit out exactly cooldown_epochs = 1 epoch (epoch 1), not epochs 1 and 2.
    c = core(skip_after_all_correct=1, cooldown_epochs=1)
    first = c.select_tasks(4)
    nxt = c.select_tasks(1)[0]  # epoch 1 started
    assert c.epoch == 1
    last = first[-1] if first[-1] != nxt else first[-2]  # drawn in epoch 0 only
    c.submit([group(last, CORRECT)])
    assert c.task_stats(last).next_eligible_epoch == 2  # was 3 before the fix


def test_cooldowns_keep_their_epochs_left_across_a_selection_patch():
    c = core(skip_after_all_correct=1, cooldown_epochs=2)
    c.select_tasks(8)  # epoch order: epoch 2 now
    assert c.epoch == 2
    t = c.select_tasks(1)[0]
    c.submit([group(t, CORRECT)])  # sits out epochs 3 and 4: eligible from 5
    assert c.task_stats(t).next_eligible_epoch == 5
    c.set_policy(c.policy.updated({"selection": "informative"}))  # informative's epoch is 0
    st = c.task_stats(t)
    assert st.epoch == 0 and st.next_eligible_epoch == 3  # 3 epochs left (epoch 2's rest, 3, 4), counted from 0


def test_greso_refuses_a_minimum_above_the_cap():
    with pytest.raises(ValueError, match=r"selection_options\.p_max: .*must be >= p_min \(0\.6\), got 0\.5"):
        core(selection="greso", selection_options={"p_min": 0.6, "p_max": 0.5})
