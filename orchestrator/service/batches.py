"""How batches leave the orchestrator actor: :class:`ReadyBatches` and :class:`BatchHandOut`,
parts of :class:`orchestrator.service.actor.Orchestrator`.

A batch released by the core is sealed and queued as ready (:meth:`ReadyBatches.finish`); a
call takes the oldest ready one, and returns it once the hand-out is committed (a batch is
handed out once; with a ``call_id``, a re-sent call gets the same batch again). ``next_batch``
also fills batches itself, running rounds through the rollout source; ``finish_batch`` and
``close_batch`` release the kept groups at the end of data or on demand.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np

from orchestrator.core.machine import DataExhaustedError, OrchestratorCore
from orchestrator.core.rounds import ScreenPlan
from orchestrator.core.types import Batch, TaskSetLike
from orchestrator.rollout.source import RolloutSource
from orchestrator.service.commits import SharedCommits
from orchestrator.service.persist import Ledger
from orchestrator.service.submit import Submission


class ReadyBatches:
    """Released batches: ready to hand out, and what the next commit writes of them.

    Args:
        commits: counts each hand-out as a change.
        observe: ``observe(batch)``, called with each released batch (the actor's metrics).
    Attributes:
        batches: ready to hand out, oldest first.
        started: when the open batch's first round started (``time.monotonic``), or None.
    """

    def __init__(self, commits: SharedCommits, observe: Callable[..., None]) -> None:
        self.commits, self.observe = commits, observe
        self.batches: list[Batch] = []
        self.started: float | None = None
        self._new: list[Batch] = []  # released since the last commit
        self._handed: list[int] = []  # ids handed out since the last commit

    def start_clock(self) -> None:
        """The open batch's first round starts now (unless one already did)."""
        if self.started is None:
            self.started = time.monotonic()

    def finish(self, batch: Batch) -> None:
        """Record a released batch: ready to hand out, written by the next commit."""
        batch.fill_seconds = time.monotonic() - self.started if self.started else 0.0
        self.started = None
        batch.seal()  # final from here: the commit and the reply pickle it once
        self._new.append(batch)
        self.batches.append(batch)
        self.observe(batch)

    def hand_out(self) -> Batch | None:
        """Take the oldest ready batch; the caller returns it once the hand-out is committed
        (``commits.durable`` of the change count after it, outside the lock: concurrent calls share
        commits; if that commit fails, the batch is ready again, see
        :meth:`~orchestrator.service.persist.Persistence.rollback`)."""
        if not self.batches:
            return None
        batch = self.batches.pop(0)
        self._handed.append(batch.batch_id)
        self.commits.changed()
        return batch

    def take(self) -> tuple[list[Batch], list[int]]:
        """The batches released and the ids handed out since the last commit (cleared)."""
        new, self._new = self._new, []
        handed, self._handed = self._handed, []
        return new, handed

    def restore(self, ready: list[Batch]) -> None:
        """Back to a committed state: ``ready`` batches, nothing new."""
        self.batches, self._new, self._handed = ready, [], []


class BatchHandOut:
    """Hand out batches; fill them through the rollout source.

    Args:
        core: the state machine.
        lock: the actor's lock (core state is changed under it).
        commits: the actor's commits.
        ready: the released batches (:class:`ReadyBatches`).
        ledger: the retry window's calls (:class:`~orchestrator.service.persist.Ledger`).
        submission: submits the groups rolled (:class:`~orchestrator.service.submit.Submission`).
        task_set: resolves task ids to tasks.
        rollout_source: rolls rounds out (None: groups are only submitted from outside).
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
        submission: Submission,
        task_set: TaskSetLike,
        rollout_source: RolloutSource | None,
        observe: Callable[..., None],
    ) -> None:
        self.core, self.lock, self.commits = core, lock, commits
        self.ready, self.ledger, self.submission = ready, ledger, submission
        self.task_set, self.rollout_source, self.observe = task_set, rollout_source, observe

    async def next_batch(self, timeout_s: float | None = None, call_id: str | None = None) -> Batch | None:
        """Fill and return the next batch, running rounds through the rollout source.

        Returns None when ``timeout_s`` passes while replenishment is paused. At the end of
        data (``max_epochs`` / ``max_rollouts``) the kept groups come out as a last batch per
        ``on_cap``; the call after that raises :class:`DataExhaustedError`.

        ``call_id``: as for :meth:`pop_batch`, a re-sent call whose first attempt handed out a
        batch gets that batch again. Without an id (at most once), a batch handed out by a call
        whose reply is lost stays handed out (it is in the sink).
        Raises:
            ReplenishCapError: cap hit under ``on_cap='raise'`` (the open batch is kept).
            DataExhaustedError: no task left and no batch to release.
            RuntimeError: no rollout source is attached.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            out = None
            async with self.lock:
                if again := self.ledger.answered(call_id):  # a re-sent call whose first attempt was committed
                    return again[0]
                if not self.ready.batches and (batch := self.core.try_emit()) is not None:
                    self.ready.finish(batch)
                if self.ready.batches:
                    out = self.ready.hand_out()
                elif self.rollout_source is None:
                    raise RuntimeError("next_batch: this orchestrator has no rollout source; submit groups and use pop_batch")
                elif self.core.cap_reached():
                    self.ready.finish(self.core.close_at_cap())
                    out = self.ready.hand_out()
                elif not (blocked := self.core.replenish_blocked()) and self.core.exhausted():
                    self._finish_last()
                    out = self.ready.hand_out()
                elif not blocked:
                    self.ready.start_clock()
                    plan = self.core.plan_round()
                    version = self.core.model_version
                    answer_screen = self.core.policy.screen == "answer"
                    # with the answer screen, the screen plan is made for the tasks it keeps
                    screening = None if answer_screen else self.core.screen_plan(plan.task_ids)
                if out is not None:
                    self.ledger.remember(call_id, [out])
                mine = self.commits.pending
            if out is not None:
                await self.commits.durable(mine)
                return out
            if blocked:
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                await asyncio.sleep(0.05)
                continue
            # the rollouts run without the lock: policy, stats and pings are answered meanwhile
            tasks = [self.task_set.get(t) for t in plan.task_ids]
            tag = f"b{plan.batch_id}r{plan.round}"
            if answer_screen:
                tasks, screening = await self._answer_screen(tasks, tag)
            groups, screens = await asyncio.to_thread(self.submission.roll, tasks, version, tag, screening)
            for g in groups:
                g.purpose, g.round = plan.purpose, plan.round
            async with self.lock:
                if screens is not None:
                    self.core.record_screens(screens.screened, screens.stopped_task_ids, screens.stopped_correct,
                                             screens.stopped_trials)
                await self.submission.submit(groups, emit=False)
                mine = self.commits.pending
            await self.commits.durable(mine)

    async def _answer_screen(self, tasks: list, tag: str) -> tuple[list, ScreenPlan]:
        """The answer screen of a planned round (``policy.screen: answer``): score the tasks' answers
        (off the lock; a recent settled score is reused instead, :meth:`~orchestrator.core.rounds.Rounds.answer_reused`),
        keep what :meth:`~orchestrator.core.rounds.Rounds.answer_screen` keeps, and top the round
        up (:meth:`~orchestrator.core.rounds.Rounds.answer_top_up`) until the kept tasks are
        expected to fill the batch; returns the tasks to roll and their screen plan."""
        kept: list = []
        pending, part = tasks, 0
        async with self.lock:
            prob = self.core.answer_reused([t.task_id for t in pending])
        while pending:
            fresh = np.isnan(prob)
            if fresh.any():
                prob[fresh] = await asyncio.to_thread(self.rollout_source.answer_probability, [t for t, f in zip(pending, fresh) if f])
            async with self.lock:  # one hold: record this part, draw the top-up, read its reusable scores
                keep = self.core.answer_screen([t.task_id for t in pending], prob, tag if part == 0 else f"{tag}.{part}", fresh)
                kept += [t for t, k in zip(pending, keep) if k]
                pending = [self.task_set.get(t) for t in self.core.answer_top_up()]
                prob = self.core.answer_reused([t.task_id for t in pending])
            part += 1
        async with self.lock:
            return kept, self.core.screen_plan([t.task_id for t in kept])

    async def pop_batch(self, call_id: str | None = None) -> Batch | None:
        """The oldest emitted batch not yet handed out, if any (never blocks, never rolls out).

        The hand-out is committed before the batch is returned: a batch is handed out once. None
        is answered at once, without waiting for other calls' commits (it changed nothing; the
        two-call pattern, submit then pop until None, 49,100-49,800 -> 51,200-51,500 groups/s
        from 16 callers). ``call_id``: as for :meth:`submit_and_pop`, a retry of a committed
        call gets its batch again.
        """
        return await self._hand_out_call(call_id)

    async def _hand_out_call(self, call_id: str | None, make: Callable[[], None] | None = None) -> Batch | None:
        """Hand out the oldest ready batch, after ``make()`` (which may emit one) when none is
        ready and ``make`` is given; with ``call_id``, answer a retry of a committed call with
        the batch it handed out."""
        async with self.lock:
            again = self.ledger.answered(call_id)
            if again:
                batch = again[0]
            else:
                if not self.ready.batches and make is not None:
                    make()
                batch = self.ready.hand_out()
                if batch is not None:
                    self.ledger.remember(call_id, [batch])
            if batch is None and make is None:  # an empty pop changed nothing: no commit to wait for
                return None
            mine = self.commits.pending
        await self.commits.durable(mine)
        return batch

    async def finish_batch(self, call_id: str | None = None) -> Batch:
        """At the end of data, release the kept groups as the last batch (per ``on_cap``).

        Batches already emitted and not handed out come first. ``call_id``: as for
        :meth:`pop_batch`.
        Raises:
            DataExhaustedError: nothing is kept (the padding candidates are dropped); the data
                is over for good. Its message names the limit reached.
            ReplenishCapError: ``on_cap='raise'`` and the kept groups are short of a batch.
        """
        return await self._hand_out_call(call_id, self._finish_last)

    def _finish_last(self) -> None:
        batch = self.core.finish()
        if batch is None:
            p, c = self.core.policy, self.core.counters
            self.commits.commit()
            self.observe()
            raise DataExhaustedError(
                f"exhausted: no task left (max_epochs={p.max_epochs}, epoch {self.core.epoch}; "
                f"max_rollouts={p.max_rollouts}, {c['rollouts_planned']} planned) and no batch to release"
            )
        self.ready.finish(batch)

    async def close_batch(self, call_id: str | None = None) -> Batch | None:
        """Close the open batch now as the cap would (pad / partial / raise), for external drivers.

        Batches already emitted and not handed out come first. ``call_id``: as for :meth:`pop_batch`."""
        return await self._hand_out_call(call_id, lambda: self.ready.finish(self.core.close_at_cap()))
