"""The ``dso_orchestrator`` task selector: Trinity's explorer asks the orchestrator which tasks to roll out next."""

from __future__ import annotations

import logging
from typing import Any

import ray

from orchestrator.core.policy import ResamplingPolicy
from orchestrator.service.actor import DEFAULT_NAME, get_or_create_orchestrator
from orchestrator.trinity.attach import IndexTaskSet, _namespace

log = logging.getLogger("trinity_dso.trinity")


class OrchestratorTaskSelector:
    """Task selector ``dso_orchestrator``: the orchestrator picks the explorer's next tasks.

    Implements the interface of Trinity's ``trinity.buffer.selector.BaseSelector``
    (``get_indices``, ``feedback``, ``state_dict``, ``load_state_dict``) without subclassing
    it, so this module imports without Trinity's file reader (which needs ``datasets``).

    Each ``get_indices(batch_size)`` (one explore step) hands out exactly ``batch_size`` tasks
    (Trinity reads a fixed number per step): first those left over from earlier plans, then
    the tasks of a new ``plan_round`` of the actor (with ``replenish="same_tasks"`` the tasks
    dropped in the open batch come first, then tasks of the policy's ``selection``: ``epoch``
    order minus those in a history cooldown, ``skip_after_all_correct`` /
    ``skip_after_all_wrong``, or ``informative`` draws by predicted informativeness, the round
    sized from the drawn tasks' predicted keep rate), topped up with ``select_tasks`` when a
    plan is short. A plan larger than ``batch_size`` is spread over the
    next explore steps (kept in ``pending`` and in ``state_dict``), so no planned task is lost
    from the epoch order.

    Creates the actor (named ``actor_name`` in the run's namespace, task ids ``"0" .. N-1``)
    when it does not exist yet.

    Args:
        data_source: Trinity's ``_HFBatchReader``; only ``dataset_size`` is read.
        config: Trinity's ``DataSelectorConfig``; ``config.seed`` seeds the task order and
            ``config.kwargs`` may hold ``actor_name``, ``namespace`` and ``policy``.
    """

    def __init__(self, data_source: Any, config: Any) -> None:
        kwargs = dict(getattr(config, "kwargs", None) or {})
        self.dataset_size = int(data_source.dataset_size)
        self.actor_name = kwargs.get("actor_name", DEFAULT_NAME)
        self.namespace = kwargs.get("namespace")
        policy = ResamplingPolicy.parse(dict(kwargs.get("policy") or {}))
        self.actor = get_or_create_orchestrator(
            policy, IndexTaskSet.of_size(self.dataset_size), seed=int(getattr(config, "seed", 0) or 0),
            name=self.actor_name, namespace=_namespace(self.namespace),
        )
        self.current_index = 0
        self.pending: list[str] = []  # planned task ids not yet handed out
        self._last_plan: dict = {}

    def get_indices(self, batch_size: int, return_extra_info: bool = False):
        """Exactly ``batch_size`` dataset indices (ints in [0, dataset_size)), per the orchestrator.

        Leftovers of earlier plans first; a new ``plan_round`` only when they do not fill the
        step; ``select_tasks`` tops up a short plan. Extra info: the latest plan's
        ``purpose``, ``round`` and ``batch_id``. At the end of data (the actor's ``max_epochs``
        or ``max_rollouts``) fewer indices may come back; when none is left it raises
        ``StopIteration``, which ends Trinity's explorer cleanly (its file reader turns it
        into ``StopAsyncIteration``).

        Raises:
            StopIteration: the orchestrator is exhausted; the message says so.
        """
        ids = self.pending[:batch_size]
        self.pending = self.pending[batch_size:]
        if len(ids) < batch_size:
            plan = ray.get(self.actor.plan_round.remote())
            self._last_plan = {"purpose": plan.purpose, "round": plan.round, "batch_id": plan.batch_id}
            planned = list(plan.task_ids)
            take = batch_size - len(ids)
            ids += planned[:take]
            self.pending = planned[take:]
        if len(ids) < batch_size:
            ids += ray.get(self.actor.select_tasks.remote(batch_size - len(ids)))
        if not ids and ray.get(self.actor.exhausted.remote()):
            raise StopIteration("exhausted: the orchestrator has no task left (max_epochs or max_rollouts reached)")
        indices = [int(t) for t in ids]
        self.current_index += len(indices)
        if return_extra_info:
            return indices, dict(self._last_plan)
        return indices

    def feedback(self, indices: list[int], values: list[float]) -> None:
        """No-op: the orchestrator learns from the pipeline operator's submissions."""

    def state_dict(self) -> dict:
        """Tasks handed out so far and planned ones not yet handed out; the task order itself
        is in the actor's state."""
        return {"current_index": self.current_index, "pending": list(self.pending)}

    def load_state_dict(self, state_dict: dict) -> None:
        self.current_index = int(state_dict.get("current_index", 0))
        self.pending = [str(t) for t in state_dict.get("pending", [])]


