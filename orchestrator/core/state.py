"""Save and load of :class:`~orchestrator.core.machine.OrchestratorCore`: :class:`CoreState`.

:meth:`CoreState.state` is the core's state as a dict (the per-task columns as arrays, the held
groups as keys or, with ``payloads``, as dicts); :meth:`CoreState.load_state_dict` restores it,
migrating a version-1 state. The rows changed since the last commit are tracked
(:meth:`~orchestrator.core.tasks.TaskColumns.touched_rows`), so a commit writes only those. How a held group is
checkpointed (its payload packed as columns, written once, released later): see
:mod:`orchestrator.service.store` and :mod:`orchestrator.service.persist`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.rounds import Rounds
from orchestrator.core.rows import GroupRows
from orchestrator.core.shared import OpenBatch, Run, Tally
from orchestrator.core.submit import Submit
from orchestrator.core.tasks import TaskColumns
from orchestrator.core.types import Experience, ExperienceId, Group


def json_safe(value: Any) -> Any:
    """``value`` with every numpy array or scalar inside dicts and lists made a Python list or number."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value




_COLUMNS = {"rewards": np.float64, "values": np.float64, "valid": bool, "versions": np.int64}


def group_to_dict(group: Group) -> dict:
    """A JSON-safe dict of a group (member columns as lists, NaN as None)."""
    out = dataclasses.asdict(dataclasses.replace(group, **dict.fromkeys(_COLUMNS)))
    for name in _COLUMNS:
        col = getattr(group, name)
        out[name] = None if col is None else [None if isinstance(x, float) and math.isnan(x) else x for x in col.tolist()]
    return out


def group_from_dict(data: dict) -> Group:
    rollouts = [Experience(**{**r, "eid": ExperienceId(**r["eid"])}) for r in data["rollouts"]]
    cols = {
        name: None if data.get(name) is None else np.array([np.nan if x is None else x for x in data[name]], dtype=dtype)
        for name, dtype in _COLUMNS.items()
    }
    return Group(**{**data, "rollouts": rollouts, **cols})


class CoreState:
    """The core's state: save, load, migrate; a part of
    :class:`~orchestrator.core.machine.OrchestratorCore`.

    Args:
        run, tasks, tally, batch: the shared state (:mod:`orchestrator.core.shared`), saved and restored.
        rounds: the rounds part, whose selections and open rounds are saved and restored.
        intake: judges held groups saved before groups had member columns.
    """

    def __init__(self, run: Run, tasks: TaskColumns, tally: Tally, batch: OpenBatch, rounds: Rounds, intake: Submit) -> None:
        self.run, self.tasks, self.tally, self.batch, self.rounds, self.intake = run, tasks, tally, batch, rounds, intake

    def held_groups(self) -> list[Group]:
        """The groups the core holds: the carry pool, then the open batch's padding candidates
        (made now from :attr:`carry` and :attr:`candidates`, the rows the core holds)."""
        return self.batch.carry.groups() + self.batch.candidates.groups()

    def state_dict(self, payloads: bool = True) -> dict:
        """Everything needed to resume: JSON-serialisable (:meth:`state` with its arrays as lists)."""
        return json_safe(self.state(payloads))

    def state(self, payloads: bool = False) -> dict:
        """Everything needed to resume, its per-task columns as (T,) numpy arrays.

        The columns are the core's own arrays and ``task_ids`` its own list (never changed after
        construction), not copies: the state is a snapshot only until the next change (the
        state store copies what a commit writes at once). Every other entry is a new object.

        Args:
            payloads: True puts the held groups themselves in ``carry`` / ``candidates``; False
                only their ``Group.key`` (the service stores the groups once, elsewhere, so the
                state stays small whatever the groups hold, and stores the columns by change).
        """
        held = (lambda rows: [group_to_dict(g) for g in rows.groups()]) if payloads else (lambda rows: list(rows.keys))
        return {
            "version": 2,
            "policy": self.run.policy.model_dump(mode="json"),
            "policy_revision": self.run.policy_revision,
            "task_ids": self.tasks.task_ids,
            "task_texts": self.tasks.texts,
            "seed": self.tasks.seed,
            "history": self.tasks.history.state_dict(),
            "model_version": self.run.model_version,
            "passrate": self.tasks.passrate.state_dict(),
            "pick_epoch": self.tasks.pick_epoch,
            **self.rounds.state(),  # selections, open_rounds, awaited, last_round, in_flight, requeued
            "batch_id": self.batch.batch_id,
            "rounds_started": self.batch.rounds_started,
            "rounds_submitted": self.batch.rounds_submitted,
            "dropped_task_ids": list(self.batch.dropped_task_ids),
            "carry": held(self.batch.carry),
            "candidates": held(self.batch.candidates),
            "counters": dict(self.tally.counters),
            "classified_by_reason": dict(self.tally.classified_by_reason),
            "dropped_by_reason": dict(self.tally.dropped_by_reason),
            "rounds_per_batch": list(self.tally.rounds_per_batch),
            "requeue": list(self.batch.requeue),
            "window": dict(self.tally.window),
            "last_batch": dict(self.tally.last_batch),
        }

    def load_state_dict(self, state: dict, groups: dict[str, Group] | None = None) -> None:
        """Restore from :meth:`state_dict`.

        Args:
            groups: the held groups by key, for a state saved with ``payloads=False``.
        Raises:
            ValueError: the task set differs.
            KeyError: a held group's key is missing from ``groups``.
        """
        if state["task_ids"] != self.tasks.task_ids:
            raise ValueError("task_ids: the saved state belongs to a different task set")
        self.tasks.touched = None  # every row may differ from what a store last saw
        self.run.policy = ResamplingPolicy.parse(state["policy"])
        self.run.policy_revision = state["policy_revision"]
        self.tasks.seed = state["seed"]
        if state.get("task_texts") is not None:
            self.tasks.set_texts(state["task_texts"])
        self.tasks.history.load_state_dict(state["history"])
        self.run.model_version = state["model_version"]
        self.batch.batch_id, self.batch.rounds_started = state["batch_id"], state["rounds_started"]
        self.tasks.passrate.half_life = self.run.policy.passrate_half_life
        self.tasks.pick_epoch = np.array(state.get("pick_epoch", np.full(len(self.tasks.task_ids), -1)), dtype=np.int64)
        if "selections" in state:
            self.tasks.passrate.load_state_dict(state["passrate"])
        self.rounds.load_state(state)
        self.batch.rounds_submitted = int(state.get("rounds_submitted", self.batch.rounds_started))
        self.batch.dropped_task_ids = list(state["dropped_task_ids"])

        def held(items: list) -> GroupRows:
            out = [groups[g] if isinstance(g, str) else group_from_dict(g) for g in items]
            if not out:
                return GroupRows.empty(self.run.policy.group_size)
            for g in out:  # saved before groups had member columns: judge their rollouts again
                if g.rewards is None and g.rollouts:
                    values, valid, _ = self.intake.judge_rows(g)
                    self.intake.fill_columns(g, values, valid)
            return GroupRows.from_groups(out, np.array([self.tasks.index[g.task_id] for g in out], dtype=np.int64))

        self.batch.carry = held(state["carry"])
        self.batch.candidates = held(state["candidates"])
        # checkpoints from before a counter or reason existed resume with it at 0
        self.tally.counters = {**self.tally.counters, **state["counters"]}
        self.tally.classified_by_reason = {**self.tally.classified_by_reason, **state["classified_by_reason"]}
        self.tally.dropped_by_reason = {**self.tally.dropped_by_reason, **state["dropped_by_reason"]}
        self.tally.rounds_per_batch = list(state["rounds_per_batch"])
        self.batch.requeue = list(state.get("requeue", []))
        self.tally.window = {**self.tally.new_window(), **state.get("window", {})}
        self.tally.last_batch = dict(state.get("last_batch", {}))
