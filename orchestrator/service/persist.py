"""How the orchestrator actor makes its changes durable: :class:`Persistence`, a part of
:class:`orchestrator.service.actor.Orchestrator`.

Every change is counted (``commits.changed``, :class:`orchestrator.service.commits.SharedCommits`);
the next commit takes what changed since the last one (:meth:`Persistence._prepare`), writes it
in one transaction (:meth:`Persistence._write`, :class:`orchestrator.service.store.StateStore`),
and after a failed write goes back to the last commit (:meth:`Persistence._rollback`, which
reloads it: :meth:`Persistence._load`). The retry window: the last call with an id that handed
out batches, and those batches, are committed with the hand-out, so a re-sent call is answered
with them (:meth:`Persistence._answered`). How a held group is checkpointed: see
:mod:`orchestrator.service.store`.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.rows import GroupRows
from orchestrator.core.types import Batch
from orchestrator.service.store import Change, Saved

log = logging.getLogger("trinity_dso.actor")


class Persistence:
    """The commit side of the actor: load, prepare, write, roll back, and the retry window's
    answers. Mixed into :class:`~orchestrator.service.actor.Orchestrator`, whose attributes
    (``core``, ``store``, ``sink``, ``commits``, ``_lock`` and the ``_new_*`` change records)
    it uses."""

    def _load(self) -> None:
        """Restore the last committed state (start, or after a failed commit; with nothing
        committed yet, the state of a new orchestrator: a failed first commit leaves nothing)."""
        found = self.store.load() if self.store is not None else None
        saved = found if found is not None else Saved(0, {})  # nothing committed: a new orchestrator's state
        if found is not None:
            self.core.load_state_dict(saved.state, saved.groups)
        self._anchor_load_state_dict(saved.state)
        self._anchor_guard = saved.state.get("anchor_guard")
        self._anchor_lost = dict.fromkeys(saved.state.get("anchor_lost") or ())
        self.attachment = dict(saved.state.get("attachment") or {})
        self._seen, self._stored, self.ready = saved.seen, set(saved.groups), saved.ready
        self._seen_order = deque(self._seen)  # oldest first (the file's commit order); trimmed by the next submit
        self._new_seen, self._new_batches, self._handed = {}, [], []
        self._last_call, self._new_call = saved.last_call, None
        call = saved.state.get("tasks_call")
        self._tasks_call = (call[0], list(call[1])) if call else None
        if found is None:
            return
        log.warning(
            "resumed from %s (commit %d) at batch %d, policy revision %d, %d groups held, %d batches ready (the "
            "saved policy replaces the configured one; delete the file to start afresh)",
            self.store.path, saved.seq, self.core.batch_id, self.core.policy_revision,
            len(self._stored), len(self.ready),
        )

    def _prepare(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """Take everything changed since the last commit (clearing it), for :class:`SharedCommits`:
        ``(write, done)``. ``write`` writes the batches to a sink other than :class:`SQLiteSink`
        (at least once: a crash before the commit writes them again), then the change to the
        store in one transaction: new group keys, newly held groups (written once), released
        groups, emitted batches, hand-outs and the small state. What the event loop may change
        while ``write`` runs in a worker thread is taken now: the per-task columns that changed
        (:meth:`StateStore.stage`) and the newly held groups, packed. ``done`` records which held
        groups the store now has."""
        batches, self._new_batches = self._new_batches, []
        seen, self._new_seen = self._new_seen, {}
        handed, self._handed = self._handed, []
        call, self._new_call = self._new_call, None
        external = batches if self.store is None or self.store.sink is None else []
        if self.store is None:
            return functools.partial(self._write, None, external), _nothing
        carry, candidates = self.core.carry, self.core.candidates
        held = set(carry.keys)
        held.update(candidates.keys)
        state = self.core.state(payloads=False)
        state.update(self._anchor_state_dict())
        state["attachment"] = dict(self.attachment)
        if self._tasks_call is not None:
            state["tasks_call"] = [self._tasks_call[0], list(self._tasks_call[1])]
        if self._anchor_guard is not None:
            state["anchor_guard"] = self._anchor_guard
        if self._anchor_lost:
            state["anchor_lost"] = list(self._anchor_lost)
        small, columns = self.store.stage(state, self.core.touched_rows())  # now: the columns are the core's own arrays
        stored = self._stored
        new = [rows.take(~np.fromiter(map(stored.__contains__, rows.keys), bool, len(rows))) for rows in (carry, candidates)]
        change = Change(
            small, columns, seen=seen, hold=GroupRows.concat(*new).pack(),  # packed now, as staged
            release=list(stored - held), batches=batches, handed=handed, call=call,
        )

        def done() -> None:
            self._stored = held

        return functools.partial(self._write, change, external), done

    def _write(self, change: Change | None, external: list[Batch]) -> None:
        """The I/O of a commit (also run in a worker thread): an external sink, then the store."""
        if self.sink is not None:
            for b in external:
                self.sink.write(b)
        if change is not None:
            self.store.commit(change)

    def _rollback(self) -> None:
        """After a failed commit: back to the last commit written."""
        if self.store is not None:
            log.exception("commit to %s failed: back to the last commit", self.store.path)
            self._record_error("commit", f"commit to {self.store.path} failed (back to the last commit)")
            self.core = OrchestratorCore(self.core.policy, self.core.task_ids, seed=self.core.seed,
                                         task_tags=self.core.passrate.task_tags(), task_texts=self.core.task_texts)
            self.ready = []
            self._load()

    def _answered(self, call_id: str | None) -> list[Batch] | None:
        """The batches that the committed call ``call_id`` handed out (a retry), else None."""
        if call_id is not None and self._last_call is not None and self._last_call[0] == call_id:
            return list(self._last_call[1])
        return None

    def _remember(self, call_id: str | None, batches: list[Batch]) -> None:
        """Record what call ``call_id`` hands out, written by the commit that covers the hand-out."""
        if call_id is not None:
            self._last_call = self._new_call = (call_id, batches)

    async def _committed(self, change: Callable[[], Any]) -> Any:
        """``change()`` under the lock, returned once a commit covers it."""
        async with self._lock:
            out = change()
            mine = self.commits.changed()
        await self.commits.durable(mine)
        return out


def _nothing() -> None:
    pass
