"""The orchestrator Ray actor: a thin, long-running shell around :class:`OrchestratorCore`.

It owns the state machine, the rollout source, the buffer sink, the metrics and a
checkpoint file. It is an async actor: while ``next_batch`` waits for rollouts (run in a
worker thread), stats, policy reads/changes and pause/resume are served concurrently.
Core state is only touched on the actor's event loop, never from the rollout thread.

Find it by name from any driver or Trinity component::

    actor = ray.get_actor("dso-orchestrator", namespace="trinity-dso")

Anchor index (GiGPO): created with ``anchor_index={"redis_url": ..., "prefix": ...,
"ttl_s": ..., "max_age_versions": ...}``, the actor runs the index's lifecycle through its
:class:`~orchestrator.service.anchor_watch.AnchorWatch` part (``anchor_spec``, ``anchor_register``,
``anchor_stats``, ``anchor_drop``, ``anchor_expire``; version-based expiry; its checkpoint
part). Workers write and query the index itself, opened with
:func:`orchestrator.anchors.owner.orchestrator_anchor_index` (Redis, or the memory index's
own Ray actor ``<name>-anchors``).

Where things live: this module is the Ray shell (the public calls, the lock, the factory
:func:`get_or_create_orchestrator`); :class:`Orchestrator` is composed of parts, one job each,
each given in its constructor the state and the parts it reads (no part reads another's
attributes through ``self``):

- :class:`~orchestrator.service.submit.Submission`: groups in (list and table routes, keys, slices, rolling a round);
- :class:`~orchestrator.service.batches.ReadyBatches`: released batches, ready to hand out;
- :class:`~orchestrator.service.batches.BatchHandOut`: batches out (hand-out, ``next_batch``, end of data);
- :class:`~orchestrator.service.persist.Ledger`: group keys accepted and calls answered (the retry window);
- :class:`~orchestrator.service.persist.Persistence`: commits (prepare, write, roll back, load);
- :class:`~orchestrator.service.attachment.Attachment`: the attached run, pinned fields and policy writes;
- :class:`~orchestrator.service.anchor_watch.AnchorWatch`: the anchor index, its Redis executor and health watch;
- :class:`ErrorLog`: failures by kind, and the last one;
- :mod:`orchestrator.service.names`: names, limits and error types others import without the actor.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import ray

from algos.dapo import InvalidGroupError
from orchestrator.anchors.owner import AnchorIndexConfig
from orchestrator.core.machine import OrchestratorCore, RoundPlan, trajectory_rollouts
from orchestrator.core.outcomes import GroupOutcome
from orchestrator.core.passrate import task_tags
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.stats import Stats, TaskStats
from orchestrator.core.types import Batch, Experience, Group, GroupTable, TaskSetLike
from orchestrator.rollout.source import RolloutSource
from orchestrator.tasks.taskset import prompt_texts
from orchestrator.service.anchor_watch import REDIS_WAIT_S, AnchorWatch
from orchestrator.service.attachment import Attachment, check_source, policy_view
from orchestrator.service.batches import BatchHandOut, ReadyBatches
from orchestrator.service.commits import SharedCommits
from orchestrator.service.logs import enable_service_logging
from orchestrator.service.metrics import ERROR_KINDS, DSOMetrics
from orchestrator.service.names import (  # noqa: F401 - re-exported: importers of the actor find them here too
    DEFAULT_NAME,
    DEFAULT_NAMESPACE,
    RETRIES,
    RETRY_WINDOW,
    OrchestratorUnavailable,
    PinnedPolicyError,
    PolicyConflictError,
    RunConflictError,
)
from orchestrator.service.persist import Ledger, Persistence
from orchestrator.service.sink import BatchSink, SQLiteSink
from orchestrator.service.store import StateStore
from orchestrator.service.submit import COMMIT_ROLLOUTS, SLICE_ROLLOUTS, Submission, held_refs  # noqa: F401 - named in docstrings

log = logging.getLogger("trinity_dso.actor")

ANCHOR_GROUP = "anchor_index"
"""Ray concurrency group of the anchor-index lifecycle calls (one thread, off the event loop)."""


class Orchestrator:
    """Actor body (also usable in-process). Ray wraps it as :data:`OrchestratorActor`.

    Args:
        policy: the initial resampling policy (a model or a dict, validated).
        task_set: object with ``task_ids: list[str]`` and ``get(task_id) -> Task``.
        rollout_source: a :class:`orchestrator.rollout.engine.RolloutSource`, or None when groups are
            only submitted from outside (e.g. by Trinity's pipeline operator).
        sink: optional object with ``write(batch)``. A :class:`orchestrator.service.sink.SQLiteSink`
            also holds the actor's state (:class:`~orchestrator.service.store.StateStore`): each
            emitted batch is written in one transaction with the state that produced it.
        checkpoint_path: optional SQLite state file, used when there is no SQLite sink (with
            one, the state lives in the sink's file and this path is unused). State is committed
            after every change and loaded at start, so a restarted actor resumes where it
            stopped (see the README's "Durability").
        metrics: optional object with ``update(stats)`` and ``observe_batch(batch)``; when it
            also has ``set_anchor_entries``, ``observe_anchor_group_sizes`` and
            ``observe_redis_op`` (:class:`orchestrator.service.metrics.DSOMetrics`), the anchor index
            feeds them.
        seed: seeds the task order.
        retry_window: how many group keys to remember, newest first, to recognise a group
            submitted again (a retried call, a resumed explorer re-submitting its steps since
            its checkpoint): at least the keys of the last ``retry_window`` groups accepted are
            recognised, before and after a restart (default :data:`RETRY_WINDOW`); an older
            group submitted again counts as a new one.
        anchor_index: an :class:`~orchestrator.anchors.owner.AnchorIndexConfig` (or its dict)
            to create an anchor index and run its lifecycle (see
            :class:`~orchestrator.anchors.owner.AnchorLifecycle`; the memory index is served
            by its own Ray actor when this one runs on Ray); None (default) for none (the
            ``anchor_*`` methods then raise
            :class:`~orchestrator.anchors.owner.AnchorIndexNotConfiguredError`).
    Raises:
        pydantic.ValidationError: invalid ``anchor_index`` settings.
    """

    def __init__(
        self,
        policy: ResamplingPolicy | dict,
        task_set: TaskSetLike,
        rollout_source: RolloutSource | None = None,
        *,
        sink: BatchSink | None = None,
        checkpoint_path: str | None = None,
        metrics: DSOMetrics | None = None,
        seed: int = 0,
        anchor_index: AnchorIndexConfig | dict | None = None,
        retry_window: int = RETRY_WINDOW,
    ):
        enable_service_logging()
        if not isinstance(retry_window, int) or isinstance(retry_window, bool) or retry_window < 1:
            raise ValueError(f"retry_window: must be an int of at least 1, got {retry_window!r}")
        policy = policy if isinstance(policy, ResamplingPolicy) else ResamplingPolicy.parse(policy)
        check_source(policy, rollout_source)
        core = self.core = OrchestratorCore(policy, task_set.task_ids, seed=seed, task_tags=task_tags(task_set),
                                            task_texts=prompt_texts(task_set))
        self.metrics = metrics
        self.training: dict = {}  # the last report_training row
        self.errors = ErrorLog(metrics)
        lock = self._lock = asyncio.Lock()
        # every change is counted (commits.changed) and each call answers once it is written; what
        # a commit writes is prepared by the persistence part, made below
        commits = self.commits = SharedCommits(lambda: self.persistence.prepare(), lambda: self.persistence.rollback())
        if metrics is not None and hasattr(metrics, "registry"):
            metrics.registry  # noqa: B018 - built now, once (never lazily from several threads)
        self.anchors = AnchorWatch(anchor_index, version=lambda: core.model_version, metrics=metrics, commits=commits,
                                   record_error=self.errors.record)
        self.ledger = Ledger(retry_window)
        self.ready = ReadyBatches(commits, self._observe)
        self.attachment = Attachment(core, ledger=self.ledger, rollout_source=rollout_source, observe=self._observe)
        self.submission = Submission(core, lock=lock, commits=commits, ready=self.ready, ledger=self.ledger,
                                     rollout_source=rollout_source, observe=self._observe)
        self.handout = BatchHandOut(core, lock=lock, commits=commits, ready=self.ready, ledger=self.ledger,
                                    submission=self.submission, task_set=task_set, rollout_source=rollout_source,
                                    observe=self._observe)
        self.store = _state_store(sink, Path(checkpoint_path) if checkpoint_path else None, retry_window)
        self.persistence = Persistence(core, self.store, sink, ledger=self.ledger, ready=self.ready, attachment=self.attachment,
                                       anchors=self.anchors, record_error=self.errors.record)
        self.persistence.load()
        self._observe()
        _freeze_startup_heap()

    # ------------------------------------------------------------- internals
    def _observe(self, batch: Batch | None = None) -> None:
        """After a change: expire old anchor batches, and record a released batch in the metrics'
        histograms. The counters and gauges are brought up to the core's stats when scraped
        (:meth:`metrics_text`), not after every call: they are cumulative, so a scrape reads
        exactly what a per-call update would have set."""
        self.anchors.expire_in_background()
        if self.metrics is not None and batch is not None:
            self.metrics.observe_batch(batch)

    # ------------------------------------------------------------- batches (in: submit.py, out: batches.py)
    async def submit_groups(
        self, groups: list[Group] | GroupTable, on_invalid: str = "raise", call_id: str | None = None
    ) -> list[str] | np.ndarray:
        """Submit groups rolled out elsewhere; returns each group's filter label.

        ``groups`` is a list of :class:`Group` (labels returned as a list) or one
        :class:`~orchestrator.core.types.GroupTable` (the Trinity operator's columns, checked
        at once; labels returned as a (G,) str array, in row order).

        Idempotent per group: a group already accepted (same task, round tag and runs, see
        :func:`~orchestrator.core.types.group_key`) is not counted again; its label is returned.
        A group without a round tag has no identity of its own: with ``call_id`` it gets
        ``anon:<call_id>:<position>`` (a re-sent call is recognised); without, it is new at every
        call (Ray never re-sends this method; a caller's re-send counts it twice).
        Large submits are processed in slices of about :data:`SLICE_ROLLOUTS` rollouts, so the
        actor keeps answering meanwhile, and committed every :data:`COMMIT_ROLLOUTS` rollouts.
        Full batches become available through :meth:`pop_batch`.

        Args:
            groups: the groups.
            on_invalid: ``"raise"`` (default): all-or-nothing, one invalid group rejects the
                call; ``"drop"``: an invalid group is dropped with label ``invalid`` (counted and
                logged) and the others go on (the Trinity operator's choice).
        Raises:
            InvalidGroupError, UnknownTaskError: under ``"raise"``, nothing is accepted (see
                ``OrchestratorCore.submit``).
        """
        self.anchors.start_watch()
        return (await self.submission.call(groups, on_invalid, pop=False, call_id=call_id))[0]

    async def submit_and_pop(
        self, groups: list[Group] | GroupTable, on_invalid: str = "raise", call_id: str | None = None,
        held: bool = False,
    ) -> tuple[Any, list[Batch]] | tuple[Any, list[Batch], list[str]]:
        """:meth:`submit_groups`, then every ready batch (what :meth:`pop_batch` returns until None),
        in one call and one commit: the Trinity operator's call, one round trip per explore step.

        Returns ``(labels, batches)``: the labels as :meth:`submit_groups` returns them, and the
        ready batches, oldest first (the batches emitted before this call included).

        ``call_id`` makes a re-send safe (:class:`~orchestrator.service.calls.ActorCalls` re-sends
        the call while the actor restarts): if the first attempt was committed (its groups
        accepted, its batches handed out), the re-sent call is answered with the same labels and
        the same batches (plus any released since); untagged groups are identified by it (see
        :meth:`submit_groups`). Only the last call with an id that handed out batches is
        remembered (one handing-out caller per orchestrator, the operator). Without an id (the
        at-most-once exception), a call whose answer is lost after its commit has handed its
        batches out (they are in a :class:`SQLiteSink`), and Ray does not re-send it.

        ``held=True`` (the Trinity operator's): the reply is ``(labels, batches, refs)``, ``refs``
        as :meth:`held_refs` after this call, so the caller knows which of its groups to keep
        without a second call after a release.
        Raises:
            see :meth:`submit_groups` (nothing is accepted or handed out).
        """
        self.anchors.start_watch()
        return await self.submission.call(groups, on_invalid, pop=True, call_id=call_id, held=held)

    async def submit_experiences(
        self, experiences: list[Experience], model_version: int = 0, call_id: str | None = None
    ) -> list[str]:
        """Group experiences by ``(eid.task, eid.round_tag)`` (one group per task and round, in run
        order, the groups in the order their first experience comes) and submit them; see
        :meth:`submit_groups` for errors (e.g. a ragged group) and for ``call_id`` (a re-sent
        call is recognised: an untagged group is ``anon:<call_id>:<its position>``).

        Multi-turn step experiences (``eid.step``) become one rollout per trajectory first
        (:func:`orchestrator.core.machine.trajectory_rollouts`): the filter judges each
        trajectory's outcome and counts it once. ``model_version`` stamps experiences without
        ``info["model_version"]``.
        """
        if not isinstance(experiences, list) or not all(isinstance(e, Experience) for e in experiences):
            raise InvalidGroupError("experiences: expected a list of Experience")
        by_key: dict[tuple[str, str], list[Experience]] = defaultdict(list)
        for e in trajectory_rollouts(experiences):
            e.info.setdefault("model_version", model_version)
            by_key[(e.eid.task, e.eid.round_tag)].append(e)
        groups = [
            Group(task_id=task, rollouts=sorted(rs, key=lambda e: e.eid.run), model_version=model_version)
            for (task, _), rs in by_key.items()
        ]
        return await self.submit_groups(groups, call_id=call_id)

    @ray.method(max_task_retries=RETRIES)
    def exhausted(self) -> bool:
        """True once ``max_epochs`` / ``max_rollouts`` allow no further round (see :meth:`finish_batch`)."""
        return self.core.exhausted()

    async def plan_round(self) -> RoundPlan:
        """Plan the next round for an external explorer (e.g. Trinity's task selector); returns
        once the plan is committed."""
        return await self._committed(self.core.plan_round)

    async def select_tasks(self, count: int) -> list[str]:
        """``count`` tasks in the epoch's order (``OrchestratorCore.select_tasks``); returns once committed."""
        return await self._committed(lambda: self.core.select_tasks(count))

    async def next_tasks(self, count: int, call_id: str | None = None) -> list[str]:
        """``count`` tasks for one explore step of an attached explorer (``OrchestratorCore.next_tasks``;
        fewer, or none, at the end of data).

        ``call_id`` makes a retry safe: Ray retries the call when the actor dies during it, and
        if the first attempt was committed, the retry gets the same tasks (none skipped for the
        epoch, none handed out twice). Only the last call with an id is remembered (one task
        selector per orchestrator).
        """
        async with self._lock:
            if (again := self.ledger.tasks_answered(call_id)) is not None:
                return again
            tasks = self.core.next_tasks(count)
            self.ledger.remember_tasks(call_id, tasks)
            mine = self.commits.changed()
        await self.commits.durable(mine)
        return tasks

    # ------------------------------------------------------------- attached runs
    async def attach_run(self, run: str, *, session: str, role: str, num_tasks: int | None = None,
                         pinned: dict | None = None, pinned_by: str = "") -> dict:
        """Attach a component of a Trinity run (its task selector or pipeline operator).

        One orchestrator serves one run: the first attach binds it (and is checkpointed);
        later attaches of the same run - the other component, or the same run resumed after
        an explorer restart - are accepted. A new ``session`` of the selector means a new
        explorer process: the tasks the previous one took but never returned are handed out
        again first (none re-rolled that came back, none skipped).

        ``pinned`` fields (``group_size``, ``target_groups``: what Trinity's trainer batch size
        is built from) are set in the policy now and refused afterwards by :meth:`set_policy`.

        Args:
            run: the run's id (``<project>/<name>``).
            session: one id per explorer process (the selector makes one at start).
            role: ``"selector"`` or ``"operator"`` (for the log and the returned record).
            num_tasks: rows of the run's training taskset (None: not checked).
            pinned: policy fields the run depends on.
            pinned_by: why, for error messages (e.g. the Trinity fields they come from).
        Returns:
            ``{"run", "pinned", "requeued": [task ids handed out again], "unconfirmed": {"session",
            "batch_ids"}}``: ``unconfirmed`` (``{}`` when none) names the batches handed to the
            last call of the operator session before this one (a restarted explorer's), which
            its pipeline may not have written to Trinity's buffer before it died.
        Raises:
            RunConflictError: the orchestrator serves another run, or its task set has another size.
            InvalidPolicyError: a pinned value is invalid, or ``group_size`` differs while groups are held.
        """
        async with self._lock:
            out = self.attachment.attach_run(run, session, role, num_tasks, pinned, pinned_by)
            mine = self.commits.changed()
        await self.commits.durable(mine)
        return out

    @ray.method(max_task_retries=RETRIES)
    async def set_task_texts(self, texts: list[str]) -> int:
        """Each task's prompt text, in task order (on the Trinity route the task selector reads them
        from Trinity's taskset), for selections that learn from prompts (``pass_predictor``); kept
        in the checkpoint. Idempotent. Returns the number of texts.

        Raises:
            ValueError: not one string per task.
        """
        await self._committed(lambda: self.core.set_task_texts(texts))
        return len(texts)

    @ray.method(max_task_retries=RETRIES)
    def held_refs(self) -> list[str]:
        """The ``ref`` of every group held (carry pool and padding candidates), for a submitter
        that keeps the payloads (the Trinity operator frees the others)."""
        return held_refs(self.core)

    @ray.method(max_task_retries=RETRIES)
    async def drop_held(self, refs: list[str]) -> int:
        """Drop the held groups named by ``refs`` as ``lost``: the Trinity operator found no payload
        for them at its attach (its explorer died between the commit of a step and the write of
        that step's held groups; ``orchestrator.trinity.held``). Counted in ``dropped_by_reason``
        and logged; refs not held are ignored (idempotent, so Ray may retry it). Returns how many
        were dropped, once committed."""
        count = await self._committed(lambda: self.core.drop_held(set(refs), GroupOutcome.LOST.label))
        if count:
            log.warning("dropped %d held groups as lost (their payload died with the explorer)", count)
        return count

    def attachment_info(self) -> dict:
        """The attached run, its pinned policy fields and their reason (``{}`` when none)."""
        return dict(self.attachment.info)

    # ------------------------------------------------------------- policy & views
    @ray.method(max_task_retries=RETRIES)
    def get_policy(self) -> dict:
        """``{"revision": int, "policy": dict}``."""
        return policy_view(self.core)

    async def set_policy(self, changes: dict, expected_revision: int | None = None, replace: bool = False) -> dict:
        """Change the resampling policy; applies from the next round.

        Args:
            changes: fields to change (``replace=False``, nested ``filter`` merged) or a full policy.
            expected_revision: when given and different from the current revision, refuse.
        Raises:
            PolicyConflictError: stale ``expected_revision``.
            InvalidPolicyError: invalid values (field and value named); the policy is unchanged.
        """
        async with self._lock:
            out = self.attachment.set_policy(changes, expected_revision, replace)
            mine = self.commits.changed()
        await self.commits.durable(mine)
        return out

    @ray.method(max_task_retries=RETRIES)
    async def set_model_version(self, version: int) -> None:
        """The trainer's model version (after a weight sync); returns once it is committed."""
        await self._committed(lambda: self.core.set_model_version(version))
        self.anchors.expire_in_background()

    @ray.method(max_task_retries=RETRIES)
    def get_stats(self) -> Stats:
        self.anchors.start_watch()
        stats = self.core.stats()
        update: dict[str, Any] = {"errors": dict(self.errors.counts), "last_error": self.errors.last, **self.anchors.health()}
        return stats.model_copy(update=update)

    def report_error(self, kind: str, message: str, step: Any = None) -> None:
        """A failure seen by a client of the actor (the Trinity operator or task selector):
        counted in ``dso_errors_total{kind}`` and kept as the last error (``GET /v1/stats``,
        ``trinity-dso status``). ``kind``: one of :data:`ERROR_KINDS` (else ``operator``);
        ``step``: the explore step, when known."""
        self.errors.record(kind if kind in ERROR_KINDS else "operator", str(message)[:2000], step)

    def report_training(self, step: int, metrics: dict) -> None:
        """A trainer's step metrics (entropy, clip fractions, KL, rewards, held-out accuracy,
        model version...): exported as ``dso_train_*`` and returned by :meth:`get_training`."""
        self.training = {"step": int(step), **{k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
        if self.metrics is not None:
            self.metrics.update_training(self.training)

    def get_training(self) -> dict:
        """The last :meth:`report_training` row (``{}`` before any)."""
        return dict(self.training)

    @ray.method(max_task_retries=RETRIES)
    def task_history(self, task_id: str) -> TaskStats:
        return self.core.task_stats(task_id)

    def state_dict(self) -> dict:
        return {**self.core.state_dict(payloads=False), **self.attachment.state_dict()}

    def ping(self) -> str:
        self.anchors.start_watch()
        return "ok"

    @ray.method(max_task_retries=RETRIES)
    async def metrics_text(self) -> str:
        """The metrics in Prometheus text format (``metrics.exposition()``); "" without metrics.

        The counters and gauges are first brought up to the core's stats (``metrics.update``).
        With an anchor index, ``dso_anchor_index_entries`` is refreshed first too (one
        :meth:`AnchorIndex.stats` call, in a worker thread; a failure is logged and counted,
        never raised).
        """
        self.anchors.start_watch()
        if self.metrics is None:
            return ""
        self.metrics.update(self.core.stats(), self.core.policy)
        await self.anchors.refresh_metrics(wait_s=REDIS_WAIT_S / 8)  # Redis-bound: a bounded wait (the gauge may lag)
        return self.metrics.exposition()

    # ------------------------------------------------------------- anchor index (Redis side: anchor_watch.py)
    # The lifecycle calls that reach the index run in their own concurrency group (a thread of
    # their own in the Ray actor), not on the event loop.
    @ray.method(concurrency_group=ANCHOR_GROUP)
    def anchor_stats(self) -> dict:
        """:meth:`AnchorWatch.anchor_stats`: the index's stats, Redis's health and outages."""
        return self.anchors.anchor_stats()

    @ray.method(concurrency_group=ANCHOR_GROUP)
    def anchor_drop(self, batch_key: str) -> int:
        """:meth:`AnchorLifecycle.anchor_drop` (off the event loop)."""
        return self.anchors.anchor_drop(batch_key)

    @ray.method(concurrency_group=ANCHOR_GROUP)
    def anchor_expire(self, max_age_versions: int | None = None) -> list[str]:
        """:meth:`AnchorLifecycle.anchor_expire` (off the event loop)."""
        return self.anchors.anchor_expire(max_age_versions)

    def anchor_register(self, batch_key: str, model_version: int | None = None) -> int:
        """:meth:`AnchorWatch.anchor_register`: record a batch key in use; starts the Redis health check.

        Raises:
            AnchorBatchLostError: ``batch_key`` was lost with Redis's data (refused for good).
            AnchorBatchExpiredError: ``batch_key`` was expired by version.
        """
        return self.anchors.anchor_register(batch_key, model_version)

    @ray.method(concurrency_group=ANCHOR_GROUP)
    def anchor_spec(self) -> dict:
        """:meth:`AnchorWatch.anchor_spec`: what a worker needs to open the index, with the run's guard."""
        return self.anchors.anchor_spec()

    # ------------------------------------------------------------- batches out (batches.py)
    async def next_batch(self, timeout_s: float | None = None, call_id: str | None = None) -> Batch | None:
        """:meth:`BatchHandOut.next_batch`: fill and return the next batch through the rollout source."""
        self.anchors.start_watch()
        return await self.handout.next_batch(timeout_s, call_id)

    async def pop_batch(self, call_id: str | None = None) -> Batch | None:
        """:meth:`BatchHandOut.pop_batch`: the oldest released batch not yet handed out, if any."""
        return await self.handout.pop_batch(call_id)

    async def finish_batch(self, call_id: str | None = None) -> Batch:
        """:meth:`BatchHandOut.finish_batch`: at the end of data, the kept groups as the last batch."""
        return await self.handout.finish_batch(call_id)

    async def close_batch(self, call_id: str | None = None) -> Batch | None:
        """:meth:`BatchHandOut.close_batch`: close the open batch now as the cap would."""
        return await self.handout.close_batch(call_id)

    async def _committed(self, change: Callable[[], Any]) -> Any:
        """``change()`` under the lock, returned once a commit covers it."""
        async with self._lock:
            out = change()
            mine = self.commits.changed()
        await self.commits.durable(mine)
        return out


class ErrorLog:
    """Failures counted by kind, and the last one (``GET /v1/stats``, ``trinity-dso status``).

    Args:
        metrics: optional; its ``count_error(kind)`` is called for each failure.
    Attributes:
        counts: failures per kind (every kind of :data:`ERROR_KINDS` seeded to 0).
        last: ``{"time", "kind", "message", "step"}`` of the last failure, or None.
    """

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics
        self.counts: Counter[str] = Counter({k: 0 for k in ERROR_KINDS})
        self.last: dict | None = None

    def record(self, kind: str, message: str, step: Any = None) -> None:
        self.counts[kind] += 1
        self.last = {"time": time.time(), "kind": kind, "message": message, "step": None if step is None else str(step)}
        count = getattr(self.metrics, "count_error", None)
        if count is not None:
            count(kind)


def _state_store(sink: BatchSink | None, checkpoint_path: Path | None, retry_window: int) -> StateStore | None:
    """The actor's state file: the SQLite sink's own file when there is one, else ``checkpoint_path`` (or none)."""
    if isinstance(sink, SQLiteSink):
        if checkpoint_path is not None and checkpoint_path.resolve() != sink.path.resolve():
            log.warning("checkpoint_path %s unused: the state is kept in the sink's file %s", checkpoint_path, sink.path)
        return StateStore(sink.path, sink=sink, keep_keys=retry_window)
    if checkpoint_path is not None:
        return StateStore(checkpoint_path, keep_keys=retry_window)
    return None


OrchestratorActor = ray.remote(num_cpus=0, max_restarts=-1, concurrency_groups={ANCHOR_GROUP: 1})(Orchestrator)
"""Restarted by Ray whenever its process dies (it resumes from its state file)."""


def _freeze_startup_heap() -> None:
    """In an actor's own process, put everything alive after start-up (the imports of torch,
    Ray and the rest, the restored state) out of the cyclic garbage collector's scans
    (``gc.freeze``): a full collection then walks only what the service made since, where it
    stalled every caller, REST included, while it walked the whole heap (see bench/README.md,
    "The actor's heap and histograms"). Frozen objects are still freed when no
    longer referenced; only reference cycles among them would stay. Elsewhere (the actor class
    used in a test or a script's own process) it does nothing."""
    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None:
        gc.collect()  # what start-up left as garbage goes now, not into the frozen set
        gc.freeze()


def get_or_create_orchestrator(
    *args: Any,
    name: str = DEFAULT_NAME,
    namespace: str = DEFAULT_NAMESPACE,
    detached: bool = False,
    max_restarts: int | None = None,
    **kwargs: Any,
) -> ray.actor.ActorHandle:
    """The named orchestrator actor, created with ``Orchestrator(*args, **kwargs)`` if absent.

    Args:
        name, namespace: how other components find it (``ray.get_actor(name, namespace=...)``).
        detached: outlive the driver (``lifetime="detached"``), for long-running services.
        max_restarts: how often Ray restarts the actor when its process dies, resuming from its
            state file. Default: always (-1) with a state file (a ``SQLiteSink`` ``sink`` or a
            ``checkpoint_path``), else never (0: a restart would silently start empty).

    A restart needs the constructor arguments again. Ray keeps arguments of more than
    :data:`RAY_INLINE_BYTES` in its object store, owned by the calling process: a detached actor
    whose creator has exited then cannot be restarted. Such a creation is logged as a warning.
    """
    if max_restarts is None:
        durable = isinstance(kwargs.get("sink"), SQLiteSink) or kwargs.get("checkpoint_path")
        max_restarts = -1 if durable else 0
    options: dict[str, Any] = {"name": name, "namespace": namespace, "get_if_exists": True, "max_restarts": max_restarts}
    if detached:
        options["lifetime"] = "detached"
        if max_restarts != 0 and (size := max(map(len, map(ray.cloudpickle.dumps, [*args, *kwargs.values()])))) > RAY_INLINE_BYTES:
            log.warning(
                "orchestrator %r: a constructor argument of %d bytes goes to Ray's object store, owned by this process; "
                "once it exits, Ray cannot restart the detached actor after a crash (keep this process running, or "
                "give the actor smaller arguments, e.g. tasks it loads itself)", name, size,
            )
    return OrchestratorActor.options(**options).remote(*args, **kwargs)


RAY_INLINE_BYTES = 100 * 1024
"""Ray's ``max_direct_call_object_size`` default: larger task arguments go to the object store."""
