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

Whole trajectories (:meth:`AnchorIndex.insert_trajectories`, what ``dso_gigpo_index`` uses)
are the bulk path: :func:`trajectory_records` checks the integer-coded step columns and
reduces them in numpy to one record per trajectory (length and a 64-bit digest of its steps,
for idempotence and conflicts) and one per anchor group (the call's ``[n, c, S1, S2]``, merged
into the stored moments by re-basing both to the smaller minimum). The insert returns an
:class:`InsertReceipt`: the complete runs of the call's tasks and the groups' moments right
after the write, so groups that the call holds whole need no second read, and a cursor from
which :meth:`AnchorIndex.wait_complete` blocks until split groups complete (Redis: an event
stream written by the insert script; memory: a condition notified by every insert).

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
carries a random *fence token* written with its first step; a client that has seen a batch's
token refuses to write to or read from it when the token changed or vanished (a restarted server
without persistence, or a ``drop``), so lost steps end in an error, never in statistics
silently computed from a partial batch. Queries with ``n_runs`` also check that every
queried task has exactly ``n_runs`` complete runs.
"""

from __future__ import annotations

import re
import time
import zlib
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from algos.gigpo import consecutive_order, encode_keys, normalise_from_moments
from algos.groups import Norm, first_rows, group_value_order
from orchestrator.anchors.redis_layout import FIELD_SEP, RECORD_SEP

_U64 = np.uint64


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


_SEPARATORS = re.compile(f"[{RECORD_SEP}{FIELD_SEP}]")  # the separators of the Redis scripts' records


def validate_steps(steps: Sequence[AnchorStep | dict]) -> list[AnchorStep]:
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


@dataclass(frozen=True)
class InsertReceipt:
    """What :meth:`AnchorIndex.insert_trajectories` wrote and where the batch stands after it.

    Attributes:
        added: trajectories newly stored (re-inserted identical ones are not counted).
        done: complete runs of each task of the call, read in the same atomic step as the write.
        cursor: backend position of that reading, for :meth:`AnchorIndex.wait_complete`
            (the Redis event-stream id; None for the memory index).
        moments: (G, 4) ``[n, c, S1, S2]`` stored for each anchor group of the call (in the
            order of its :class:`TrajectoryRecords`), read after the write in one consistent
            reading with ``done`` (Redis: in the same script); None when the backend did not
            return them. For a group complete at that moment they are its final statistics
            (:meth:`InsertReceipt.step_advantages`).
    """

    added: int
    done: dict[str, int]
    cursor: Any = None
    moments: np.ndarray | None = None

    def step_advantages(
        self, group_of_row: Any, returns: Any, *, norm: Norm = "std", eps: float = 1e-6, n_runs: int | None = None
    ) -> np.ndarray | None:
        """A^S (GiGPO Eq. 7) of the call's rows from the moments the insert returned, with the
        checks of :meth:`AnchorIndex.group_step_advantages`; None when they cannot be used (no
        moments, or with ``n_runs`` some task of the call not complete at the write: query then).

        Args:
            group_of_row: (Q,) int, each row's anchor group as coded in the call's records
                (``encode_keys(task_ids, state_ids)``).
            returns: (Q,) float, each row's R_t.
        Raises:
            AnchorIndexError: a group missing from the index (its batch state was lost).
        """
        if self.moments is None or (n_runs is not None and any(v != n_runs for v in self.done.values())):
            return None
        if np.isnan(self.moments[:, 0]).any():
            raise AnchorIndexError(f"{int(np.isnan(self.moments[:, 0]).sum())} anchor groups of the call are not in the index")
        m = self.moments[np.asarray(group_of_row, dtype=np.int64)]
        return normalise_from_moments(returns, m[:, 0], m[:, 1], m[:, 2], m[:, 3], norm=norm, eps=eps)


@dataclass(frozen=True)
class TrajectoryRecords:
    """Whole trajectories prepared for a backend, in numpy, without per-step Python objects.

    Attributes:
        run_task, run_id, run_length: (R,) each trajectory's task (index into ``task_names``),
            run and number of steps.
        run_digest: (R,) uint64, an order-free 64-bit digest of the trajectory's (step, state,
            return) triples (``state`` by the CRC-32 of its UTF-8 text, ``return`` by its
            float64 bits, mixed with splitmix64 and summed mod 2^64): equal trajectories get
            equal digests, so a re-insert is recognised, and different ones differ except with
            probability ~2^-64.
        group_task, group_state: (G,) each anchor group's task and state (indices into the names).
        moments: (G, 4) float64 ``[n, c, S1, S2]`` of the call's returns in each anchor group,
            ``c`` the group minimum, sums accumulated in (group, return) order (as
            :func:`algos.groups.normalise_in_groups`).
        task_names, state_names: the texts of the codes.
        num_steps: S, steps in the call.
        columns: the checked (S,) step columns ``(task_ids, runs, steps, state_ids, returns,
            last)``, for backends that store steps one by one.
    """

    run_task: np.ndarray
    run_id: np.ndarray
    run_length: np.ndarray
    run_digest: np.ndarray
    group_task: np.ndarray
    group_state: np.ndarray
    moments: np.ndarray
    task_names: list[str]
    state_names: list[str]
    num_steps: int
    columns: tuple[np.ndarray, ...]


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (Steele, Lea and Flood, 2014), vectorised on uint64 (wrapping)."""
    with np.errstate(over="ignore"):
        z = x + _U64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
        return z ^ (z >> _U64(31))


def trajectory_records(
    task_ids: Any,
    task_names: Sequence[str],
    runs: Any,
    steps: Any,
    state_ids: Any,
    state_names: Sequence[str],
    returns: Any,
) -> TrajectoryRecords:
    """Check whole trajectories given as integer-coded columns and reduce them per trajectory
    and per anchor group (GiGPO Eq. 6: the steps of one task that acted from one state).

    Args:
        task_ids: (S,) int, index into ``task_names``.
        task_names: (T,) str, non-empty, without the separators \\x1e / \\x1f.
        runs, steps: (S,) int >= 0; each (task, run) holds steps 0..L-1 exactly once.
        state_ids: (S,) int, index into ``state_names`` (same rules as ``task_names``).
        returns: (S,) float, finite: R_t of each step (Eq. 5).
    Returns:
        :class:`TrajectoryRecords`.
    Raises:
        ValueError: lengths differ, a bad name, a negative run or step, a non-finite return, a
            duplicate step or a trajectory whose steps are not 0..L-1 (the message names task,
            run and step).
    """
    tk = np.asarray(task_ids, dtype=np.int64).reshape(-1)
    rn = np.asarray(runs, dtype=np.int64).reshape(-1)
    st = np.asarray(steps, dtype=np.int64).reshape(-1)
    sid = np.asarray(state_ids, dtype=np.int64).reshape(-1)
    ret = np.asarray(returns, dtype=np.float64).reshape(-1)
    if not (tk.size == rn.size == st.size == sid.size == ret.size):
        raise ValueError(f"task_ids, runs, steps, state_ids, returns lengths differ: {tk.size}, {rn.size}, {st.size}, {sid.size}, {ret.size}")
    task_names, state_names = list(task_names), list(state_names)
    for kind, names in (("task", task_names), ("state_hash", state_names)):
        # one C-level check of all names; the loop below only runs to name the bad one
        if all(map(str.__instancecheck__, names)) and all(names) and not _SEPARATORS.search("".join(names)):
            continue
        for k, name in enumerate(names):
            if not isinstance(name, str) or not name or _SEPARATORS.search(name):
                raise ValueError(f"{kind}: empty, not a str, or with a control character \\x1e/\\x1f: {name!r} (code {k})")
    for kind, codes, names in (("task_ids", tk, task_names), ("state_ids", sid, state_names)):
        if codes.size and (codes.min() < 0 or codes.max() >= len(names)):
            i = int(np.flatnonzero((codes < 0) | (codes >= len(names)))[0])
            raise ValueError(f"{kind}: code {int(codes[i])} at row {i} is not an index into its {len(names)} names")

    def where(i: int) -> str:
        return f"task {task_names[tk[i]]!r} run {int(rn[i])} step {int(st[i])}"

    bad = ~np.isfinite(ret)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"ret: non-finite value {float(ret[i])!r} for {where(i)} (row {i})")
    neg = (rn < 0) | (st < 0)
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        raise ValueError(f"run/step: negative value for {where(i)} (row {i})")
    if tk.size == 0:
        e = np.zeros(0, dtype=np.int64)
        return TrajectoryRecords(
            e, e, e, e.astype(np.uint64), e, e, np.zeros((0, 4)), task_names, state_names, 0, (e, e, e, e, ret, e.astype(bool))
        )
    traj, num_traj = encode_keys(tk, rn)
    order = consecutive_order(traj, st)  # (trajectory, step) order, without a sort when valid
    if order is None:
        order = np.lexsort((st, traj))
    ts, ss = traj[order], st[order]
    starts = np.flatnonzero(np.r_[True, ts[1:] != ts[:-1]])
    length = np.diff(np.r_[starts, ts.size])
    expect = np.arange(ts.size) - np.repeat(starts, length)  # 0..L-1 within each trajectory
    wrong = ss != expect
    if wrong.any():
        k = int(np.flatnonzero(wrong)[0])
        i = int(order[k])
        what = "duplicate" if k and ts[k] == ts[k - 1] and ss[k] == ss[k - 1] else f"expected step {int(expect[k])}"
        raise ValueError(f"steps: {where(i)} (row {i}): {what}; a call must hold whole trajectories, steps 0..L-1 once each")
    first = order[starts]
    crc = np.array(list(map(zlib.crc32, map(str.encode, state_names))), dtype=np.uint64)
    mixed = _splitmix64(ret.view(np.uint64) ^ _splitmix64((crc[sid] << _U64(32)) | st.astype(np.uint64)))
    digest = np.add.reduceat(mixed[order], starts) if ts.size else np.zeros(0, dtype=np.uint64)
    gid, num = encode_keys(tk, sid)
    gorder = group_value_order(gid, ret)
    gs, rs = gid[gorder], ret[gorder] + 0.0  # -0.0 as +0.0: the shift is the same whatever the order of zeros
    gstart = np.flatnonzero(np.r_[True, gs[1:] != gs[:-1]])
    count = np.bincount(gs, minlength=num).astype(np.float64)
    shift = rs[gstart]
    d = rs - shift[gs]
    s1 = np.bincount(gs, weights=d, minlength=num)
    s2 = np.bincount(gs, weights=d * d, minlength=num)
    grow = gorder[gstart]
    return TrajectoryRecords(
        run_task=tk[first], run_id=rn[first], run_length=length.astype(np.int64), run_digest=digest.astype(np.uint64),
        group_task=tk[grow], group_state=sid[grow], moments=np.stack([count, shift, s1, s2], axis=1),
        task_names=task_names, state_names=state_names, num_steps=int(tk.size),
        columns=(tk, rn, st, sid, ret, st == length[traj] - 1),  # traj codes are the sorted ranks
    )


def poll_complete(index: Any, batch_key: str, tasks: Sequence[str], n_runs: int, timeout_s: float) -> None:
    """Wait, by polling ``index.completed_runs`` (back-off 20 ms doubling to 0.5 s), until every
    task has ``n_runs`` complete runs in ``batch_key``: the default of
    :meth:`AnchorIndex.wait_complete`, for backends that cannot announce completion (the memory
    and Redis indexes and the memory index's actor client override it with blocking waits).

    Raises:
        AnchorIndexError: still incomplete after ``timeout_s`` (names up to 5 tasks and counts).
    """
    deadline = time.monotonic() + timeout_s
    delay = 0.02
    while True:
        done = index.completed_runs(batch_key)
        short = {t: done.get(t, 0) for t in tasks if done.get(t, 0) < n_runs}
        if not short:
            return
        if time.monotonic() >= deadline:
            raise incomplete_error(batch_key, short, n_runs, timeout_s)
        time.sleep(min(delay, max(deadline - time.monotonic(), 0.0)))
        delay = min(delay * 2, 0.5)


def incomplete_error(batch_key: str, short: dict[str, int], n_runs: int, timeout_s: float) -> AnchorIndexError:
    """The error of a query that waited ``timeout_s`` for groups still ``short`` of ``n_runs``
    complete trajectories (shared by the index implementations)."""
    return AnchorIndexError(
        f"group_size: after {timeout_s:.0f}s these groups of batch {batch_key!r} still have fewer than {n_runs} "
        f"complete trajectories in the anchor index: {dict(list(short.items())[:5])}"
    )


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

    @abstractmethod
    def insert_trajectories(self, batch_key: str, records: TrajectoryRecords) -> InsertReceipt:
        """Record whole trajectories (see :func:`trajectory_records`) and report the completed
        runs of their tasks.

        Same stored statistics and the same idempotence as :meth:`insert` of their steps, each
        trajectory's ``last`` step marked: re-inserting a stored trajectory is a no-op (not
        counted in ``added``) and re-inserting it with other steps is refused. The memory index
        writes the steps through :meth:`insert`; the Redis index sends one record per trajectory
        and per anchor group.

        Raises:
            AnchorConflictError: a trajectory already stored with other steps.
            AnchorIndexError: backend failure or lost batch state.
        """

    def wait_complete(
        self, batch_key: str, tasks: Sequence[str], n_runs: int, timeout_s: float, receipt: InsertReceipt | None = None
    ) -> None:
        """Return once every task in ``tasks`` has ``n_runs`` complete runs in ``batch_key``.

        This default polls (:func:`poll_complete`); the memory and Redis indexes override it to
        block until an insert announces completion.

        Args:
            receipt: the caller's own :class:`InsertReceipt` for this batch, if any (its counts
                and cursor spare a first read).
        Raises:
            AnchorIndexError: still incomplete after ``timeout_s``, or backend failure.
        """
        poll_complete(self, batch_key, tasks, n_runs, timeout_s)

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
        keys = [(str(tasks_a[i]), str(hashes_a[i])) for i in first_rows(gid, num)]
        return self.group_step_advantages(batch_key, keys, gid, rets, norm=norm, eps=eps, n_runs=n_runs)

    def group_step_advantages(
        self,
        batch_key: str,
        group_keys: Sequence[tuple[str, str]],
        group_of_row: Any,
        returns: Any,
        *,
        norm: Norm = "std",
        eps: float = 1e-6,
        n_runs: int | None = None,
    ) -> np.ndarray:
        """:meth:`step_advantages` for callers that already grouped their rows: one read of the
        distinct anchor groups' moments, gathered per row by integer code (no per-row keys).

        Args:
            group_keys: (K,) distinct ``(task, state_hash)`` anchor groups.
            group_of_row: (Q,) int in [0, K), each row's group.
            returns: (Q,) float, each row's R_t.
            norm, eps, n_runs: as :meth:`step_advantages`.
        Returns:
            (Q,) float64.
        Raises:
            as :meth:`step_advantages`.
        """
        gid = np.asarray(group_of_row, dtype=np.int64).reshape(-1)
        rets = np.asarray(returns, dtype=np.float64).reshape(-1)
        keys = [(str(t), str(h)) for t, h in group_keys]
        if gid.size != rets.size:
            raise ValueError(f"group_of_row, returns lengths differ: {gid.size}, {rets.size}")
        if rets.size == 0:
            return rets.copy()
        uniq_tasks = sorted({t for t, _ in keys})
        moments, done = self._moments(batch_key, keys, uniq_tasks)
        missing = np.isnan(moments[:, 0])
        if missing.any():
            t, h = keys[int(np.flatnonzero(missing)[0])]
            raise AnchorIndexError(
                f"{self._where()}: anchor group (task {t!r}, state {h!r}) is not in batch {batch_key!r} "
                f"({int(missing.sum())} of {len(keys)} queried groups missing)"
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


def size_histogram(sizes: Iterable[int]) -> dict[int, int]:
    """``{group size: groups of that size}``, sizes ascending (the ``group_size_histogram`` of ``stats``)."""
    return dict(sorted(Counter(int(s) for s in sizes).items()))
