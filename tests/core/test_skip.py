"""``predicted_skip``: epoch order, tasks skipped by their predicted chance of an informative group."""

import numpy as np
import pytest

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.passrate import keep_probability
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.selection import SELECTIONS, SelectionContext
from orchestrator.core.skip import PredictedSkipOptions, PredictedSkipSelection
from orchestrator.core.types import Experience, ExperienceId, Group


def group(task, rewards):
    return Group(task_id=task, rollouts=[Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)])


def test_the_mode_is_registered():
    assert SELECTIONS["predicted_skip"] is PredictedSkipSelection


def test_keep_probability_by_hand():
    # clip(I / keep_at, floor, 1): 0.1 / 0.5 = 0.2; 0.01 / 0.5 = 0.02 -> floor 0.05; 0.7 / 0.5 -> 1
    np.testing.assert_allclose(keep_probability(np.array([0.1, 0.01, 0.7, 0.5]), 0.5, 0.05), [0.2, 0.05, 1.0, 1.0])


def test_an_epoch_keeps_every_predicted_informative_task_and_few_of_the_rest():
    sel = PredictedSkipSelection(200, seed=3)
    informative = np.where(np.arange(200) < 100, 0.0, 0.6)  # half predicted never informative: kept at the floor 0.05
    ctx = SelectionContext(skip_until_epoch=np.zeros(200, dtype=np.int64), informative=informative, max_epochs=1)
    picked = sel.select(200, ctx)
    assert set(range(100, 200)) <= set(picked.tolist())
    low = int((picked < 100).sum())
    assert 0 < low < 15  # about 100 * 0.05 = 5
    assert sel.passed_over == 100 - low
    assert len(set(picked.tolist())) == len(picked)  # at most once per epoch


def test_a_never_seen_task_of_a_zero_variance_family_is_kept_only_at_the_floor():
    # 8 tasks of family "easy" (always solved) and 8 of "hard" (never): after the first groups of
    # 4 tasks of each family the per-tag prior predicts the unseen ones of either family zero-variance
    tasks = [f"e{i}" for i in range(8)] + [f"h{i}" for i in range(8)]
    pol = ResamplingPolicy(selection="predicted_skip", target_groups=2, group_size=4)
    c = OrchestratorCore(pol, tasks, seed=0, task_tags=["easy"] * 8 + ["hard"] * 8)
    c.submit([group(f"e{i}", [1.0] * 4) for i in range(4)] + [group(f"h{i}", [-1.0] * 4) for i in range(4)])
    unseen = [c.task_index(t) for t in ["e4", "e5", "e6", "e7", "h4", "h5", "h6", "h7"]]
    assert (c.predicted_informative()[unseen] < 0.05).all()
    np.testing.assert_allclose(keep_probability(c.predicted_informative()[unseen], 0.5, 0.05), 0.05)


def test_unknown_and_out_of_range_options_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="selection_options.*bogus"):
        OrchestratorCore(ResamplingPolicy(selection="predicted_skip", selection_options={"bogus": 1.0}), ["a"], seed=0)
    with pytest.raises(ValueError, match="keep_at.*1.5"):
        OrchestratorCore(ResamplingPolicy(selection="predicted_skip", selection_options={"keep_at": 1.5}), ["a"], seed=0)


def test_the_task_row_shows_the_keep_probability():
    sel = PredictedSkipSelection(3)
    ctx = SelectionContext(skip_until_epoch=np.zeros(3, dtype=np.int64), informative=np.array([0.1, 0.3, 0.9]))
    assert sel.task_row(1, ctx) == {"keep_probability": pytest.approx(0.6)}


def test_a_task_passed_over_max_skip_epochs_turns_is_rolled_out_at_the_next():
    from orchestrator.core.skip import overdue

    # last drawn in epochs 0, 1, 2 and never; at epoch 3 with max_skip_epochs 1: 3 - 0 = 3 > 1 and
    # 3 - 1 = 2 > 1 are due, 3 - 2 = 1 is not, never drawn (-1): 4 > 1 is due
    assert overdue(3, np.array([0, 1, 2, -1]), 1.0).tolist() == [True, True, False, True]
    sel = PredictedSkipSelection(4, seed=3)
    sel.options = PredictedSkipOptions(keep_at=0.5, floor=0.0, max_skip_epochs=1)
    ctx = SelectionContext(skip_until_epoch=np.zeros(4, dtype=np.int64), informative=np.zeros(4),
                           last_drawn_epoch=np.array([0, 0, -1, -1]))
    # predicted never informative, floor 0: only the overdue ones come out; epoch 0: tasks 0 and 1 (0 - 0 = 0) are
    # not due, nor 2 and 3 (0 - (-1) = 1); epoch 1: 2 and 3 are due (2 > 1), 0 and 1 not (1)
    picked = sel.select(2, ctx)
    assert sorted(picked.tolist()) == [2, 3] and sel.picked_epochs.tolist() == [1, 1]


def test_max_skip_epochs_below_zero_is_refused_by_name():
    with pytest.raises(ValueError, match=r"selection_options\.max_skip_epochs: Input should be greater than or equal to 0 \(got -1\)"):
        OrchestratorCore(ResamplingPolicy(selection="predicted_skip", selection_options={"max_skip_epochs": -1}), ["a", "b"])
