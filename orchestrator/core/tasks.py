"""The per-task columns of :class:`~orchestrator.core.machine.OrchestratorCore`: :class:`TaskColumns`.

Every part of the core reads and writes per-task state through one object: the task ids and
their rows, the reward history (:class:`~orchestrator.core.history.TaskHistory`), the pass-rate
evidence (:class:`~orchestrator.core.passrate.PassRateEstimate`), the epoch in which each task
was last drawn, and the rows written since the last commit (:meth:`TaskColumns.touched_rows`).
"""

from __future__ import annotations

import numpy as np

from orchestrator.core.errors import short_repr
from orchestrator.core.history import TaskHistory
from orchestrator.core.passrate import PassRateEstimate
from orchestrator.core.types import UnknownTaskError
from orchestrator.core.validate import unknown_task


class TaskColumns:
    """Per-task state: arrays of length T (the number of tasks), one row per task.

    Args:
        task_ids: every task id of the task set, in a stable order (checked unique by the core).
        seed: seeds the selections' task orders and the answer screen's draws.
        half_life: the pass-rate evidence's half-life (``policy.passrate_half_life``).
        task_tags: each task's difficulty tag, or None.
        task_texts: each task's prompt text, or None (see :meth:`set_texts`).
    Attributes:
        task_ids: the ids (never changed after construction); ``index``: id -> row.
        history: (T,) reward statistics; ``passrate``: (T,) pass-rate evidence.
        pick_epoch: (T,) int64, the active selection's epoch in which each task was last drawn
            (-1: never); skip-rule cooldowns count from it.
        texts: each task's prompt text (task order), or None: read by selections that learn from
            prompts (``pass_predictor``); kept in the checkpoint.
    """

    def __init__(self, task_ids: list[str], seed: int, half_life: float | None, task_tags: list[str] | None,
                 task_texts: list[str] | None = None) -> None:
        self.task_ids = list(task_ids)
        self.index = {t: i for i, t in enumerate(self.task_ids)}
        self.seed = seed
        self.history = TaskHistory(len(task_ids))
        self.passrate = PassRateEstimate(len(task_ids), half_life=half_life, tags=task_tags)
        self.pick_epoch = np.full(len(task_ids), -1, dtype=np.int64)
        self.texts: list[str] | None = None
        if task_texts is not None:
            self.set_texts(task_texts)
        # task rows the per-task columns were written at since touched_rows(); None: any row
        self.touched: list[np.ndarray] | None = None

    def set_texts(self, texts: list[str]) -> None:
        """Set each task's prompt text, in task order.

        Raises:
            ValueError: not one string per task (the count or the first bad index is named).
        """
        texts = list(texts)
        if len(texts) != len(self.task_ids):
            raise ValueError(f"task_texts: expected one per task ({len(self.task_ids)}), got {len(texts)}")
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise ValueError(f"task_texts: expected strings, got {short_repr(texts[bad])} at index {bad}")
        self.texts = texts

    def __len__(self) -> int:
        return len(self.task_ids)

    def task_index(self, task_id: str) -> int:
        """The row of ``task_id``.

        Raises:
            UnknownTaskError: not a task of the task set (or not a task id at all).
        """
        try:
            return self.index[task_id]
        except KeyError:
            raise UnknownTaskError(unknown_task(task_id, len(self.task_ids))) from None
        except TypeError:  # unhashable
            raise UnknownTaskError(f"task_id: not a task id: {short_repr(task_id)}") from None

    def rows(self, task_ids: list[str]) -> np.ndarray:
        """(k,) int64 rows of known task ids (a KeyError for an unknown one: callers checked them)."""
        return np.array([self.index[t] for t in task_ids], dtype=np.int64)

    def touch(self, rows: np.ndarray) -> None:
        """Record task rows whose per-task columns (history, pass-rate evidence, selection) this
        change wrote: every write to those columns goes with a call of this (see
        :meth:`touched_rows`)."""
        if self.touched is not None:
            self.touched.append(rows)

    def touched_rows(self) -> np.ndarray | None:
        """The task rows whose per-task columns may have changed since the last call (sorted,
        unique int64), or None when any may have (a new or restored core); resets the record.

        The state store compares only these rows with its last commit, so that a commit costs
        in proportion to the tasks a change touched, not to the task set."""
        touched, self.touched = self.touched, []
        if touched is None:
            return None
        return np.unique(np.concatenate(touched)).astype(np.int64, copy=False) if touched else np.empty(0, dtype=np.int64)
