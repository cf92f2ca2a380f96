"""The state the parts of :class:`~orchestrator.core.machine.OrchestratorCore` share, one typed
object per concern, each given to the parts that read it (their constructors say which):

- :class:`Run`: the policy, its revision and the newest model version;
- :class:`OpenBatch`: the batch being filled (its id, rounds, held groups, tasks to roll again);
- :class:`Tally`: the cumulative counters and the per-batch sums;
- :class:`~orchestrator.core.tasks.TaskColumns`: the per-task columns.
"""

from __future__ import annotations

from orchestrator.core.outcomes import GroupOutcome
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.rows import GroupRows
from orchestrator.core.stats import COUNTERS


class Run:
    """The policy in force and the model version.

    Attributes:
        policy: the resampling policy (replaced by ``OrchestratorCore.set_policy``).
        policy_revision: how often it was replaced.
        model_version: the newest model version (model weights) seen.
    """

    def __init__(self, policy: ResamplingPolicy) -> None:
        self.policy = policy
        self.policy_revision = 0
        self.model_version = 0


class OpenBatch:
    """The batch being filled, reset when it is released.

    Attributes:
        batch_id: its id.
        rounds_started: rounds planned for it (cap, same_tasks).
        rounds_submitted: rounds submitted into it (purpose, counters).
        carry: informative groups, oldest first (they outlive the batch: surplus carries over).
        candidates: its dropped groups, for padding.
        dropped_task_ids: its dropped tasks, oldest first (``same_tasks`` re-rolls them).
        requeue: tasks of stale groups to roll again (``requeue_stale``).
    """

    def __init__(self, group_size: int) -> None:
        self.batch_id = 0
        self.rounds_started = 0
        self.rounds_submitted = 0
        self.carry = GroupRows.empty(group_size)
        self.candidates = GroupRows.empty(group_size)
        self.dropped_task_ids: list[str] = []
        self.requeue: list[str] = []


class Tally:
    """Cumulative counters (see :class:`~orchestrator.core.stats.Stats`) and the sums of the batch being filled.

    Attributes:
        counters: every counter of :data:`~orchestrator.core.stats.COUNTERS`, from 0.
        classified_by_reason / dropped_by_reason: groups per outcome label.
        rounds_per_batch: replenish rounds of the most recent batches.
        window: reward sums since the last release (:meth:`new_window`).
        last_batch: per-batch reward metrics of the last released batch.
    """

    def __init__(self) -> None:
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self.classified_by_reason = {r.label: 0 for r in GroupOutcome}
        self.dropped_by_reason = {r.label: 0 for r in GroupOutcome if r != GroupOutcome.INFORMATIVE}
        self.rounds_per_batch: list[int] = []
        self.window = self.new_window()
        self.last_batch: dict = {}

    @staticmethod
    def new_window() -> dict:
        return {"reward_sum_all": 0.0, "reward_count_all": 0, "reward_sum_kept": 0.0, "reward_count_kept": 0, "rollouts": 0}
