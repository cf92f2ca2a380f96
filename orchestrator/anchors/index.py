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

* :class:`~orchestrator.anchors.memory.MemoryAnchorIndex` - in process, thread safe (the
  embedded default). Picklable: a pickled copy (e.g. sent to a worker process) is an
  independent snapshot. Shared between processes by running it as a Ray actor
  (:mod:`orchestrator.anchors.remote`).
* :class:`~orchestrator.anchors.redis_index.RedisAnchorIndex` - redis-py. Each write is one Lua script per chunk of steps
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
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from algos.gigpo import encode_keys, normalise_from_moments
from algos.groups import Norm


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


def _validate(steps: Sequence[AnchorStep | dict]) -> list[AnchorStep]:
    """The steps as :class:`AnchorStep` objects (field dicts converted), checked.

    Raises:
        ValueError: a step without state hash, with a control character in its task or state,
            a non-finite return or a negative index (the message names task, run and step).
        TypeError: a dict with unknown or missing fields.
    """
    recs = [s if isinstance(s, AnchorStep) else AnchorStep(**s) for s in steps]
    for i, s in enumerate(recs):
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
    return recs


class AnchorIndex(ABC):
    """Interface shared by the memory and Redis anchor indexes (see the module docstring).

    Backends implement storage (``insert``, ``_moments``, ``completed_runs``, ``group_sizes``,
    ``stats``, ``drop``); the query maths (:meth:`step_advantages`) is written once, here.
    """

    @abstractmethod
    def insert(self, batch_key: str, steps: Sequence[AnchorStep | dict]) -> int:
        """Record steps of ``batch_key`` (:class:`AnchorStep` objects or their field dicts);
        returns how many were new (duplicates are no-ops).

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
            batch_key: the batch (or model version) the steps belong to.
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
