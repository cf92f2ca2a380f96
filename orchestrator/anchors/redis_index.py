"""Redis anchor index: one atomic Lua script per chunk of steps (``insert.lua``) or per call of
whole trajectories (``insert_runs.lua``), keys with a TTL, reads and writes fenced per batch
(``fence.lua``), and
an event stream per batch on which waiters for complete groups block (``XREAD BLOCK``)."""

from __future__ import annotations

import functools
import re
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.anchors.index import (
    AnchorConflictError,
    AnchorIndex,
    AnchorIndexError,
    AnchorStep,
    InsertReceipt,
    TrajectoryRecords,
    incomplete_error,
    size_histogram,
    validate_steps,
)
from orchestrator.anchors.redis_layout import (
    EVENT_DONE,
    EVENT_TASK,
    FENCE_FIELD,
    FIELD_SEP,
    RECORD_SEP,
    RUN_STEPS_FIELD,
    batch_keys,
    group_field,
    guard_key,
    lua_prelude,
    registry_key,
)

_FENCE_LUA = lua_prelude() + (Path(__file__).with_name("fence.lua")).read_text()
_INSERT_LUA = _FENCE_LUA + (Path(__file__).with_name("insert.lua")).read_text()
"""The insert script, after the layout and fence preludes (ARGV documented in the files)."""
_INSERT_RUNS_LUA = _FENCE_LUA + (Path(__file__).with_name("insert_runs.lua")).read_text()
"""The whole-trajectory insert script, after the layout and fence preludes (ARGV documented in the files)."""


def _redact(url: str) -> str:
    url = re.sub(r"//([^@/]*)@", "//***@", url)
    return re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", url)


def _url_password(url: str) -> str | None:
    from urllib.parse import parse_qs, unquote, urlsplit

    try:
        parts = urlsplit(url)
        return parts.password and unquote(parts.password) or (parse_qs(parts.query).get("password") or [None])[0]
    except ValueError:
        return None


def _timed(op: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Report the wrapped operation's latency (seconds) and failure to the index's ``observe``
    callback as ``op`` (one of ``insert``, ``query``, ``complete``, ``stats``, ``delete``, ``ping``)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(self: RedisAnchorIndex, *args: Any, **kwargs: Any) -> Any:
            if self.observe is None:
                return fn(self, *args, **kwargs)
            t0 = time.perf_counter()
            try:
                out = fn(self, *args, **kwargs)
            except Exception:
                self.observe(op, time.perf_counter() - t0, True)
                raise
            self.observe(op, time.perf_counter() - t0, False)
            return out

        return timed

    return wrap


def _subset(records: TrajectoryRecords, keep: np.ndarray) -> TrajectoryRecords:
    """The records of the trajectories ``keep`` (indices), their anchor-group moments recomputed."""
    from orchestrator.anchors.index import trajectory_records

    tk, rn, st, sid, ret, _ = records.columns
    run_of = {(t, r): k for k, (t, r) in enumerate(zip(records.run_task.tolist(), records.run_id.tolist()))}
    wanted = set(keep.tolist())
    rows = np.fromiter((run_of[(t, r)] in wanted for t, r in zip(tk.tolist(), rn.tolist())), dtype=bool, count=tk.size)
    return trajectory_records(tk[rows], records.task_names, rn[rows], st[rows], sid[rows], records.state_names, ret[rows])


class RedisAnchorIndex(AnchorIndex):
    """Anchor index in Redis (see the module docstring for keys, atomicity and failures).

    Args:
        url: ``redis://[:password@]host:port/db``.
        prefix: key namespace, e.g. ``dso:<run name>``; the keys under it are laid out in
            :mod:`orchestrator.anchors.redis_layout`.
        ttl_s: keys expire this long after a batch's last write, > 0.
        chunk_size: steps per Lua call, in [1, 2000] (all chunks go in one pipelined round
            trip; each call is atomic and blocks the server for its duration, which grows
            with the chunk: see bench/README.md, "Redis Lua calls").
        read_retries: extra attempts for reads after a connection error (with backoff).
        socket_timeout: seconds, for connect and commands.
        observe: optional ``observe(op, seconds, error)`` called after each operation (e.g.
            :meth:`orchestrator.service.metrics.DSOMetrics.observe_redis_op`); not pickled
            (metrics belong to one process).
        guard: the token of the run's guard key ``{prefix}:guard`` (see :meth:`ensure_guard`),
            given by the orchestrator to its workers. With it, a client that has not seen a
            batch's fence token checks the guard before touching the batch: when Redis lost its data
            since the orchestrator set the guard, the batch is refused instead of being started
            afresh from the steps this client happens to hold.
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "dso",
        ttl_s: float = 6 * 3600.0,
        chunk_size: int = 1000,
        read_retries: int = 3,
        socket_timeout: float = 5.0,
        observe: Callable[[str, float, bool], None] | None = None,
        guard: str | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        if not 1 <= chunk_size <= 2000:  # Lua unpack() stays well under its ~8000 limit
            raise ValueError(f"chunk_size must be in [1, 2000], got {chunk_size!r}")
        if not prefix:
            raise ValueError("prefix must be a non-empty string")
        self.url = url
        self.prefix = prefix
        self.ttl_s = ttl_s
        self.chunk_size = chunk_size
        self.read_retries = read_retries
        self.socket_timeout = socket_timeout
        self.observe = observe
        self.guard = guard
        self._client: Any = None
        self._script: Any = None
        self._runs_script: Any = None
        self._fences: dict[str, str] = {}  # batch key -> fence token seen

    # -- plumbing
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_script"] = None
        state["_runs_script"] = None
        state["observe"] = None
        return state

    def _insert_error(self, batch_key: str, msg: str) -> AnchorIndexError:
        """The error of an insert the server refused (``msg``: the script's error text)."""
        if "CONFLICT" in msg:
            return AnchorConflictError(f"{self._where()}: batch {batch_key!r}: {msg}")
        if "FENCE" in msg:
            return AnchorIndexError(
                f"{self._where()}: insert into batch {batch_key!r} refused: {msg} "
                f"(server restarted without persistence, keys expired, or batch dropped)"
            )
        return AnchorIndexError(f"{self._where()}: insert into batch {batch_key!r} failed: {msg}")

    def _where(self) -> str:
        return f"RedisAnchorIndex({_redact(self.url)})"

    def _conn(self) -> Any:
        if self._client is None:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry

            self._client = redis.Redis.from_url(
                self.url,
                socket_timeout=self.socket_timeout,
                socket_connect_timeout=self.socket_timeout,
                retry=Retry(NoBackoff(), 0),  # no silent retries of writes; reads retry below
            )
            self._script = self._client.register_script(_INSERT_LUA)
            self._runs_script = self._client.register_script(_INSERT_RUNS_LUA)
        return self._client

    @_timed("ping")
    def ping(self) -> float:
        """One PING on a fresh connection (no retries); returns the round trip in seconds.

        Raises:
            AnchorIndexError: the URL is malformed, or the server is unreachable, times out
                (``socket_timeout``) or refuses the password; the message names the URL
                (password hidden) and redis-py's reason.
        """
        import redis

        def fail(kind: str, exc: Exception) -> AnchorIndexError:
            self._client = None
            reason = str(exc) or type(exc).__name__
            secret = _url_password(self.url)
            if secret:
                reason = reason.replace(secret, "***")
            return AnchorIndexError(f"{self._where()}: {kind}: {reason}")

        t0 = time.perf_counter()
        try:
            self._conn().ping()
        except (ValueError, TypeError) as exc:  # redis-py: bad scheme, port or query option
            raise fail("malformed URL", exc) from None
        except redis.RedisError as exc:
            raise fail("PING failed", exc) from None
        return time.perf_counter() - t0

    def _keys(self, batch_key: str) -> dict[str, str]:
        return batch_keys(self.prefix, batch_key)

    def _registry(self) -> str:
        return registry_key(self.prefix)

    def _read(self, op: str, fn: Any) -> Any:
        import redis

        delay = 0.05
        for attempt in range(self.read_retries + 1):
            try:
                return fn(self._conn())
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if attempt == self.read_retries:
                    raise AnchorIndexError(f"{self._where()}: {op} failed after {attempt + 1} attempts: {exc}") from exc
                self._client = None
                time.sleep(delay)
                delay *= 2
            except redis.RedisError as exc:
                raise AnchorIndexError(f"{self._where()}: {op} failed: {exc}") from exc
        raise AssertionError("unreachable")

    def _guard_key(self) -> str:
        return guard_key(self.prefix)

    def ensure_guard(self, token: str | None = None) -> tuple[str, bool]:
        """Set the run's guard key (no expiry) if absent; returns ``(token in Redis, lost)``.

        Args:
            token: the token this run set before (from the orchestrator's state file), or None.
        Returns:
            The guard token now in Redis, and True when ``token`` was given but Redis no longer
            holds it (Redis lost its data since: every batch written before is gone).
        Raises:
            AnchorIndexError: Redis unreachable.
        """
        new = uuid.uuid4().hex
        key = self._guard_key()

        def write(c: Any) -> Any:
            c.set(key, new, nx=True)
            return c.get(key)

        raw = self._read("guard", write)  # SET NX is idempotent: safe to retry
        current = raw.decode() if isinstance(raw, bytes) else str(raw)
        self.guard = current
        return current, token is not None and token != current

    def _check_guard(self, batch_key: str, op: str) -> None:
        """For a batch this client has not seen: refuse when Redis lost the run's data."""
        if self.guard is None or batch_key in self._fences:
            return
        raw = self._read(f"{op}: guard", lambda c: c.get(self._guard_key()))
        current = raw.decode() if isinstance(raw, bytes) else raw
        if current != self.guard:
            raise AnchorIndexError(
                f"{self._where()}: {op}: batch {batch_key!r} refused: Redis lost its data since the orchestrator "
                f"started this run (guard {self.guard} {'gone' if current is None else 'replaced by ' + current}; "
                f"server restarted without persistence, or flushed)"
            )

    def _check_fence(self, batch_key: str, fence: str | None, op: str) -> None:
        seen = self._fences.get(batch_key)
        if fence is None:
            if seen is not None:
                raise AnchorIndexError(
                    f"{self._where()}: {op}: batch {batch_key!r} state lost (fence token {seen} gone: server restarted "
                    f"without persistence, keys expired, or batch dropped)"
                )
            raise AnchorIndexError(f"{self._where()}: {op}: batch {batch_key!r} is unknown (never written, dropped or expired)")
        if seen is not None and seen != fence:
            raise AnchorIndexError(
                f"{self._where()}: {op}: batch {batch_key!r} state lost (fence token changed from {seen} to {fence})"
            )
        self._fences[batch_key] = fence

    # -- API
    @_timed("insert")
    def insert(self, batch_key: str, steps: Sequence[AnchorStep | dict]) -> int:
        import redis

        steps = validate_steps(steps)
        if not steps:
            return 0
        self._check_guard(batch_key, "insert")
        keys = self._keys(batch_key)
        ttl_ms = str(int(self.ttl_s * 1000))
        new_fence = uuid.uuid4().hex
        client = self._conn()
        try:
            pipe = client.pipeline(transaction=False)
            for lo in range(0, len(steps), self.chunk_size):
                chunk = steps[lo : lo + self.chunk_size]
                records = RECORD_SEP.join(
                    FIELD_SEP.join((s.task, str(int(s.run)), str(int(s.step)), s.state_hash, repr(float(s.ret)), "1" if s.last else "0"))
                    for s in chunk
                )
                argv = [ttl_ms, self._fences.get(batch_key, ""), new_fence, records]
                self._script(keys=list(keys.values()), args=argv, client=pipe)
            pipe.sadd(self._registry(), batch_key)
            pipe.pexpire(self._registry(), ttl_ms)
            results = pipe.execute(raise_on_error=False)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            self._client = None
            raise AnchorIndexError(
                f"{self._where()}: insert of {len(steps)} steps into batch {batch_key!r} failed: {exc} "
                f"(not retried; the insert is idempotent, so the caller may retry it)"
            ) from exc
        added = 0
        for res in results[:-2]:
            if isinstance(res, Exception):
                msg = str(res)
                if isinstance(res, (redis.ConnectionError, redis.TimeoutError)):
                    self._client = None
                raise self._insert_error(batch_key, msg)
            added += int(res[0])
            fence = res[1].decode() if isinstance(res[1], bytes) else str(res[1])
            self._fences.setdefault(batch_key, fence)
        return added

    @_timed("insert")
    def insert_trajectories(self, batch_key: str, records: TrajectoryRecords) -> InsertReceipt:
        """Record whole trajectories in one atomic Lua call (``insert_runs.lua``): one record per
        trajectory (task, run, length, 64-bit digest of its steps) and one per anchor group
        (the call's moments, merged into the stored ones), instead of one per step; the same
        statistics as :meth:`insert` of the steps, to float rounding (~1e-16 relative).

        A trajectory already stored with the same digest is a no-op, with another digest a
        conflict. When a call mixes stored and new trajectories, the script writes nothing and
        names the new ones, which are resent (their moments recomputed) in a second call.

        Returns:
            :class:`InsertReceipt`: new trajectories, the complete runs of the call's tasks
            after the write, and the batch's event-stream id for :meth:`wait_complete`.
        Raises:
            AnchorConflictError: a trajectory stored with other steps, or stored step by step.
            AnchorIndexError: Redis failure or lost batch state (the write is not retried; it is
                idempotent, so the caller may retry it).
        """
        import redis

        self._check_guard(batch_key, "insert")
        keys = self._keys(batch_key)
        names, states = records.task_names, records.state_names
        call_tasks = [names[t] for t in np.unique(records.run_task).tolist()]
        subset = None
        for _ in range(3):
            recs = records if subset is None else _subset(records, subset)
            runs = RECORD_SEP.join(
                FIELD_SEP.join((names[t], str(r), str(n), f"{d:016x}"))
                for t, r, n, d in zip(recs.run_task.tolist(), recs.run_id.tolist(), recs.run_length.tolist(), recs.run_digest.tolist())
            )
            m = recs.moments
            groups = RECORD_SEP.join(
                FIELD_SEP.join((names[t], states[h], str(int(n)), repr(c), repr(a), repr(b)))
                for t, h, n, c, a, b in zip(
                    recs.group_task.tolist(), recs.group_state.tolist(), m[:, 0].tolist(), m[:, 1].tolist(),
                    m[:, 2].tolist(), m[:, 3].tolist(),
                )
            )
            argv = [str(int(self.ttl_s * 1000)), self._fences.get(batch_key, ""), uuid.uuid4().hex, runs, groups,
                    RECORD_SEP.join(call_tasks)]
            try:
                pipe = self._conn().pipeline(transaction=False)
                self._runs_script(keys=list(keys.values()), args=argv, client=pipe)
                pipe.sadd(self._registry(), batch_key)
                pipe.pexpire(self._registry(), argv[0])
                res = pipe.execute(raise_on_error=False)[0]
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                self._client = None
                raise AnchorIndexError(
                    f"{self._where()}: insert of {records.run_id.size} trajectories into batch {batch_key!r} failed: {exc} "
                    f"(not retried; the insert is idempotent, so the caller may retry it)"
                ) from exc
            if isinstance(res, Exception):
                msg = str(res)
                if isinstance(res, (redis.ConnectionError, redis.TimeoutError)):
                    self._client = None
                if msg.startswith("PARTIAL") and subset is None:
                    subset = np.array([int(i) for i in msg.split()[1].split(",")], dtype=np.int64)
                    continue
                raise self._insert_error(batch_key, msg)
            added, fence, cursor, done, stored = res
            self._fences.setdefault(batch_key, fence.decode() if isinstance(fence, bytes) else str(fence))
            cursor = cursor.decode() if isinstance(cursor, bytes) else str(cursor)
            done_by_task = {t: int(v) for t, v in zip(call_tasks, done, strict=True)}
            if subset is not None:  # the moments returned cover the resent groups only
                return InsertReceipt(int(added), done_by_task, cursor)
            moments = np.array(stored.split(), dtype=np.float64).reshape(-1, 4) if stored else np.zeros((0, 4))
            return InsertReceipt(int(added), done_by_task, cursor, moments)
        raise AnchorIndexError(
            f"{self._where()}: insert into batch {batch_key!r}: other writers kept storing these trajectories "
            "concurrently; retry the call"
        )

    def wait_complete(
        self, batch_key: str, tasks: Sequence[str], n_runs: int, timeout_s: float, receipt: InsertReceipt | None = None
    ) -> None:
        """Block (``XREAD BLOCK`` on the batch's event stream, no polling) until every task has
        ``n_runs`` complete runs in ``batch_key``.

        :meth:`insert_trajectories` adds one event per task whose count grows, in the same
        atomic script as the write; the wait starts from the caller's ``receipt`` (its counts
        and stream id, read atomically with its own write), so no event can fall in between.
        Without a receipt it reads the counts first and replays the stream from its start.

        Raises:
            AnchorIndexError: still incomplete after ``timeout_s`` (names up to 5 tasks and
                their counts), or Redis failure.
        """
        if receipt is not None:
            done, cursor = dict(receipt.done), receipt.cursor or "0-0"
        else:
            done, cursor = self.completed_runs(batch_key), "0-0"
        short = {t: done.get(t, 0) for t in tasks if done.get(t, 0) < n_runs}
        events = self._keys(batch_key)["events"]
        deadline = time.monotonic() + timeout_s
        while short:
            left = deadline - time.monotonic()
            if left <= 0:
                raise incomplete_error(batch_key, short, n_runs, timeout_s)
            block_ms = max(1, int(min(left, 0.8 * self.socket_timeout) * 1000))  # below the socket timeout
            reply = self._read(
                f"wait for complete groups of batch {batch_key!r}",
                lambda c, cur=cursor, ms=block_ms: c.xread({events: cur}, count=10_000, block=ms),
            )
            for _, entries in reply or []:
                for eid, fields in entries:
                    cursor = eid.decode() if isinstance(eid, bytes) else str(eid)
                    task = fields[EVENT_TASK.encode()].decode()
                    if task in short:
                        short[task] = int(fields[EVENT_DONE.encode()])
                        if short[task] >= n_runs:
                            del short[task]

    def fence(self, batch_key: str) -> str | None:
        """The batch's fence token (None when it does not exist)."""
        keys = self._keys(batch_key)
        raw = self._read(f"fence token of batch {batch_key!r}", lambda c: c.hget(keys["meta"], FENCE_FIELD))
        return raw.decode() if raw is not None else None

    @_timed("query")
    def _moments(self, batch_key: str, group_keys: list[tuple[str, str]], tasks: list[str]) -> tuple[np.ndarray, dict[str, int]]:
        self._check_guard(batch_key, "query")
        keys = self._keys(batch_key)
        fields = [group_field(t, h) for t, h in group_keys]

        def read(c: Any) -> list[Any]:
            pipe = c.pipeline(transaction=True)  # one consistent snapshot
            pipe.hget(keys["meta"], FENCE_FIELD)
            pipe.hmget(keys["groups"], fields)
            pipe.hmget(keys["done"], tasks)
            return pipe.execute()

        raw_fence, raw_groups, raw_done = self._read(f"query of {len(fields)} anchor groups in batch {batch_key!r}", read)
        self._check_fence(batch_key, raw_fence.decode() if raw_fence is not None else None, "query")
        m = np.full((len(fields), 4), np.nan)
        for i, raw in enumerate(raw_groups):
            if raw is not None:
                m[i] = [float(x) for x in raw.split()]
        done = {t: int(v) if v is not None else 0 for t, v in zip(tasks, raw_done, strict=True)}
        return m, done

    def _read_checked(self, batch_key: str, op: str, key: str, fn: Any) -> Any:
        """``fn(pipe, key)`` with the batch's fence token read in the same transaction and checked.

        Returns None for a batch this client never saw and Redis does not hold (unknown).
        """
        self._check_guard(batch_key, op)
        meta = self._keys(batch_key)["meta"]

        def read(c: Any) -> list[Any]:
            pipe = c.pipeline(transaction=True)  # one consistent snapshot
            pipe.hget(meta, FENCE_FIELD)
            fn(pipe, key)
            return pipe.execute()

        raw_fence, out = self._read(f"{op} of batch {batch_key!r}", read)
        if raw_fence is None and batch_key not in self._fences:
            return None
        self._check_fence(batch_key, raw_fence.decode() if raw_fence is not None else None, op)
        return out

    @_timed("complete")
    def completed_runs(self, batch_key: str) -> dict[str, int]:
        """Complete runs per task (``{}`` for a batch unknown to this client and to Redis).

        Raises:
            AnchorIndexError: the batch's state was lost since this client saw it, or Redis lost
                the run's data (``guard``), or Redis failed.
        """
        raw = self._read_checked(batch_key, "completed runs", self._keys(batch_key)["done"], lambda p, k: p.hgetall(k))
        return {k.decode(): int(v) for k, v in (raw or {}).items()}

    @_timed("stats")
    def group_sizes(self, batch_key: str) -> np.ndarray:
        """Steps per anchor group, ascending (empty for an unknown batch); raises as :meth:`completed_runs`."""
        vals = self._read_checked(batch_key, "group sizes", self._keys(batch_key)["groups"], lambda p, k: p.hvals(k))
        return np.sort(np.asarray([int(v.split()[0]) for v in (vals or [])], dtype=np.int64))

    @_timed("stats")
    def stats(self) -> dict[str, Any]:
        def read(c: Any) -> dict[str, Any]:
            batches = sorted(b.decode() for b in c.smembers(self._registry()))
            pipe = c.pipeline(transaction=False)
            for b in batches:
                keys = self._keys(b)
                pipe.exists(keys["meta"])
                pipe.hlen(keys["steps"])
                pipe.hvals(keys["groups"])
                pipe.hget(keys["meta"], RUN_STEPS_FIELD)  # steps stored as whole trajectories
            res = pipe.execute()
            live, entries, sizes, gone = 0, 0, [], []
            for i, b in enumerate(batches):
                exists, n_steps, vals, run_steps = res[4 * i : 4 * i + 4]
                if not exists:
                    gone.append(b)
                    continue
                live += 1
                entries += int(n_steps) + int(run_steps or 0)
                sizes += [int(v.split()[0]) for v in vals]
            if gone:
                c.srem(self._registry(), *gone)
            return {
                "backend": "redis",
                "batches": live,
                "entries": entries,
                "groups": len(sizes),
                "group_size_histogram": size_histogram(sizes),
            }

        return self._read("stats", read)

    @_timed("delete")
    def drop(self, batch_key: str) -> int:
        import redis

        keys = self._keys(batch_key)
        try:
            pipe = self._conn().pipeline(transaction=True)
            pipe.hlen(keys["steps"])
            pipe.hget(keys["meta"], RUN_STEPS_FIELD)
            pipe.delete(*keys.values())
            pipe.srem(self._registry(), batch_key)
            n_steps, run_steps = pipe.execute()[:2]
        except redis.RedisError as exc:
            self._client = None
            raise AnchorIndexError(f"{self._where()}: drop of batch {batch_key!r} failed: {exc}") from exc
        self._fences.pop(batch_key, None)
        return int(n_steps) + int(run_steps or 0)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


