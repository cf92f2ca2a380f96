"""Groups as rows of columns (:class:`GroupRows`): how the core holds groups and releases batches.

A :class:`~orchestrator.core.types.Group` object per group costs a Python object, four row
views and a pass over them wherever groups are counted, trimmed, packed or sealed. The core
instead holds its carry pool and padding candidates as :class:`GroupRows`: one list per scalar
field and one (G, n) array per member column, taken and concatenated by row. ``Group``
objects are made only where someone reads them (:meth:`GroupRows.groups`: a batch's groups
on the trainer's side, the list route's rollouts).

Pure data, no state beyond the rows: no Ray, no I/O.
"""

from __future__ import annotations

import copy
import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from orchestrator.core.types import Group, pack_columns

FIELDS = ("task_ids", "rollouts", "model_versions", "purposes", "rounds", "reasons", "padding", "keys", "refs", "sizes")
"""The scalar fields, one list each, in the order of :meth:`Group._fields` (``task_id``, ``rollouts``, ...)."""
COLUMNS = ("rewards", "values", "valid", "versions")
"""The member columns, one (G, n) array each: float64, float64, bool, int64."""


class GroupRows:
    """G groups of ``n`` members as columns (see the module docstring).

    Attributes (one entry per group, in order):
        task_ids, rollouts, model_versions, purposes, rounds, reasons, padding, keys, refs,
            sizes: lists, the :class:`Group` fields of the same names (singular there).
        rewards, values, valid, versions: (G, n) float64, float64, bool, int64 by run.
        task_index: (G,) int64, each group's row in the task set.

    The arrays are never written in place once rows exist: a commit may be pickling them in
    its worker thread. A change replaces the array (e.g. :meth:`with_valid`).
    """

    __slots__ = (*FIELDS, *COLUMNS, "task_index")

    def __init__(self, task_ids: list, rollouts: list, model_versions: list, purposes: list, rounds: list,
                 reasons: list, padding: list, keys: list, refs: list, sizes: list, rewards: np.ndarray,
                 values: np.ndarray, valid: np.ndarray, versions: np.ndarray, task_index: np.ndarray) -> None:
        self.task_ids, self.rollouts, self.model_versions = task_ids, rollouts, model_versions
        self.purposes, self.rounds, self.reasons, self.padding = purposes, rounds, reasons, padding
        self.keys, self.refs, self.sizes = keys, refs, sizes
        self.rewards, self.values, self.valid, self.versions = rewards, values, valid, versions
        self.task_index = task_index

    # ----------------------------------------------------------------- making rows
    @classmethod
    def empty(cls, n: int) -> GroupRows:
        """No group, with members of width ``n``."""
        return cls(*([] for _ in FIELDS), np.empty((0, n)), np.empty((0, n)), np.empty((0, n), dtype=bool),
                   np.empty((0, n), dtype=np.int64), np.empty(0, dtype=np.int64))

    @classmethod
    def from_groups(cls, groups: Sequence[Group], task_index: np.ndarray) -> GroupRows:
        """Rows of :class:`Group` objects whose member columns are set (all of width n).

        Args:
            groups: G >= 1 groups.
            task_index: (G,) int64, their rows in the task set.
        Raises:
            ValueError: no group, or member columns of different widths (numpy's, from ``np.stack``).
        """
        if not groups:
            raise ValueError("groups: no group (use GroupRows.empty)")
        fields = list(map(list, zip(*map(Group._fields, groups))))
        cols = [np.stack([getattr(g, name) for g in groups]) for name in COLUMNS]
        return cls(*fields, *cols, np.asarray(task_index, dtype=np.int64))

    # ----------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self.task_ids)

    def fields(self) -> tuple[list, ...]:
        """The scalar fields, in :data:`FIELDS` order."""
        return tuple(getattr(self, name) for name in FIELDS)

    def group(self, i: int) -> Group:
        """Row ``i`` as a :class:`Group` (its columns: views of this row's arrays)."""
        return Group(*(f[i] for f in self.fields()), self.rewards[i], self.values[i], self.valid[i], self.versions[i])

    def groups(self) -> list[Group]:
        """Every row as a :class:`Group`, in order (positional arguments: one C-level ``map``)."""
        return list(map(Group, *self.fields(), *(list(getattr(self, name)) for name in COLUMNS)))

    def __iter__(self) -> Iterator[Group]:
        return iter(self.groups())

    def __getitem__(self, i: int) -> Group:
        """Row ``i`` (negative counts from the end) as a :class:`Group`; TypeError for anything
        but an int, IndexError out of range."""
        if not isinstance(i, int):
            raise TypeError(f"GroupRows index: expected an int (use take for several rows), got {type(i).__name__}")
        return self.group(range(len(self))[i])

    def pack(self) -> tuple:
        """The rows as :func:`~orchestrator.core.types.pack_groups` packs ``self.groups()``, byte
        for byte once pickled, without making the groups: the fields are the lists themselves."""
        if not len(self):
            return (), ()
        return pack_columns(tuple(map(list, self.fields())), dict(zip(COLUMNS, (self.rewards, self.values, self.valid, self.versions))))

    # ----------------------------------------------------------------- taking rows
    def take(self, rows: Any) -> GroupRows:
        """The given rows, in that order: a slice, a (G,) bool mask, or row numbers."""
        if isinstance(rows, slice):
            pick = operator.itemgetter(rows)
            return GroupRows(*map(pick, self.fields()), *(a[rows] for a in self._arrays()))
        rows = np.asarray(rows)
        if rows.dtype == bool:
            mask = rows.tolist()
            lists = [list(itertools.compress(f, mask)) for f in self.fields()]
        else:
            rows = rows.astype(np.int64, copy=False)
            lists = [list(map(f.__getitem__, rows.tolist())) for f in self.fields()]
        return GroupRows(*lists, *(a[rows] for a in self._arrays()))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return self.rewards, self.values, self.valid, self.versions, self.task_index

    @staticmethod
    def concat(first: GroupRows, second: GroupRows) -> GroupRows:
        """``first`` then ``second`` (either may be empty)."""
        if not len(second):
            return first
        if not len(first):
            return second
        return GroupRows(*map(operator.add, first.fields(), second.fields()),
                         *(np.concatenate(pair) for pair in zip(first._arrays(), second._arrays())))

    def with_valid(self, valid: np.ndarray) -> GroupRows:
        """The same rows with ``valid`` replaced (a new (G, n) bool array; the lists are shared)."""
        return GroupRows(*self.fields(), self.rewards, self.values, valid, self.versions, self.task_index)


def flagged(rollouts: list, flags: dict[str, Any], which: Callable[[Any], bool] | None = None) -> list:
    """``rollouts`` with ``flags`` added to the ``info`` of each (of those where ``which(r)``
    when given), as copies: a shallow copy of the rollout with a copy of its ``info``; the
    others are the same objects.

    A held group's rollouts are never changed in place once accepted: the state store may be
    pickling them in its worker thread (the commit of the change that made the group held),
    and a dict that grows while it is pickled fails the commit; what a commit writes is the
    group as it was when the commit was prepared."""
    out = []
    for r in rollouts:
        if which is None or which(r):
            r = copy.copy(r)
            r.info = {**r.info, **flags}
        out.append(r)
    return out
