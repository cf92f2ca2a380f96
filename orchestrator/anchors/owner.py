"""The orchestrator's anchor index (GiGPO step advantages, issue 3): its owner and worker-side access.

:class:`AnchorIndexOwner` is plain Python (no Ray): created from an :class:`AnchorIndexConfig`,
it owns the index's lifecycle: creation, the batch keys in use and the model version each
was opened at, completion queries, expiry and stats (fed to the metrics), and its part of the
checkpoint (:meth:`AnchorIndexOwner.state_dict`). The orchestrator actor
(:class:`orchestrator.service.actor.Orchestrator`) holds one and forwards its ``anchor_*`` methods to it.

Advantage workers open the same index from :meth:`Orchestrator.anchor_spec` with
:func:`anchor_index_from_spec`: a Redis index is then queried directly (not through the
actor); the in-process memory index is served by the actor (:class:`ActorAnchorIndex`
forwards each call)::

    index = orchestrator_anchor_index(actor)      # RedisAnchorIndex or ActorAnchorIndex
    index.insert(batch_key, steps); index.step_advantages(batch_key, tasks, hashes, returns)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import ray
from pydantic import BaseModel, ConfigDict, Field

from algos.groups import Norm
from orchestrator.anchors.index import AnchorIndex, AnchorIndexError, AnchorStep, make_anchor_index
from orchestrator.anchors.redis_index import RedisAnchorIndex

__all__ = [
    "ActorAnchorIndex",
    "AnchorIndexConfig",
    "AnchorIndexNotConfiguredError",
    "AnchorIndexOwner",
    "anchor_index_from_spec",
    "orchestrator_anchor_index",
]

log = logging.getLogger("trinity_dso.anchor_owner")


class AnchorIndexNotConfiguredError(RuntimeError):
    """An ``anchor_*`` call on an orchestrator created without ``anchor_index``."""


class AnchorIndexConfig(BaseModel):
    """Settings of the orchestrator's anchor-state index (GiGPO step advantages, issue 3).

    Attributes:
        redis_url: ``redis://[:password@]host:port/db`` for a
            :class:`~orchestrator.anchors.index.RedisAnchorIndex` that workers open themselves;
            None for an in-process :class:`~orchestrator.anchors.index.MemoryAnchorIndex`
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


class AnchorIndexOwner:
    """Owns one anchor index and the batch keys in use (no Ray, no I/O of its own).

    Args:
        config: an :class:`AnchorIndexConfig` or its dict; the index is created from it
            (:func:`~orchestrator.anchors.index.make_anchor_index`).
        version: returns the current model weights (policy) version; batches are registered
            at it and expire relative to it.
        metrics: optional object; its ``set_anchor_entries``, ``observe_anchor_group_sizes``
            and ``observe_redis_op`` (:class:`orchestrator.service.metrics.DSOMetrics`) are fed when
            present.
        on_change: called after the tracked batch keys change (the actor saves its
            checkpoint there).
    Raises:
        pydantic.ValidationError: invalid ``config``.
    """

    def __init__(
        self,
        config: AnchorIndexConfig | dict,
        *,
        version: Callable[[], int],
        metrics: Any = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.config = config if isinstance(config, AnchorIndexConfig) else AnchorIndexConfig.model_validate(config)
        self.index: AnchorIndex = make_anchor_index(self.config.redis_url, prefix=self.config.prefix, ttl_s=self.config.ttl_s)
        self.metrics = metrics
        self._version = version
        self._on_change = on_change if on_change is not None else (lambda: None)
        self._batches: dict[str, int] = {}  # batch key -> model version it was opened at

    # ------------------------------------------------------------- checkpoint
    def state_dict(self) -> dict:
        """``{"anchor_batches": {batch key: model version}}``: JSON-serialisable, merged into
        the actor's checkpoint at its top level."""
        return {"anchor_batches": dict(self._batches)}

    def load_state_dict(self, state: dict) -> None:
        """Restore the tracked batch keys from :meth:`state_dict` (a state without them: none)."""
        self._batches = {str(k): int(v) for k, v in state.get("anchor_batches", {}).items()}

    # ------------------------------------------------------------- internals
    def _call(self, op: str, fn: Callable[[AnchorIndex], Any]) -> Any:
        """Run ``fn(index)``; for a Redis index record its latency/failure as ``op`` in the metrics."""
        index = self.index
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

    def _retire(self, batch_key: str, op: str) -> int:
        """Drop one batch: observe its final anchor-group sizes, delete it, forget its key."""
        observe = getattr(self.metrics, "observe_anchor_group_sizes", None)
        if observe is not None:
            observe(self._call(op, lambda i: i.group_sizes(batch_key)))
        n = int(self._call(op, lambda i: i.drop(batch_key)))
        self._batches.pop(batch_key, None)
        return n

    # ------------------------------------------------------------- API
    def spec(self) -> dict:
        """What a worker needs to open the index itself (see :meth:`Orchestrator.anchor_spec`)."""
        cfg = self.config
        if isinstance(self.index, RedisAnchorIndex):
            return {"backend": "redis", "redis_url": cfg.redis_url, "prefix": cfg.prefix, "ttl_s": cfg.ttl_s}
        return {"backend": "memory", "ttl_s": cfg.ttl_s}

    def register(self, batch_key: str, model_version: int | None = None) -> int:
        """Track ``batch_key`` at ``model_version`` (default: the current version); the first
        registration wins. Returns the version recorded for ``batch_key``."""
        if batch_key not in self._batches:
            self._batches[batch_key] = int(self._version() if model_version is None else model_version)
            self._on_change()
        return self._batches[batch_key]

    def insert(self, batch_key: str, steps: Sequence[AnchorStep | dict]) -> int:
        """Register ``batch_key`` and insert ``steps`` (objects or field dicts); returns the new steps."""
        recs = [s if isinstance(s, AnchorStep) else AnchorStep(**s) for s in steps]
        self.register(batch_key)
        return int(self._call("insert", lambda i: i.insert(batch_key, recs)))

    def step_advantages(
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
        """:meth:`AnchorIndex.step_advantages` (timed as ``query``). Returns (Q,) float64."""
        return self._call(
            "query",
            lambda i: i.step_advantages(batch_key, tasks, state_hashes, returns, norm=norm, eps=eps, n_runs=n_runs),
        )

    def completed_runs(self, batch_key: str) -> dict[str, int]:
        """Complete runs per task of ``batch_key`` (``{}`` for an unknown batch)."""
        return self._call("complete", lambda i: i.completed_runs(batch_key))

    def completed(self, batch_key: str, task: str, n: int) -> bool:
        """True when ``task`` has exactly ``n`` complete runs in ``batch_key``."""
        return bool(self._call("complete", lambda i: i.is_complete(batch_key, task, n)))

    def group_sizes(self, batch_key: str) -> np.ndarray:
        """:meth:`AnchorIndex.group_sizes` (timed as ``stats``). Returns (G,) int64, ascending."""
        return self._call("stats", lambda i: i.group_sizes(batch_key))

    def stats(self) -> dict:
        """The index's stats plus the tracked batches, version and settings; sets
        ``dso_anchor_index_entries`` to ``groups`` (see :meth:`Orchestrator.anchor_stats`)."""
        stats = dict(self._call("stats", lambda i: i.stats()))
        set_entries = getattr(self.metrics, "set_anchor_entries", None)
        if set_entries is not None:
            set_entries(int(stats["groups"]))
        stats.update(
            tracked_batches=dict(self._batches),
            model_version=self._version(),
            max_age_versions=self.config.max_age_versions,
            ttl_s=self.config.ttl_s,
        )
        return stats

    def refresh_metrics(self) -> None:
        """:meth:`stats` for its metrics side effect; a failure is logged (and counted), never raised."""
        try:
            self.stats()
        except AnchorIndexError as exc:
            log.warning("anchor index stats for the metrics failed: %s", exc)

    def drop(self, batch_key: str) -> int:
        """Forget one batch (its group sizes observed first); returns the steps it held (0 when unknown)."""
        n = self._retire(batch_key, "delete")
        self._on_change()
        return n

    def expire(self, max_age_versions: int | None = None) -> list[str]:
        """Drop every tracked batch opened more than ``max_age_versions`` versions ago
        (default the configured one; None with none configured drops nothing). Returns the
        dropped batch keys, sorted."""
        k = self.config.max_age_versions if max_age_versions is None else int(max_age_versions)
        if k is None:
            return []
        cutoff = self._version() - k
        old = sorted(b for b, v in self._batches.items() if v < cutoff)
        for b in old:
            self._retire(b, "expire")
        if old:
            log.info("anchor index: expired %d batches older than %d versions: %s", len(old), k, old)
            self._on_change()
        return old

    def auto_expire(self) -> None:
        """:meth:`expire` when ``max_age_versions`` is configured and a tracked batch is too old;
        a failure is logged (retried at the next call; the TTL is the backstop)."""
        k = self.config.max_age_versions
        if k is None or not self._batches:
            return
        if min(self._batches.values()) < self._version() - k:
            try:
                self.expire()
            except AnchorIndexError as exc:
                log.warning("anchor index expiry failed: %s", exc)


# --------------------------------------------------------------------------- worker side


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

    def group_sizes(self, batch_key: str) -> np.ndarray:
        return ray.get(self.actor.anchor_group_sizes.remote(batch_key))

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
