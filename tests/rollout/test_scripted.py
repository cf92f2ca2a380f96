"""The scripted and Bernoulli rollout sources used by benchmarks and tests."""

import pytest

from orchestrator.core.types import UnknownTaskError
from orchestrator.rollout.scripted import BernoulliRolloutSource, ScriptedRolloutSource, ScriptedTasks

TASKS = ScriptedTasks(["a", "b", "c"])


def test_bernoulli_extremes_are_all_correct_and_all_wrong():
    src = BernoulliRolloutSource({"a": 1.0, "b": 0.0, "c": 0.5}, seed=0)
    a, b, _ = src.generate([TASKS.get(t) for t in "abc"], 4, round_tag="r0")
    assert [r.reward for r in a.rollouts] == [1.0] * 4 and [r.metrics["accuracy"] for r in b.rollouts] == [0.0] * 4
    assert [r.eid.run for r in a.rollouts] == [0, 1, 2, 3] and a.rollouts[0].eid.round_tag == "r0"


def test_bernoulli_rate_is_respected_on_average():
    src = BernoulliRolloutSource({"c": 0.25}, seed=1)
    (g,) = src.generate([TASKS.get("c")], 4000)
    assert abs(sum(r.metrics["accuracy"] for r in g.rollouts) / 4000 - 0.25) < 0.03  # 4.5 sigma


def test_scripted_cycles_reward_vectors_per_task():
    src = ScriptedRolloutSource({"a": [[1.0, -1.0], [-1.0, -1.0]]})
    first, second, third = (src.generate([TASKS.get("a")], 2)[0] for _ in range(3))
    assert [r.reward for r in first.rollouts] == [1.0, -1.0] == [r.reward for r in third.rollouts]
    assert [r.reward for r in second.rollouts] == [-1.0, -1.0]


def test_scripted_tasks_unknown_id():
    with pytest.raises(UnknownTaskError, match="unknown task 'zz'"):
        TASKS.get("zz")
