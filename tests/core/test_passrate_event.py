"""The pass-rate estimate learns DAPO's informative event (0 < correct < n), not the filter's verdict."""

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group


def group(task, rewards):
    return Group(task_id=task, rollouts=[Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)])


def test_with_the_filter_off_an_all_correct_first_group_is_not_counted_informative():
    c = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=2, filter={"enabled": False}), ["a", "b", "c"], seed=0)
    c.submit([group("a", [1.0, 1.0]), group("b", [1.0, -1.0]), group("c", [-1.0, -1.0])])
    # kept: all three (filter off); informative in DAPO's sense: only b
    assert c.passrate.first_informative.tolist() == [0.0, 1.0, 0.0]
