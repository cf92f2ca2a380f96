"""Reading Trinity experiences' fields in memory order into lists and arrays: the common
fields in one pass over the experiences, ``info`` keys in C-level passes (``map`` over item
getters); no per-row objects."""

from __future__ import annotations

import ctypes
import functools
import itertools
import operator
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from trinity.common.experience import Experience as TrinityExperience

from algos.groups import first_rows

REWARD = operator.attrgetter("reward")
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
    Non-negative ints below ``4N + 1024`` (Trinity's ``eid.task``, the usual case) skip the
    dict: one array of the keys and a first-row table over their values (cheaper; see
    bench/README.md, "Reading and writing experiences").
    """
    rows, uniq = _first_rows_of_small_ints(keys), None
    if rows is None:
        first: dict = {}
        rows = np.array(list(map(first.setdefault, keys, range(len(keys)))), dtype=np.int64)
        uniq = list(first)
    present = np.zeros(len(keys), dtype=bool)
    present[rows] = True
    if uniq is None:
        uniq = list(map(keys.__getitem__, np.flatnonzero(present).tolist()))
    return (np.cumsum(present) - 1)[rows], uniq


def _first_rows_of_small_ints(keys: Sequence) -> np.ndarray | None:
    """(N,) int64, the row of each key's first appearance, when ``keys`` is a list of
    non-negative ints below ``4N + 1024`` (bools count as ints, equal as dict keys too); else None."""
    if not keys or type(keys[0]) is not int:  # only then is the array worth making
        return None
    k = np.array(keys)
    if k.dtype.kind != "i" or int(k.min()) < 0 or int(k.max()) >= 4 * k.size + 1024:
        return None
    return first_rows(k, int(k.max()) + 1)[k]


def tid_codes(batches: list, tasks: list) -> tuple[np.ndarray, list[tuple]]:
    """:func:`first_appearance_codes` of Trinity's ``eid.tid`` ``(batch, task)`` pairs, given as
    the two columns. When every row has the same batch (one explore step, the usual case) only
    the tasks are factorised: no tuple per row, about twice as fast; the codes and keys are the
    same."""
    if batches and batches.count(batches[0]) == len(batches):
        code, uniq = first_appearance_codes(tasks)
        return code, [(batches[0], t) for t in uniq]
    return first_appearance_codes(list(zip(batches, tasks)))


def masked_rows(exps: list[TrinityExperience], order: MemoryOrder | None = None) -> np.ndarray | None:
    """(N,) bool in the order of ``exps``: the experience is of a member the orchestrator masked
    (``info["dso_masked"]``, zero loss weight); None when none is. One C-level pass over the
    infos :class:`MemoryOrder` read.

    Args:
        order: ``MemoryOrder(exps)`` when the caller already has it.
    """
    order = order if order is not None else MemoryOrder(exps)
    infos = order.infos
    if not any(map(operator.contains, infos, itertools.repeat(MASKED))):
        return None
    masked = np.fromiter(map(bool, map(operator.methodcaller("get", MASKED), infos)), dtype=bool, count=len(infos))
    out = np.empty_like(masked)
    out[order.pos] = masked  # items[k] is exps[pos[k]]
    return out


class MemoryOrder:
    """A batch's experiences sorted by address (``id``), ``items[k] is exps[pos[k]]``, and the
    fields every adapter reads, taken off each experience in one pass in that order.

    A batch is usually a shuffle of objects allocated one after the other, spread over many
    pages; a read of a field off each in list order misses the cache on almost every object,
    while in address order the hardware prefetcher follows. One Python loop then reads
    ``info``, ``action_mask`` and the four ``eid`` fields of each experience while it is in
    cache, where one C-level ``map`` pass per field touched every experience and every ``eid``
    again (both measured: bench/README.md, "Reading and writing experiences"). Any order gives
    the same results; this one only makes the passes cheaper.

    Attributes:
        items: the N experiences in address order.
        pos: (N,) int64, ``items[k] is exps[pos[k]]``.
        infos: each item's ``info``, a missing one (None or {}) read as an empty dict.
        masks: each item's ``action_mask`` (None where it has none).
        batches, tasks, runs, steps: each item's ``eid.batch``, ``eid.task``, ``eid.run``, ``eid.step``.
    """

    def __init__(self, exps: list[TrinityExperience]) -> None:
        self.pos = np.argsort(item_addresses(exps))  # distinct objects have distinct addresses: no ties to order
        items, infos, masks, batches, tasks, runs, steps = [], [], [], [], [], [], []
        for e in map(exps.__getitem__, self.pos.tolist()):
            items.append(e)
            infos.append(e.info or NO_INFO)
            masks.append(e.action_mask)
            eid = e.eid
            batches.append(eid.batch)
            tasks.append(eid.task)
            runs.append(eid.run)
            steps.append(eid.step)
        self.items, self.infos, self.masks = items, infos, masks
        self.batches, self.tasks, self.runs, self.steps = batches, tasks, runs, steps

    @functools.cached_property
    def back(self) -> np.ndarray:
        """(N,) int64, the inverse of :attr:`pos`: batch row i is ``items[back[i]]``."""
        return inverse(self.pos)


def item_addresses(items: list) -> np.ndarray:
    """(N,) uint64: ``id`` of each item of a list, read off the list's own array of item
    pointers (one copy of N machine words).

    An ``id`` call per item touches each object (the iteration takes a reference to it) and,
    in a shuffled batch, misses the cache on almost every one (see bench/README.md, "Reading
    and writing experiences"). This reads CPython's list layout (``ob_item``, the item pointer
    array, as the second-to-last field of ``PyListObject``), checked against ``id`` once at
    import (:data:`_LIST_POINTERS`); on other interpreters, builds without the GIL and other
    sequences it is the ``id`` pass. Like every read of the batch, it expects no other thread
    to resize the list during the call.
    """
    n = len(items)
    if _LIST_POINTERS and type(items) is list and n:
        ob_item = ctypes.c_void_p.from_address(id(items) + _OB_ITEM).value
        return np.frombuffer(ctypes.string_at(ob_item, n * _WORD), dtype=np.uint64)
    return np.fromiter(map(id, items), dtype=np.uint64, count=n)


_WORD = ctypes.sizeof(ctypes.c_void_p)
_OB_ITEM = list.__basicsize__ - 2 * _WORD  # PyListObject ends with ob_item, allocated


def _list_pointers_readable() -> bool:
    """Whether :func:`item_addresses` may read a list's pointer array (CPython with the GIL,
    the layout checked on a probe list)."""
    if sys.implementation.name != "cpython" or _WORD != 8 or not getattr(sys, "_is_gil_enabled", lambda: True)():
        return False
    probe = [object() for _ in range(5)]
    ob_item = ctypes.c_void_p.from_address(id(probe) + _OB_ITEM).value
    return ob_item is not None and np.frombuffer(ctypes.string_at(ob_item, 5 * _WORD), dtype=np.uint64).tolist() == list(map(id, probe))


_LIST_POINTERS = _list_pointers_readable()


def inverse(pos: np.ndarray) -> np.ndarray:
    """The inverse permutation: ``inverse(pos)[pos] == arange(N)``."""
    back = np.empty_like(pos)
    back[pos] = np.arange(pos.size)
    return back


def relabel_by_first_row(codes: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Codes in [0, k) renumbered in order of first appearance along the rows; also the old
    code of each new label (no sort of the rows: a first-row table over the k codes)."""
    first = first_rows(codes, k)
    old_of_new = np.argsort(first, kind="stable")
    new_of_old = np.empty(k, dtype=np.int64)
    new_of_old[old_of_new] = np.arange(k)
    return new_of_old[codes], old_of_new


def group_codes(order: MemoryOrder) -> tuple[np.ndarray, list[tuple]]:
    """(N,) int64 in the batch's order: each experience's group, Trinity's ``eid.tid``
    (explore step, task), numbered in order of first appearance in the batch (Trinity's
    ``group_by`` order); and the ``(eid.batch, eid.task)`` of each code."""
    code, uniq = tid_codes(order.batches, order.tasks)
    group, old_of_new = relabel_by_first_row(code[order.back], len(uniq))
    return group, [uniq[k] for k in old_of_new.tolist()]


def info_column(infos: list[dict], key: str, default: Any) -> tuple[list, np.ndarray | None]:
    """``info[key]`` of every step in one C-level pass, and where the key is present.

    Returns:
        the (N,) values (``default`` where absent), and None when every info has the key,
        else (N,) bool: the key is present.
    """
    try:
        return list(map(operator.itemgetter(key), infos)), None
    except KeyError:  # some steps lack it: a second pass with the default
        present = np.fromiter(map(operator.contains, infos, itertools.repeat(key)), dtype=bool, count=len(infos))
        return list(map(operator.methodcaller("get", key, default), infos)), present


def is_number(x: Any) -> bool:
    try:
        float(x)
    except (TypeError, ValueError):
        return False
    return True
