"""``ranked_skip``: each pass most informative first, re-ranked every round, with ``predicted_skip``'s keep."""

import numpy as np
import pytest

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.ranked import RankedSkipSelection, ranked
from orchestrator.core.selection import SELECTIONS, SelectionContext
from orchestrator.core.types import Experience, ExperienceId, Group


def ctx(informative, max_epochs=None):
    informative = np.asarray(informative, dtype=float)
    return SelectionContext(skip_until_epoch=np.zeros(len(informative), dtype=np.int64), informative=informative,
                            max_epochs=max_epochs)


def group(task, rewards):
    return Group(task_id=task, rollouts=[Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)])


def test_the_mode_is_registered():
    assert SELECTIONS["ranked_skip"] is RankedSkipSelection


def test_ranked_by_hand():
    # I = [0.2, 0.9, 0.2, 0.5], positions [3, 0, 1, 2]: 0.9 (index 1), 0.5 (3), then the two 0.2s by
    # position: index 2 (position 1) before index 0 (position 3)
    assert ranked(np.array([0.2, 0.9, 0.2, 0.5]), np.array([3, 0, 1, 2])).tolist() == [1, 3, 2, 0]


def test_a_pass_takes_the_most_informative_tasks_first():
    # every task kept (I >= keep_at 0.5): the pass is the tasks by I, highest first
    sel = RankedSkipSelection(6, seed=0)
    c = ctx([0.5, 0.8, 0.6, 0.9, 0.7, 0.55])
    assert sel.select(3, c).tolist() == [3, 1, 4]
    assert sel.select(3, c).tolist() == [2, 5, 0]
    assert sel.select(1, c).tolist() == [3] and sel.epoch == 1  # the next pass begins when this one has no more


def test_the_rest_of_a_pass_is_re_ranked_by_the_new_predictions():
    sel = RankedSkipSelection(4, seed=0)
    assert sel.select(1, ctx([0.9, 0.8, 0.7, 0.6])).tolist() == [0]
    # the groups came back and task 3 now leads; task 0 already had its turn in this pass
    assert sel.select(2, ctx([1.0, 0.6, 0.7, 0.95])).tolist() == [3, 2]
    assert sel.epoch == 0 and sel.cursor == 3
    assert sel.taken_epoch.tolist() == [0, -1, 0, 0]  # only the drawn tasks' rows changed


def test_every_task_has_at_most_one_turn_per_pass_and_low_ones_are_mostly_skipped():
    # half predicted never informative (kept at the floor 0.05), half 0.6 (always kept)
    sel = RankedSkipSelection(200, seed=3)
    picked = sel.select(200, ctx(np.where(np.arange(200) < 100, 0.0, 0.6), max_epochs=1))
    assert len(set(picked.tolist())) == len(picked)
    assert set(picked[:100].tolist()) == set(range(100, 200))  # the informative half first
    low = int((picked < 100).sum())
    assert 0 < low < 15  # about 100 * 0.05 = 5
    assert sel.passed_over == 100 - low


def test_a_family_that_gives_informative_groups_is_rolled_out_before_one_that_does_not():
    # 4 tasks of each family seen: "mixed" gave informative groups, "solved" all-correct ones; the
    # unseen tasks of "mixed" rank first
    tasks = [f"m{i}" for i in range(8)] + [f"s{i}" for i in range(8)]
    c = OrchestratorCore(ResamplingPolicy(selection="ranked_skip", target_groups=2, group_size=4), tasks, seed=0,
                         task_tags=["mixed"] * 8 + ["solved"] * 8)
    c.submit([group(f"m{i}", [1.0, -1.0, 1.0, -1.0]) for i in range(4)] + [group(f"s{i}", [1.0] * 4) for i in range(4)])
    c.selection.taken_epoch[[c.task_index(f"m{i}") for i in range(4)] + [c.task_index(f"s{i}") for i in range(4)]] = 0
    assert sorted(c.select_tasks(4)) == ["m4", "m5", "m6", "m7"]


def test_a_checkpoint_with_a_wrong_sized_column_is_refused():
    sel = RankedSkipSelection(4)
    with pytest.raises(ValueError, match="taken_epoch has shape"):
        sel.load_state_dict({"epoch": 0, "cursor": 0, "taken_epoch": [-1] * 3})


def test_the_task_row_shows_the_keep_probability():
    assert RankedSkipSelection(2).task_row(0, ctx([0.1, 0.9])) == {"keep_probability": pytest.approx(0.2)}
