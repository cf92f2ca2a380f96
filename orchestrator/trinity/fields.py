"""Reading Trinity experiences' fields in C-level passes (``map`` over attribute getters)."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

EID = operator.attrgetter("eid")
INFO = operator.attrgetter("info")
RUN = operator.attrgetter("run")
STEP = operator.attrgetter("step")
BATCH = operator.attrgetter("batch")
TASK = operator.attrgetter("task")
NO_INFO: dict = {}
"""Read in place of an experience's missing (None or empty) ``info``; never written."""
MASKED = "dso_masked"
"""``info`` key of a released member the orchestrator masked (zero loss weight): set by the
operator, read by the advantage functions."""


def first_appearance_codes(keys: Sequence) -> tuple[np.ndarray, list]:
    """(N,) int64 code of each hashable key, numbered in order of first appearance, and the
    distinct keys in that order.

    One C-level pass (``map(dict.setdefault, keys, range(N))`` gives each row the row of its
    key's first appearance), then those rows are numbered densely by their rank among the
    first-appearance rows (a presence table over 0..N-1 and a cumulative sum, no sort).
    """
    first: dict = {}
    rows = np.array(list(map(first.setdefault, keys, range(len(keys)))), dtype=np.int64)
    present = np.zeros(len(keys), dtype=bool)
    present[rows] = True
    return (np.cumsum(present) - 1)[rows], list(first)


def tid_codes(batches: list, tasks: list) -> tuple[np.ndarray, list[tuple]]:
    """:func:`first_appearance_codes` of Trinity's ``eid.tid`` ``(batch, task)`` pairs, given as
    the two columns. When every row has the same batch (one explore step, the usual case) only
    the tasks are factorised: no tuple per row, about twice as fast; the codes and keys are the
    same."""
    if batches and batches.count(batches[0]) == len(batches):
        code, uniq = first_appearance_codes(tasks)
        return code, [(batches[0], t) for t in uniq]
    return first_appearance_codes(list(zip(batches, tasks)))
