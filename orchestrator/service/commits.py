"""Shared commits: changes counted under the actor's lock, written in one transaction at a time,
and every call answered once a commit that covers its change is written.

The actor counts each change it makes (:meth:`SharedCommits.changed`), releases its lock, and
awaits :meth:`SharedCommits.durable` of that count. While one commit is written in a worker
thread, the calls that arrive meanwhile wait for the next one, which covers all of their
changes at once (what databases call group commit). A failed commit goes back to the last one
written (``rollback``) and fails every call whose change it held.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

Prepare = Callable[[], tuple[Callable[[], None], Callable[[], None]]]
"""``prepare() -> (write, done)``: take everything changed since the last commit (clearing it);
``write()`` does its I/O (maybe in a worker thread), ``done()`` runs on the caller's thread once
it is written."""


class SharedCommits:
    """One writer at a time; calls wait for a commit that covers their change, and the calls
    that arrive while one is written share the next (a database's *group commit*; the name
    avoids "group", which here means the rollouts of one task).

    Args:
        prepare: see :data:`Prepare`; called on the event loop (or the caller's thread).
        rollback: called after a failed ``write``: go back to the last commit written.
    Attributes:
        committing: a commit is being written in a worker thread.
    """

    def __init__(self, prepare: Prepare, rollback: Callable[[], None]) -> None:
        self._prepare, self._rollback = prepare, rollback
        self.committing = False
        self._again = False  # something asked for a commit while one was written: commit once it is done
        self._tick = 0  # changes counted so far
        self._upto = 0  # changes covered by the commits written
        self._waiters: list[asyncio.Future] = []

    def changed(self) -> int:
        """Count a change; the caller answers once :meth:`durable` of the count returned is done
        (outside its lock, so that concurrent calls share the commit)."""
        self._tick += 1
        return self._tick

    @property
    def pending(self) -> int:
        """The count of the last change (what a caller holding the lock awaits)."""
        return self._tick

    def commit(self) -> None:
        """Commit now, on this thread. While a commit is written in a worker thread this one is
        left to the commit that follows it: the change is not on disk yet when this returns (the
        async calls use :meth:`durable` instead).

        Raises:
            whatever ``write`` raised, after ``rollback``.
        """
        if self.committing:
            self._again = True
            return
        upto = self._tick
        write, done = self._prepare()
        try:
            write()
        except BaseException as exc:
            self._failed(exc)
            raise
        self._written(upto, done)

    async def commit_async(self) -> None:
        """:meth:`commit` with the writing in a worker thread (the event loop keeps answering);
        then the commit that was asked for meanwhile, if any."""
        if self.committing:
            self._again = True
            return
        upto = self._tick
        write, done = self._prepare()
        self.committing = True
        try:
            await asyncio.to_thread(write)
        except BaseException as exc:
            self.committing = False
            self._failed(exc)
            raise
        self.committing = False
        self._written(upto, done)
        if self._again:  # asked for meanwhile: those calls wait in durable (or were synchronous)
            self._again = False
            try:
                await self.commit_async()
            except Exception:  # rolled back and raised to the calls it held (_wake); this call's change is written
                pass

    async def durable(self, mine: int) -> None:
        """Return once change ``mine`` is committed: write a commit when none is being written,
        else wait for the next one.

        Raises:
            RuntimeError: the commit failed (the state went back to the last commit).
        """
        while self._upto < mine:
            if self.committing:
                fut = asyncio.get_running_loop().create_future()
                self._waiters.append(fut)
                await fut
            else:
                await self.commit_async()

    def _written(self, upto: int, done: Callable[[], None]) -> None:
        """A commit covering the changes up to ``upto`` is written: record it, answer the waiters."""
        done()
        self._upto = upto
        self._wake()

    def _failed(self, exc: BaseException) -> None:
        """A commit failed: back to the last one written; its waiters fail with ``exc``."""
        self._rollback()
        self._wake(exc)

    def _wake(self, exc: BaseException | None = None) -> None:
        """Answer the calls waiting in :meth:`durable`: they look again, or fail with ``exc``."""
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if fut.done():
                continue
            if exc is None:
                fut.set_result(None)
            else:
                fut.set_exception(RuntimeError(f"the commit of this change failed and was rolled back: {exc!r}"))
