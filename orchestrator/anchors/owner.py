"""The anchor index's lifecycle, written once, and how workers open the index.

:class:`AnchorLifecycle` is plain Python, usable alone: created from an
:class:`AnchorIndexConfig`, it creates the index, tracks the batch keys in use with the model
version each was opened at, expires them by version, drops them (their anchor-group sizes go
to the metrics), reports stats and saves its part of the checkpoint. The orchestrator actor
(:class:`orchestrator.service.actor.Orchestrator`) holds one as its
:class:`~orchestrator.service.anchor_watch.AnchorWatch` part, and Ray exposes its
``anchor_spec``, ``anchor_register``, ``anchor_drop``, ``anchor_expire`` and ``anchor_stats``.

Workers never write or query through the orchestrator: they open the index from
``anchor_spec()``, a :class:`~orchestrator.anchors.redis_index.RedisAnchorIndex` talking to
Redis, or a :class:`~orchestrator.anchors.remote.RemoteAnchorIndex` of the memory index served
by its own named Ray actor (``<orchestrator name>-anchors``), and register each batch key once
for version-based expiry::

    index = orchestrator_anchor_index(actor)            # RedisAnchorIndex or RemoteAnchorIndex
    ray.get(actor.anchor_register.remote(batch_key))
    index.insert(batch_key, steps); index.step_advantages(batch_key, tasks, hashes, returns)

With the memory backend, a lifecycle call that touches the index (stats, drop, expiry) is one
blocking round trip from the orchestrator's event loop to the index actor (milliseconds; Ray
warns once about the blocking ``ray.get``). The index actor never calls back, so this cannot
deadlock; it is owned by the orchestrator actor and dies with it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import ray
from pydantic import BaseModel, ConfigDict, Field

from orchestrator.anchors.index import AnchorIndex, AnchorIndexError
from orchestrator.anchors.memory import MemoryAnchorIndex
from orchestrator.anchors.redis_index import RedisAnchorIndex
from orchestrator.anchors.remote import RemoteAnchorIndex, serve_memory_index

__all__ = [
    "AnchorBatchExpiredError",
    "AnchorBatchLostError",
    "AnchorIndexConfig",
    "AnchorIndexNotConfiguredError",
    "AnchorLifecycle",
    "anchor_index_from_spec",
    "make_anchor_index",
    "orchestrator_anchor_index",
]

log = logging.getLogger("trinity_dso.anchor_owner")


def make_anchor_index(redis_url: str | None = None, **kwargs: Any) -> AnchorIndex:
    """A :class:`~orchestrator.anchors.redis_index.RedisAnchorIndex` when ``redis_url`` is given,
    else a :class:`~orchestrator.anchors.memory.MemoryAnchorIndex`.

    ``kwargs`` go to the constructor (``prefix`` and the Redis options are ignored by the
    memory index).
    """
    if redis_url:
        return RedisAnchorIndex(redis_url, **kwargs)
    return MemoryAnchorIndex(**{k: v for k, v in kwargs.items() if k == "ttl_s"})


class AnchorIndexNotConfiguredError(RuntimeError):
    """An ``anchor_*`` call on an orchestrator created without ``anchor_index``."""


class AnchorBatchLostError(AnchorIndexError):
    """A batch key registered before Redis lost its data: refused for good (never restarted from
    a fraction of its runs)."""


class AnchorBatchExpiredError(AnchorIndexError):
    """``anchor_register`` of a batch key that version-based expiry has dropped: refused, since a
    late worker writing it again would get step advantages over a fraction of its runs."""


EXPIRED_KEYS = 100_000
"""Batch keys remembered as expired by version (refused by ``anchor_register``); the oldest are
forgotten first."""


class AnchorIndexConfig(BaseModel):
    """Settings of the orchestrator's anchor-state index (GiGPO step advantages).

    Attributes:
        redis_url: ``redis://[:password@]host:port/db`` for a
            :class:`~orchestrator.anchors.redis_index.RedisAnchorIndex` that workers open
            themselves; None for a :class:`~orchestrator.anchors.memory.MemoryAnchorIndex`,
            served by its own Ray actor when the orchestrator runs as one (in process otherwise).
        prefix: Redis key namespace (e.g. ``dso:<run name>``); unused by the memory index.
        ttl_s: seconds a batch's data live after its last write (Redis key expiry; the
            memory index drops batches idle this long), > 0. The backstop for batches the
            orchestrator never heard of or forgot.
        max_age_versions: drop a batch key once the model version is more than this many
            versions past the version the batch was opened at (``>= 0``; 0 keeps only batches
            of the current version). None: no version-based expiry, only ``ttl_s``.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    redis_url: str | None = None
    prefix: str = Field("dso", min_length=1)
    ttl_s: float = Field(6 * 3600.0, gt=0)
    max_age_versions: int | None = Field(None, ge=0)


def _current_actor() -> tuple[str, str] | None:
    """(name, namespace) of the Ray actor this code runs in (a made-up name for an unnamed
    one); None outside an actor."""
    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    actor_id = ctx.get_actor_id()
    if actor_id is None:
        return None
    return ctx.get_actor_name() or f"dso-{actor_id}", ctx.namespace


class AnchorLifecycle:
    """The anchor index of an orchestrator and the batch keys in use (see the module docstring).

    Args:
        config: an :class:`AnchorIndexConfig` or its dict; None for no index (every
            ``anchor_*`` method then raises :class:`AnchorIndexNotConfiguredError`). The index
            is Redis with ``redis_url``; else memory, served by the Ray actor
            ``<this actor's name>-anchors`` when this object lives in a Ray actor, in process
            otherwise (then only this process reaches it).
        version: returns the current model version; batches are registered at it and expire
            relative to it.
        metrics: optional object; its ``set_anchor_entries``, ``observe_anchor_group_sizes``
            and ``observe_redis_op`` (:class:`orchestrator.service.metrics.DSOMetrics`) are fed
            when present (Redis operations of this process's index are timed by op).
        on_change: called after the tracked batch keys change (the actor saves its checkpoint).
    Attributes:
        anchor: the index (None without ``config``).
    Raises:
        pydantic.ValidationError: invalid ``config``.
    """

    def __init__(
        self,
        config: AnchorIndexConfig | dict | None,
        *,
        version: Callable[[], int],
        metrics: Any = None,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self._anchor_version = version
        self._anchor_metrics = metrics
        self._anchor_on_change = on_change if on_change is not None else (lambda: None)
        self._anchor_batches: dict[str, int] = {}  # batch key -> model version it was opened at
        self._anchor_expired: dict[str, int] = {}  # the same, for keys expired by version (oldest first)
        self._anchor_served_by: tuple[str, str] | None = None  # (name, namespace) of the memory index actor
        self.anchor: AnchorIndex | RemoteAnchorIndex | None = None
        self._anchor_cfg: AnchorIndexConfig | None = None
        if config is None:
            return
        cfg = self._anchor_cfg = config if isinstance(config, AnchorIndexConfig) else AnchorIndexConfig.model_validate(config)
        if cfg.redis_url:
            observe = getattr(metrics, "observe_redis_op", None)
            self.anchor = RedisAnchorIndex(cfg.redis_url, prefix=cfg.prefix, ttl_s=cfg.ttl_s, observe=observe)
        elif (me := _current_actor()) is not None:
            self._anchor_served_by = (f"{me[0]}-anchors", me[1])
            self.anchor = serve_memory_index(*self._anchor_served_by, ttl_s=cfg.ttl_s)
        else:
            self.anchor = MemoryAnchorIndex(ttl_s=cfg.ttl_s)

    # ------------------------------------------------------------- internals
    def _anchor_config(self) -> AnchorIndexConfig:
        if self._anchor_cfg is None:
            raise AnchorIndexNotConfiguredError(
                "anchor_index: this orchestrator was created without an anchor index "
                "(pass anchor_index={'redis_url': ..., 'prefix': ..., 'ttl_s': ...}, or {} for memory)"
            )
        return self._anchor_cfg

    def _anchor_index(self) -> AnchorIndex | RemoteAnchorIndex:
        self._anchor_config()
        assert self.anchor is not None  # created with the config
        return self.anchor

    def _anchor_state_dict(self) -> dict:
        """``{"anchor_batches": {batch key: model version}, "anchor_expired": {...}}`` (``{}``
        without an index): the tracked keys and those expired by version, JSON-serialisable,
        merged into the actor's checkpoint at its top level."""
        if self.anchor is None:
            return {}
        return {"anchor_batches": dict(self._anchor_batches), "anchor_expired": dict(self._anchor_expired)}

    def _anchor_load_state_dict(self, state: dict) -> None:
        """Restore the tracked and expired batch keys from :meth:`_anchor_state_dict` (a state
        without them, as an older checkpoint: none)."""
        self._anchor_batches = {str(k): int(v) for k, v in state.get("anchor_batches", {}).items()}
        self._anchor_expired = {str(k): int(v) for k, v in state.get("anchor_expired", {}).items()}

    def _anchor_retire(self, batch_key: str) -> int:
        """Drop one batch: observe its final anchor-group sizes, delete it, forget its key."""
        index = self._anchor_index()
        observe = getattr(self._anchor_metrics, "observe_anchor_group_sizes", None)
        if observe is not None:
            observe(index.group_sizes(batch_key))
        n = int(index.drop(batch_key))
        self._anchor_batches.pop(batch_key, None)
        return n

    def _anchor_auto_expire(self) -> None:
        """:meth:`anchor_expire` when ``max_age_versions`` is configured and a tracked batch is
        too old; a failure is logged (retried at the next call; the TTL is the backstop)."""
        k = self._anchor_cfg.max_age_versions if self._anchor_cfg is not None else None
        if k is None or not self._anchor_batches:
            return
        if min(self._anchor_batches.values()) < self._anchor_version() - k:
            try:
                self.anchor_expire()
            except AnchorIndexError as exc:
                log.warning("anchor index expiry failed: %s", exc)

    def _anchor_refresh_metrics(self) -> None:
        """:meth:`anchor_stats` for its metrics side effect (no-op without an index); a failure
        is logged (and counted), never raised."""
        if self.anchor is None:
            return
        try:
            self.anchor_stats()
        except AnchorIndexError as exc:
            log.warning("anchor index stats for the metrics failed: %s", exc)

    # ------------------------------------------------------------- API
    def anchor_spec(self) -> dict:
        """What a worker needs to open the index itself (:func:`anchor_index_from_spec`).

        Returns:
            ``{"backend": "redis", "redis_url", "prefix", "ttl_s"}`` (the URL includes any
            password); ``{"backend": "memory", "ttl_s", "actor", "namespace"}`` for the memory
            index served by the named actor; ``{"backend": "memory", "ttl_s"}`` for an
            in-process memory index (no other process can open it).
        Raises:
            AnchorIndexNotConfiguredError: no anchor index (so do all ``anchor_*`` methods).
        """
        index, cfg = self._anchor_index(), self._anchor_config()
        if isinstance(index, RedisAnchorIndex):
            return {"backend": "redis", "redis_url": cfg.redis_url, "prefix": cfg.prefix, "ttl_s": cfg.ttl_s}
        spec: dict[str, Any] = {"backend": "memory", "ttl_s": cfg.ttl_s}
        if self._anchor_served_by is not None:
            spec["actor"], spec["namespace"] = self._anchor_served_by
        return spec

    def anchor_register(self, batch_key: str, model_version: int | None = None) -> int:
        """Record that ``batch_key`` is in use, for version-based expiry (idempotent).

        Workers call this once per batch key they write. The first registration wins.

        Args:
            batch_key: the index batch key.
            model_version: the model version the batch's rollouts came from; default the
                current one.
        Returns:
            The version recorded for ``batch_key``.
        Raises:
            AnchorBatchExpiredError: ``batch_key`` was expired by version (:meth:`anchor_expire`);
                its groups need a new batch key. (A key dropped by :meth:`anchor_drop`, or by the
                TTL alone, may be registered again.)
        """
        cfg = self._anchor_config()
        if batch_key in self._anchor_expired:
            raise AnchorBatchExpiredError(
                f"anchor_register: batch {batch_key!r} was opened at model version {self._anchor_expired[batch_key]} "
                f"and expired by version (max_age_versions {cfg.max_age_versions}; the model is at version "
                f"{self._anchor_version()}); a worker writing it again would get step advantages over a fraction "
                "of its runs: write its groups under a new batch key"
            )
        if batch_key not in self._anchor_batches:
            self._anchor_batches[batch_key] = int(self._anchor_version() if model_version is None else model_version)
            self._anchor_on_change()
        return self._anchor_batches[batch_key]

    def anchor_stats(self) -> dict:
        """The index's :meth:`AnchorIndex.stats` plus the tracked batches, version and settings.

        Returns:
            ``{"backend", "batches", "entries" (steps), "groups" (anchor states),
            "group_size_histogram", "tracked_batches" ({batch key: model version}),
            "model_version", "max_age_versions", "ttl_s"}``. ``dso_anchor_index_entries``
            is set to ``groups`` (the metric counts anchor states).
        """
        stats = dict(self._anchor_index().stats())
        set_entries = getattr(self._anchor_metrics, "set_anchor_entries", None)
        if set_entries is not None:
            set_entries(int(stats["groups"]))
        cfg = self._anchor_config()
        stats.update(
            tracked_batches=dict(self._anchor_batches),
            model_version=self._anchor_version(),
            max_age_versions=cfg.max_age_versions,
            ttl_s=cfg.ttl_s,
        )
        return stats

    def anchor_drop(self, batch_key: str) -> int:
        """Forget one batch (its group sizes go to ``dso_anchor_group_size`` first).

        Returns:
            The number of steps it held (0 when unknown).
        """
        n = self._anchor_retire(batch_key)
        self._anchor_on_change()
        return n

    def anchor_expire(self, max_age_versions: int | None = None) -> list[str]:
        """Drop every tracked batch opened more than ``max_age_versions`` model versions ago.

        Runs by itself whenever the model version advances when
        ``AnchorIndexConfig.max_age_versions`` is set. Batches never registered (or lost with
        the memory index's actor) are left to the TTL.

        Args:
            max_age_versions: default the configured one; None with none configured drops nothing.
        Returns:
            The dropped batch keys, sorted.
        """
        configured = self._anchor_config().max_age_versions
        k = configured if max_age_versions is None else int(max_age_versions)
        if k is None:
            return []
        cutoff = self._anchor_version() - k
        old = sorted(b for b, v in self._anchor_batches.items() if v < cutoff)
        for b in old:
            opened = self._anchor_batches[b]
            self._anchor_retire(b)
            self._anchor_expired[b] = opened
        while len(self._anchor_expired) > EXPIRED_KEYS:  # forget the oldest (dicts keep insertion order)
            del self._anchor_expired[next(iter(self._anchor_expired))]
        if old:
            log.info("anchor index: expired %d batches older than %d versions: %s", len(old), k, old)
            self._anchor_on_change()
        return old


# --------------------------------------------------------------------------- worker side


def anchor_index_from_spec(spec: dict) -> AnchorIndex | RemoteAnchorIndex:
    """Open the index described by :meth:`AnchorLifecycle.anchor_spec`.

    Args:
        spec: ``{"backend": "redis", "redis_url", "prefix", "ttl_s"}`` or
            ``{"backend": "memory", "ttl_s", "actor", "namespace"}``.
    Returns:
        a :class:`RedisAnchorIndex` (direct Redis access) or a :class:`RemoteAnchorIndex` of
        the memory index's actor (``ray`` must be initialised).
    Raises:
        ValueError: a memory spec without ``actor`` (the index lives inside an orchestrator
            running in process), or an unknown backend.
    """
    backend = spec.get("backend")
    if backend == "redis":
        return RedisAnchorIndex(spec["redis_url"], prefix=spec["prefix"], ttl_s=float(spec["ttl_s"]), guard=spec.get("guard"))
    if backend == "memory":
        if not spec.get("actor"):
            raise ValueError(
                f"actor: the memory anchor index in spec {spec!r} lives inside an orchestrator running in process; "
                "only an orchestrator running as a Ray actor serves it to other processes (or configure redis_url)"
            )
        return RemoteAnchorIndex(ray.get_actor(spec["actor"], namespace=spec["namespace"]))
    raise ValueError(f"backend: unknown anchor index backend {backend!r} in spec {spec!r}")


def orchestrator_anchor_index(actor: Any) -> AnchorIndex | RemoteAnchorIndex:
    """The anchor index of a running orchestrator actor, opened from its ``anchor_spec()``."""
    return anchor_index_from_spec(ray.get(actor.anchor_spec.remote()))
