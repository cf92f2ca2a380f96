"""Rounds counted at submission, and tasks handed to an external explorer (no Ray)."""

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.types import Experience, ExperienceId, Group

TASKS = [f"t{i}" for i in range(6)]
MIXED, CORRECT = [1.0, -1.0], [1.0, 1.0]


def group(task, rewards):
    return Group(task_id=task, rollouts=[Experience(eid=ExperienceId(task=task, run=i), reward=r) for i, r in enumerate(rewards)])


def core(**policy):
    return OrchestratorCore(ResamplingPolicy(**{"target_groups": 2, "group_size": 2, **policy}), TASKS, seed=0)


def counters(c):
    s = c.stats()
    return s.rollouts_initial, s.rollouts_replenish, s.replenish_rounds


def test_a_batchs_first_submission_is_initial_and_later_ones_replenish():
    c = core()
    c.submit([group("t0", MIXED), group("t1", CORRECT)])  # round 0 of batch 0: 1 kept
    c.submit([group("t2", MIXED)])  # round 1 fills batch 0
    assert c.try_emit().rounds == 1
    assert counters(c) == (4, 2, 1)


def test_planning_rounds_ahead_does_not_count_them_as_replenish_rounds():
    # Trinity plans several explore steps before any comes back: only submissions count
    c = core()
    c.next_tasks(2), c.next_tasks(2), c.next_tasks(2)
    assert counters(c) == (0, 0, 0)
    c.submit([group("t0", MIXED), group("t1", MIXED)])
    assert c.try_emit().rounds == 0
    c.submit([group("t2", MIXED), group("t3", MIXED)])  # the next batch's first round
    assert counters(c) == (8, 0, 0)


def test_a_round_submitted_in_slices_counts_once():
    c = core(target_groups=3)
    c.submit([group("t0", CORRECT)])  # round 0
    c.submit([group("t1", MIXED)])  # round 1, first slice
    c.submit([group("t2", CORRECT)], new_round=False)  # round 1, second slice
    assert counters(c) == (2, 4, 1)


def test_the_end_of_data_gives_fewer_tasks_then_none():
    c = core(max_rollouts=6)  # 3 groups of 2
    assert c.next_tasks(2) and len(c.next_tasks(2)) == 1
    assert c.next_tasks(2) == [] and c.exhausted()


def test_the_group_carries_the_purpose_and_round_it_was_counted_with():
    c = core()
    first = c.submit([group("t0", CORRECT)])[0]
    second = c.submit([group("t1", MIXED)])[0]
    assert (first.purpose, first.round, second.purpose, second.round) == ("initial", 0, "replenish", 1)


def test_next_tasks_hands_out_exactly_count_in_epoch_order():
    c = core()
    order = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=2), TASKS, seed=0).select_tasks(6)
    assert c.next_tasks(4) + c.next_tasks(2) == order
    assert c.in_flight == order


def test_a_submitted_group_leaves_the_in_flight_list():
    c = core()
    a, b = c.next_tasks(2)
    c.submit([group(a, MIXED)])
    assert c.in_flight == [b]


def test_after_a_restart_the_tasks_that_never_came_back_come_first():
    c = core()
    a, b = c.next_tasks(2)
    c.submit([group(a, MIXED)])
    assert c.requeue_in_flight() == [b]
    again = c.next_tasks(2)
    assert again[0] == b and again[1] not in (a, b)


def test_in_flight_and_requeued_tasks_survive_the_state_dict():
    c = core()
    c.next_tasks(3)
    c.requeue_in_flight()
    c.next_tasks(1)
    restored = core()
    restored.load_state_dict(c.state_dict())
    assert (restored.in_flight, restored.requeued, restored.rounds_submitted) == (c.in_flight, c.requeued, 0)
