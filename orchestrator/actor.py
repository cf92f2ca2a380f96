"""The orchestrator Ray actor: a thin, long-running shell around :class:`OrchestratorCore`.

It owns the state machine, the rollout source, the buffer sink, the metrics and a
checkpoint file. It is an async actor: while ``next_batch`` waits for rollouts (run in a
worker thread), stats, policy reads/changes and pause/resume are served concurrently.
Core state is only touched on the actor's event loop, never from the rollout thread.

Find it by name from any driver or Trinity component::

    actor = ray.get_actor("dso-orchestrator", namespace="trinity-dso")

Anchor index (GiGPO, issue 3): created with ``anchor_index={"redis_url": ..., "prefix": ...,
"ttl_s": ..., "max_age_versions": ...}`` (:class:`AnchorIndexConfig`), the actor owns the
index's lifecycle: creation, the batch keys in use and the policy version each was opened
at, completion queries, expiry and stats (fed to the metrics). Advantage workers open the
same index from :meth:`Orchestrator.anchor_spec` with :func:`anchor_index_from_spec`: a Redis
index is then queried directly (not through the actor); the in-process memory index is
served by the actor (:class:`ActorAnchorIndex` forwards each call)::

    index = orchestrator_anchor_index(actor)      # RedisAnchorIndex or ActorAnchorIndex
    index.insert(batch_key, steps); index.step_advantages(batch_key, tasks, hashes, returns)
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
from pydantic import BaseModel, ConfigDict, Field

from algos.gigpo import Norm
from orchestrator.anchor_index import (
    AnchorIndex,
    AnchorIndexError,
    AnchorStep,
    MemoryAnchorIndex,
    RedisAnchorIndex,
    make_anchor_index,
)
from orchestrator.core import OrchestratorCore, RoundPlan
from orchestrator.policy import InvalidPolicyError, ResamplingPolicy
from orchestrator.types import Batch, Experience, Group

DEFAULT_NAME = "dso-orchestrator"
DEFAULT_NAMESPACE = "trinity-dso"

log = logging.getLogger("trinity_dso.actor")


class PolicyConflictError(ValueError):
    """A policy write based on a stale revision (the REST layer maps it to 409)."""


class AnchorIndexNotConfiguredError(RuntimeError):
    """An ``anchor_*`` call on an orchestrator created without ``anchor_index``."""


class AnchorIndexConfig(BaseModel):
    """Settings of the orchestrator's anchor-state index (GiGPO step advantages, issue 3).

    Attributes:
        redis_url: ``redis://[:password@]host:port/db`` for a
            :class:`~orchestrator.anchor_index.RedisAnchorIndex` that workers open themselves;
            None for an in-process :class:`~orchestrator.anchor_index.MemoryAnchorIndex`
            inside the actor, served through the actor's ``anchor_*`` methods.
        prefix: Redis key namespace (e.g. ``dso:<run name>``); unused by the memory index.
        ttl_s: seconds a batch's data live after its last write (Redis key expiry; the
            memory index drops batches idle this long), > 0. The backstop for batches the
            actor never heard of or forgot.
        max_age_versions: drop a batch key once the model weights (policy) version is more
            than this many versions past the version the batch was opened at (``>= 0``; 0
            keeps only batches of the current version). None: no version-based expiry, only
            ``ttl_s``.
    """

    model_config = ConfigDict(extra="forbid")

    redis_url: str | None = None
    prefix: str = Field("dso", min_length=1)
    ttl_s: float = Field(6 * 3600.0, gt=0)
    max_age_versions: int | None = Field(None, ge=0)


class Orchestrator:
    """Actor body (also usable in-process). Wrap with :func:`orchestrator_actor` for Ray.

    Args:
        policy: the initial resampling policy (a model or a dict, validated).
        task_set: object with ``task_ids: list[str]`` and ``get(task_id) -> Task``.
        rollout_source: a :class:`orchestrator.rollout.RolloutSource`, or None when groups are
            only submitted from outside (e.g. by Trinity's pipeline operator).
        sink: optional object with ``write(batch)`` (e.g. :class:`orchestrator.sink.SQLiteSink`).
        checkpoint_path: optional JSON file; state is saved after every change and loaded at
            start when present, so a restarted actor resumes where it stopped.
        metrics: optional object with ``update(stats)`` and ``observe_batch(batch)``; when it
            also has ``set_anchor_entries``, ``observe_anchor_group_sizes`` and
            ``observe_redis_op`` (:class:`orchestrator.metrics.DSOMetrics`), the anchor index
            feeds them.
        seed: seeds the task order.
        anchor_index: an :class:`AnchorIndexConfig` (or its dict) to create and own an anchor
            index; None (default) for none (the ``anchor_*`` methods then raise
            :class:`AnchorIndexNotConfiguredError`).
    Raises:
        pydantic.ValidationError: invalid ``anchor_index`` settings.
    """

    def __init__(
        self,
        policy: ResamplingPolicy | dict,
        task_set: Any,
        rollout_source: Any = None,
        *,
        sink: Any = None,
        checkpoint_path: str | None = None,
        metrics: Any = None,
        seed: int = 0,
        anchor_index: AnchorIndexConfig | dict | None = None,
    ):
        policy = policy if isinstance(policy, ResamplingPolicy) else ResamplingPolicy.parse(policy)
        self.core = OrchestratorCore(policy, task_set.task_ids, seed=seed)
        self.task_set = task_set
        self.rollout_source = rollout_source
        self.sink = sink
        self.metrics = metrics
        self.checkpoint_path = Path(checkpoint_path) if checkpoint_path else None
        self.ready: list[Batch] = []
        self._batch_started: float | None = None
        self.anchor_config: AnchorIndexConfig | None = None
        self.anchor: AnchorIndex | None = None
        self._anchor_batches: dict[str, int] = {}  # batch key -> policy version it was opened at
        if anchor_index is not None:
            cfg = anchor_index if isinstance(anchor_index, AnchorIndexConfig) else AnchorIndexConfig.model_validate(anchor_index)
            self.anchor_config = cfg
            self.anchor = make_anchor_index(cfg.redis_url, prefix=cfg.prefix, ttl_s=cfg.ttl_s)
        if self.checkpoint_path and self.checkpoint_path.exists():
            saved = json.loads(self.checkpoint_path.read_text())
            self.core.load_state_dict(saved)
            self._anchor_batches = {str(k): int(v) for k, v in saved.get("anchor_batches", {}).items()}
            log.info("resumed from %s at batch %d", self.checkpoint_path, self.core.batch_id)
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
        if self.anchor is not None:
            state["anchor_batches"] = dict(self._anchor_batches)
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
            self.rollout_source.generate, tasks, self.core.policy.group_size, policy_version=version, batch_tag=tag
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

    def submit_experiences(self, experiences: list[Experience], policy_version: int = 0) -> list[str]:
        """Group experiences by ``eid.task`` (run order kept) and submit them as groups."""
        by_task: dict[str, list[Experience]] = defaultdict(list)
        for e in experiences:
            by_task[e.eid.task].append(e)
        groups = [
            Group(task_id=t, rollouts=sorted(rs, key=lambda e: e.eid.run), policy_version=policy_version)
            for t, rs in by_task.items()
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

    def get_stats(self) -> dict:
        return self.core.stats()

    def task_history(self, task_id: str) -> dict:
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
        exposition = getattr(self.metrics, "exposition", None)
        if exposition is None:
            return ""
        if self.anchor is not None:
            try:
                self.anchor_stats()
            except AnchorIndexError as exc:
                log.warning("anchor index stats for the metrics failed: %s", exc)
        return exposition()

    # ------------------------------------------------------------- anchor index
    def _index(self) -> AnchorIndex:
        if self.anchor is None:
            raise AnchorIndexNotConfiguredError(
                "anchor_index: this orchestrator was created without an anchor index "
                "(pass anchor_index={'redis_url': ..., 'prefix': ..., 'ttl_s': ...}, or {} for memory)"
            )
        return self.anchor

    def _anchor_call(self, op: str, fn: Any) -> Any:
        """Run ``fn(index)``; for a Redis index record its latency/failure as ``op`` in the metrics."""
        index = self._index()
        observe = getattr(self.metrics, "observe_redis_op", None) if isinstance(index, RedisAnchorIndex) else None
        t0 = time.perf_counter()
        try:
            out = fn(index)
        except Exception:
            if observe is not None:
                observe(op, time.perf_counter() - t0, True)
            raise
        if observe is not None:
            observe(op, time.perf_counter() - t0, False)
        return out

    def _group_sizes(self, batch_key: str) -> list[int]:
        """Sizes of the anchor groups of one batch (for the group-size histogram).

        Reads the index's storage directly (``MemoryAnchorIndex._batches``, the Redis
        ``groups`` hash): :class:`AnchorIndex` has no public per-batch read of group sizes.
        """
        index = self._index()
        if isinstance(index, MemoryAnchorIndex):
            with index._lock:
                b = index._batches.get(batch_key)
                return [int(g[0]) for g in b.groups.values()] if b is not None else []
        if isinstance(index, RedisAnchorIndex):
            key = index._keys(batch_key)[2]
            vals = index._read(f"group sizes of batch {batch_key!r}", lambda c: c.hvals(key))
            return [int(v.split()[0]) for v in vals]
        return []

    def _retire(self, batch_key: str, op: str) -> int:
        """Drop one batch: observe its final anchor-group sizes, delete it, forget its key."""
        observe = getattr(self.metrics, "observe_anchor_group_sizes", None)
        if observe is not None:
            observe(self._anchor_call(op, lambda _i: self._group_sizes(batch_key)))
        n = int(self._anchor_call(op, lambda i: i.drop(batch_key)))
        self._anchor_batches.pop(batch_key, None)
        return n

    def _anchor_auto_expire(self) -> None:
        cfg = self.anchor_config
        if cfg is None or cfg.max_age_versions is None or not self._anchor_batches:
            return
        if min(self._anchor_batches.values()) < self.core.model_version - cfg.max_age_versions:
            try:
                self.anchor_expire()
            except AnchorIndexError as exc:  # retried at the next change; TTL is the backstop
                log.warning("anchor index expiry failed: %s", exc)

    def anchor_spec(self) -> dict:
        """What a worker needs to open this orchestrator's anchor index itself.

        Returns:
            ``{"backend": "redis", "redis_url", "prefix", "ttl_s"}`` (open it with
            :func:`anchor_index_from_spec`; the URL includes any password), or
            ``{"backend": "memory", "ttl_s"}``: the index lives in the actor and is reached
            through its ``anchor_*`` methods (:class:`ActorAnchorIndex`).
        Raises:
            AnchorIndexNotConfiguredError: no anchor index.
        """
        index = self._index()
        cfg = self.anchor_config
        assert cfg is not None
        if isinstance(index, RedisAnchorIndex):
            return {"backend": "redis", "redis_url": cfg.redis_url, "prefix": cfg.prefix, "ttl_s": cfg.ttl_s}
        return {"backend": "memory", "ttl_s": cfg.ttl_s}

    def anchor_register(self, batch_key: str, policy_version: int | None = None) -> int:
        """Record that ``batch_key`` is in use, for version-based expiry (idempotent).

        Workers writing to Redis directly call this once per batch key; ``anchor_insert``
        does it itself. The first registration wins.

        Args:
            batch_key: the index batch key.
            policy_version: the model weights version the batch's rollouts came from;
                default the orchestrator's current ``model_version``.
        Returns:
            The version recorded for ``batch_key``.
        """
        self._index()
        if batch_key not in self._anchor_batches:
            self._anchor_batches[batch_key] = int(self.core.model_version if policy_version is None else policy_version)
            self._checkpoint()
        return self._anchor_batches[batch_key]

    def anchor_insert(self, batch_key: str, steps: Sequence[AnchorStep | dict]) -> int:
        """Insert steps into the index (see :meth:`AnchorIndex.insert`); registers ``batch_key``.

        Args:
            steps: :class:`~orchestrator.anchor_index.AnchorStep` objects or their field dicts.
        Returns:
            The number of new steps (re-inserted identical steps are no-ops).
        Raises:
            ValueError, AnchorConflictError, AnchorIndexError: as :meth:`AnchorIndex.insert`.
        """
        recs = [s if isinstance(s, AnchorStep) else AnchorStep(**s) for s in steps]
        self.anchor_register(batch_key)
        return int(self._anchor_call("insert", lambda i: i.insert(batch_key, recs)))

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
        return self._anchor_call(
            "query",
            lambda i: i.step_advantages(batch_key, tasks, state_hashes, returns, norm=norm, eps=eps, n_runs=n_runs),
        )

    def anchor_completed_runs(self, batch_key: str) -> dict[str, int]:
        """Complete runs per task of ``batch_key`` (``{}`` for an unknown batch)."""
        return self._anchor_call("complete", lambda i: i.completed_runs(batch_key))

    def anchor_completed(self, batch_key: str, task: str, n: int) -> bool:
        """True when ``task`` has exactly ``n`` complete runs (all steps up to ``last``) in ``batch_key``."""
        return bool(self._anchor_call("complete", lambda i: i.is_complete(batch_key, task, n)))

    def anchor_stats(self) -> dict:
        """The index's :meth:`AnchorIndex.stats` plus the actor's view; refreshes the metrics.

        Returns:
            ``{"backend", "batches", "entries" (steps), "groups" (anchor states),
            "group_size_histogram", "tracked_batches" ({batch key: policy version}),
            "policy_version", "max_age_versions", "ttl_s"}``. ``dso_anchor_index_entries``
            is set to ``groups`` (the metric counts anchor states).
        """
        stats = dict(self._anchor_call("stats", lambda i: i.stats()))
        set_entries = getattr(self.metrics, "set_anchor_entries", None)
        if set_entries is not None:
            set_entries(int(stats["groups"]))
        cfg = self.anchor_config
        assert cfg is not None
        stats.update(
            tracked_batches=dict(self._anchor_batches),
            policy_version=self.core.model_version,
            max_age_versions=cfg.max_age_versions,
            ttl_s=cfg.ttl_s,
        )
        return stats

    def anchor_drop(self, batch_key: str) -> int:
        """Forget one batch (its sizes go to ``dso_anchor_group_size`` first).

        Returns:
            The number of steps it held (0 when unknown).
        """
        n = self._retire(batch_key, "delete")
        self._checkpoint()
        return n

    def anchor_expire(self, max_age_versions: int | None = None) -> list[str]:
        """Drop every tracked batch opened more than ``max_age_versions`` policy versions ago.

        Runs by itself whenever the model version advances (``set_model_version``, submitted
        groups, rounds) when ``AnchorIndexConfig.max_age_versions`` is set. Batches the actor
        does not track (written to Redis without :meth:`anchor_register`, or lost with a
        restart of the memory index) are left to the TTL.

        Args:
            max_age_versions: default the configured one; None with none configured drops nothing.
        Returns:
            The dropped batch keys, sorted.
        """
        self._index()
        k = self.anchor_config.max_age_versions if max_age_versions is None else int(max_age_versions)
        if k is None:
            return []
        cutoff = self.core.model_version - k
        old = sorted(b for b, v in self._anchor_batches.items() if v < cutoff)
        for b in old:
            self._retire(b, "expire")
        if old:
            log.info("anchor index: expired %d batches older than %d versions: %s", len(old), k, old)
            self._checkpoint()
        return old


class ActorAnchorIndex(AnchorIndex):
    """An :class:`AnchorIndex` whose calls go to an orchestrator actor's index (memory backend).

    Picklable (it holds an actor handle), so Ray tasks and actors can use it. Each call is
    one actor round trip; ``step_advantages`` is computed in the actor.

    Args:
        actor: handle of an :class:`Orchestrator` actor created with ``anchor_index``.
    """

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def _where(self) -> str:
        return "ActorAnchorIndex"

    def insert(self, batch_key: str, steps: Sequence[AnchorStep]) -> int:
        return int(ray.get(self.actor.anchor_insert.remote(batch_key, list(steps))))

    def _moments(self, batch_key: str, group_keys: list[tuple[str, str]], tasks: list[str]) -> tuple[np.ndarray, dict[str, int]]:
        raise NotImplementedError("ActorAnchorIndex forwards step_advantages to the actor")

    def step_advantages(  # type: ignore[override]
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
        return ray.get(
            self.actor.anchor_step_advantages.remote(
                batch_key, list(map(str, tasks)), list(map(str, state_hashes)), np.asarray(returns, dtype=np.float64),
                norm=norm, eps=eps, n_runs=n_runs,
            )
        )

    def completed_runs(self, batch_key: str) -> dict[str, int]:
        return ray.get(self.actor.anchor_completed_runs.remote(batch_key))

    def stats(self) -> dict[str, Any]:
        return ray.get(self.actor.anchor_stats.remote())

    def drop(self, batch_key: str) -> int:
        return int(ray.get(self.actor.anchor_drop.remote(batch_key)))


def anchor_index_from_spec(spec: dict, actor: Any = None) -> AnchorIndex:
    """Open the index described by :meth:`Orchestrator.anchor_spec`.

    Args:
        spec: ``{"backend": "redis", "redis_url", "prefix", "ttl_s"}`` or ``{"backend": "memory", ...}``.
        actor: the orchestrator actor; required for the memory backend.
    Returns:
        a :class:`RedisAnchorIndex` (direct Redis access) or an :class:`ActorAnchorIndex`.
    Raises:
        ValueError: memory backend without ``actor``, or an unknown backend.
    """
    backend = spec.get("backend")
    if backend == "redis":
        return RedisAnchorIndex(spec["redis_url"], prefix=spec["prefix"], ttl_s=float(spec["ttl_s"]))
    if backend == "memory":
        if actor is None:
            raise ValueError("actor: the memory anchor index lives in the orchestrator actor; pass its handle")
        return ActorAnchorIndex(actor)
    raise ValueError(f"backend: unknown anchor index backend {backend!r} in spec {spec!r}")


def orchestrator_anchor_index(actor: Any) -> AnchorIndex:
    """The anchor index of a running orchestrator actor, opened from its ``anchor_spec()``."""
    return anchor_index_from_spec(ray.get(actor.anchor_spec.remote()), actor)


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
