"""How the orchestrator actor makes its changes durable: :class:`Persistence` and its
:class:`Ledger`, parts of :class:`orchestrator.service.actor.Orchestrator`.

Every change is counted (``commits.changed``, :class:`orchestrator.service.commits.SharedCommits`);
the next commit takes what changed since the last one (:meth:`Persistence.prepare`), writes it
in one transaction (:meth:`Persistence._write`, :class:`orchestrator.service.store.StateStore`),
and after a failed write goes back to the last commit (:meth:`Persistence.rollback`, which
reloads it: :meth:`Persistence.load`). The retry window: the last call with an id that handed
out batches, and those batches, are committed with the hand-out, so a re-sent call is answered
with them (:meth:`Ledger.answered`). How a held group is checkpointed: see
:mod:`orchestrator.service.store`.
"""

from __future__ import annotations

import functools
import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.rows import GroupRows
from orchestrator.core.types import Batch
from orchestrator.service.store import Change, Saved, StateStore

if TYPE_CHECKING:
    from orchestrator.service.anchor_watch import AnchorWatch
    from orchestrator.service.attachment import Attachment
    from orchestrator.service.batches import ReadyBatches

log = logging.getLogger("trinity_dso.actor")


class Ledger:
    """What the next commit writes besides the core's state, and the retry window's records.

    Args:
        retry_window: how many group keys to remember, newest first (see
            :class:`~orchestrator.service.actor.Orchestrator`).
    Attributes:
        seen: filter label of the last ``retry_window`` group keys accepted; ``seen_order`` those
            keys, oldest first; ``new_seen`` the ones accepted since the last commit.
        last_call: the last call with an id that handed out batches, and those batches
            (committed); ``new_call``: set by a call, written by the next commit.
        tasks_call: the last ``next_tasks`` call with an id, and its tasks.
    """

    def __init__(self, retry_window: int) -> None:
        self.retry_window = retry_window
        self.seen: dict[str, str] = {}
        self.seen_order: deque[str] = deque()
        self.new_seen: dict[str, str] = {}
        self.last_call: tuple[str, list[Batch]] | None = None
        self.new_call: tuple[str, list[Batch]] | None = None
        self.tasks_call: tuple[str, list[str]] | None = None

    def label(self, key: str | None) -> str | None:
        """The label a group with ``key`` got when it was accepted within the retry window, else None."""
        return self.seen.get(key) if key is not None else None

    def labels(self, keys: list[str | None]) -> list[str | None]:
        """:meth:`label` of each key."""
        return list(map(self.seen.get, keys))  # None for a new key (and for None: no key is None)

    def accept(self, labels: dict[str, str]) -> None:
        """Record the labels of newly accepted groups (keys unique, none seen), forgetting the oldest
        beyond the retry window (O(1) each, no stall)."""
        self.seen.update(labels)
        self.new_seen.update(labels)
        self.seen_order.extend(labels)
        while len(self.seen_order) > self.retry_window:
            self.seen.pop(self.seen_order.popleft(), None)

    @staticmethod
    def _replay(call: tuple[str, list] | None, call_id: str | None) -> list | None:
        """What the committed ``call`` (call id, what it handed out) gave, when ``call_id`` retries it; else None."""
        return list(call[1]) if call_id is not None and call is not None and call[0] == call_id else None

    def answered(self, call_id: str | None) -> list[Batch] | None:
        """The batches that the committed call ``call_id`` handed out (a retry), else None."""
        return self._replay(self.last_call, call_id)

    def remember(self, call_id: str | None, batches: list[Batch]) -> None:
        """Record what call ``call_id`` hands out, written by the commit that covers the hand-out."""
        if call_id is not None:
            self.last_call = self.new_call = (call_id, batches)

    def tasks_answered(self, call_id: str | None) -> list[str] | None:
        """The tasks that the committed ``next_tasks`` call ``call_id`` got (a retry), else None."""
        return self._replay(self.tasks_call, call_id)

    def remember_tasks(self, call_id: str | None, tasks: list[str]) -> None:
        if call_id is not None:
            self.tasks_call = (call_id, list(tasks))

    def take(self) -> tuple[dict[str, str], tuple[str, list[Batch]] | None]:
        """The keys accepted and the call remembered since the last commit (cleared)."""
        seen, self.new_seen = self.new_seen, {}
        call, self.new_call = self.new_call, None
        return seen, call

    def state_dict(self) -> dict:
        """The small state's part: ``{"tasks_call": [id, tasks]}`` (``{}`` without one)."""
        return {"tasks_call": [self.tasks_call[0], list(self.tasks_call[1])]} if self.tasks_call is not None else {}

    def restore(self, saved: Saved) -> None:
        """Back to a committed state (the keys in the file's commit order, oldest first; trimmed by
        the next :meth:`accept`)."""
        self.seen = saved.seen
        self.seen_order = deque(self.seen)
        self.new_seen = {}
        self.last_call, self.new_call = saved.last_call, None
        call = saved.state.get("tasks_call")
        self.tasks_call = (call[0], list(call[1])) if call else None


class Persistence:
    """The commit side of the actor: load, prepare, write and roll back.

    Args:
        core: the state machine (reset in place after a failed commit).
        store: the state file, or None (then only an external ``sink`` is written).
        sink: the batch sink (a :class:`~orchestrator.service.sink.SQLiteSink` is written by the store).
        ledger: the group keys and calls to commit (:class:`Ledger`).
        ready: the emitted and handed-out batches to commit (:class:`~orchestrator.service.batches.ReadyBatches`).
        attachment: the attached run (:class:`~orchestrator.service.attachment.Attachment`).
        anchors: the anchor index's tracked keys (:class:`~orchestrator.service.anchor_watch.AnchorWatch`).
        record_error: ``record_error(kind, message)``, called after a failed commit.
    """

    def __init__(
        self,
        core: OrchestratorCore,
        store: StateStore | None,
        sink: Any,
        *,
        ledger: Ledger,
        ready: ReadyBatches,
        attachment: Attachment,
        anchors: AnchorWatch,
        record_error: Callable[[str, str], None],
    ) -> None:
        self.core, self.store, self.sink = core, store, sink
        self.ledger, self.ready, self.attachment, self.anchors = ledger, ready, attachment, anchors
        self.record_error = record_error
        self.stored: set[str] = set()  # keys of the held groups whose payload is in the store

    def load(self) -> None:
        """Restore the last committed state (start, or after a failed commit; with nothing
        committed yet, the state of a new orchestrator: a failed first commit leaves nothing)."""
        found = self.store.load() if self.store is not None else None
        saved = found if found is not None else Saved(0, {})  # nothing committed: a new orchestrator's state
        if found is not None:
            self.core.load_state_dict(saved.state, saved.groups)
        self.anchors.load_state_dict(saved.state)
        self.attachment.load_state_dict(saved.state)
        self.stored = set(saved.groups)
        self.ready.restore(saved.ready)
        self.ledger.restore(saved)
        if found is None:
            return
        log.warning(
            "resumed from %s (commit %d) at batch %d, policy revision %d, %d groups held, %d batches ready (the "
            "saved policy replaces the configured one; delete the file to start afresh)",
            self.store.path, saved.seq, self.core.batch_id, self.core.policy_revision,
            len(self.stored), len(saved.ready),
        )

    def prepare(self) -> tuple[Callable[[], None], Callable[[], None]]:
        """Take everything changed since the last commit (clearing it), for :class:`SharedCommits`:
        ``(write, done)``. ``write`` writes the batches to a sink other than :class:`SQLiteSink`
        (at least once: a crash before the commit writes them again), then the change to the
        store in one transaction: new group keys, newly held groups (written once), released
        groups, emitted batches, hand-outs and the small state. What the event loop may change
        while ``write`` runs in a worker thread is taken now: the per-task columns that changed
        (:meth:`StateStore.stage`) and the newly held groups, packed. ``done`` records which held
        groups the store now has."""
        batches, handed = self.ready.take()
        seen, call = self.ledger.take()
        external = batches if self.store is None or self.store.sink is None else []
        if self.store is None:
            return functools.partial(self._write, None, external), _nothing
        carry, candidates = self.core.carry, self.core.candidates
        held = set(carry.keys)
        held.update(candidates.keys)
        state = self.core.state(payloads=False)
        state.update(self.anchors.state_dict())
        state.update(self.attachment.state_dict())
        state.update(self.ledger.state_dict())
        small, columns = self.store.stage(state, self.core.touched_rows())  # now: the columns are the core's own arrays
        stored = self.stored
        new = [rows.take(~np.fromiter(map(stored.__contains__, rows.keys), bool, len(rows))) for rows in (carry, candidates)]
        change = Change(
            small, columns, seen=seen, hold=GroupRows.concat(*new).pack(),  # packed now, as staged
            release=list(stored - held), batches=batches, handed=handed, call=call,
        )

        def done() -> None:
            self.stored = held

        return functools.partial(self._write, change, external), done

    def _write(self, change: Change | None, external: list[Batch]) -> None:
        """The I/O of a commit (also run in a worker thread): an external sink, then the store."""
        if self.sink is not None:
            for b in external:
                self.sink.write(b)
        if change is not None:
            self.store.commit(change)

    def rollback(self) -> None:
        """After a failed commit: back to the last commit written."""
        if self.store is not None:
            log.exception("commit to %s failed: back to the last commit", self.store.path)
            self.record_error("commit", f"commit to {self.store.path} failed (back to the last commit)")
            self.core.reset()
            self.ready.restore([])
            self.load()


def _nothing() -> None:
    pass
