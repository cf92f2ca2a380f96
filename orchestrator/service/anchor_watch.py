"""The anchor index's Redis side of the orchestrator actor: :class:`AnchorWatch`, a part of
:class:`orchestrator.service.actor.Orchestrator`.

Every call that may reach Redis (stats, drop, expiry, health) runs in a worker thread, on an
executor of its own (:data:`REDIS_THREADS` threads), so a hung or dead Redis (socket timeouts,
retries: seconds) never stalls pings, stats or submits. The health watch pings Redis every few
seconds, reports outages, and on recovery checks the run's guard key, so that batches lost with
Redis's data are forgotten and refused, never served (docs/durability-faults.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from typing import Any

from orchestrator.anchors.index import AnchorIndexError
from orchestrator.anchors.owner import AnchorLifecycle
from orchestrator.anchors.redis_index import RedisAnchorIndex

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
    Redis kept off the actor's event loop, and its health watch. Mixed into
    :class:`~orchestrator.service.actor.Orchestrator`, whose attributes (``commits``,
    ``metrics``, ``_record_error`` and the ``_anchor_*`` / ``_redis_*`` fields) it uses."""

    def _anchor_redis(self) -> RedisAnchorIndex | None:
        return self.anchor if isinstance(self.anchor, RedisAnchorIndex) else None

    def _anchor_changed(self) -> None:
        """The tracked batch keys changed (maybe in a worker thread): commit on the event loop."""
        loop = self._loop
        if loop is not None and loop.is_running() and not _on_loop(loop):
            loop.call_soon_threadsafe(self.commits.commit)
        else:
            self.commits.commit()

    def _on_redis_pool(self, name: str, fn: Any, *args: Any, wait_s: float | None = None) -> Any:
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

    def _anchor_in_background(self, fn: Any) -> None:
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
        if self._anchor_redis() is None:  # the memory index: no Redis to hang on
            loop.run_in_executor(None, fn)
            return
        try:
            job = self._on_redis_pool(getattr(fn, "__name__", "job"), fn)
        except RuntimeError:
            return
        loop.create_task(self._quietly(job))

    async def _quietly(self, job: Any) -> None:
        try:
            await job
        except Exception as exc:  # noqa: BLE001 - a background job's failure is logged and counted
            log.warning("anchor index background job failed: %s", exc)
            self._record_error("anchor_index", str(exc))

    def _start_watch(self) -> None:
        """Start the Redis health check once an event loop runs (idempotent)."""
        if self._anchor_redis() is None or self._watch is not None:
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
        index = self._anchor_redis()
        assert index is not None
        while True:
            up = None
            try:
                up = await self._check_anchor_index(index)
            except Exception as exc:  # noqa: BLE001 - the watch never dies
                log.exception("anchor index health check failed unexpectedly (the check goes on)")
                self._record_error("health_watch", f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(up_every_s if up else down_every_s)

    async def _check_anchor_index(self, index: RedisAnchorIndex) -> bool:
        """One health check (see :meth:`_watch_anchor_index`); returns whether Redis is up."""
        def check() -> tuple[str, bool]:
            index.ping()
            return index.ensure_guard(self._anchor_guard)

        try:
            guard, lost = await self._on_redis_pool("health", check, wait_s=REDIS_WAIT_S)
            up = True
        except (AnchorIndexError, TimeoutError, RuntimeError) as exc:  # refused, timed out, or the last check still hangs
            if self._anchor_up is not False:
                log.warning("anchor index (Redis) is down: %s", exc or type(exc).__name__)
            up = False
        if up:
            if lost:
                log.warning("anchor index (Redis) lost its data (guard %s gone): forgetting %d tracked batches %s "
                            "(refused from now on)", self._anchor_guard, len(self._anchor_batches), sorted(self._anchor_batches))
                self._anchor_lost.update(dict.fromkeys(self._anchor_batches))
                while len(self._anchor_lost) > LOST_KEYS:
                    del self._anchor_lost[next(iter(self._anchor_lost))]
                self._anchor_batches.clear()
            if self._anchor_up is False:
                log.warning("anchor index (Redis) is back")
            if guard != self._anchor_guard or lost:
                self._anchor_guard = guard
                await self.commits.durable(self.commits.changed())
        if self._anchor_up is True and not up:
            self._anchor_outages += 1
        self._anchor_up = up
        if self.metrics is not None:
            self.metrics.set_anchor_index_up(up)
        return up


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
