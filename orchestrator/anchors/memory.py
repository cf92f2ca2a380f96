"""In-process anchor index (the embedded default): thread safe, picklable as an independent snapshot."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
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
        self._changed = threading.Condition(self._lock)  # notified after every insert

    def __getstate__(self) -> dict[str, Any]:
        with self._lock:
            state = self.__dict__.copy()
        del state["_lock"], state["_changed"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def _expire(self) -> None:
        now = time.monotonic()
        for k in [k for k, b in self._batches.items() if now - b.touched > self.ttl_s]:
            del self._batches[k]

    def insert(self, batch_key: str, steps: Sequence[AnchorStep | dict]) -> int:
        return sum(self._insert(batch_key, steps).values())

    def insert_trajectories(self, batch_key: str, records: TrajectoryRecords) -> InsertReceipt:
        """:meth:`AnchorIndex.insert_trajectories` through the per-step insert; ``added`` counts
        the trajectories with a step not stored before."""
        tk, rn, st, sid, ret, last = records.columns
        names, states = records.task_names, records.state_names
        new_runs = self._insert(batch_key, [
            AnchorStep(names[t], r, k, states[h], x, last=e)
            for t, r, k, h, x, e in zip(tk.tolist(), rn.tolist(), st.tolist(), sid.tolist(), ret.tolist(), last.tolist())
        ])
        tasks = [names[t] for t in np.unique(records.run_task).tolist()]
        if not tasks:
            return InsertReceipt(len(new_runs), {})
        keys = [(names[t], states[h]) for t, h in zip(records.group_task.tolist(), records.group_state.tolist())]
        moments, done = self._moments(batch_key, keys, tasks)  # one consistent reading, after the write
        return InsertReceipt(len(new_runs), done, None, moments)

    def _insert(self, batch_key: str, steps: Sequence[AnchorStep | dict]) -> dict[tuple[str, int], int]:
        """Store the steps not stored yet (all or nothing: a conflict refuses the call); returns
        the count of new steps of each trajectory ``(task, run)`` that got any."""
        steps = validate_steps(steps)
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
            added: dict[tuple[str, int], int] = {}
            for s in steps:
                key = (s.task, s.run, s.step)
                rk = (s.task, s.run)
                if key not in b.steps:
                    r = float(s.ret)
                    b.steps[key] = (s.state_hash, r)
                    added[rk] = added.get(rk, 0) + 1
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
            self._changed.notify_all()
            return added

    def wait_complete(
        self, batch_key: str, tasks: Sequence[str], n_runs: int, timeout_s: float, receipt: InsertReceipt | None = None
    ) -> None:
        """Block until every task has ``n_runs`` complete runs (woken by each insert, no polling).

        Raises:
            AnchorIndexError: still incomplete after ``timeout_s`` (names up to 5 tasks).
        """
        short = self.await_complete(batch_key, tasks, n_runs, timeout_s)
        if short:
            raise incomplete_error(batch_key, short, n_runs, timeout_s)

    def await_complete(self, batch_key: str, tasks: Sequence[str], n_runs: int, timeout_s: float) -> dict[str, int]:
        """Wait on the index's condition (notified by every insert) until every task has
        ``n_runs`` complete runs, or ``timeout_s`` passed; returns the tasks still short and
        their counts (empty: complete). Served by a Ray actor, it runs in one of the actor's
        threads while others keep answering inserts (see :mod:`orchestrator.anchors.remote`)."""

        def short() -> dict[str, int]:
            b = self._batches.get(batch_key)
            done = b.done if b is not None else {}
            return {t: done.get(t, 0) for t in tasks if done.get(t, 0) < n_runs}

        with self._changed:
            self._changed.wait_for(lambda: not short(), timeout=max(timeout_s, 0.0))
            return short()

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
                "group_size_histogram": size_histogram(sizes),
            }

    def drop(self, batch_key: str) -> int:
        with self._lock:
            b = self._batches.pop(batch_key, None)
            return len(b.steps) if b is not None else 0


