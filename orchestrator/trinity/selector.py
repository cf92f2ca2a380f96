"""The ``dso_orchestrator`` task selector: Trinity's explorer asks the orchestrator which tasks to roll out next."""

from __future__ import annotations

import logging
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from orchestrator.trinity.attach import AttachConfig, actor_calls, attach_args, create_orchestrator, new_session

log = logging.getLogger("trinity_dso.trinity")


class OrchestratorTaskSelector:
    """Task selector ``dso_orchestrator``: the orchestrator picks the explorer's next tasks.

    Implements the interface of Trinity's ``trinity.buffer.selector.BaseSelector``
    (``get_indices``, ``feedback``, ``state_dict``, ``load_state_dict``) without subclassing
    it, so this module imports without Trinity's file reader (which needs ``datasets``).

    At construction it creates the orchestrator actor when absent (detached, checkpointed,
    with metrics: every setting from ``config.kwargs``, an :class:`AttachConfig`) and attaches
    the run to it with a new session id. Each ``get_indices(batch_size)`` (one explore step)
    returns exactly ``batch_size`` tasks (Trinity reads a fixed number per step) from the
    actor's ``next_tasks``: tasks a previous explorer process took but never returned first,
    then with ``replenish="same_tasks"`` this batch's dropped tasks, then fresh tasks of the policy's
    ``selection`` (``epoch`` order minus those in a history cooldown, or ``informative`` draws).

    The task frontier lives in the actor's checkpoint, not in Trinity's explorer checkpoint
    (which is written only at weight syncs and so lags behind): after a restart the actor
    knows which tasks came back (consumed: never handed out again in this epoch) and which
    did not (handed out again first). ``state_dict`` therefore only reports a count.

    No blocking in the explorer's event loop: Trinity calls ``get_indices`` synchronously from
    inside its async taskset ``read`` (``FileReader._read_sync``), where a ``ray.get`` would
    stall the loop. So the tasks of the next step are requested one step ahead (an object ref
    whose result has long arrived when the next step reads it); only an explorer's first step
    waits for its tasks. The cost: the orchestrator picks each step's tasks one step
    earlier (same-task re-rolls and skip rules act one step later), and the step reserved
    after the last one stays "in flight" in the actor until a resumed run takes it first.
    Each request carries a call id and is re-sent with it while the actor restarts (up to
    ``restart_deadline_s``, :class:`~orchestrator.service.calls.ActorCalls`, in a thread of the
    selector's own): the restarted actor answers a committed request with the same tasks. A
    failure is logged with the explore step and reported to the actor (``dso_errors_total
    {kind="selector"}``).

    It also hands the actor each task's prompt text (:func:`prompt_column`), which selections that
    learn from prompts read (``pass_predictor``): the orchestrator holds only row indices.

    Args:
        data_source: Trinity's ``_HFBatchReader``; ``dataset_size`` and, for the prompts, its
            ``dataset`` columns are read (as Trinity's own ``difficulty_based`` selector reads them).
        config: Trinity's ``DataSelectorConfig``; ``config.seed`` seeds the task order (unless
            ``kwargs.seed`` is set) and ``config.kwargs`` is an :class:`AttachConfig`.
    Raises:
        ValueError: invalid ``kwargs`` (the field is named).
        orchestrator.service.names.RunConflictError: the actor serves another run.
    """

    def __init__(self, data_source: Any, config: Any) -> None:
        kwargs = dict(getattr(config, "kwargs", None) or {})
        kwargs.setdefault("seed", int(getattr(config, "seed", 0) or 0))
        self.settings = AttachConfig.parse(kwargs, "data_selector.kwargs")
        self.dataset_size = int(data_source.dataset_size)
        self.session = new_session()
        self.actor = create_orchestrator(self.settings, self.dataset_size)
        self.calls = actor_calls(self.settings, self.actor)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dso-selector")  # the requests, re-sent while the actor restarts
        self._wait_s = self.settings.actor_timeout_s + self.settings.restart_deadline_s
        self._steps = 0  # explore steps served by this process
        run = self.settings.run or "trinity-run"
        # once, at the explorer's start (before its loop runs a step)
        self.attached = self.calls.call(
            "attach_run", run, **attach_args(self.settings, "selector", self.session, self.dataset_size),
            wait_s=self.settings.actor_timeout_s,
        )
        texts = prompt_column(data_source, config)
        if texts is not None:  # for selections that learn from prompts (pass_predictor)
            self.calls.call("set_task_texts", texts, wait_s=self.settings.actor_timeout_s)
        if self.attached["requeued"]:
            log.warning("run %s resumed: %d tasks handed out again", run, len(self.attached["requeued"]))
        self.current_index = 0
        self._ahead: tuple[int, Future] | None = None  # (count, tasks of the next step)

    def _request(self, count: int) -> Future:
        return self._pool.submit(self.calls.call, "next_tasks", int(count), call_id=uuid.uuid4().hex,
                                 wait_s=self.settings.actor_timeout_s)

    def get_indices(self, batch_size: int, return_extra_info: bool = False):
        """Exactly ``batch_size`` dataset indices (ints in [0, dataset_size)), per the orchestrator.

        The tasks were requested one step ahead (see the class docstring). At the end of data
        (the actor's ``max_epochs`` or ``max_rollouts``) fewer indices may come back; when none
        is left it raises ``StopIteration``, which ends Trinity's explorer cleanly (its file
        reader turns it into ``StopAsyncIteration``).

        Raises:
            StopIteration: the orchestrator is exhausted; the message says so.
            the actor's errors (logged with the explore step, and reported to the actor).
        """
        try:
            return self._get_indices(batch_size, return_extra_info)
        except StopIteration:
            raise
        except Exception as exc:
            log.error("dso_orchestrator selector failed at explore step %d of session %s: %s: %s",
                      self._steps, self.session, type(exc).__name__, exc)
            self.actor.report_error.remote("selector", f"{type(exc).__name__}: {exc}", self._steps)  # best effort
            raise

    def _get_indices(self, batch_size: int, return_extra_info: bool):
        self._steps += 1
        if self._ahead is None:  # the first step (or a size change): ask now
            self._ahead = (batch_size, self._request(batch_size))
        count, future = self._ahead
        ids = list(future.result(timeout=self._wait_s))  # arrived during the last step
        if count < batch_size:
            ids += self._request(batch_size - count).result(timeout=self._wait_s)
        ids, extra = ids[:batch_size], ids[batch_size:]
        if not ids:  # next_tasks hands out nothing only at the end of data
            self._ahead = None
            raise StopIteration("exhausted: the orchestrator has no task left (max_epochs or max_rollouts reached)")
        self._ahead = (batch_size, self._request(batch_size - len(extra)))
        if extra:  # a smaller step than asked ahead: keep the rest for the next one
            rest = self._ahead[1]
            self._ahead = (batch_size, _prepend(extra, rest))
        indices = [int(t) for t in ids]
        self.current_index += len(indices)
        if return_extra_info:
            return indices, {"session": self.session}
        return indices

    def feedback(self, indices: list[int], values: list[float]) -> None:
        """No-op: the orchestrator learns from the pipeline operator's submissions."""

    def state_dict(self) -> dict:
        """Tasks handed out by this explorer process (informative only: the frontier is in the actor)."""
        return {"current_index": self.current_index}

    def load_state_dict(self, state_dict: dict) -> None:
        self.current_index = int(state_dict.get("current_index", 0))


def _prepend(first: list[str], rest: Future) -> Future:
    out: Future = Future()
    rest.add_done_callback(lambda f: out.set_exception(f.exception()) if f.exception() else out.set_result(first + f.result()))
    return out


def prompt_column(data_source: Any, config: Any) -> list[str] | None:
    """Each row's prompt text from Trinity's taskset, or None when there is none to read.

    Read as Trinity 0.6.0's own ``DifficultyBasedSelector`` reads its features: columns of
    ``data_source.dataset`` (a ``datasets.Dataset``), named by the selector config's
    ``feature_keys`` (several are joined with newlines); without ``feature_keys``, the column
    ``prompt`` when the taskset has one (the default ``format.prompt_key``).

    Raises:
        ValueError: a ``feature_keys`` entry that is not a column of the taskset (named).
    """
    dataset = getattr(data_source, "dataset", None)
    names = list(getattr(dataset, "column_names", None) or [])
    given = list(getattr(config, "feature_keys", None) or [])
    if missing := [k for k in given if k not in names]:
        raise ValueError(f"data_selector.feature_keys: {missing} not among the taskset's columns {names}")
    keys = given or (["prompt"] if "prompt" in names else [])
    if not keys:
        return None
    columns = [list(dataset[k]) for k in keys]
    return ["\n".join(str(c[i]) for c in columns) for i in range(len(columns[0]))]
