"""Groups as columns (:class:`~orchestrator.core.types.GroupTable`): every row checked at once.

Pure numpy over the (G, n) columns, no state: the core accepts what :func:`check_table` returns.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np

from algos.dapo import InvalidGroupError
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.rows import GroupRows
from orchestrator.core.types import GroupTable, UnknownTaskError
from orchestrator.core.validate import MAX_INT32, member_problem, unknown_task, wrong_size


def table_error(errors: dict[int, str]) -> Exception:
    """The error of the first invalid row of :func:`check_table`'s ``errors``."""
    first = errors[min(errors)]
    return (UnknownTaskError if first.startswith("task_id:") else InvalidGroupError)(first)


class CheckedTable(NamedTuple):
    """What :func:`check_table` found: every row as a group, and the invalid rows."""

    rows: GroupRows
    """one group per row of the table, in order (member columns by run; ``ref`` the table's;
    ``model_version`` the oldest member's; ``purpose``, ``round``, ``reason`` and ``key`` still
    unset: the core sets them when it takes the rows)."""
    errors: dict[int, str]
    """``{row: message}`` of the invalid rows (message names the field, the run, the task and the value)."""


def check_table(table: GroupTable, policy: ResamplingPolicy, index: dict[str, int]) -> CheckedTable:
    """Check every row of a :class:`GroupTable` at once (no state change).

    The rules of the list route (``Submit._check_group`` in :mod:`orchestrator.core.submit`),
    tested at once over the (G, n) columns: a known task, runs a permutation of ``0..n-1``,
    model versions in [0, 2**31 - 1]; per member a finite reward and judged value within
    ``max_abs_reward`` (:func:`orchestrator.core.validate.member_problem`); at least the
    ``group_validity`` mode's :meth:`~orchestrator.core.modes.GroupValidity.min_usable` usable
    members (``reject``: every member; ``mask``: ``min_valid_group_size``, the others masked).
    Each invalid row's message is worded by :func:`_problem`, with the same rules.

    Args:
        table: the groups as columns.
        policy: the resampling policy (``group_size``, ``filter.judge``, ``group_validity``, ...).
        index: task id -> task index of the task set.
    Returns:
        see :class:`CheckedTable`.
    """
    p = policy
    n = p.group_size
    num, width = table.runs.shape
    tasks = table.task_ids
    try:  # one C-level pass; an unhashable task id (not a str) is an unknown task
        idx = np.fromiter(map(index.get, tasks, itertools.repeat(-1)), dtype=np.int64, count=num)
    except TypeError:
        idx = np.array([index.get(t, -1) if isinstance(t, str) else -1 for t in tasks], dtype=np.int64).reshape(num)
    if (table.runs == np.arange(width)).all():  # the usual case: every row's runs are 0..n-1 in order
        along = lambda a: a  # noqa: E731
    else:  # members by run id
        order = np.argsort(table.runs, axis=1, kind="stable")
        along = lambda a: np.take_along_axis(a, order, 1)  # noqa: E731
    runs = along(table.runs)
    rewards = along(table.rewards.astype(np.float64))
    versions = along(table.versions.astype(np.int64))
    judge = p.filter.judge
    if judge == "auto":
        acc = table.metrics.get("accuracy")
        values = rewards if acc is None else along(acc)
        values = np.where(np.isnan(values).all(axis=1, keepdims=True), rewards, values) if acc is not None else values
    elif judge == "reward":
        values = rewards
    else:
        col = table.metrics.get(judge)
        values = np.full(rewards.shape, np.nan) if col is None else along(col.astype(np.float64))
    bound = p.max_abs_reward
    with np.errstate(invalid="ignore"):
        bad_reward = ~np.isfinite(rewards) | (np.abs(rewards) > bound)
        bad_value = ~np.isfinite(values) | (np.abs(values) > bound)
    usable = ~(bad_reward | bad_value)
    bad_row = (idx < 0) | ((versions < 0) | (versions > MAX_INT32)).any(axis=1)
    if width != n:
        bad_row[:] = True
    else:
        bad_row |= (runs != np.arange(n)).any(axis=1)
    bad_row |= usable.sum(axis=1) < p.mode("group_validity").min_usable(p, width)
    errors = {i: _problem(table, i, p, index, runs, rewards, values, versions, judge) for i in np.flatnonzero(bad_row).tolist()}
    values = np.where(usable, values, np.nan)
    oldest = versions.min(axis=1).tolist() if width else [0] * num
    rows = GroupRows(list(tasks), [[] for _ in range(num)], oldest, ["initial"] * num, [0] * num, [""] * num,
                     [False] * num, [""] * num, list(table.refs), [width] * num, rewards, values, usable, versions, idx)
    return CheckedTable(rows, errors)


def _problem(table: GroupTable, i: int, p: ResamplingPolicy, index: dict[str, int], runs: np.ndarray,
             rewards: np.ndarray, values: np.ndarray, versions: np.ndarray, judge: str) -> str:
    """The first problem of (invalid) row ``i`` of a table, worded as the list route words it."""
    n = p.group_size
    task = table.task_ids[i]
    if not isinstance(task, str) or task not in index:
        return unknown_task(task, len(index))
    if runs.shape[1] != n:
        return wrong_size(task, runs.shape[1], n)
    if (runs[i] != np.arange(n)).any():
        return f"eid.run: run ids {sorted(runs[i].tolist())} of task {task!r} are not 0..{n - 1} once each"
    bad = np.flatnonzero((versions[i] < 0) | (versions[i] > MAX_INT32))
    if bad.size:
        return f"versions: {int(versions[i, bad[0]])} not in [0, {MAX_INT32}] in run {int(bad[0])} of task {task!r}"
    problems = []
    for run, (reward, value) in enumerate(zip(rewards[i].tolist(), values[i].tolist())):
        problem = member_problem(reward, None if math.isnan(value) else value, judge, p.max_abs_reward, run, task,
                                 missing="missing or not a number")  # a NaN in a column: missing or NaN
        if problem is not None:
            problems.append(problem)
    return p.mode("group_validity").refusal(task, n - len(problems), p, problems)
