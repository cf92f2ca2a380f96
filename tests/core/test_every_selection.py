"""What every registered selection mode must do in the orchestrator core: draw, learn from groups,
come back from a checkpoint with the same next draw, and be switched to and away from mid-run."""

import pytest

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.selections import SELECTIONS
from orchestrator.core.types import Experience, ExperienceId, Group

TASKS = [f"t{i}" for i in range(24)]
MODES = sorted(SELECTIONS)


def group(task, rewards):
    return Group(task_id=task, rollouts=[Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)])


def played(mode: str) -> OrchestratorCore:
    """A core in ``mode`` that has drawn and classified two rounds: all correct, mixed, all wrong in turn."""
    c = OrchestratorCore(ResamplingPolicy(selection=mode, target_groups=4, group_size=2), TASKS, seed=0,
                         task_tags=["a"] * 12 + ["b"] * 12)
    kinds = [[1.0, 1.0], [1.0, -1.0], [-1.0, -1.0]]
    for _ in range(2):
        c.submit([group(t, kinds[i % 3]) for i, t in enumerate(c.select_tasks(8))])
    return c


@pytest.mark.parametrize("mode", MODES)
def test_a_mode_draws_known_tasks_after_learning_from_groups(mode):
    drawn = played(mode).select_tasks(8)
    assert drawn and set(drawn) <= set(TASKS)


@pytest.mark.parametrize("mode", MODES)
def test_a_mode_restored_from_its_checkpoint_draws_the_same_next_tasks(mode):
    a = played(mode)
    b = OrchestratorCore(a.policy, TASKS, seed=0, task_tags=["a"] * 12 + ["b"] * 12)
    b.load_state_dict(a.state_dict())
    assert a.select_tasks(20) == b.select_tasks(20)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("other", ["epoch", "informative"])
def test_a_mode_can_be_switched_to_and_away_from_mid_run(mode, other):
    c = played(other)
    c.set_policy(c.policy.updated({"selection": mode}))
    assert c.selection.name == mode and set(c.select_tasks(8)) <= set(TASKS)
    c.set_policy(c.policy.updated({"selection": other}))
    assert c.selection.name == other and set(c.select_tasks(8)) <= set(TASKS)
