"""How groups come into the orchestrator actor: :class:`Submission`, a part of
:class:`orchestrator.service.actor.Orchestrator`.

Groups are submitted from outside (a list of :class:`~orchestrator.core.types.Group`, or one
:class:`~orchestrator.core.types.GroupTable`, the Trinity operator's) or rolled by the actor's
own rollout source (:meth:`Submission.roll`). Each group is identified by its key
(:func:`~orchestrator.core.types.group_key`; ``anon:<call_id>:<position>`` without a round tag),
so a group submitted again within the retry window is recognised and answered with its label.
A list is handled in slices of :data:`SLICE_ROLLOUTS` rollouts (the actor answers other calls
between slices) and committed every :data:`COMMIT_ROLLOUTS` rollouts.
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from algos.dapo import InvalidGroupError
from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.rounds import ScreenPlan
from orchestrator.core.table import table_error
from orchestrator.core.types import Batch, Group, GroupTable, group_key
from orchestrator.rollout.screening import screened_generate
from orchestrator.rollout.source import RolloutSource
from orchestrator.service.commits import SharedCommits
from orchestrator.service.persist import Ledger

if TYPE_CHECKING:
    from orchestrator.service.batches import ReadyBatches

SLICE_ROLLOUTS = 256
"""Rollouts handled per slice of a submit; the actor answers other calls between slices."""

COMMIT_ROLLOUTS = 4096
"""A large submit commits after about this many rollouts (and at its end)."""

_KEY, _REASON, _SIZE = operator.attrgetter("key"), operator.attrgetter("reason"), operator.attrgetter("size")


class Submission:
    """Submit (list or table route), deduplicate and commit as it goes; roll planned rounds.

    Args:
        core: the state machine.
        lock: the actor's lock (core state is changed under it).
        commits: the actor's commits.
        ready: the released batches (:class:`~orchestrator.service.batches.ReadyBatches`).
        ledger: the group keys accepted and the retry window's calls
            (:class:`~orchestrator.service.persist.Ledger`).
        rollout_source: rolls planned rounds (None: groups are only submitted from outside).
        observe: ``observe()``, called after a change (the actor's background jobs).
    """

    def __init__(
        self,
        core: OrchestratorCore,
        *,
        lock: asyncio.Lock,
        commits: SharedCommits,
        ready: ReadyBatches,
        ledger: Ledger,
        rollout_source: RolloutSource | None,
        observe: Callable[[], None],
    ) -> None:
        self.core, self.lock, self.commits = core, lock, commits
        self.ready, self.ledger = ready, ledger
        self.rollout_source, self.observe = rollout_source, observe

    def roll(self, tasks: list, version: int, round_tag: str, screening: ScreenPlan) -> tuple[list[Group], Any]:
        """Roll one planned round through the rollout source (off the lock), with screens where
        ``screening`` says (:meth:`~orchestrator.core.rounds.Rounds.screen_plan`,
        :mod:`orchestrator.rollout.screening`). Returns the groups and the screens' result (None
        without screens), which the caller records under the lock."""
        p = self.core.policy
        if not screening.screen.any():
            return self.rollout_source.generate(tasks, p.group_size, model_version=version, round_tag=round_tag), None
        f = p.filter
        res = screened_generate(self.rollout_source, tasks, p.group_size, p.mode_options("screen").rollouts, screening.screen, judge=f.judge,
                                correct_threshold=f.correct_threshold, model_version=version, round_tag=round_tag,
                                go_if_correct=screening.go_if_correct, go_if_wrong=screening.go_if_wrong,
                                std_tol=f.std_tol, wrong_threshold=f.wrong_threshold, band=f.band)
        return res.groups, res

    async def call(
        self, groups: list[Group] | GroupTable, on_invalid: str, *, pop: bool, call_id: str | None = None,
        held: bool = False,
    ) -> tuple[Any, list[Batch]] | tuple[Any, list[Batch], list[str]]:
        """Submit a list or a table and, with ``pop``, take every ready batch; return the labels
        and the batches (and with ``held`` the held refs) once a commit covers them (outside the
        lock: concurrent calls share it)."""
        async with self.lock:
            if isinstance(groups, GroupTable):
                labels = await self._submit_table(groups, on_invalid, call_id=call_id)
            else:
                labels = await self.submit(groups, on_invalid, call_id=call_id)
            batches = self.ledger.answered(call_id) or []  # a retry of a committed call: its batches again
            fresh = []
            while pop and (batch := self.ready.hand_out()) is not None:
                fresh.append(batch)
            batches += fresh
            if fresh:
                self.ledger.remember(call_id, batches)
            refs = held_refs(self.core) if held else None
            mine = self.commits.pending
        await self.commits.durable(mine)
        return (labels, batches, refs) if held else (labels, batches)

    @staticmethod
    def _slices(items: list, rollouts: Any) -> list[list]:
        out: list[list] = [[]]
        size = 0
        for item in items:
            if out[-1] and size >= SLICE_ROLLOUTS:
                out.append([])
                size = 0
            out[-1].append(item)
            size += rollouts(item)
        return out if out[0] else []

    async def submit(self, groups: list[Group], on_invalid: str = "raise", *, emit: bool = True,
                      call_id: str | None = None) -> list[str]:
        """Validate, deduplicate and submit ``groups`` in slices, committing as it goes.

        ``emit``: release every full batch into the ready queue (``submit_groups``, whose
        callers pop batches). ``next_batch`` passes False: it releases one batch per call, so
        surplus informative groups stay carried over and are judged for staleness (against
        the model version of the moment) when their batch is assembled.
        """
        if not isinstance(groups, list):
            raise InvalidGroupError(f"groups: expected a list of groups, got {type(groups).__name__}")
        if on_invalid not in ("raise", "drop"):
            raise ValueError(f"on_invalid: must be 'raise' or 'drop', got {on_invalid!r}")
        n_of = lambda g: len(getattr(g, "rollouts", None) or ()) + 1  # noqa: E731
        checked: list = [None] * len(groups)
        if on_invalid == "raise":  # all checked before anything changes
            checked = []
            for part in self._slices(groups, n_of):
                checked.extend(self.core.check_groups(part))
                await asyncio.sleep(0)
        keys = []
        for g in groups:
            try:
                keys.append(group_key(g))
            except Exception:  # an invalid group (dropped below under on_invalid="drop") has no identity
                keys.append(None)
        keys = _anonymous_keys(self._call_keys(keys), call_id)
        fresh = []
        for g, k, values in zip(groups, keys, checked):
            if (label := self.ledger.label(k)) is not None:
                g.reason = label
                continue
            g.key = k if k is not None else f"anon:{uuid.uuid4().hex}"
            fresh.append((g, values))
        parts = self._slices(fresh, lambda item: n_of(item[0]))

        def submit(i: int) -> tuple[list[str], list[str], int]:
            part = parts[i]
            checked = [c for _, c in part] if on_invalid == "raise" else None
            # the slices of one call are one round
            done = self.core.submit([g for g, _ in part], on_invalid=on_invalid, checked=checked, new_round=i == 0)
            return list(map(_KEY, done)), list(map(_REASON, done)), sum(map(_SIZE, done))

        await self._submit_parts(len(parts), submit, emit)
        return [g.reason for g in groups]

    async def _submit_table(self, table: GroupTable, on_invalid: str, *, emit: bool = True,
                            call_id: str | None = None) -> np.ndarray:
        """:meth:`_submit` of a table: the same identities (:meth:`GroupTable.keys`), with the rows
        checked and accepted in one vectorised pass (no per-rollout objects, no slices).

        The call is one round, whatever it releases: a batch released by it does not start a
        new round within it (the list route releases between slices of about
        :data:`SLICE_ROLLOUTS` rollouts and counts the rest of the call as the next batch's first
        round). Batches are the same either way; round counters and the padding candidates of
        a batch released inside a call can differ.
        """
        if not isinstance(table, GroupTable):
            raise InvalidGroupError(f"groups: expected a GroupTable, got {type(table).__name__}")
        if on_invalid not in ("raise", "drop"):
            raise ValueError(f"on_invalid: must be 'raise' or 'drop', got {on_invalid!r}")
        keys = _anonymous_keys(self._call_keys(table.keys()), call_id)
        labels = self.ledger.labels(keys)
        fresh = [i for i, label in enumerate(labels) if label is None]
        todo = table.take(fresh) if len(fresh) < len(table) else table
        checked = None
        if on_invalid == "raise" and fresh:  # all checked before anything changes
            checked = self.core.check_table(todo)
            if checked.errors:
                raise table_error(checked.errors)
        held = [k if k is not None else f"anon:{uuid.uuid4().hex}" for k in map(keys.__getitem__, fresh)]

        def submit(_: int) -> tuple[list[str], list[str], int]:  # one vectorised pass: the whole call is one round
            rows = self.core.submit_table(todo, on_invalid, checked=checked, keys=held)
            if len(fresh) == len(labels):
                labels[:] = rows.reasons
            else:
                for row, reason in zip(fresh, rows.reasons):
                    labels[row] = reason
            return held, rows.reasons, sum(rows.sizes)

        await self._submit_parts(1 if fresh else 0, submit, emit)
        return np.array(labels, dtype=str)

    @staticmethod
    def _call_keys(keys: list[str | None]) -> list[str | None]:
        """A task drawn twice in one round: its second group is ``<key>#1`` (the same again on a retry)."""
        if len(set(keys)) == len(keys):  # no key repeats (the usual case): the keys as they are
            return keys
        counts = Counter(keys)
        repeated = {k for k, c in counts.items() if c > 1 and k is not None}
        occurrences: dict[str, int] = defaultdict(int)
        out = list(keys)
        for i in [i for i, k in enumerate(keys) if k in repeated]:  # only the repeated keys are renamed
            k = keys[i]
            occurrences[k] += 1
            if occurrences[k] > 1:
                out[i] = f"{k}#{occurrences[k] - 1}"
        return out

    async def _submit_parts(self, count: int, submit: Any, emit: bool) -> None:
        """Run ``submit(i)`` for each slice ``i`` of one call (one round; it returns the slice's
        keys, labels and rollouts): record the labels, release full batches (``emit``), commit
        every :data:`COMMIT_ROLLOUTS` rollouts; the end is committed by the caller's
        ``commits.durable``, after it releases the lock."""
        if count:
            self.ready.start_clock()
        uncommitted = 0
        for i in range(count):
            keys, reasons, rollouts = submit(i)
            self.ledger.accept(dict(zip(keys, reasons)))  # new keys only: the fresh groups of one call, keys unique
            while emit and (batch := self.core.try_emit()) is not None:
                self.ready.finish(batch)
                if self.core.carry:  # the next batch starts with the groups carried over
                    self.ready.start_clock()
            uncommitted += rollouts
            if i == count - 1:  # the caller waits for it outside the lock (commits.durable)
                self.commits.changed()
                self.observe()
            elif uncommitted >= COMMIT_ROLLOUTS:
                await self.commits.commit_async()
                self.observe()
                uncommitted = 0
            await asyncio.sleep(0)


def _anonymous_keys(keys: list[str | None], call_id: str | None) -> list[str | None]:
    """Keys for the groups without one (no round tag): ``anon:<call_id>:<position>`` with a call id,
    so a re-sent call is recognised; None (a fresh ``anon:<uuid>`` at each call) without."""
    if call_id is None or None not in keys:
        return keys
    return [k if k is not None else f"anon:{call_id}:{i}" for i, k in enumerate(keys)]


def held_refs(core: OrchestratorCore) -> list[str]:
    """The ``ref`` of every group the core holds (carry pool and padding candidates)."""
    return [ref for ref in core.carry.refs + core.candidates.refs if ref]
