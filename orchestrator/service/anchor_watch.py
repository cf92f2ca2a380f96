"""The anchor index of the orchestrator actor: :class:`AnchorWatch`, a part of
:class:`orchestrator.service.actor.Orchestrator` (its lifecycle, with Redis kept off the event loop).

Every call that may reach Redis (stats, drop, expiry, health) runs in a worker thread, on an
executor of its own (:data:`REDIS_THREADS` threads), so a hung or dead Redis (socket timeouts,
retries: seconds) never stalls pings, stats or submits. The health watch pings Redis every few
seconds, reports outages, and on recovery checks the run's guard key, so that batches lost with
Redis's data are forgotten and refused, never served (docs/guide/durability.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any

from orchestrator.anchors.index import AnchorIndexError
from orchestrator.anchors.owner import AnchorBatchLostError, AnchorIndexConfig, AnchorLifecycle
from orchestrator.anchors.redis_index import RedisAnchorIndex
from orchestrator.service.commits import SharedCommits

log = logging.getLogger("trinity_dso.actor")

REDIS_TIMEOUT_S = 0.5
"""Socket timeout of the actor's own Redis client, in seconds (one attempt; reads are tried twice):
a hung Redis is seen as down within about a second, never ties up a thread for long."""

REDIS_THREADS = 2
"""Threads of the actor's Redis executor (health check, stats, expiry): Redis-bound work never
waits in, or fills, the pool that writes commits."""

REDIS_WAIT_S = 2.0
"""How long the health check and ``metrics_text`` wait for a Redis answer before reporting the
index down (the health check) or leaving the index's gauges as they were (``metrics_text``)."""

LOST_KEYS = 100_000
"""Anchor batch keys remembered as lost with Redis's data (refused by ``anchor_register``)."""


class AnchorWatch(AnchorLifecycle):
    """The anchor index lifecycle (:class:`~orchestrator.anchors.owner.AnchorLifecycle`) with
    Redis kept off the actor's event loop, and its health watch.

    Args:
        config, version, metrics: as for :class:`~orchestrator.anchors.owner.AnchorLifecycle`
            (``metrics`` also gets ``set_anchor_index_up``).
        commits: the actor's commits (a change of the tracked keys or of the guard is committed).
        record_error: ``record_error(kind, message)``, called when a background job or the watch fails.
    Attributes:
        up: whether Redis answered the last health check (None before one, or without Redis).
        outages: how often Redis went down since start.
        guard: the run's guard token in Redis (checkpointed), None before it is set.
        lost: batch keys lost with Redis's data, oldest first (checkpointed; refused by
            :meth:`anchor_register`).
    """

    def __init__(
        self,
        config: AnchorIndexConfig | dict | None,
        *,
        version: Callable[[], int],
        metrics: Any,
        commits: SharedCommits,
        record_error: Callable[[str, str], None],
    ) -> None:
        self.commits, self.metrics, self.record_error = commits, metrics, record_error
        self.up: bool | None = None
        self.outages = 0
        self.guard: str | None = None
        self.lost: dict[str, None] = {}
        self._loop: asyncio.AbstractEventLoop | None = None  # the actor's event loop, once an async call ran
        self._watch: asyncio.Task | None = None
        self._redis_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._redis_busy: set[str] = set()  # background Redis jobs queued or running, by name
        super().__init__(config, version=version, metrics=metrics, on_change=self._anchor_changed)
        if (index := self.redis()) is not None:  # the actor's own client: fast timeouts
            index.socket_timeout, index.read_retries = REDIS_TIMEOUT_S, 1

    def state_dict(self) -> dict:
        """The tracked keys (:meth:`~orchestrator.anchors.owner.AnchorLifecycle._anchor_state_dict`),
        the guard and the lost keys, merged into the actor's checkpoint at its top level."""
        state = self._anchor_state_dict()
        if self.guard is not None:
            state["anchor_guard"] = self.guard
        if self.lost:
            state["anchor_lost"] = list(self.lost)
        return state

    def load_state_dict(self, state: dict) -> None:
        self._anchor_load_state_dict(state)
        self.guard = state.get("anchor_guard")
        self.lost = dict.fromkeys(state.get("anchor_lost") or ())

    def health(self) -> dict:
        """``{"anchor_index_up", "anchor_index_outages"}`` with Redis, else ``{}`` (for the stats)."""
        if self.redis() is None:
            return {}
        return {"anchor_index_up": self.up, "anchor_index_outages": self.outages}

    def expire_in_background(self) -> None:
        """Version-based expiry (:meth:`~orchestrator.anchors.owner.AnchorLifecycle._anchor_auto_expire`), off the loop."""
        self.in_background(self._anchor_auto_expire)

    async def refresh_metrics(self, wait_s: float) -> None:
        """The index's gauges (one :meth:`anchor_stats` on the Redis executor), waiting at most
        ``wait_s``; a timeout or a job still running leaves them as they were."""
        if self.anchor is None:
            return
        try:
            await self.on_redis_pool("stats", self._anchor_refresh_metrics, wait_s=wait_s)
        except (TimeoutError, RuntimeError):
            pass

    def anchor_stats(self) -> dict:
        """:meth:`AnchorLifecycle.anchor_stats` plus ``up`` (Redis health, None before the first
        check or without Redis) and ``outages``."""
        return {**super().anchor_stats(), "up": self.up, "outages": self.outages}

    def anchor_register(self, batch_key: str, model_version: int | None = None) -> int:
        """:meth:`AnchorLifecycle.anchor_register`; starts the Redis health check.

        Raises:
            AnchorBatchLostError: ``batch_key`` was registered before Redis lost its data (the
                run's guard changed since): it can never be restarted, from any of its runs;
                its groups need a new batch key.
        """
        self.start_watch()
        if batch_key in self.lost:
            raise AnchorBatchLostError(
                f"anchor_register: batch {batch_key!r} was lost with the anchor index's data (Redis restarted empty "
                "or was flushed after it was registered); it is refused for good, so that no worker restarts it from "
                "a fraction of its runs: write its groups under a new batch key"
            )
        return super().anchor_register(batch_key, model_version)

    def anchor_spec(self) -> dict:
        """:meth:`AnchorLifecycle.anchor_spec`, with the run's Redis guard token (set now when
        not yet known and Redis answers): workers then refuse batches lost with Redis's data."""
        spec = super().anchor_spec()
        index = self.redis()
        if index is not None and self.guard is None:
            try:
                self.guard, _ = index.ensure_guard(None)
                self._anchor_changed()
            except AnchorIndexError as exc:
                log.warning("anchor index (Redis) guard not set (workers get no guard): %s", exc)
        if index is not None and self.guard is not None:
            spec["guard"] = self.guard
        return spec

    def redis(self) -> RedisAnchorIndex | None:
        return self.anchor if isinstance(self.anchor, RedisAnchorIndex) else None

    def _anchor_changed(self) -> None:
        """The tracked batch keys changed (maybe in a worker thread): commit on the event loop."""
        loop = self._loop
        if loop is not None and loop.is_running() and not _on_loop(loop):
            loop.call_soon_threadsafe(self.commits.commit)
        else:
            self.commits.commit()

    def on_redis_pool(self, name: str, fn: Any, *args: Any, wait_s: float | None = None) -> Any:
        """``fn(*args)`` on the actor's Redis executor (:data:`REDIS_THREADS` threads of its own):
        awaitable, waiting at most ``wait_s`` (``asyncio.TimeoutError`` then; the job runs on).
        One job per ``name`` at a time: while one is queued or running, ``RuntimeError`` (a hung
        Redis never piles jobs up)."""
        if name in self._redis_busy:
            raise RuntimeError(f"anchor index: a {name} job is still queued or running")
        if self._redis_pool is None:
            self._redis_pool = concurrent.futures.ThreadPoolExecutor(REDIS_THREADS, thread_name_prefix="dso-redis")
        self._redis_busy.add(name)
        future = self._redis_pool.submit(fn, *args)
        future.add_done_callback(lambda _: self._redis_busy.discard(name))
        return asyncio.wait_for(asyncio.wrap_future(future), wait_s)

    def in_background(self, fn: Any) -> None:
        """``fn()`` in a worker thread when the event loop runs (else here, e.g. in-process use):
        with Redis on the Redis executor, skipped while the last such job is still running (it
        may outlive an ``asyncio.run`` of the call that started it)."""
        if self.anchor is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            fn()
            return
        self._loop = loop
        if self.redis() is None:  # the memory index: no Redis to hang on
            loop.run_in_executor(None, fn)
            return
        try:
            job = self.on_redis_pool(getattr(fn, "__name__", "job"), fn)
        except RuntimeError:
            return
        loop.create_task(self._quietly(job))

    async def _quietly(self, job: Any) -> None:
        try:
            await job
        except Exception as exc:  # noqa: BLE001 - a background job's failure is logged and counted
            log.warning("anchor index background job failed: %s", exc)
            self.record_error("anchor_index", str(exc))

    def start_watch(self) -> None:
        """Start the Redis health check once an event loop runs (idempotent)."""
        if self.redis() is None or self._watch is not None:
            return
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._watch = self._loop.create_task(self._watch_anchor_index())

    async def _watch_anchor_index(self, up_every_s: float = 5.0, down_every_s: float = 1.0) -> None:
        """Ping Redis (on the Redis executor) every few seconds: report outages, and on recovery
        check the run's guard key, so batches lost with Redis's data are forgotten, never served.

        A check not answered within :data:`REDIS_WAIT_S` reports the index down (a hung Redis is
        down within a few seconds). Any other failure is logged and counted
        (``dso_errors_total{kind="health_watch"}``), and the watch goes on."""
        index = self.redis()
        assert index is not None
        while True:
            up = None
            try:
                up = await self._check_anchor_index(index)
            except Exception as exc:  # noqa: BLE001 - the watch never dies
                log.exception("anchor index health check failed unexpectedly (the check goes on)")
                self.record_error("health_watch", f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(up_every_s if up else down_every_s)

    async def _check_anchor_index(self, index: RedisAnchorIndex) -> bool:
        """One health check (see :meth:`_watch_anchor_index`); returns whether Redis is up."""
        def check() -> tuple[str, bool]:
            index.ping()
            return index.ensure_guard(self.guard)

        try:
            guard, lost = await self.on_redis_pool("health", check, wait_s=REDIS_WAIT_S)
            up = True
        except (AnchorIndexError, TimeoutError, RuntimeError) as exc:  # refused, timed out, or the last check still hangs
            if self.up is not False:
                log.warning("anchor index (Redis) is down: %s", exc or type(exc).__name__)
            up = False
        if up:
            if lost:
                log.warning("anchor index (Redis) lost its data (guard %s gone): forgetting %d tracked batches %s "
                            "(refused from now on)", self.guard, len(self._anchor_batches), sorted(self._anchor_batches))
                self.lost.update(dict.fromkeys(self._anchor_batches))
                while len(self.lost) > LOST_KEYS:
                    del self.lost[next(iter(self.lost))]
                self._anchor_batches.clear()
            if self.up is False:
                log.warning("anchor index (Redis) is back")
            if guard != self.guard or lost:
                self.guard = guard
                await self.commits.durable(self.commits.changed())
        if self.up is True and not up:
            self.outages += 1
        self.up = up
        if self.metrics is not None:
            self.metrics.set_anchor_index_up(up)
        return up


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
