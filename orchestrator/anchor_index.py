"""Anchor index: shared per-anchor-group statistics for GiGPO step advantages.

GiGPO's step advantage (arXiv 2505.10978, Eq. 6-7) normalises each step's discounted
return R_t within its *anchor group*: all steps of one task's n trajectories that acted from
the same environment state. When trajectories finish on different rollout workers, the
anchor groups are assembled here, and advantage workers query them.

Per (namespace, batch key, task, anchor state) the index keeps the member count ``n``, a
shift ``c`` (the smallest return so far) and the shifted sums ``S1 = sum(R - c)`` and
``S2 = sum((R - c)^2)``; the query normalises with :func:`algos.gigpo.normalise_from_moments`,
which equals :func:`algos.gigpo.step_advantages` to ~1e-15 and gives exactly 0 for identical
returns. Shifting by the minimum (not the first arrival) makes the stored numbers independent
of insertion order whenever the float sums are exact (e.g. dyadic returns), so concurrent
writers give bit-identical results to a single writer; otherwise they agree to ~1e-15. Every step is recorded under its (task, run, step): re-inserting the same step is a
no-op (never double counted) and re-inserting it with a different state or return is refused
(:class:`AnchorConflictError`). A run is complete when its step with ``last=True`` and all
steps before it are stored; a task is complete when its n runs are.

Implementations:

* :class:`MemoryAnchorIndex` - in process, thread safe (the embedded default). Picklable: a
  pickled copy (e.g. sent to a worker process) is an independent snapshot.
* :class:`RedisAnchorIndex` - redis-py. Each write is one Lua script per chunk of steps
  (atomic, so concurrent writers never lose an update), all chunks in one pipelined round
  trip. Keys are ``{prefix}:{<batch key>}:<kind>`` (the batch key is a Redis Cluster hash
  tag, so one batch's keys share a slot) and expire ``ttl_s`` after the last write.

Failure handling (Redis): connection errors raise :class:`AnchorIndexError` naming the URL
(password redacted) and the operation. Reads (queries, stats) are retried a few times;
writes are not retried here (they are idempotent, so a caller may retry them). Each batch
carries a random *epoch* written with its first step; a client that has seen a batch's epoch
refuses to write to or read from it when the epoch changed or vanished (a restarted server
without persistence, or a ``drop``), so lost steps end in an error, never in statistics
silently computed from a partial batch. Queries with ``n_runs`` also check that every
queried task has exactly ``n_runs`` complete runs.
"""

from __future__ import annotations

import re
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from algos.gigpo import Norm, encode_keys, normalise_from_moments

__all__ = [
    "AnchorConflictError",
    "AnchorIndex",
    "AnchorIndexError",
    "AnchorStep",
    "MemoryAnchorIndex",
    "RedisAnchorIndex",
    "make_anchor_index",
]


class AnchorIndexError(RuntimeError):
    """The index cannot answer correctly: backend unreachable, batch state lost, an anchor
    group or task missing or incomplete. The message names the backend, operation and key."""


class AnchorConflictError(AnchorIndexError):
    """A (task, run, step) was inserted again with a different state hash or return."""


@dataclass(frozen=True)
class AnchorStep:
    """One step as the index stores it.

    Attributes:
        task: task id.
        run: trajectory index within the task's group, >= 0.
        step: turn index within the trajectory, >= 0.
        state_hash: ``env_state_hash`` of the state the step acted from (non-empty).
        ret: discounted return R_t of the step (GiGPO Eq. 5), finite.
        last: True on the trajectory's final step (marks the run complete once all its
            steps ``0..step`` are stored).
    """

    task: str
    run: int
    step: int
    state_hash: str
    ret: float
    last: bool = False


_SEPARATORS = re.compile("[\x1e\x1f]")


def _validate(steps: Sequence[AnchorStep]) -> None:
    for i, s in enumerate(steps):
        if not s.state_hash or not isinstance(s.state_hash, str):
            raise ValueError(f"state_hash: missing ({s.state_hash!r}) for task {s.task!r} run {s.run} step {s.step} (item {i})")
        if not s.task or _SEPARATORS.search(s.task) or _SEPARATORS.search(s.state_hash):
            raise ValueError(
                f"task/state_hash: empty task or a control character \\x1e/\\x1f in task {s.task!r} "
                f"or state_hash {s.state_hash!r} (item {i})"
            )
        if not np.isfinite(s.ret):
            raise ValueError(f"ret: non-finite value {s.ret!r} for task {s.task!r} run {s.run} step {s.step} (item {i})")
        if s.run < 0 or s.step < 0:
            raise ValueError(f"run/step: negative value (run {s.run}, step {s.step}) for task {s.task!r} (item {i})")


class AnchorIndex(ABC):
    """Interface shared by the memory and Redis anchor indexes (see the module docstring)."""

    @abstractmethod
    def insert(self, batch_key: str, steps: Sequence[AnchorStep]) -> int:
        """Record steps of ``batch_key``; returns how many were new (duplicates are no-ops).

        Raises:
            ValueError: a step without state hash, a non-finite return, a negative index.
            AnchorConflictError: a (task, run, step) already stored with another payload
                (nothing of the call is written).
            AnchorIndexError: backend failure or lost batch state.
        """

    @abstractmethod
    def _moments(self, batch_key: str, group_keys: list[tuple[str, str]], tasks: list[str]) -> tuple[np.ndarray, dict[str, int]]:
        """(K, 4) float64 [n, shift, S1, S2] per group (NaN row if missing), complete runs per task."""

    @abstractmethod
    def completed_runs(self, batch_key: str) -> dict[str, int]:
        """Number of complete runs per task of ``batch_key``."""

    @abstractmethod
    def group_sizes(self, batch_key: str) -> np.ndarray:
        """Member count (steps) of each anchor group of ``batch_key``.

        Returns:
            (G,) int64, ascending; empty for an unknown batch (never written, dropped or expired).
        Raises:
            AnchorIndexError: backend failure.
        """

    @abstractmethod
    def stats(self) -> dict[str, Any]:
        """``{"batches", "entries" (steps), "groups", "group_size_histogram": {size: count}}``."""

    @abstractmethod
    def drop(self, batch_key: str) -> int:
        """Forget a batch; returns the number of steps it held."""

    def close(self) -> None:
        """Release connections (no-op for the memory index)."""

    def ping(self) -> float:
        """Check that the backend answers; returns the round trip in seconds (0 for memory).

        Raises:
            AnchorIndexError: backend unreachable or refusing the connection (bad URL, host,
                port, password); the message names the URL with its password hidden.
        """
        return 0.0

    def is_complete(self, batch_key: str, task: str, n_runs: int) -> bool:
        """True when ``task`` has exactly ``n_runs`` complete runs in ``batch_key``."""
        return self.completed_runs(batch_key).get(task, 0) == n_runs

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
        """A^S (GiGPO Eq. 7) of each queried step from its anchor group's stored moments.

        Same normalisation as :func:`algos.gigpo.step_advantages` (unbiased std + ``eps`` or
        none; singleton groups 0; identical returns exactly 0); agrees to ~1e-15.

        Args:
            batch_key: the batch (or policy version) the steps belong to.
            tasks, state_hashes: (Q,) str, the anchor group key of each queried step.
            returns: (Q,) float, the step's own return R_t (a member of its group).
            norm, eps: as in :class:`algos.gigpo.GiGPOConfig`.
            n_runs: when given, every queried task must have exactly ``n_runs`` complete
                runs (otherwise :class:`AnchorIndexError`): guards against partial batches.
        Returns:
            (Q,) float64.
        Raises:
            AnchorIndexError: an anchor group is not in the batch, a task is incomplete, the
                batch state was lost, or the backend failed.
            ValueError: lengths differ, unknown ``norm``.
        """
        tasks_a = np.asarray(tasks, dtype=object).astype(str)
        hashes_a = np.asarray(state_hashes, dtype=object).astype(str)
        rets = np.asarray(returns, dtype=np.float64)
        if not (len(tasks_a) == len(hashes_a) == len(rets)):
            raise ValueError(f"tasks, state_hashes, returns lengths differ: {len(tasks_a)}, {len(hashes_a)}, {len(rets)}")
        if rets.size == 0:
            return rets.copy()
        gid, num = encode_keys(tasks_a, hashes_a)
        first = np.full(num, -1, dtype=np.int64)
        first[gid[::-1]] = np.arange(gid.size)[::-1]
        keys = [(str(tasks_a[i]), str(hashes_a[i])) for i in first]
        uniq_tasks = sorted(set(tasks_a.tolist()))
        moments, done = self._moments(batch_key, keys, uniq_tasks)
        missing = np.isnan(moments[:, 0])
        if missing.any():
            t, h = keys[int(np.flatnonzero(missing)[0])]
            raise AnchorIndexError(
                f"{self._where()}: anchor group (task {t!r}, state {h!r}) is not in batch {batch_key!r} "
                f"({int(missing.sum())} of {num} queried groups missing)"
            )
        if n_runs is not None:
            for t in uniq_tasks:
                if done.get(t, 0) != n_runs:
                    raise AnchorIndexError(
                        f"{self._where()}: task {t!r} of batch {batch_key!r} has {done.get(t, 0)} complete runs, expected {n_runs}"
                    )
        m = moments[gid]
        return normalise_from_moments(rets, m[:, 0], m[:, 1], m[:, 2], m[:, 3], norm=norm, eps=eps)

    def query(self, batch_key: str, steps: Sequence[AnchorStep], **kwargs: Any) -> np.ndarray:
        """:meth:`step_advantages` for a list of :class:`AnchorStep` (uses task, state_hash, ret)."""
        return self.step_advantages(
            batch_key, [s.task for s in steps], [s.state_hash for s in steps], [s.ret for s in steps], **kwargs
        )

    def _where(self) -> str:
        return type(self).__name__


def _histogram(sizes: Iterable[int]) -> dict[int, int]:
    return dict(sorted(Counter(int(s) for s in sizes).items()))


# --------------------------------------------------------------------------- memory


def _add_moment(g: list[float], r: float) -> None:
    """Add ``r`` to moments ``[n, c, S1, S2]`` shifted by the group minimum ``c``.

    Same operations, in the same order, as the Redis Lua script, so both backends hold the
    same bits. A new minimum re-bases the sums (``S2 += 2*delta*S1 + n*delta^2``,
    ``S1 += n*delta``, all terms >= 0, no cancellation).
    """
    n, c, s1, s2 = g
    if r < c:
        delta = c - r
        s2 = s2 + 2 * delta * s1 + n * delta * delta
        s1 = s1 + n * delta
        c = r
    d = r - c
    g[0], g[1], g[2], g[3] = n + 1, c, s1 + d, s2 + d * d


class _MemBatch:
    def __init__(self) -> None:
        self.steps: dict[tuple[str, int, int], tuple[str, float]] = {}
        self.groups: dict[tuple[str, str], list[float]] = {}  # [n, shift, S1, S2]
        self.run_count: dict[tuple[str, int], int] = {}
        self.run_len: dict[tuple[str, int], int] = {}
        self.done_runs: set[tuple[str, int]] = set()
        self.done: dict[str, int] = {}
        self.touched = time.monotonic()


class MemoryAnchorIndex(AnchorIndex):
    """In-process anchor index (dicts under a lock). Batches idle for ``ttl_s`` are dropped."""

    def __init__(self, *, ttl_s: float = 6 * 3600.0) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self.ttl_s = ttl_s
        self._batches: dict[str, _MemBatch] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def _expire(self) -> None:
        now = time.monotonic()
        for k in [k for k, b in self._batches.items() if now - b.touched > self.ttl_s]:
            del self._batches[k]

    def insert(self, batch_key: str, steps: Sequence[AnchorStep]) -> int:
        _validate(steps)
        with self._lock:
            self._expire()
            b = self._batches.setdefault(batch_key, _MemBatch())
            pending: dict[tuple[str, int, int], tuple[str, float]] = {}
            for s in steps:  # validation pass: refuse the whole call on a conflict
                key = (s.task, s.run, s.step)
                payload = (s.state_hash, float(s.ret))
                old = b.steps.get(key, pending.get(key))
                if old is not None and old != payload:
                    raise AnchorConflictError(
                        f"MemoryAnchorIndex: step (task {s.task!r}, run {s.run}, step {s.step}) of batch {batch_key!r} "
                        f"already stored as {old}, got {payload}"
                    )
                pending[key] = payload
            added = 0
            for s in steps:
                key = (s.task, s.run, s.step)
                rk = (s.task, s.run)
                if key not in b.steps:
                    r = float(s.ret)
                    b.steps[key] = (s.state_hash, r)
                    added += 1
                    g = b.groups.get((s.task, s.state_hash))
                    if g is None:
                        b.groups[(s.task, s.state_hash)] = [1.0, r, 0.0, 0.0]
                    else:
                        _add_moment(g, r)
                    b.run_count[rk] = b.run_count.get(rk, 0) + 1
                if s.last:
                    b.run_len[rk] = s.step + 1
                if rk not in b.done_runs and rk in b.run_len and b.run_count.get(rk, 0) == b.run_len[rk]:
                    b.done_runs.add(rk)
                    b.done[s.task] = b.done.get(s.task, 0) + 1
            b.touched = time.monotonic()
            return added

    def _moments(self, batch_key: str, group_keys: list[tuple[str, str]], tasks: list[str]) -> tuple[np.ndarray, dict[str, int]]:
        with self._lock:
            self._expire()
            b = self._batches.get(batch_key)
            if b is None:
                raise AnchorIndexError(f"MemoryAnchorIndex: batch {batch_key!r} is unknown (never written, dropped or expired)")
            nan = [np.nan] * 4
            m = np.array([b.groups.get(k, nan) for k in group_keys], dtype=np.float64).reshape(-1, 4)
            return m, {t: b.done.get(t, 0) for t in tasks}

    def completed_runs(self, batch_key: str) -> dict[str, int]:
        with self._lock:
            b = self._batches.get(batch_key)
            return dict(b.done) if b is not None else {}

    def group_sizes(self, batch_key: str) -> np.ndarray:
        with self._lock:
            b = self._batches.get(batch_key)
            sizes = [int(g[0]) for g in b.groups.values()] if b is not None else []
        return np.sort(np.asarray(sizes, dtype=np.int64))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._expire()
            sizes = [int(g[0]) for b in self._batches.values() for g in b.groups.values()]
            return {
                "backend": "memory",
                "batches": len(self._batches),
                "entries": sum(len(b.steps) for b in self._batches.values()),
                "groups": len(sizes),
                "group_size_histogram": _histogram(sizes),
            }

    def drop(self, batch_key: str) -> int:
        with self._lock:
            b = self._batches.pop(batch_key, None)
            return len(b.steps) if b is not None else 0


# --------------------------------------------------------------------------- redis

# KEYS: meta, steps, groups, runs, done.  ARGV: ttl_ms, expected_epoch ('' = any),
# new_epoch, records: one string, records separated by \x1e, fields by \x1f: task, run,
# step, state, return (repr, exact), last ('1'/'0'). Hash fields are built here
# (length-prefixed task, see _field). Reads and writes are batched per call (one HMGET /
# HSET per hash); group moments are updated in arrival order with the same operations as
# MemoryAnchorIndex (_add_moment).
_INSERT_LUA = r"""
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if ARGV[2] ~= '' and epoch ~= ARGV[2] then
  return redis.error_reply('EPOCH batch state lost: expected epoch ' .. ARGV[2] .. ', found ' .. tostring(epoch))
end
if not epoch then
  epoch = ARGV[3]
  redis.call('HSET', KEYS[1], 'epoch', epoch)
end
local T, RUN, STEP, H, V, LAST, SF, GF, RF = {}, {}, {}, {}, {}, {}, {}, {}, {}
local count = 0
for rec in string.gmatch(ARGV[4], '[^\30]+') do
  local task, run, step, state, ret, last = string.match(rec, '^([^\31]+)\31([^\31]+)\31([^\31]+)\31([^\31]+)\31([^\31]+)\31([^\31]+)$')
  if not task then return redis.error_reply('BADRECORD ' .. rec) end
  count = count + 1
  local tp = #task .. ':' .. task .. '|'
  T[count], RUN[count], STEP[count], H[count], V[count], LAST[count] = task, run, step, state, ret, last
  SF[count] = tp .. run .. '|' .. step
  GF[count] = tp .. state
  RF[count] = tp .. run
end
if count == 0 then return {0, epoch} end
local olds = redis.call('HMGET', KEYS[2], unpack(SF))
-- validation: refuse the whole call on a conflicting duplicate, before any write
local pending, new_rows, is_new = {}, {}, {}
for i = 1, count do
  local payload = H[i] .. '\31' .. V[i]
  local old = olds[i]
  if not old then old = pending[SF[i]] end
  if old then
    if old ~= payload then
      return redis.error_reply('CONFLICT step ' .. SF[i] .. ' already stored as ' .. old .. ', got ' .. payload)
    end
  else
    pending[SF[i]] = payload
    new_rows[#new_rows + 1] = i
    is_new[i] = true
  end
end
if #new_rows > 0 then
  local kv = {}
  for _, i in ipairs(new_rows) do
    kv[#kv + 1] = SF[i]
    kv[#kv + 1] = H[i] .. '\31' .. V[i]
  end
  redis.call('HSET', KEYS[2], unpack(kv))
  -- anchor-group moments [n, c, S1, S2], c = group minimum
  local gfields, gseen, gstate = {}, {}, {}
  for _, i in ipairs(new_rows) do
    if not gseen[GF[i]] then gseen[GF[i]] = true; gfields[#gfields + 1] = GF[i] end
  end
  local cur = redis.call('HMGET', KEYS[3], unpack(gfields))
  for k, gf in ipairs(gfields) do
    if cur[k] then
      local sn, sc, ss1, ss2 = string.match(cur[k], '^(%S+) (%S+) (%S+) (%S+)$')
      gstate[gf] = {tonumber(sn), tonumber(sc), tonumber(ss1), tonumber(ss2)}
    end
  end
  for _, i in ipairs(new_rows) do
    local r = tonumber(V[i])
    local g = gstate[GF[i]]
    if not g then
      gstate[GF[i]] = {1, r, 0, 0}
    else
      local n, c, s1, s2 = g[1], g[2], g[3], g[4]
      if r < c then
        local delta = c - r
        s2 = s2 + 2 * delta * s1 + n * delta * delta
        s1 = s1 + n * delta
        c = r
      end
      local d = r - c
      g[1], g[2], g[3], g[4] = n + 1, c, s1 + d, s2 + d * d
    end
  end
  local gkv = {}
  for _, gf in ipairs(gfields) do
    local g = gstate[gf]
    gkv[#gkv + 1] = gf
    gkv[#gkv + 1] = string.format('%d %.17g %.17g %.17g', g[1], g[2], g[3], g[4])
  end
  redis.call('HSET', KEYS[3], unpack(gkv))
end
-- run completion: #n stored steps, #len from the last step, #done once complete
local rfields, rstate = {}, {}
for i = 1, count do
  if not rstate[RF[i]] then rfields[#rfields + 1] = RF[i]; rstate[RF[i]] = {task = T[i]} end
end
local q = {}
for _, rf in ipairs(rfields) do
  q[#q + 1] = rf .. '#n'; q[#q + 1] = rf .. '#len'; q[#q + 1] = rf .. '#done'
end
local rc = redis.call('HMGET', KEYS[4], unpack(q))
for k, rf in ipairs(rfields) do
  local st = rstate[rf]
  st.n = tonumber(rc[3 * k - 2] or '0')
  st.len = rc[3 * k - 1] and tonumber(rc[3 * k - 1]) or false
  st.done = rc[3 * k] and true or false
end
for i = 1, count do
  local st = rstate[RF[i]]
  if is_new[i] then st.n = st.n + 1 end
  if LAST[i] == '1' then st.len = tonumber(STEP[i]) + 1 end
end
local rkv, done_inc = {}, {}
for _, rf in ipairs(rfields) do
  local st = rstate[rf]
  rkv[#rkv + 1] = rf .. '#n'; rkv[#rkv + 1] = st.n
  if st.len then
    rkv[#rkv + 1] = rf .. '#len'; rkv[#rkv + 1] = st.len
    if not st.done and st.n == st.len then
      rkv[#rkv + 1] = rf .. '#done'; rkv[#rkv + 1] = '1'
      done_inc[st.task] = (done_inc[st.task] or 0) + 1
    end
  end
end
redis.call('HSET', KEYS[4], unpack(rkv))
for task, k in pairs(done_inc) do redis.call('HINCRBY', KEYS[5], task, k) end
for k = 1, 5 do redis.call('PEXPIRE', KEYS[k], tonumber(ARGV[1])) end
return {#new_rows, epoch}
"""

_KINDS = ("meta", "steps", "groups", "runs", "done")


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


def _field(task: str, *rest: Any) -> str:
    # task prefixed by its UTF-8 byte length (as Lua's #task) so ids containing '|' cannot collide
    return f"{len(task.encode())}:{task}|" + "|".join(str(x) for x in rest)


class RedisAnchorIndex(AnchorIndex):
    """Anchor index in Redis (see the module docstring for keys, atomicity and failures).

    Args:
        url: ``redis://[:password@]host:port/db``.
        prefix: key namespace, e.g. ``dso:<run name>``; keys are ``{prefix}:{<batch>}:<kind>``
            plus the registry set ``{prefix}:batches``.
        ttl_s: keys expire this long after a batch's last write, > 0.
        chunk_size: steps per Lua call, in [1, 2000] (all chunks go in one pipelined round
            trip; each call is atomic and blocks the server for its duration, ~10 ms per
            1000 steps).
        read_retries: extra attempts for reads after a connection error (with backoff).
        socket_timeout: seconds, for connect and commands.
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
        self._client: Any = None
        self._script: Any = None
        self._epochs: dict[str, str] = {}

    # -- plumbing
    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_client"] = None
        state["_script"] = None
        return state

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
        return self._client

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

    def _keys(self, batch_key: str) -> list[str]:
        return [f"{self.prefix}:{{{batch_key}}}:{k}" for k in _KINDS]

    def _registry(self) -> str:
        return f"{self.prefix}:batches"

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

    def _check_epoch(self, batch_key: str, epoch: str | None, op: str) -> None:
        seen = self._epochs.get(batch_key)
        if epoch is None:
            if seen is not None:
                raise AnchorIndexError(
                    f"{self._where()}: {op}: batch {batch_key!r} state lost (epoch {seen} gone: server restarted "
                    f"without persistence, keys expired, or batch dropped)"
                )
            raise AnchorIndexError(f"{self._where()}: {op}: batch {batch_key!r} is unknown (never written, dropped or expired)")
        if seen is not None and seen != epoch:
            raise AnchorIndexError(
                f"{self._where()}: {op}: batch {batch_key!r} state lost (epoch changed from {seen} to {epoch})"
            )
        self._epochs[batch_key] = epoch

    # -- API
    def insert(self, batch_key: str, steps: Sequence[AnchorStep]) -> int:
        import redis

        _validate(steps)
        if not steps:
            return 0
        keys = self._keys(batch_key)
        ttl_ms = str(int(self.ttl_s * 1000))
        new_epoch = uuid.uuid4().hex
        client = self._conn()
        try:
            pipe = client.pipeline(transaction=False)
            for lo in range(0, len(steps), self.chunk_size):
                chunk = steps[lo : lo + self.chunk_size]
                records = "\x1e".join(
                    f"{s.task}\x1f{int(s.run)}\x1f{int(s.step)}\x1f{s.state_hash}\x1f{float(s.ret)!r}\x1f{'1' if s.last else '0'}"
                    for s in chunk
                )
                argv = [ttl_ms, self._epochs.get(batch_key, ""), new_epoch, records]
                self._script(keys=keys, args=argv, client=pipe)
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
                if "CONFLICT" in msg:
                    raise AnchorConflictError(f"{self._where()}: batch {batch_key!r}: {msg}")
                if "EPOCH" in msg:
                    raise AnchorIndexError(
                        f"{self._where()}: insert into batch {batch_key!r} refused: {msg} "
                        f"(server restarted without persistence, keys expired, or batch dropped)"
                    )
                raise AnchorIndexError(f"{self._where()}: insert into batch {batch_key!r} failed: {msg}")
            added += int(res[0])
            epoch = res[1].decode() if isinstance(res[1], bytes) else str(res[1])
            self._epochs.setdefault(batch_key, epoch)
        return added

    def epoch(self, batch_key: str) -> str | None:
        """The batch's epoch token (None when it does not exist)."""
        keys = self._keys(batch_key)
        raw = self._read(f"epoch of batch {batch_key!r}", lambda c: c.hget(keys[0], "epoch"))
        return raw.decode() if raw is not None else None

    def _moments(self, batch_key: str, group_keys: list[tuple[str, str]], tasks: list[str]) -> tuple[np.ndarray, dict[str, int]]:
        keys = self._keys(batch_key)
        fields = [_field(t, h) for t, h in group_keys]

        def read(c: Any) -> list[Any]:
            pipe = c.pipeline(transaction=True)  # one consistent snapshot
            pipe.hget(keys[0], "epoch")
            pipe.hmget(keys[2], fields)
            pipe.hmget(keys[4], tasks)
            return pipe.execute()

        raw_epoch, raw_groups, raw_done = self._read(f"query of {len(fields)} anchor groups in batch {batch_key!r}", read)
        self._check_epoch(batch_key, raw_epoch.decode() if raw_epoch is not None else None, "query")
        m = np.full((len(fields), 4), np.nan)
        for i, raw in enumerate(raw_groups):
            if raw is not None:
                m[i] = [float(x) for x in raw.split()]
        done = {t: int(v) if v is not None else 0 for t, v in zip(tasks, raw_done, strict=True)}
        return m, done

    def completed_runs(self, batch_key: str) -> dict[str, int]:
        key = self._keys(batch_key)[4]
        raw = self._read(f"completed runs of batch {batch_key!r}", lambda c: c.hgetall(key))
        return {k.decode(): int(v) for k, v in raw.items()}

    def group_sizes(self, batch_key: str) -> np.ndarray:
        key = self._keys(batch_key)[2]
        vals = self._read(f"group sizes of batch {batch_key!r}", lambda c: c.hvals(key))
        return np.sort(np.asarray([int(v.split()[0]) for v in vals], dtype=np.int64))

    def stats(self) -> dict[str, Any]:
        def read(c: Any) -> dict[str, Any]:
            batches = sorted(b.decode() for b in c.smembers(self._registry()))
            pipe = c.pipeline(transaction=False)
            for b in batches:
                keys = self._keys(b)
                pipe.exists(keys[0])
                pipe.hlen(keys[1])
                pipe.hvals(keys[2])
            res = pipe.execute()
            live, entries, sizes, gone = 0, 0, [], []
            for i, b in enumerate(batches):
                exists, n_steps, vals = res[3 * i : 3 * i + 3]
                if not exists:
                    gone.append(b)
                    continue
                live += 1
                entries += int(n_steps)
                sizes += [int(v.split()[0]) for v in vals]
            if gone:
                c.srem(self._registry(), *gone)
            return {
                "backend": "redis",
                "batches": live,
                "entries": entries,
                "groups": len(sizes),
                "group_size_histogram": _histogram(sizes),
            }

        return self._read("stats", read)

    def drop(self, batch_key: str) -> int:
        import redis

        keys = self._keys(batch_key)
        try:
            pipe = self._conn().pipeline(transaction=True)
            pipe.hlen(keys[1])
            pipe.delete(*keys)
            pipe.srem(self._registry(), batch_key)
            n_steps = pipe.execute()[0]
        except redis.RedisError as exc:
            self._client = None
            raise AnchorIndexError(f"{self._where()}: drop of batch {batch_key!r} failed: {exc}") from exc
        self._epochs.pop(batch_key, None)
        return int(n_steps)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def make_anchor_index(redis_url: str | None = None, **kwargs: Any) -> AnchorIndex:
    """:class:`RedisAnchorIndex` when ``redis_url`` is given, else :class:`MemoryAnchorIndex`.

    ``kwargs`` go to the constructor (``prefix`` and the Redis options are ignored by the
    memory index).
    """
    if redis_url:
        return RedisAnchorIndex(redis_url, **kwargs)
    return MemoryAnchorIndex(**{k: v for k, v in kwargs.items() if k == "ttl_s"})
