"""The orchestrator Ray actor: a thin, long-running shell around :class:`OrchestratorCore`.

It owns the state machine, the rollout source, the buffer sink, the metrics and a
checkpoint file. It is an async actor: while ``next_batch`` waits for rollouts (run in a
worker thread), stats, policy reads/changes and pause/resume are served concurrently.
Core state is only touched on the actor's event loop, never from the rollout thread.

Find it by name from any driver or Trinity component::

    actor = ray.get_actor("dso-orchestrator", namespace="trinity-dso")

Anchor index (GiGPO): created with ``anchor_index={"redis_url": ..., "prefix": ...,
"ttl_s": ..., "max_age_versions": ...}``, the actor runs the index's lifecycle, inherited from
:class:`~orchestrator.anchors.owner.AnchorLifecycle` (``anchor_spec``, ``anchor_register``,
``anchor_stats``, ``anchor_drop``, ``anchor_expire``; version-based expiry; its checkpoint
part). Workers write and query the index itself, opened with
:func:`orchestrator.anchors.owner.orchestrator_anchor_index` (Redis, or the memory index's
own Ray actor ``<name>-anchors``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import ray

from orchestrator.anchors.owner import AnchorIndexConfig, AnchorLifecycle
from orchestrator.core.machine import DataExhaustedError, OrchestratorCore, RoundPlan, trajectory_rollouts
from orchestrator.core.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.core.stats import Stats, TaskStats
from orchestrator.core.types import Batch, Experience, Group, TaskSetLike
from orchestrator.rollout.source import RolloutSource
from orchestrator.service.logs import enable_service_logging
from orchestrator.service.metrics import DSOMetrics
from orchestrator.service.sink import BatchSink

DEFAULT_NAME = "dso-orchestrator"
DEFAULT_NAMESPACE = "trinity-dso"

log = logging.getLogger("trinity_dso.actor")


class OrchestratorUnavailable(RuntimeError):
    """The orchestrator actor is missing, dead or did not answer in time."""


class PolicyConflictError(ValueError):
    """A policy write based on a stale revision (the REST layer maps it to 409)."""


def check_judge(policy: ResamplingPolicy, rollout_source: Any) -> None:
    """Refuse a ``filter.judge`` metric the rollout source does not produce, at config time.

    A source declares what it writes in ``metric_names`` (a tuple); sources that do not
    declare it, and ``judge`` values ``reward`` / ``auto``, are not checked.

    Raises:
        InvalidPolicyError: names ``filter.judge``, the value and the source's metrics.
    """
    judge = policy.filter.judge
    names = getattr(rollout_source, "metric_names", None)
    if judge in ("reward", "auto") or names is None or judge in names:
        return
    raise InvalidPolicyError(
        f"invalid resampling policy: filter.judge: {type(rollout_source).__name__} produces metrics "
        f"{sorted(names)}, not {judge!r} (use one of them, 'reward' or 'auto')"
    )


class Orchestrator(AnchorLifecycle):
    """Actor body (also usable in-process). Ray wraps it as :data:`OrchestratorActor`.

    Args:
        policy: the initial resampling policy (a model or a dict, validated).
        task_set: object with ``task_ids: list[str]`` and ``get(task_id) -> Task``.
        rollout_source: a :class:`orchestrator.rollout.engine.RolloutSource`, or None when groups are
            only submitted from outside (e.g. by Trinity's pipeline operator).
        sink: optional object with ``write(batch)`` (e.g. :class:`orchestrator.service.sink.SQLiteSink`).
        checkpoint_path: optional JSON file; state is saved after every change and loaded at
            start when present, so a restarted actor resumes where it stopped.
        metrics: optional object with ``update(stats)`` and ``observe_batch(batch)``; when it
            also has ``set_anchor_entries``, ``observe_anchor_group_sizes`` and
            ``observe_redis_op`` (:class:`orchestrator.service.metrics.DSOMetrics`), the anchor index
            feeds them.
        seed: seeds the task order.
        anchor_index: an :class:`~orchestrator.anchors.owner.AnchorIndexConfig` (or its dict)
            to create an anchor index and run its lifecycle (see
            :class:`~orchestrator.anchors.owner.AnchorLifecycle`; the memory index is served
            by its own Ray actor when this one runs on Ray); None (default) for none (the
            ``anchor_*`` methods then raise
            :class:`~orchestrator.anchors.owner.AnchorIndexNotConfiguredError`).
    Raises:
        pydantic.ValidationError: invalid ``anchor_index`` settings.
    """

    def __init__(
        self,
        policy: ResamplingPolicy | dict,
        task_set: TaskSetLike,
        rollout_source: RolloutSource | None = None,
        *,
        sink: BatchSink | None = None,
        checkpoint_path: str | None = None,
        metrics: DSOMetrics | None = None,
        seed: int = 0,
        anchor_index: AnchorIndexConfig | dict | None = None,
    ):
        enable_service_logging()
        policy = policy if isinstance(policy, ResamplingPolicy) else ResamplingPolicy.parse(policy)
        check_judge(policy, rollout_source)
        self.core = OrchestratorCore(policy, task_set.task_ids, seed=seed)
        self.task_set = task_set
        self.rollout_source = rollout_source
        self.sink = sink
        self.metrics = metrics
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        self.ready: list[Batch] = []
        self._batch_started: float | None = None
        super().__init__(anchor_index, version=lambda: self.core.model_version, metrics=metrics, on_change=self._checkpoint)
        if self.checkpoint_path and self.checkpoint_path.exists():
            saved = json.loads(self.checkpoint_path.read_text())
            self.core.load_state_dict(saved)
            self._anchor_load_state_dict(saved)
            log.warning(
                "resumed from checkpoint %s at batch %d, policy revision %d (the checkpoint's policy replaces the "
                "configured one; delete the file to start afresh)",
                self.checkpoint_path, self.core.batch_id, self.core.policy_revision,
            )
        self._observe()

    # ------------------------------------------------------------- internals
    def _observe(self, batch: Batch | None = None) -> None:
        self._anchor_auto_expire()
        if self.metrics is not None:
            self.metrics.update(self.core.stats(), self.core.policy)
            if batch is not None:
                self.metrics.observe_batch(batch)

    def _checkpoint(self) -> None:
        if self.checkpoint_path is None:
            return
        tmp = self.checkpoint_path.with_suffix(".tmp")
        tmp.parent.mkdir(parents=True, exist_ok=True)
        state = self.core.state_dict()
        state.update(self._anchor_state_dict())
        tmp.write_text(json.dumps(state))
        os.replace(tmp, self.checkpoint_path)

    def _finish(self, batch: Batch) -> Batch:
        batch.fill_seconds = time.monotonic() - self._batch_started if self._batch_started else 0.0
        self._batch_started = None
        if self.sink is not None:
            self.sink.write(batch)
        self._checkpoint()
        self._observe(batch)
        return batch

    async def _run_round(self, plan: RoundPlan) -> None:
        tasks = [self.task_set.get(t) for t in plan.task_ids]
        tag = f"b{plan.batch_id}r{plan.round}"
        version = self.core.model_version
        groups = await asyncio.to_thread(
            self.rollout_source.generate, tasks, self.core.policy.group_size, model_version=version, round_tag=tag
        )
        for g in groups:
            g.purpose, g.round = plan.purpose, plan.round
        self.core.submit(groups)
        self._checkpoint()
        self._observe()

    # ------------------------------------------------------------- batches
    async def next_batch(self, timeout_s: float | None = None) -> Batch | None:
        """Fill and return the next batch, running rounds through the rollout source.

        Returns None when ``timeout_s`` passes while replenishment is paused. At the end of
        data (``max_epochs`` / ``max_rollouts``) the kept groups come out as a last batch per
        ``on_cap``; the call after that raises :class:`DataExhaustedError`.
        Raises:
            ReplenishCapError: cap hit under ``on_cap='raise'`` (the open batch is kept).
            DataExhaustedError: no task left and no batch to release.
            RuntimeError: no rollout source is attached.
        """
        if self.ready:
            return self.ready.pop(0)
        if self.rollout_source is None:
            raise RuntimeError("next_batch: this orchestrator has no rollout source; submit groups and use pop_batch")
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        if self._batch_started is None:
            self._batch_started = time.monotonic()
        while True:
            batch = self.core.try_emit()
            if batch is not None:
                return self._finish(batch)
            if self.core.cap_reached():
                return self._finish(self.core.close_at_cap())
            if self.core.replenish_blocked():
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                await asyncio.sleep(0.05)
                continue
            if self.core.exhausted():
                return self.finish_batch()
            await self._run_round(self.core.plan_round())

    def submit_groups(self, groups: list[Group], on_invalid: str = "raise") -> list[str]:
        """Submit groups rolled out elsewhere; returns each group's filter label.

        Full batches become available through :meth:`pop_batch`.

        Args:
            groups: the groups.
            on_invalid: ``"raise"`` (default): all-or-nothing, one invalid group rejects the
                call; ``"drop"``: an invalid group is dropped with label ``invalid`` (counted and
                logged) and the others go on (the Trinity operator's choice).
        Raises:
            InvalidGroupError, UnknownTaskError: under ``"raise"``, nothing is accepted (see
                ``OrchestratorCore.submit``).
        """
        if self._batch_started is None:
            self._batch_started = time.monotonic()
        self.core.submit(groups, on_invalid=on_invalid)
        while (batch := self.core.try_emit()) is not None:
            self.ready.append(self._finish(batch))
            self._batch_started = time.monotonic() if self.core.carry else None
        self._checkpoint()
        self._observe()
        return [g.reason for g in groups]

    def submit_experiences(self, experiences: list[Experience], model_version: int = 0) -> list[str]:
        """Group experiences by ``(eid.task, eid.round_tag)`` (one group per task and round, in run
        order) and submit them; see :meth:`submit_groups` for errors (e.g. a ragged group).

        Multi-turn step experiences (``eid.step``) become one rollout per trajectory first
        (:func:`orchestrator.core.machine.trajectory_rollouts`): the filter judges each
        trajectory's outcome and counts it once. ``model_version`` stamps experiences without
        ``info["model_version"]``.
        """
        by_key: dict[tuple[str, str], list[Experience]] = defaultdict(list)
        for e in trajectory_rollouts(experiences):
            e.info.setdefault("model_version", model_version)
            by_key[(e.eid.task, e.eid.round_tag)].append(e)
        groups = [
            Group(task_id=task, rollouts=sorted(rs, key=lambda e: e.eid.run), model_version=model_version)
            for (task, _), rs in by_key.items()
        ]
        return self.submit_groups(groups)

    def pop_batch(self) -> Batch | None:
        """A completed batch if one is ready (never blocks, never rolls out)."""
        return self.ready.pop(0) if self.ready else None

    def exhausted(self) -> bool:
        """True once ``max_epochs`` / ``max_rollouts`` allow no further round (see :meth:`finish_batch`)."""
        return self.core.exhausted()

    def finish_batch(self) -> Batch:
        """At the end of data, release the kept groups as the last batch (per ``on_cap``).

        Raises:
            DataExhaustedError: nothing is kept (the padding candidates are dropped); the data
                is over for good. Its message names the limit reached.
            ReplenishCapError: ``on_cap='raise'`` and the kept groups are short of a batch.
        """
        batch = self.core.finish()
        if batch is None:
            p, c = self.core.policy, self.core.counters
            self._checkpoint()
            self._observe()
            raise DataExhaustedError(
                f"exhausted: no task left (max_epochs={p.max_epochs}, epoch {self.core.epoch}; "
                f"max_rollouts={p.max_rollouts}, {c['rollouts_planned']} planned) and no batch to release"
            )
        return self._finish(batch)

    def close_batch(self) -> Batch | None:
        """Close the open batch now as the cap would (pad / partial / raise), for external drivers."""
        batch = self.core.close_at_cap()
        return self._finish(batch)

    def plan_round(self) -> RoundPlan:
        """Plan the next round for an external explorer (e.g. Trinity's task selector)."""
        plan = self.core.plan_round()
        self._checkpoint()
        return plan

    def select_tasks(self, count: int) -> list[str]:
        tasks = self.core.select_tasks(count)
        self._checkpoint()
        return tasks

    # ------------------------------------------------------------- policy & views
    def get_policy(self) -> dict:
        """``{"revision": int, "policy": dict}``."""
        return {"revision": self.core.policy_revision, "policy": self.core.policy.model_dump(mode="json")}

    def set_policy(self, changes: dict, expected_revision: int | None = None, replace: bool = False) -> dict:
        """Change the resampling policy; applies from the next round.

        Args:
            changes: fields to change (``replace=False``, nested ``filter`` merged) or a full policy.
            expected_revision: when given and different from the current revision, refuse.
        Raises:
            PolicyConflictError: stale ``expected_revision``.
            InvalidPolicyError: invalid values (field and value named); the policy is unchanged.
        """
        if expected_revision is not None and expected_revision != self.core.policy_revision:
            raise PolicyConflictError(
                f"revision: expected {expected_revision} but the policy is at revision {self.core.policy_revision}"
            )
        new = ResamplingPolicy.parse(changes) if replace else self.core.policy.updated(changes)
        check_judge(new, self.rollout_source)
        try:
            self.core.set_policy(new)
        except ValueError as err:
            raise InvalidPolicyError(str(err)) from None
        log.info("policy revision %d: %s", self.core.policy_revision, changes)
        self._checkpoint()
        self._observe()
        return self.get_policy()

    def pause_replenish(self) -> dict:
        return self.set_policy({"replenish_paused": True})

    def resume_replenish(self) -> dict:
        return self.set_policy({"replenish_paused": False})

    def set_model_version(self, version: int) -> None:
        self.core.set_model_version(version)
        self._anchor_auto_expire()
        self._checkpoint()

    def get_stats(self) -> Stats:
        return self.core.stats()

    def report_training(self, step: int, metrics: dict) -> None:
        """A trainer's step metrics (entropy, clip fractions, KL, rewards, held-out accuracy,
        model version...): exported as ``dso_train_*`` and returned by :meth:`get_training`."""
        self.training = {"step": int(step), **{k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
        if hasattr(self.metrics, "update_training"):
            self.metrics.update_training(self.training)

    def get_training(self) -> dict:
        """The last :meth:`report_training` row (``{}`` before any)."""
        return dict(getattr(self, "training", {}))

    def task_history(self, task_id: str) -> TaskStats:
        return self.core.task_stats(task_id)

    def state_dict(self) -> dict:
        return self.core.state_dict()

    def ping(self) -> str:
        return "ok"

    def metrics_text(self) -> str:
        """The metrics in Prometheus text format (``metrics.exposition()``); "" without metrics.

        With an anchor index, ``dso_anchor_index_entries`` is refreshed first (one
        :meth:`AnchorIndex.stats` call; a failure is logged and counted, never raised).
        """
        if self.metrics is None:
            return ""
        self._anchor_refresh_metrics()
        return self.metrics.exposition()


OrchestratorActor = ray.remote(num_cpus=0, max_restarts=0)(Orchestrator)


def get_or_create_orchestrator(
    *args: Any,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    detached: bool = False,
    **kwargs: Any,
) -> ray.actor.ActorHandle:
    """The named orchestrator actor, created with ``Orchestrator(*args, **kwargs)`` if absent.

    Args:
        name, namespace: how other components find it (``ray.get_actor(name, namespace=...)``).
        detached: outlive the driver (``lifetime="detached"``), for long-running services.
    """
    options: dict[str, Any] = {"name": name, "namespace": namespace, "get_if_exists": True}
    if detached:
        options["lifetime"] = "detached"
    return OrchestratorActor.options(**options).remote(*args, **kwargs)
