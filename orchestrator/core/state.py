"""Save and load of :class:`~orchestrator.core.machine.OrchestratorCore`: :class:`CoreState`.

:meth:`CoreState.state` is the core's state as a dict (the per-task columns as arrays, the held
groups as keys or, with ``payloads``, as dicts); :meth:`CoreState.load_state_dict` restores it,
migrating a version-1 state. The rows changed since the last commit are tracked
(:meth:`CoreState.touched_rows`), so a commit writes only those. How a held group is
checkpointed (its payload packed as columns, written once, released later): see
:mod:`orchestrator.service.store` and :mod:`orchestrator.service.persist`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.rows import GroupRows
from orchestrator.core.selections import make_selection
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
    :class:`~orchestrator.core.machine.OrchestratorCore`, whose attributes it uses."""

    def held_groups(self) -> list[Group]:
        """The groups the core holds: the carry pool, then the open batch's padding candidates
        (made now from :attr:`carry` and :attr:`candidates`, the rows the core holds)."""
        return self.carry.groups() + self.candidates.groups()

    def state_dict(self, payloads: bool = True) -> dict:
        """Everything needed to resume: JSON-serialisable (:meth:`state` with its arrays as lists)."""
        return json_safe(self.state(payloads))

    def _touch(self, rows: np.ndarray) -> None:
        """Record task rows whose per-task columns (history, pass-rate evidence, selection) this
        change wrote: every write to those columns goes with a call of this (see
        :meth:`touched_rows`)."""
        if self._touched is not None:
            self._touched.append(rows)

    def touched_rows(self) -> np.ndarray | None:
        """The task rows whose per-task columns may have changed since the last call (sorted,
        unique int64), or None when any may have (a new or restored core); resets the record.

        The state store compares only these rows with its last commit, so that a commit costs
        in proportion to the tasks a change touched, not to the task set."""
        touched, self._touched = self._touched, []
        if touched is None:
            return None
        return np.unique(np.concatenate(touched)).astype(np.int64, copy=False) if touched else np.empty(0, dtype=np.int64)

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
            "policy": self.policy.model_dump(mode="json"),
            "policy_revision": self.policy_revision,
            "task_ids": self.task_ids,
            "task_texts": self.task_texts,
            "seed": self.seed,
            "history": self.history.state_dict(),
            "model_version": self.model_version,
            "passrate": self.passrate.state_dict(),
            "selections": {name: sel.state_dict() for name, sel in self.selections.items()},
            "pick_epoch": self.pick_epoch,
            "open_rounds": {k: dict(v) for k, v in self.open_rounds.items()},
            "awaited": {str(i): list(keys) for i, keys in self.awaited.items()},
            "last_round": dict(self.last_round) if self.last_round else None,
            "batch_id": self.batch_id,
            "rounds_started": self.rounds_started,
            "rounds_submitted": self.rounds_submitted,
            "in_flight": list(self.in_flight),
            "requeued": list(self.requeued),
            "dropped_task_ids": list(self.dropped_task_ids),
            "carry": held(self.carry),
            "candidates": held(self.candidates),
            "counters": dict(self.counters),
            "classified_by_reason": dict(self.classified_by_reason),
            "dropped_by_reason": dict(self.dropped_by_reason),
            "rounds_per_batch": list(self.rounds_per_batch),
            "requeue": list(self.requeue),
            "window": dict(self.window),
            "last_batch": dict(self.last_batch),
        }

    def load_state_dict(self, state: dict, groups: dict[str, Group] | None = None) -> None:
        """Restore from :meth:`state_dict`.

        Args:
            groups: the held groups by key, for a state saved with ``payloads=False``.
        Raises:
            ValueError: the task set differs.
            KeyError: a held group's key is missing from ``groups``.
        """
        if state["task_ids"] != self.task_ids:
            raise ValueError("task_ids: the saved state belongs to a different task set")
        self._touched = None  # every row may differ from what a store last saw
        self.policy = ResamplingPolicy.parse(state["policy"])
        self.policy_revision = state["policy_revision"]
        self.seed = state["seed"]
        if state.get("task_texts") is not None:
            self.set_task_texts(state["task_texts"])
        self.history.load_state_dict(state["history"])
        for key in ("model_version", "batch_id", "rounds_started"):
            setattr(self, key, state[key])
        self.passrate.half_life = self.policy.passrate_half_life
        self.selections = {}
        self.pick_epoch = np.array(state.get("pick_epoch", np.full(len(self.task_ids), -1)), dtype=np.int64)
        if "selections" in state:
            self.passrate.load_state_dict(state["passrate"])
            for name, sel_state in state["selections"].items():
                self.selections[name] = make_selection(name, len(self.task_ids), self.seed, self.policy)
                self.selections[name].load_state_dict(sel_state)
            self.open_rounds = {k: dict(v) for k, v in state["open_rounds"].items()}
            self.awaited = {int(i): list(keys) for i, keys in state["awaited"].items()}
            self.last_round = dict(state["last_round"]) if state["last_round"] else None
        else:  # version 1: epoch order only, no estimates
            self.selections["epoch"] = make_selection("epoch", len(self.task_ids), self.seed, self.policy)
            self.selections["epoch"].load_state_dict({"epoch": state["epoch"], "cursor": state["cursor"]})
        self.rounds_submitted = int(state.get("rounds_submitted", self.rounds_started))
        self.in_flight = list(state.get("in_flight", []))
        self.requeued = list(state.get("requeued", []))
        self.dropped_task_ids = list(state["dropped_task_ids"])

        def held(items: list) -> GroupRows:
            out = [groups[g] if isinstance(g, str) else group_from_dict(g) for g in items]
            if not out:
                return GroupRows.empty(self.policy.group_size)
            for g in out:  # saved before groups had member columns: judge their rollouts again
                if g.rewards is None and g.rollouts:
                    values, valid, _ = self._judge_rows(g)
                    self._fill_columns(g, values, valid)
            return GroupRows.from_groups(out, np.array([self._index[g.task_id] for g in out], dtype=np.int64))

        self.carry = held(state["carry"])
        self.candidates = held(state["candidates"])
        # checkpoints from before a counter or reason existed resume with it at 0
        self.counters = {**self.counters, **state["counters"]}
        self.classified_by_reason = {**self.classified_by_reason, **state["classified_by_reason"]}
        self.dropped_by_reason = {**self.dropped_by_reason, **state["dropped_by_reason"]}
        self.rounds_per_batch = list(state["rounds_per_batch"])
        self.requeue = list(state.get("requeue", []))
        self.window = {**self._new_window(), **state.get("window", {})}
        self.last_batch = dict(state.get("last_batch", {}))
