"""Writing token advantages back onto Trinity experiences: one batch of arrays in, a constant
number of tensor operations for the whole batch, one view per experience out."""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import gc
import itertools
import operator
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from trinity.common.experience import Experience as TrinityExperience

from orchestrator.trinity.fields import MemoryOrder


class TokenMasks:
    """A batch's action masks (as :class:`~orchestrator.trinity.fields.MemoryOrder` read them)
    joined into one float32 array in a worker thread: torch releases the GIL while it copies,
    so the caller reads the ``info`` keys and computes advantages meanwhile (see
    bench/README.md, "Reading and writing experiences"). Made as soon as the batch is read, handed to
    :func:`write_token_advantages`.

    Attributes:
        masks: each experience's ``action_mask``, in the order of ``order.items``.
        complete: every experience has a mask (the join starts only then).
    """

    def __init__(self, order: MemoryOrder) -> None:
        self.order = order
        self.masks = order.masks
        self.complete = not any(map(operator.is_, self.masks, itertools.repeat(None)))
        self._joined = _worker().submit(_join, self.masks) if self.complete else None

    def joined(self) -> tuple[np.ndarray, np.ndarray | None]:
        """The joined masks, waiting for the worker: ``((N, T) float32, None)`` for equal lengths,
        else ``(flat float32, (N,) lengths)``.

        Raises:
            ValueError: some experience has no ``action_mask`` (:attr:`complete` is False; nothing was joined).
        """
        if self._joined is None:
            raise ValueError("TokenMasks.joined: some experiences have no action_mask, so nothing was joined")
        return self._joined.result()


def _join(masks: list[torch.Tensor]) -> tuple[np.ndarray, np.ndarray | None]:
    """The masks as float32: ``((N, T) array, None)`` when they have one length T > 0 (one
    ``torch.stack``), else ``(flat array, (N,) lengths)`` (one ``torch.cat``)."""
    try:
        flat = torch.stack(masks)
    except RuntimeError:  # ragged masks
        flat = None
    if flat is not None and flat.ndim == 2 and flat.shape[1] > 0:
        return flat.to(torch.float32).numpy(), None
    lengths = np.fromiter(map(torch.Tensor.numel, masks), dtype=np.int64, count=len(masks))
    return torch.cat(masks).reshape(-1).to(torch.float32).numpy(), lengths


@functools.cache
def _worker() -> concurrent.futures.ThreadPoolExecutor:
    """One thread per process for :class:`TokenMasks` (made on first use)."""
    return concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="dso-masks")


def write_token_advantages(
    exps: list[TrinityExperience], scalars: Any, *, order: MemoryOrder | None = None, masks: TokenMasks | None = None
) -> None:
    """Set ``advantages = A * action_mask`` and ``returns`` (an equal copy) on every experience.

    The result is bit for bit the per-experience ``action_mask.to(float32) * A`` then
    ``.clone()`` of Trinity's ``gigpo`` / ``grpo`` write-back (``GiGPOAdvantageFn._apply_mask``:
    A rounded to float32, a 0 mask entry gives a signed zero), done for the whole batch as one
    concatenation of the masks (:class:`TokenMasks`: one ``torch.stack`` into (N, T) when they
    have equal lengths, else one ``torch.cat``), one multiply (a broadcast over the rows, else
    with the scalars repeated over the tokens) and one copy. The two arrays are then split into per-experience
    views (their rows, or slices at the mask boundaries), each wrapped without copying by
    ``torch.from_numpy`` (a C-level ``map``) and both assigned in one visit of each experience,
    not one ``map(setattr)`` pass per field (see bench/README.md, "Reading and writing
    experiences"). The views do
    not overlap, and each is its own storage for torch (pickling or serialising one experience writes only its own tokens;
    Trinity's ``Experience.serialize_many`` sees distinct storages and clones nothing). An
    experience without ``action_mask`` gets a 0-dim ``tensor(A, float32)``, as in Trinity. The
    experiences are visited in memory order (:class:`~orchestrator.trinity.fields.MemoryOrder`), which only changes which
    rows of the arrays back which experience.

    Args:
        exps: N experiences; ``action_mask`` (T_i,) bool / int / float on the CPU, or None.
        scalars: (N,) float, one advantage per experience, in the order of ``exps``.
        order: ``MemoryOrder(exps)`` when the caller already has it (read the rows with it).
        masks: ``TokenMasks(order)`` when the caller started the join before computing ``scalars``.
    Raises:
        ValueError: ``scalars`` is not one value per experience, or ``masks`` not one per experience.
    """
    a = np.asarray(scalars, dtype=np.float32).reshape(-1)
    if a.shape[0] != len(exps):
        raise ValueError(f"scalars: {a.shape[0]} values for {len(exps)} experiences")
    if not exps:
        return
    if masks is None:
        masks = TokenMasks(order if order is not None else MemoryOrder(exps))
    elif len(masks.masks) != len(exps):
        raise ValueError(f"masks: {len(masks.masks)} masks for {len(exps)} experiences (TokenMasks of another batch)")
    order = masks.order
    exps, pos = order.items, order.pos  # memory order: each pass walks the heap forward
    a = a[pos]
    if masks.complete:
        joined, lengths = masks.joined()
    else:
        present = [k for k, m in enumerate(masks.masks) if m is not None]
        for k in sorted(set(range(len(exps))) - set(present)):
            exps[k].advantages = torch.tensor(float(a[k]), dtype=torch.float32)
            exps[k].returns = exps[k].advantages.clone()
        if not present:
            return
        exps = [exps[k] for k in present]
        a = a[present]
        joined, lengths = _join([masks.masks[k] for k in present])
    if lengths is None:  # equal lengths: the rows are the views
        adv = joined * a[:, None]
        ret = adv.copy()
        adv_parts, ret_parts = map(torch.from_numpy, adv), map(torch.from_numpy, ret)
    else:
        adv = joined * np.repeat(a, lengths)
        ret = adv.copy()
        ends = np.cumsum(lengths)
        cuts = list(map(slice, (ends - lengths).tolist(), ends.tolist()))
        adv_parts = map(torch.from_numpy, map(adv.__getitem__, cuts))
        ret_parts = map(torch.from_numpy, map(ret.__getitem__, cuts))
    with gc_paused():  # 2N new tensors, no reference cycles: no collection is due for them
        for e, x, y in zip(exps, adv_parts, ret_parts):  # one visit per experience sets both
            e.advantages = x
            e.returns = y


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a batch allocates its many acyclic objects,
    and file what they leave alive under the oldest generation.

    Each allocation would otherwise count towards a collection that scans the whole heap (a
    first write-back of a large batch spent most of its time in collections; ``dso_gigpo`` is
    paused over its reading and maths too; see bench/README.md, "Reading and writing
    experiences").
    On exit the objects the young generations hold, the batch's new tensors above all, are
    moved to the oldest one by ``gc.freeze()`` then ``gc.unfreeze()`` (two O(1) list splices
    that also restart the young count): they live until the trainer's step is done, so they
    would have survived two young collections to get there; those walks are skipped (same
    section). Garbage cycles among them wait for the next full collection instead. Done only
    when nothing is frozen (``gc.get_freeze_count() == 0``): a process that froze its heap, as
    our actor does, keeps its frozen set as it was. Restored on exit, also when the collector
    was already disabled by the caller (then nothing is moved)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        gc.enable()
