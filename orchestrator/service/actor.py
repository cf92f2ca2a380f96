"""The orchestrator Ray actor: a thin, long-running shell around :class:`OrchestratorCore`.

It owns the state machine, the rollout source, the buffer sink, the metrics and a
checkpoint file. It is an async actor: while ``next_batch`` waits for rollouts (run in a
worker thread), stats, policy reads/changes and pause/resume are served concurrently.
Core state is only touched on the actor's event loop, never from the rollout thread.

Find it by name from any driver or Trinity component::

    actor = ray.get_actor("dso-orchestrator", namespace="trinity-dso")

Anchor index (GiGPO, issue 3): created with ``anchor_index={"redis_url": ..., "prefix": ...,
"ttl_s": ..., "max_age_versions": ...}``, the actor holds an
:class:`~orchestrator.anchors.owner.AnchorIndexOwner` (its lifecycle, expiry, stats and
checkpoint part) and forwards its ``anchor_*`` methods to it; workers open the index with
:func:`orchestrator.anchors.owner.orchestrator_anchor_index`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import ray

from algos.groups import Norm
from orchestrator.anchors.index import AnchorIndex, AnchorStep
from orchestrator.anchors.owner import (
    AnchorIndexConfig,
    AnchorIndexNotConfiguredError,
    AnchorIndexOwner,
)
from orchestrator.core.machine import OrchestratorCore, RoundPlan
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


class PinnedPolicyError(PolicyConflictError):
    """A policy write that would change a field an attached run has pinned (409, naming the field)."""


class RunConflictError(RuntimeError):
    """A second run (or a different task set) tried to attach to an orchestrator that serves another run."""


class Orchestrator:
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
            to create and own an anchor index (through an :class:`AnchorIndexOwner`); None
            (default) for none (the ``anchor_*`` methods then raise
            :class:`AnchorIndexNotConfiguredError`).
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
        self.core = OrchestratorCore(policy, task_set.task_ids, seed=seed)
        self.task_set = task_set
        self.rollout_source = rollout_source
        self.sink = sink
        self.metrics = metrics
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        self.ready: list[Batch] = []
        self._batch_started: float | None = None
        # the Trinity run this orchestrator serves (attach_run): run id, pinned policy fields, sessions
        self.attachment: dict[str, Any] = {}
        self.anchors: AnchorIndexOwner | None = None
        if anchor_index is not None:
            self.anchors = AnchorIndexOwner(
                anchor_index, version=lambda: self.core.model_version, metrics=metrics, on_change=self._checkpoint
            )
        if self.checkpoint_path and self.checkpoint_path.exists():
            saved = json.loads(self.checkpoint_path.read_text())
            self.core.load_state_dict(saved)
            self.attachment = dict(saved.get("attachment") or {})
            if self.anchors is not None:
                self.anchors.load_state_dict(saved)
            log.warning(
                "resumed from checkpoint %s at batch %d, policy revision %d (the checkpoint's policy replaces the "
                "configured one; delete the file to start afresh)",
                self.checkpoint_path, self.core.batch_id, self.core.policy_revision,
            )
        self._observe()

    @property
    def anchor(self) -> AnchorIndex | None:
        """The anchor index (None without ``anchor_index``)."""
        return self.anchors.index if self.anchors is not None else None

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
        state["attachment"] = self.attachment
        if self.anchors is not None:
            state.update(self.anchors.state_dict())
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

        Returns None when ``timeout_s`` passes while replenishment is paused.
        Raises:
            ReplenishCapError: cap hit under ``on_cap='raise'`` (the open batch is kept).
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
            await self._run_round(self.core.plan_round())

    def submit_groups(self, groups: list[Group]) -> list[str]:
        """Submit groups rolled out elsewhere; returns each group's filter label.

        Full batches become available through :meth:`pop_batch`.
        Raises:
            InvalidGroupError, UnknownTaskError: nothing is accepted (see ``OrchestratorCore.validate``).
        """
        if self._batch_started is None:
            self._batch_started = time.monotonic()
        self.core.submit(groups)
        while (batch := self.core.try_emit()) is not None:
            self.ready.append(self._finish(batch))
            self._batch_started = time.monotonic() if self.core.carry else None
        self._checkpoint()
        self._observe()
        return [g.reason for g in groups]

    def submit_experiences(self, experiences: list[Experience], model_version: int = 0) -> list[str]:
        """Group experiences by ``(eid.task, eid.round_tag)`` (one group per task and round, in run
        order) and submit them; see :meth:`submit_groups` for errors (e.g. a ragged group)."""
        by_key: dict[tuple[str, str], list[Experience]] = defaultdict(list)
        for e in experiences:
            by_key[(e.eid.task, e.eid.round_tag)].append(e)
        groups = [
            Group(task_id=task, rollouts=sorted(rs, key=lambda e: e.eid.run), model_version=model_version)
            for (task, _), rs in by_key.items()
        ]
        return self.submit_groups(groups)

    def pop_batch(self) -> Batch | None:
        """A completed batch if one is ready (never blocks, never rolls out)."""
        return self.ready.pop(0) if self.ready else None

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

    def next_tasks(self, count: int) -> list[str]:
        """Exactly ``count`` tasks for one explore step of an attached explorer (``OrchestratorCore.next_tasks``)."""
        tasks = self.core.next_tasks(count)
        self._checkpoint()
        return tasks

    # ------------------------------------------------------------- attached runs
    def attach_run(self, run: str, *, session: str, role: str, num_tasks: int | None = None, pinned: dict | None = None,
                   pinned_by: str = "") -> dict:
        """Attach a component of a Trinity run (its task selector or pipeline operator).

        One orchestrator serves one run: the first attach binds it (and is checkpointed);
        later attaches of the same run - the other component, or the same run resumed after
        an explorer restart - are accepted. A new ``session`` of the selector means a new
        explorer process: the tasks the previous one took but never returned are handed out
        again first (none re-rolled that came back, none skipped).

        ``pinned`` fields (``group_size``, ``target_groups``: what Trinity's trainer batch size
        is built from) are set in the policy now and refused afterwards by :meth:`set_policy`.

        Args:
            run: the run's id (``<project>/<name>``).
            session: one id per explorer process (the selector makes one at start).
            role: ``"selector"`` or ``"operator"`` (for the log and the returned record).
            num_tasks: rows of the run's training taskset (None: not checked).
            pinned: policy fields the run depends on.
            pinned_by: why, for error messages (e.g. the Trinity fields they come from).
        Returns:
            ``{"run", "pinned", "requeued": [task ids handed out again]}``.
        Raises:
            RunConflictError: the orchestrator serves another run, or its task set has another size.
            InvalidPolicyError: a pinned value is invalid, or ``group_size`` differs while groups are held.
        """
        bound = self.attachment.get("run")
        if bound is not None and bound != run:
            raise RunConflictError(
                f"run: orchestrator serves run {bound!r}; run {run!r} must use its own actor_name "
                "(one orchestrator per run, so that each run's groups, history and metrics stay apart)"
            )
        if num_tasks is not None and len(self.core.task_ids) != int(num_tasks):
            raise RunConflictError(
                f"num_tasks: run {run!r} has {num_tasks} tasks but this orchestrator was created with "
                f"{len(self.core.task_ids)}; use another actor_name or delete its checkpoint"
            )
        pinned = {k: v for k, v in (pinned or {}).items() if v is not None}
        changes = {k: v for k, v in pinned.items() if getattr(self.core.policy, k) != v}
        self.attachment.update(run=run, pinned=pinned, pinned_by=pinned_by)
        if changes:
            self._apply_policy(self.core.policy.updated(changes), changes)
        requeued: list[str] = []
        if role == "selector" and self.attachment.get("selector_session") != session:
            if self.attachment.get("selector_session") is not None:
                requeued = self.core.requeue_in_flight()
                log.warning("run %s: explorer restarted (session %s); %d tasks it took are handed out again",
                            run, session, len(requeued))
            self.attachment["selector_session"] = session
        log.info("run %s: %s attached (session %s, pinned %s)", run, role, session, pinned)
        self._checkpoint()
        return {"run": run, "pinned": dict(pinned), "requeued": requeued}

    def attachment_info(self) -> dict:
        """The attached run, its pinned policy fields and their reason (``{}`` when none)."""
        return dict(self.attachment)

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
        pinned = self.attachment.get("pinned") or {}
        broken = [f"{k}: pinned to {v} by run {self.attachment.get('run')!r}, got {getattr(new, k)}"
                  for k, v in pinned.items() if getattr(new, k) != v]
        if broken:
            raise PinnedPolicyError(
                "; ".join(broken) + f" ({self.attachment.get('pinned_by') or 'the trainer batch size depends on it'}); "
                "the policy is unchanged"
            )
        self._apply_policy(new, changes)
        return self.get_policy()

    def _apply_policy(self, new: ResamplingPolicy, changes: dict) -> None:
        try:
            self.core.set_policy(new)
        except ValueError as err:
            raise InvalidPolicyError(str(err)) from None
        log.info("policy revision %d: %s", self.core.policy_revision, changes)
        self._checkpoint()
        self._observe()

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

    def task_history(self, task_id: str) -> TaskStats:
        return self.core.task_stats(task_id)

    def state_dict(self) -> dict:
        return {**self.core.state_dict(), "attachment": dict(self.attachment)}

    def ping(self) -> str:
        return "ok"

    def metrics_text(self) -> str:
        """The metrics in Prometheus text format (``metrics.exposition()``); "" without metrics.

        With an anchor index, ``dso_anchor_index_entries`` is refreshed first (one
        :meth:`AnchorIndex.stats` call; a failure is logged and counted, never raised).
        """
        if self.metrics is None:
            return ""
        if self.anchors is not None:
            self.anchors.refresh_metrics()
        return self.metrics.exposition()

    # ------------------------------------------------------------- anchor index
    def _anchor_owner(self) -> AnchorIndexOwner:
        if self.anchors is None:
            raise AnchorIndexNotConfiguredError(
                "anchor_index: this orchestrator was created without an anchor index "
                "(pass anchor_index={'redis_url': ..., 'prefix': ..., 'ttl_s': ...}, or {} for memory)"
            )
        return self.anchors

    def _anchor_auto_expire(self) -> None:
        if self.anchors is not None:
            self.anchors.auto_expire()

    def anchor_spec(self) -> dict:
        """What a worker needs to open this orchestrator's anchor index itself.

        Returns:
            ``{"backend": "redis", "redis_url", "prefix", "ttl_s"}`` (open it with
            :func:`~orchestrator.anchors.owner.anchor_index_from_spec`; the URL includes any
            password), or ``{"backend": "memory", "ttl_s"}``: the index lives in the actor and
            is reached through its ``anchor_*`` methods
            (:class:`~orchestrator.anchors.owner.ActorAnchorIndex`).
        Raises:
            AnchorIndexNotConfiguredError: no anchor index (so do all ``anchor_*`` methods).
        """
        return self._anchor_owner().spec()

    def anchor_register(self, batch_key: str, model_version: int | None = None) -> int:
        """Record that ``batch_key`` is in use, for version-based expiry (idempotent).

        Workers writing to Redis directly call this once per batch key; ``anchor_insert``
        does it itself. The first registration wins.

        Args:
            batch_key: the index batch key.
            model_version: the model weights version the batch's rollouts came from;
                default the orchestrator's current ``model_version``.
        Returns:
            The version recorded for ``batch_key``.
        """
        return self._anchor_owner().register(batch_key, model_version)

    def anchor_insert(self, batch_key: str, steps: Sequence[AnchorStep | dict]) -> int:
        """Insert steps into the index (see :meth:`AnchorIndex.insert`); registers ``batch_key``.

        Args:
            steps: :class:`~orchestrator.anchors.index.AnchorStep` objects or their field dicts.
        Returns:
            The number of new steps (re-inserted identical steps are no-ops).
        Raises:
            ValueError, AnchorConflictError, AnchorIndexError: as :meth:`AnchorIndex.insert`.
        """
        return self._anchor_owner().insert(batch_key, steps)

    def anchor_step_advantages(
        self,
        batch_key: str,
        tasks: Sequence[str],
        state_hashes: Sequence[str],
        returns: Any,
        *,
        norm: Norm = "std",
        eps: float = 1e-6,
        n_runs: int | None = None,
    ) -> np.ndarray:
        """A^S of the queried steps from the index (:meth:`AnchorIndex.step_advantages`).

        Needed for the memory index (it lives here); works for Redis too.

        Returns:
            (Q,) float64.
        Raises:
            AnchorIndexError: unknown/incomplete group or task, lost batch, backend failure.
        """
        return self._anchor_owner().step_advantages(batch_key, tasks, state_hashes, returns, norm=norm, eps=eps, n_runs=n_runs)

    def anchor_completed_runs(self, batch_key: str) -> dict[str, int]:
        """Complete runs per task of ``batch_key`` (``{}`` for an unknown batch)."""
        return self._anchor_owner().completed_runs(batch_key)

    def anchor_completed(self, batch_key: str, task: str, n: int) -> bool:
        """True when ``task`` has exactly ``n`` complete runs (all steps up to ``last``) in ``batch_key``."""
        return self._anchor_owner().completed(batch_key, task, n)

    def anchor_group_sizes(self, batch_key: str) -> np.ndarray:
        """Steps per anchor group of ``batch_key`` (:meth:`AnchorIndex.group_sizes`): (G,) int64, ascending."""
        return self._anchor_owner().group_sizes(batch_key)

    def anchor_stats(self) -> dict:
        """The index's :meth:`AnchorIndex.stats` plus the actor's view; refreshes the metrics.

        Returns:
            ``{"backend", "batches", "entries" (steps), "groups" (anchor states),
            "group_size_histogram", "tracked_batches" ({batch key: model version}),
            "model_version", "max_age_versions", "ttl_s"}``. ``dso_anchor_index_entries``
            is set to ``groups`` (the metric counts anchor states).
        """
        return self._anchor_owner().stats()

    def anchor_drop(self, batch_key: str) -> int:
        """Forget one batch (its sizes go to ``dso_anchor_group_size`` first).

        Returns:
            The number of steps it held (0 when unknown).
        """
        return self._anchor_owner().drop(batch_key)

    def anchor_expire(self, max_age_versions: int | None = None) -> list[str]:
        """Drop every tracked batch opened more than ``max_age_versions`` model versions ago.

        Runs by itself whenever the model version advances (``set_model_version``, submitted
        groups, rounds) when ``AnchorIndexConfig.max_age_versions`` is set. Batches the actor
        does not track (written to Redis without :meth:`anchor_register`, or lost with a
        restart of the memory index) are left to the TTL.

        Args:
            max_age_versions: default the configured one; None with none configured drops nothing.
        Returns:
            The dropped batch keys, sorted.
        """
        return self._anchor_owner().expire(max_age_versions)


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
