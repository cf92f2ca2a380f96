"""``greso_prior``: GRESO's streak skip for tasks rolled out before, the prior's skip for the rest."""

import numpy as np
import pytest

from orchestrator.core.greso_prior import GresoPriorSelection
from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.selection import SELECTIONS, SelectionContext
from orchestrator.core.types import Experience, ExperienceId, Group


def group(task, rewards):
    return Group(task_id=task, rollouts=[Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)])


def ctx(informative, groups, streak_correct, streak_wrong=None, max_epochs=None):
    n = len(informative)
    return SelectionContext(skip_until_epoch=np.zeros(n, dtype=np.int64), informative=np.asarray(informative, dtype=float),
                            groups=np.asarray(groups), zero_streak_correct=np.asarray(streak_correct),
                            zero_streak_wrong=np.zeros(n, dtype=np.int64) if streak_wrong is None else np.asarray(streak_wrong),
                            max_epochs=max_epochs)


def test_the_mode_is_registered():
    assert SELECTIONS["greso_prior"] is GresoPriorSelection


def test_keep_probability_by_hand():
    # never rolled out (groups 0): clip(I / 0.5, 0.05, 1): 0.1 -> 0.2, 0.0 -> 0.05;
    # rolled out: GRESO's p ** z with p_easy = p_hard = 0.5: 2 all-correct -> 0.25, 1 all-wrong -> 0.5,
    # last group informative -> 1 (whatever the prediction)
    sel = GresoPriorSelection(5)
    c = ctx([0.1, 0.0, 0.9, 0.9, 0.0], groups=[0, 0, 3, 1, 2], streak_correct=[0, 0, 2, 0, 0], streak_wrong=[0, 0, 0, 1, 0])
    np.testing.assert_allclose(sel.keep_probability(np.arange(5), c), [0.2, 0.05, 0.25, 0.5, 1.0])


def test_a_first_epoch_keeps_few_never_seen_tasks_of_a_zero_variance_family():
    # 100 never-seen tasks predicted never informative (kept at the floor, 0.05), 100 seen whose last
    # group was informative (kept always)
    sel = GresoPriorSelection(200, seed=3)
    c = ctx(np.zeros(200), groups=np.where(np.arange(200) < 100, 0, 1),
            streak_correct=np.zeros(200, dtype=np.int64), max_epochs=1)
    picked = sel.select(200, c)
    assert set(range(100, 200)) <= set(picked.tolist())
    assert 0 < int((picked < 100).sum()) < 15  # about 100 * 0.05 = 5


def test_a_task_seen_all_correct_follows_gresos_streak_not_its_prediction():
    # predicted informative 0.9 (kept always by the prior rule) but 3 all-correct groups in a row:
    # kept with 0.5 ** 3 = 0.125, as GRESO would
    sel = GresoPriorSelection(400, seed=0)
    c = ctx(np.full(400, 0.9), groups=np.full(400, 3), streak_correct=np.full(400, 3), max_epochs=1)
    kept = len(sel.select(400, c))
    assert 25 < kept < 75  # about 400 * 0.125 = 50


def test_options_of_both_rules_are_accepted_and_others_refused():
    # the range checks are predicted_skip's (tests/core/test_skip.py); the checkpoint round trip is
    # every mode's (tests/core/test_every_selection.py)
    opts = {"keep_at": 0.6, "floor": 0.1, "p_min": 0.1, "target_zero_share": 0.3}
    c = OrchestratorCore(ResamplingPolicy(selection="greso_prior", selection_options=opts), ["a"], seed=0)
    assert {k: getattr(c.selection.options, k) for k in opts} == opts
    with pytest.raises(ValueError, match="selection_options.*bogus"):
        OrchestratorCore(ResamplingPolicy(selection="greso_prior", selection_options={"bogus": 1.0}), ["a"], seed=0)


def test_the_task_row_shows_the_keep_probability():
    sel = GresoPriorSelection(2)
    c = ctx([0.1, 0.9], groups=[0, 1], streak_correct=[0, 1])
    assert sel.task_row(0, c) == {"keep_probability": pytest.approx(0.2)}
    assert sel.task_row(1, c) == {"keep_probability": pytest.approx(0.5)}
