"""Reading Trinity experiences' fields in C-level passes (``map`` over attribute getters)."""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

EID = operator.attrgetter("eid")
INFO = operator.attrgetter("info")
RUN = operator.attrgetter("run")
STEP = operator.attrgetter("step")
BATCH_TASK = operator.attrgetter("batch", "task")
NO_INFO: dict = {}
"""Read in place of an experience's missing (None or empty) ``info``; never written."""


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
