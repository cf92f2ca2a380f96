"""The orchestrator's state machine: keep or drop groups, plan replenish rounds, assemble batches.

Pure Python and numpy: no Ray, no I/O, no clock. The Ray actor (``orchestrator.service.actor``) is a
thin shell that feeds it rollouts and forwards its batches.

Life of a batch::

    plan_round()  -> RoundPlan (round 0 'initial', then 'replenish' rounds 1, 2, ...)
    submit(groups) -> one round: 'initial' when it is the open batch's first, else 'replenish'
                      (counted here, so a round means the same whoever planned it);
                      each group classified (algos.dapo.classify_groups):
                      informative -> carry pool; otherwise -> padding candidates / dropped
    try_emit()    -> Batch of exactly target_groups when the carry pool holds enough
    cap_reached() -> close_at_cap(): pad | partial | raise, per policy.on_cap
    exhausted()   -> finish(): the last batch (per on_cap) or DataExhaustedError

Semantics users rely on (each tested):

* A group is judged on one outcome per rollout. A multi-turn trajectory is one rollout
  (:func:`trajectory_rollouts` sums its step rewards and keeps its last step's metrics), so a
  long trajectory weighs as much as a short one and per-step rows never make an all-solved
  group look informative. Rollout counters count rollouts, never steps.
* Group validity (``policy.group_validity``): ``reject`` refuses a group with a NaN, inf or
  missing reward or judged value, or fewer than ``group_size`` rollouts; ``mask`` marks those
  members (``info["dso_masked"]``, ``info["dso_loss_weight"] = 0``), leaves them out of the
  filter and of the baseline, and keeps the group while ``min_valid_group_size`` remain.
  :meth:`submit` is all-or-nothing (``on_invalid="raise"``); the Trinity route uses
  ``on_invalid="drop"``: an invalid group is dropped with reason ``invalid``, the others go on.
* Staleness: a rollout's *lag* is ``model_version - rollout_model_version`` in model versions,
  where ``model_version`` is the newest version the orchestrator has seen *when the batch is
  assembled* (:meth:`try_emit` / :meth:`close_at_cap`) and ``rollout_model_version`` is the
  rollout's ``info["model_version"]`` (else its group's). Lag > ``max_staleness`` is stale.
  ``stale_members="oldest"``: the oldest member decides and the group is dropped as ``stale``;
  ``"mask"``: stale members are masked as above.
* End of data: with ``max_epochs`` or ``max_rollouts`` set, :meth:`plan_round` plans nothing
  once the task order passed its last epoch or the budget cannot pay for one more group;
  :meth:`finish` then releases what is kept as a last batch per ``on_cap`` (or raises
  :class:`DataExhaustedError` when nothing is kept).

Accounting invariant (checked by the tests)::

    groups_submitted == groups_emitted + groups_padded + groups_dropped + groups_held

where ``groups_held`` are the carry pool plus the current batch's padding candidates.
Every group is emitted once, used once as padding, or dropped once with a reason.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import logging
import math
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from algos.dapo import GroupReason, InvalidGroupError, classify_groups
from orchestrator.core.errors import short_repr
from orchestrator.core.history import TaskHistory
from orchestrator.core.passrate import PassRateEstimate
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.rows import GroupRows
from orchestrator.core.selection import SelectionContext, TaskSelection, make_selection
from orchestrator.core.stats import COUNTERS, BatchStats, LastRound, Stats, TaskEstimate, TaskStats
from orchestrator.core.table import CheckedTable, check_table, table_error
from orchestrator.core.types import Batch, Experience, ExperienceId, Group, GroupTable, Purpose, UnknownTaskError
from orchestrator.core.validate import MAX_INT32, check_group

log = logging.getLogger("trinity_dso.core")

_LABELS = {int(r): r.label for r in GroupReason}
_consume = collections.deque(maxlen=0).extend
_TASK = operator.attrgetter("task_id")

ROUNDS_KEPT = 256
"""Replenish rounds of the most recent batches kept in ``stats()`` (the metrics histogram has all)."""
OPEN_ROUNDS_KEPT = 64
"""Planned rounds whose groups are still awaited, kept for the predicted-vs-realised keep rate."""


class ReplenishCapError(RuntimeError):
    """The replenish-round cap was hit under ``on_cap='raise'``. The open batch is kept."""


class DataExhaustedError(RuntimeError):
    """No task is left to roll out (``max_epochs`` or ``max_rollouts`` reached) and no batch remains."""


def rollout_lags(batch: Batch) -> np.ndarray:
    """Staleness lag, in model versions, of every trained rollout of a batch (not padding, not masked).

    ``lag = batch.model_version - rollout model version`` (see the module docstring).
    Returns:
        (R,) int64, in group then run order, from the batch's member columns at once.
    """
    versions, valid, padding = batch.columns("versions", "valid", "padding")
    trained = valid & ~padding[:, None]
    return batch.model_version - versions[trained].astype(np.int64)


def trajectory_rollouts(steps: list[Experience]) -> list[Experience]:
    """One rollout per trajectory from multi-turn step experiences, for the filter.

    Step rows sharing ``(eid.task, eid.round_tag, eid.run)`` form one trajectory, ordered by
    ``eid.step``. Its rollout has ``reward`` = the sum of the step rewards (the trajectory's
    outcome; a single-turn rollout keeps its reward), the last step's ``metrics`` (e.g. a
    terminal ``accuracy``), ``info["model_version"]`` = the oldest step's (staleness is judged
    by the oldest), ``info["num_steps"]`` and ``info["steps"]`` (the step experiences, in order).

    Args:
        steps: experiences of any number of trajectories, in any order.
    Returns:
        one :class:`Experience` per trajectory, in order of first appearance.
    """
    by_traj: dict[tuple[str, str, int], list[Experience]] = {}
    for e in steps:
        by_traj.setdefault((e.eid.task, e.eid.round_tag, int(e.eid.run)), []).append(e)
    out = []
    for (task, tag, run), rows in by_traj.items():
        if len(rows) == 1 and rows[0].eid.step == 0:
            out.append(rows[0])
            continue
        rows = sorted(rows, key=lambda e: e.eid.step)
        versions = [int(e.info["model_version"]) for e in rows if "model_version" in e.info]
        info = {"num_steps": len(rows), "steps": rows}
        if versions:
            info["model_version"] = min(versions)
        out.append(Experience(
            eid=ExperienceId(task=task, run=run, step=0, round_tag=tag),
            reward=float(sum(e.reward for e in rows)),
            info=info,
            metrics=dict(rows[-1].metrics),
        ))
    return out


@dataclass
class RoundPlan:
    """What the next round should roll out.

    Attributes:
        task_ids: tasks to roll out, n rollouts each (empty when nothing is needed).
        purpose: ``initial`` for a batch's first round, ``replenish`` afterwards.
        round: round index within the batch (0 = initial).
        batch_id: the batch the round serves.
    """

    task_ids: list[str]
    purpose: Purpose
    round: int
    batch_id: int


def json_safe(value: Any) -> Any:
    """``value`` with every numpy array or scalar inside dicts and lists made a Python list or number."""
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


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


def flagged(rollouts: list, flags: dict[str, Any], which: Callable[[Any], bool] | None = None) -> list:
    """``rollouts`` with ``flags`` added to the ``info`` of each (of those where ``which(r)``
    when given), as copies: a shallow copy of the rollout with a copy of its ``info``; the
    others are the same objects.

    A held group's rollouts are never changed in place once accepted: the state store may be
    pickling them in its worker thread (the commit of the change that made the group held),
    and a dict that grows while it is pickled fails the commit; what a commit writes is the
    group as it was when the commit was prepared."""
    out = []
    for r in rollouts:
        if which is None or which(r):
            r = copy.copy(r)
            r.info = {**r.info, **flags}
        out.append(r)
    return out


class OrchestratorCore:
    """Dynamic-sampling state machine for one training run.

    Args:
        policy: the resampling policy (replaceable at run time with :meth:`set_policy`).
        task_ids: every task id of the task set, in a stable order.
        seed: seeds the per-epoch task order.
    Raises:
        ValueError: empty or duplicate task ids.
    """

    def __init__(self, policy: ResamplingPolicy, task_ids: list[str], seed: int = 0, task_tags: list[str] | None = None):
        if not task_ids:
            raise ValueError("task_ids: the task set is empty")
        if len(set(task_ids)) != len(task_ids):
            raise ValueError("task_ids: duplicate task ids")
        self.policy = policy
        self.policy_revision = 0
        self.task_ids = list(task_ids)
        self._index = {t: i for i, t in enumerate(self.task_ids)}
        self.seed = seed
        self.history = TaskHistory(len(task_ids))
        self.passrate = PassRateEstimate(len(task_ids), half_life=policy.passrate_half_life, tags=task_tags)
        self.model_version = 0  # newest model version (model weights) seen
        # task order: one selection per mode used so far (the registry's, made on first use), each
        # keeping its place while another is active
        self.selections: dict[str, TaskSelection] = {policy.selection: make_selection(policy.selection, len(task_ids), seed, policy)}
        # the active selection's epoch in which each task was last drawn (-1: never); skip-rule
        # cooldowns count from it, in the active selection's epochs
        self.pick_epoch = np.full(len(task_ids), -1, dtype=np.int64)
        # planned rounds awaiting their groups: round key -> counts; task index -> round keys
        self.open_rounds: dict[str, dict] = {}
        self.awaited: dict[int, list[str]] = {}
        self.last_round: dict | None = None
        # the open batch
        self.batch_id = 0
        self.rounds_started = 0  # rounds planned for the open batch (cap, same_tasks)
        self.rounds_submitted = 0  # rounds submitted into the open batch (purpose, counters)
        self.dropped_task_ids: list[str] = []
        # tasks handed to an external explorer (next_tasks) whose groups have not come back yet
        self.in_flight: list[str] = []
        self.requeued: list[str] = []  # in-flight tasks of an explorer that restarted: handed out first
        self.carry = GroupRows.empty(policy.group_size)  # informative groups, oldest first
        self.candidates = GroupRows.empty(policy.group_size)  # the open batch's dropped groups, for padding
        # counters (cumulative)
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)  # cumulative, see Stats
        self.classified_by_reason = {r.label: 0 for r in GroupReason}
        self.dropped_by_reason = {r.label: 0 for r in GroupReason if r != GroupReason.INFORMATIVE}
        self.rounds_per_batch: list[int] = []
        self.requeue: list[str] = []  # tasks of stale groups to roll again (requeue_stale)
        self.window = self._new_window()  # per-batch sums since the last release
        self.last_batch: dict = {}  # per-batch reward metrics of the last released batch
        # task rows the per-task columns were written at since touched_rows(); None: any row
        self._touched: list[np.ndarray] | None = None

    @staticmethod
    def _new_window() -> dict:
        return {"reward_sum_all": 0.0, "reward_count_all": 0, "reward_sum_kept": 0.0, "reward_count_kept": 0, "rollouts": 0}

    # ------------------------------------------------------------------ policy
    def set_policy(self, policy: ResamplingPolicy) -> int:
        """Replace the policy; it applies from the next round. Returns the new revision.

        Raises:
            ValueError: ``group_size`` changed while groups are held (they would be ragged).
        """
        if policy.group_size != self.policy.group_size and (self.carry or self.candidates):
            raise ValueError(
                f"group_size: cannot change from {self.policy.group_size} to {policy.group_size} "
                f"while {len(self.carry) + len(self.candidates)} groups are held (they have {self.policy.group_size} "
                "rollouts each); change it once the stats' groups_held is 0"
            )
        old = self.selection
        new = self.selections.get(policy.selection) or make_selection(policy.selection, len(self.task_ids), self.seed, policy)
        for sel in {**self.selections, policy.selection: new}.values():
            sel.configure(policy)  # may refuse the policy (e.g. unknown selection_options): nothing changed yet
        self.selections[policy.selection] = new
        if new is not old:
            self._move_cooldowns(old.epoch, new.epoch)
        self.policy = policy
        self.policy_revision += 1
        self.passrate.half_life = policy.passrate_half_life
        return self.policy_revision

    def _move_cooldowns(self, old_epoch: int, new_epoch: int) -> None:
        """Re-express cooldowns and draw epochs in another selection's epoch count (a PATCH of
        ``selection``): a task keeps the epochs it has left to sit out, counted from the new
        selection's current epoch."""
        h = self.history
        left = np.maximum(h.skip_until_epoch - old_epoch, 0)
        h.skip_until_epoch[:] = np.where(left > 0, new_epoch + left, 0)
        self.pick_epoch[:] = np.where(self.pick_epoch >= 0, np.maximum(new_epoch + self.pick_epoch - old_epoch, 0), -1)
        self._touch(np.arange(len(self.task_ids), dtype=np.int64))

    def set_model_version(self, version: int) -> None:
        """Record the trainer's newest model version (model weights); used for staleness.

        Raises:
            ValueError: not an integer in [0, 2**31 - 1].
        """
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or not 0 <= version <= MAX_INT32:
            raise ValueError(f"model_version: expected an integer in [0, {MAX_INT32}], got {short_repr(version)}")
        self.model_version = max(self.model_version, int(version))

    # ------------------------------------------------------------------ tasks
    def task_index(self, task_id: str) -> int:
        try:
            return self._index[task_id]
        except KeyError:
            raise UnknownTaskError(f"task_id: unknown task {short_repr(task_id)} (task set has {len(self.task_ids)} tasks)") from None
        except TypeError:  # unhashable
            raise UnknownTaskError(f"task_id: not a task id: {short_repr(task_id)}") from None

    @property
    def selection(self) -> TaskSelection:
        """The active task selection (``policy.selection``; made from the registry on first use)."""
        name = self.policy.selection
        if name not in self.selections:
            self.selections[name] = make_selection(name, len(self.task_ids), self.seed, self.policy)
        return self.selections[name]

    @property
    def epoch(self) -> int:
        """The active selection's epoch (skip-rule cooldowns count in it)."""
        return self.selection.epoch

    def predicted_informative(self) -> np.ndarray:
        """(T,) float64: each task's predicted chance that its next group is informative
        (Beta-Binomial posterior predictive, :mod:`orchestrator.core.passrate`)."""
        return self.passrate.informativeness(self.model_version, self.policy.group_size)

    def _context(self) -> SelectionContext:
        p = self.policy
        return SelectionContext(
            skip_until_epoch=self.history.skip_until_epoch,
            informative=self.predicted_informative(),
            explore=p.selection_explore,
            sharpness=p.selection_sharpness,
            revisit_epochs=p.selection_revisit_epochs,
            max_epochs=p.max_epochs,
            zero_streak_correct=self.history.consec_all_correct,
            zero_streak_wrong=self.history.consec_all_wrong,
            options=dict(p.selection_options),
        )

    def select_tasks(self, count: int) -> list[str]:
        """Up to ``count`` next tasks (see :meth:`_draw_tasks`), within ``max_epochs`` and the rollout
        budget (``max_rollouts`` counts ``group_size`` rollouts per task handed out)."""
        left = self.rollouts_left()
        if left is not None:
            count = min(count, left // self.policy.group_size)
        tasks = self._draw_tasks(count)
        self.counters["rollouts_planned"] += len(tasks) * self.policy.group_size
        return tasks

    def _draw_tasks(self, count: int, need: float | None = None, ctx: SelectionContext | None = None) -> list[str]:
        """Up to ``count`` next tasks of the active selection (``policy.selection``).

        ``epoch``: each epoch is a seeded permutation of the task set. A task skipped by the
        rules ``skip_after_all_correct`` / ``skip_after_all_wrong`` sits out ``cooldown_epochs``.
        When every task is cooling down, the order moves to the next epoch (at most
        ``cooldown_epochs + 1`` epochs ahead), so selection always terminates.
        ``informative``: see :class:`orchestrator.core.selection.InformativeSelection`; an epoch
        is as many picks as there are tasks. With ``need`` (informative only), the draw stops
        once the tasks drawn are predicted to give ``need`` informative groups
        (:meth:`~orchestrator.core.selection.TaskSelection.fill`).

        Nothing is drawn once ``max_epochs`` epochs have passed, and a draw never enters epoch
        ``max_epochs`` (the selection stops at its boundary).
        """
        if self.epochs_done() or count <= 0:
            return []
        ctx = ctx if ctx is not None else self._context()
        idx = self.selection.select(count, ctx) if need is None else self.selection.fill(need, count, ctx)
        self.pick_epoch[idx] = self.selection.picked_epochs
        self._touch(idx)  # the selection's last_pick
        return [self.task_ids[i] for i in idx]

    # ------------------------------------------------------------------ end of data
    def epochs_done(self) -> bool:
        """True once the task order has passed ``policy.max_epochs`` epochs."""
        return self.policy.max_epochs is not None and self.epoch >= self.policy.max_epochs

    def rollouts_left(self) -> int | None:
        """Rollouts the budget still allows (None without ``max_rollouts``)."""
        if self.policy.max_rollouts is None:
            return None
        c = self.counters
        return max(0, self.policy.max_rollouts - c["rollouts_planned"])

    def exhausted(self) -> bool:
        """True when no further round can be planned: epochs done, or no budget for one more group."""
        left = self.rollouts_left()
        return self.epochs_done() or (left is not None and left < self.policy.group_size)

    def finish(self) -> Batch | None:
        """At the end of data: release what is kept as the last batch, per ``on_cap``.

        Returns:
            the last batch (``pad``: kept groups plus padding; ``partial``: kept groups only),
            or None when no informative group is held (the padding candidates are dropped).
        Raises:
            ReplenishCapError: ``on_cap='raise'`` and a short batch is held (nothing changes).
        """
        self._drop_stale()
        if not self.carry:
            self._drop(self.candidates)
            self.candidates = GroupRows.empty(self.policy.group_size)
            return None
        return self.close_at_cap()

    # ------------------------------------------------------------------ rounds
    def predicted_keep_rate(self) -> float:
        """Laplace-smoothed share of groups classified informative so far: (k + 1) / (g + 2)."""
        c = self.counters
        return (c["groups_kept_classified"] + 1) / (c["groups_submitted"] + 2)

    def missing_groups(self) -> int:
        return max(0, self.policy.target_groups - len(self.carry))

    def cap_reached(self) -> bool:
        """True when the open batch may not start another replenish round.

        Filter-only mode (``replenish='none'``): as soon as the initial round has run.
        """
        if self.missing_groups() == 0 or self.rounds_started == 0:
            return False
        if self.policy.screen_rollouts and not self.carry and not self.candidates:
            return False  # every group so far was a stopped screen: nothing to release yet (no empty batch)
        if self.policy.replenish == "none":
            return True
        cap = self.policy.max_replenish_rounds
        return cap > 0 and self.rounds_started > cap

    def replenish_blocked(self) -> bool:
        """True when the next round would be a replenish round and replenishment is paused."""
        return self.policy.replenish_paused and self.rounds_started > 0

    def plan_round(self) -> RoundPlan:
        """Plan the next round: only the missing count, sized by the predicted keep rate.

        ``count = min(ceil(missing / max(min_keep_rate, p_keep)), max_tasks_per_round)``,
        and no more than the rollout budget pays for. Tasks of stale groups (``requeue_stale``)
        come first. With ``replenish='same_tasks'``, replenish rounds then re-roll this batch's
        dropped tasks (oldest first; not those a skip rule has just put in cooldown) and top up
        with fresh tasks. Plans nothing once :meth:`exhausted`.
        """
        missing = self.missing_groups()
        rnd = self.rounds_started
        purpose: Purpose = "initial" if rnd == 0 else "replenish"
        if missing == 0 or self.exhausted():
            return RoundPlan([], purpose, rnd, self.batch_id)
        ctx = self._context()
        informative = self.selection.sizes_by_prediction
        p = self.policy.min_keep_rate if informative else max(self.policy.min_keep_rate, self.predicted_keep_rate())
        count = min(math.ceil(missing / p), self.policy.max_tasks_per_round)
        left = self.rollouts_left()
        if left is not None:
            count = min(count, left // self.policy.group_size)
        task_ids, self.requeue = self.requeue[:count], self.requeue[count:]
        if rnd > 0 and self.policy.replenish == "same_tasks":
            skip_until = self.history.skip_until_epoch
            rerolls = [t for t in self.dropped_task_ids if skip_until[self._index[t]] <= self.epoch]
            take = count - len(task_ids)
            task_ids, self.dropped_task_ids = task_ids + rerolls[:take], rerolls[take:]
        taken = np.array([self._index[t] for t in task_ids], dtype=np.int64)
        need = missing - float(ctx.informative[taken].sum()) if informative else None
        task_ids += self._draw_tasks(count - len(task_ids), need=need, ctx=ctx)
        self.counters["rollouts_planned"] += len(task_ids) * self.policy.group_size
        self.rounds_started += 1
        self._open_round(np.array([self._index[t] for t in task_ids], dtype=np.int64), ctx.informative)
        return RoundPlan(task_ids, purpose, rnd, self.batch_id)

    def screen_mask(self, task_ids: list[str]) -> np.ndarray:
        """(k,) bool: which of a round's tasks to screen first (``policy.screen_rollouts > 0`` and the
        task's predicted chance of an informative group below ``policy.screen_skip_above``); see
        :mod:`orchestrator.rollout.screening`."""
        if not self.policy.screen_rollouts or not task_ids:
            return np.zeros(len(task_ids), dtype=bool)
        idx = np.array([self._index[t] for t in task_ids], dtype=np.int64)
        return self.predicted_informative()[idx] < self.policy.screen_skip_above

    def record_screens(self, screened: int, task_ids: list[str], correct: np.ndarray, trials: np.ndarray) -> None:
        """Count a round's screens and take the evidence of those that stopped (all rollouts equal,
        never completed): their rollouts count as generated (``rollouts_screen_stopped``), the
        rollouts they did not spend go back to the ``max_rollouts`` budget, the pass-rate estimate
        learns from them, and their planned round counts them as not informative."""
        c = self.counters
        c["screens"] += screened
        if not task_ids:
            return
        idx = np.array([self.task_index(t) for t in task_ids], dtype=np.int64)
        trials = np.asarray(trials, dtype=np.int64)
        versions = np.full(len(idx), self.model_version, dtype=np.int64)
        self.passrate.observe(idx, np.asarray(correct), trials, np.zeros(len(idx), dtype=bool), versions)
        self._close_rounds(idx, np.zeros(len(idx), dtype=bool))
        c["screens_stopped"] += len(idx)
        c["rollouts_screen_stopped"] += int(trials.sum())
        c["rollouts_planned"] -= int((self.policy.group_size - trials).sum())
        self._touch(idx)

    def _open_round(self, idx: np.ndarray, informative: np.ndarray) -> None:
        """Remember a planned round's predicted keep rate until all its groups are submitted."""
        if not len(idx):
            return
        key = f"b{self.batch_id}r{self.rounds_started - 1}"
        self.open_rounds[key] = {
            "predicted_keep_rate": float(informative[idx].mean()),
            "predicted_informative": float(informative[idx].sum()),
            "tasks": int(len(idx)),
            "submitted": 0,
            "informative": 0,
        }
        for i in idx.tolist():
            self.awaited.setdefault(i, []).append(key)
        while len(self.open_rounds) > OPEN_ROUNDS_KEPT:  # groups never came back: forget the oldest round
            old = next(iter(self.open_rounds))
            del self.open_rounds[old]
            for i in [i for i, keys in self.awaited.items() if old in keys]:
                self.awaited[i] = [k for k in self.awaited[i] if k != old]
                if not self.awaited[i]:
                    del self.awaited[i]

    def _close_rounds(self, idx: np.ndarray, keep: np.ndarray) -> None:
        """Count submitted groups against the planned rounds awaiting them (oldest round first)."""
        if not self.awaited:  # no planned round awaits a group (e.g. tasks chosen by the caller)
            return
        c = self.counters
        for i, kept in zip(idx.tolist(), keep.tolist(), strict=True):
            keys = self.awaited.get(i)
            if not keys:
                continue
            key = keys.pop(0)
            if not keys:
                del self.awaited[i]
            r = self.open_rounds.get(key)
            if r is None:
                continue
            r["submitted"] += 1
            r["informative"] += int(kept)
            if r["submitted"] == r["tasks"]:
                del self.open_rounds[key]
                c["rounds_completed"] += 1
                c["round_predicted_informative"] += r["predicted_informative"]
                c["round_realised_informative"] += r["informative"]
                c["round_groups"] += r["tasks"]
                self.last_round = {
                    "round": key,
                    "tasks": r["tasks"],
                    "predicted_keep_rate": r["predicted_keep_rate"],
                    "realised_keep_rate": r["informative"] / r["tasks"],
                }

    def next_tasks(self, count: int) -> list[str]:
        """``count`` tasks for one step of an external explorer (Trinity reads a fixed number).

        Order: tasks requeued after an explorer restart (:meth:`requeue_in_flight`), then with
        ``replenish='same_tasks'`` this batch's dropped tasks (not those a skip rule has just
        put in cooldown), then fresh tasks in epoch order (:meth:`select_tasks`). Every task
        handed out stays "in flight" until its group is submitted. At the end of data
        (:meth:`exhausted`: ``max_epochs`` passed, or the ``max_rollouts`` budget spent) fewer
        come back, none once only requeued tasks were left; new tasks (re-rolls included)
        count against the rollout budget, requeued ones were counted when first handed out.

        Raises:
            ValueError: ``count`` < 1.
        """
        if count < 1:
            raise ValueError(f"count: must be >= 1, got {count}")
        tasks, self.requeued = self.requeued[:count], self.requeued[count:]
        want = count - len(tasks)
        left = self.rollouts_left()
        if left is not None:
            want = min(want, left // self.policy.group_size)
        if self.epochs_done():
            want = 0
        if self.policy.replenish == "same_tasks" and want > 0:
            skip_until = self.history.skip_until_epoch
            rerolls = [t for t in self.dropped_task_ids if skip_until[self._index[t]] <= self.epoch]
            take = rerolls[:want]
            tasks += take
            want -= len(take)
            self.dropped_task_ids = rerolls[len(take):]
            self.counters["rollouts_planned"] += len(take) * self.policy.group_size
        while want > 0 and not self.exhausted():  # select_tasks may fall short when every task cools down
            more = self.select_tasks(want)
            if not more and not self.exhausted():
                more = self.task_ids[:want]
                self.counters["rollouts_planned"] += len(more) * self.policy.group_size
            tasks += more
            want -= len(more)
        self.in_flight.extend(tasks)
        return tasks

    def requeue_in_flight(self) -> list[str]:
        """Hand the in-flight tasks out again first: their explorer restarted before their groups came back.

        Returns:
            the requeued task ids (oldest first).
        """
        moved, self.in_flight = self.in_flight, []
        self.requeued = moved + self.requeued
        return list(moved)

    # ------------------------------------------------------------------ submit
    def judge_name(self, group: Group) -> str:
        """The judged value of a group: ``policy.filter.judge``, with ``auto`` resolved.

        ``auto`` judges ``metrics["accuracy"]`` (the unshaped outcome DAPO's scorers write) when
        any rollout of the group carries it, else the reward.
        """
        judge = self.policy.filter.judge
        if judge != "auto":
            return judge
        return "accuracy" if any("accuracy" in r.metrics for r in group.rollouts) else "reward"

    def _judge_rows(self, group: Group) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(n,) judged values by run (NaN where unusable), (n,) valid flags, and the problems found."""
        n = self.policy.group_size
        judge = self.judge_name(group)
        values = np.full(n, np.nan)
        valid = np.zeros(n, dtype=bool)
        problems = []
        for r in group.rollouts:
            reward = r.reward
            value = reward if judge == "reward" else r.metrics.get(judge)
            where = f"in run {r.eid.run} of task {group.task_id!r}"
            if reward is None:
                problems.append(f"reward: missing (None) {where}")
            elif not isinstance(reward, (int, float)) or not math.isfinite(reward):
                problems.append(f"reward: non-finite value {reward!r} {where}")
            elif abs(reward) > self.policy.max_abs_reward:
                problems.append(f"reward: |{reward!r}| exceeds max_abs_reward={self.policy.max_abs_reward:g} {where}")
            elif value is None:
                problems.append(f"metrics[{judge!r}]: missing {where} (the filter judges it)")
            elif not isinstance(value, (int, float)) or not math.isfinite(value) or abs(value) > self.policy.max_abs_reward:
                problems.append(f"{judge}: non-finite or absurd value {value!r} {where}")
            elif not r.info.get("dso_masked"):
                values[r.eid.run] = float(value)
                valid[r.eid.run] = True
        return values, valid, problems

    def _check_group(self, g: Group) -> tuple[np.ndarray, np.ndarray]:
        """Validate one group (no state change). Returns its (n,) judged values and valid flags.

        Raises:
            UnknownTaskError: a task id outside the task set.
            InvalidGroupError: types and storable values (:func:`orchestrator.core.validate.check_group`:
                wrong types, numpy scalars, values JSON cannot hold, negative or huge version,
                oversize id), structure (empty, too many or, under ``reject``, too few rollouts;
                duplicate or out-of-range runs; another task's experience) or values (non-finite
                or missing reward / judged value under ``reject``; under ``mask``, fewer than
                ``min_valid_group_size`` usable members).
        """
        p = self.policy
        n = p.group_size
        mask = p.group_validity == "mask"
        check_group(g)
        self.task_index(g.task_id)
        if not g.rollouts:
            raise InvalidGroupError(f"rollouts: group of task {g.task_id!r} is empty")
        if len(g.rollouts) > n or (len(g.rollouts) < n and not mask):
            raise InvalidGroupError(
                f"rollouts: group of task {g.task_id!r} has {len(g.rollouts)} rollouts, expected group_size={n}"
            )
        runs = [r.eid.run for r in g.rollouts]
        if len(set(runs)) != len(runs):
            dup = next(x for x in runs if runs.count(x) > 1)
            raise InvalidGroupError(f"eid.run: duplicate run id {dup} in group of task {g.task_id!r}")
        if min(runs) < 0 or max(runs) >= n:
            raise InvalidGroupError(f"eid.run: run ids {sorted(runs)} of task {g.task_id!r} not in [0, {n})")
        other = next((r.eid.task for r in g.rollouts if r.eid.task != g.task_id), None)
        if other is not None:
            raise InvalidGroupError(f"eid.task: experience of task {other!r} in group of task {g.task_id!r}")
        values, valid, problems = self._judge_rows(g)
        if problems and not mask:
            raise InvalidGroupError(problems[0])
        if mask and valid.sum() < p.min_valid_group_size:
            why = f" ({problems[0]})" if problems else ""
            raise InvalidGroupError(
                f"group_validity: task {g.task_id!r} has {int(valid.sum())} usable rollouts of {n}, below "
                f"min_valid_group_size={p.min_valid_group_size}{why}"
            )
        return values, valid

    def _fill_columns(self, g: Group, values: np.ndarray, valid: np.ndarray) -> None:
        """Set a checked rollouts group's member columns (by run) from its rollouts."""
        n = self.policy.group_size
        rewards = np.full(n, np.nan)
        runs = [r.eid.run for r in g.rollouts]
        rewards[runs] = [np.nan if r.reward is None else float(r.reward) for r in g.rollouts]
        present = [int(r.info.get("model_version", g.model_version)) for r in g.rollouts]
        versions = np.full(n, max(present), dtype=np.int64)  # absent members: no effect on min / max
        versions[runs] = present
        g.rewards, g.values, g.valid, g.versions, g.size = rewards, values, valid, versions, len(g.rollouts)

    def check_table(self, table: GroupTable) -> CheckedTable:
        """:func:`orchestrator.core.table.check_table` under the current policy and task set (no state change)."""
        return check_table(table, self.policy, self._index)

    def check_groups(self, groups: list[Group]) -> list[tuple[np.ndarray, np.ndarray]]:
        """:meth:`_check_group` of each group (no state change): their (n,) judged values and valid flags.

        Raises:
            see :meth:`_check_group`.
        """
        if not isinstance(groups, list):
            raise InvalidGroupError(f"groups: expected a list of groups, got {short_repr(groups)}")
        return [self._check_group(g) for g in groups]

    def validate(self, groups: list[Group]) -> np.ndarray:
        """Check groups before any state changes; raise naming the field, task and value.

        Returns:
            (G, n) float64: the judged value of every rollout by run (NaN for masked members).
        Raises:
            see :meth:`_check_group`.
        """
        if not isinstance(groups, list):
            raise InvalidGroupError(f"groups: expected a list of groups, got {short_repr(groups)}")
        return np.array([self._check_group(g)[0] for g in groups], dtype=np.float64).reshape(len(groups), -1)

    def submit(
        self, groups: list[Group], on_invalid: str = "raise", checked: list[tuple[np.ndarray, np.ndarray]] | None = None,
        new_round: bool = True,
    ) -> list[Group]:
        """Classify and take ownership of groups.

        Args:
            groups: G groups of ``group_size`` rollouts (fewer allowed under ``group_validity='mask'``).
            on_invalid: ``"raise"``: all groups are validated first and one invalid group
                rejects the call, changing nothing (the direct actor API); ``"drop"``: each
                invalid group is dropped with reason ``invalid`` (counted, logged) and the
                others go on (the Trinity route).
            checked: what :meth:`check_groups` returned for exactly these groups under the
                current policy (they are not checked again); None checks here.
            new_round: True: this call is the next round of the open batch (``initial`` when it
                is the first, else ``replenish``); False: it continues the round of the previous
                call (a caller submitting one round in slices), or starts one if a batch was
                released in between.
        Returns:
            the same groups, with ``reason`` set to the filter's label (``invalid`` for dropped ones).
        Raises:
            see :meth:`_check_group` (``on_invalid="raise"`` only).
        """
        if on_invalid not in ("raise", "drop"):
            raise ValueError(f"on_invalid: must be 'raise' or 'drop', got {on_invalid!r}")
        if not groups:
            return []
        results = iter(checked) if checked is not None else None
        invalid = []
        for g in groups:
            try:
                values, valid = next(results) if results is not None else self._check_group(g)
            except (InvalidGroupError, UnknownTaskError) as err:
                if on_invalid == "raise":
                    raise
                if isinstance(g, Group):
                    g.size = len(g.rollouts) if isinstance(g.rollouts, list) else 0
                invalid.append((g, err))
                continue
            self._fill_columns(g, values, valid)
        rnd, purpose = self._count_round(new_round)
        self._came_back([g.task_id for g in groups if isinstance(g, Group)])
        for g in groups:
            if isinstance(g, Group):
                g.purpose, g.round = purpose, rnd
        bad = set()
        for g, err in invalid:
            log.warning("dropped invalid group of task %r: %s", g.task_id, err)
            bad.add(id(g))
            g.reason = GroupReason.INVALID.label
            self._count_invalid(purpose, [g.size])
        accepted = [g for g in groups if id(g) not in bad] if bad else groups
        if accepted:
            for g in accepted:
                if not g.valid.all():  # flagged on copies: the submitter's rollouts stay as they were
                    g.rollouts = flagged(g.rollouts, {"dso_masked": "invalid", "dso_loss_weight": 0.0},
                                         lambda r, valid=g.valid: not valid[r.eid.run] and not r.info.get("dso_masked"))
            idx = np.fromiter(map(self._index.__getitem__, map(_TASK, accepted)), np.int64, len(accepted))
            rows = GroupRows.from_groups(accepted, idx)
            self._accept(rows)
            _consume(map(setattr, accepted, itertools.repeat("reason"), rows.reasons))
        return groups

    def submit_table(self, table: GroupTable, on_invalid: str = "drop", new_round: bool = True,
                     checked: CheckedTable | None = None, keys: list[str] | None = None) -> GroupRows:
        """:meth:`submit` of a :class:`GroupTable`: checked at once (:meth:`check_table`), no
        per-rollout objects and no :class:`Group` objects. Returns every row, in row order,
        ``reason`` set (``invalid`` for a dropped one).

        ``checked``: what :meth:`check_table` returned for exactly this table under the current
        policy (not checked again); None checks here. ``keys``: each row's storage key
        (``Group.key``; the actor's identities), held with it.

        Raises:
            InvalidGroupError, UnknownTaskError: ``on_invalid="raise"`` and a row is invalid
                (the first one; nothing changes).
            ValueError: ``keys`` is not one key per row (nothing changes).
        """
        if on_invalid not in ("raise", "drop"):
            raise ValueError(f"on_invalid: must be 'raise' or 'drop', got {on_invalid!r}")
        checked = checked if checked is not None else self.check_table(table)
        rows, errors = checked.rows, checked.errors
        if errors and on_invalid == "raise":
            raise table_error(errors)
        if keys is not None:
            if len(keys) != len(rows):
                raise ValueError(f"keys: {len(keys)} keys for {len(rows)} rows")
            rows.keys = list(keys)
        if not len(rows):
            return rows
        rnd, purpose = self._count_round(new_round)
        self._came_back(rows.task_ids)
        num = len(rows)
        rows.purposes, rows.rounds = [purpose] * num, [rnd] * num
        if not errors:
            self._accept(rows)
            return rows
        bad = np.zeros(num, dtype=bool)
        bad[list(errors)] = True
        for i in sorted(errors):
            log.warning("dropped invalid group of task %r: %s", rows.task_ids[i], errors[i])
        self._count_invalid(purpose, [rows.sizes[i] for i in sorted(errors)])
        accepted = rows.take(~bad)
        if len(accepted):
            self._accept(accepted)
        labels = iter(accepted.reasons)
        rows.reasons = [GroupReason.INVALID.label if b else next(labels) for b in bad.tolist()]
        return rows

    def _count_round(self, new_round: bool) -> tuple[int, Purpose]:
        """Count one submission as a round of the open batch, whoever planned it: its round
        number and purpose (``new_round=False``: the round of the previous submission)."""
        if new_round or self.rounds_submitted == 0:
            rnd = self.rounds_submitted
            self.rounds_submitted += 1
            if rnd > 0:
                self.counters["replenish_rounds"] += 1
        else:
            rnd = self.rounds_submitted - 1
        return rnd, "initial" if rnd == 0 else "replenish"

    def _came_back(self, task_ids: list) -> None:
        """Tasks whose groups were submitted are no longer in flight."""
        if self.in_flight:
            back = {t for t in task_ids if isinstance(t, str)}
            self.in_flight = [t for t in self.in_flight if t not in back]

    def _count_invalid(self, purpose: Purpose, sizes: list[int]) -> None:
        """Count groups dropped as invalid on submit (of ``sizes`` rollouts each)."""
        c, label, size = self.counters, GroupReason.INVALID.label, sum(sizes)
        c["groups_submitted"] += len(sizes)
        c["rollouts_initial" if purpose == "initial" else "rollouts_replenish"] += size
        self.window["rollouts"] += size
        self.classified_by_reason[label] += len(sizes)
        self._count_dropped(size, collections.Counter({label: len(sizes)}))

    def _accept(self, rows: GroupRows) -> None:
        """Classify checked groups on their member columns and hold them (carry pool or
        candidates); sets ``rows.reasons``. All rows of one call share ``purpose``."""
        f = self.policy.filter
        idx, raw, values, valid, all_versions = rows.task_index, rows.rewards, rows.values, rows.valid, rows.versions
        rewards = np.where(valid, raw, 0.0)
        if f.enabled:
            keep, reasons = classify_groups(
                values, std_tol=f.std_tol, correct_threshold=f.correct_threshold, wrong_threshold=f.wrong_threshold,
                band=f.band, valid=valid,
            )
        else:
            keep = np.ones(len(rows), dtype=bool)
            reasons = np.full(len(rows), GroupReason.INFORMATIVE, dtype=np.int8)
        versions = all_versions.min(axis=1)
        correct = valid & (np.nan_to_num(values, nan=-np.inf) >= f.correct_threshold)
        self.history.update(idx, rewards, correct, reasons, versions, valid=valid)
        self.passrate.observe(idx, correct.sum(axis=1), valid.sum(axis=1), keep, versions)
        for sel in self.selections.values():
            sel.observe(idx, keep, reasons == GroupReason.ALL_CORRECT)
        self._close_rounds(idx, keep)
        self.model_version = max(self.model_version, int(all_versions.max()))
        if self.policy.skip_after_all_correct or self.policy.skip_after_all_wrong:
            self._apply_skip_rules(np.unique(idx))
        self._touch(idx)  # the history (skip rules included) and the pass-rate evidence

        c, w = self.counters, self.window
        size = sum(rows.sizes)
        c["groups_submitted"] += len(rows)
        c["groups_kept_classified"] += int(keep.sum())
        c["rollouts_masked"] += int(size - valid.sum())
        for sums in (c, w):
            sums["reward_sum_all"] += float(rewards[valid].sum())
            sums["reward_count_all"] += int(valid.sum())
            sums["reward_sum_kept"] += float(rewards[keep][valid[keep]].sum())
            sums["reward_count_kept"] += int(valid[keep].sum())
        rows.reasons = list(map(_LABELS.__getitem__, reasons.tolist()))
        for code, count in enumerate(np.bincount(reasons, minlength=len(_LABELS)).tolist()):
            if count:
                self.classified_by_reason[_LABELS[code]] += count
        c["rollouts_initial" if rows.purposes[0] == "initial" else "rollouts_replenish"] += size
        w["rollouts"] += size
        informative = reasons == GroupReason.INFORMATIVE
        if informative.all():
            self.carry = GroupRows.concat(self.carry, rows)
            return
        self.carry = GroupRows.concat(self.carry, rows.take(informative))
        dropped = rows.take(~informative)
        self.dropped_task_ids.extend(dropped.task_ids)
        candidates = GroupRows.concat(self.candidates, dropped)
        overflow = len(candidates) - self.policy.target_groups
        if overflow > 0:
            self._drop(candidates.take(slice(None, overflow)))
            candidates = candidates.take(slice(overflow, None))
        self.candidates = candidates

    def _apply_skip_rules(self, idx: np.ndarray) -> None:
        p, h = self.policy, self.history
        hit = np.zeros(len(idx), dtype=bool)
        if p.skip_after_all_correct:
            hit |= h.consec_all_correct[idx] >= p.skip_after_all_correct
        if p.skip_after_all_wrong:
            hit |= h.consec_all_wrong[idx] >= p.skip_after_all_wrong
        t = idx[hit]
        # counted from the epoch the task was drawn in (its group may come back after the order
        # entered the next epoch); a task never drawn here (groups submitted from elsewhere): now
        drawn = self.pick_epoch[t]
        h.skip_until_epoch[t] = np.where(drawn >= 0, drawn, self.epoch) + 1 + p.cooldown_epochs
        h.consec_all_correct[t] = 0
        h.consec_all_wrong[t] = 0

    def _drop(self, rows: GroupRows) -> None:
        """Count held groups dropped, each under its own ``reason``, in one pass."""
        if len(rows):
            self._count_dropped(sum(rows.sizes), collections.Counter(rows.reasons))

    def drop_held(self, refs: set[str], reason: str) -> int:
        """Drop the held groups (carry pool and padding candidates) whose ``ref`` is in ``refs``,
        counted under ``reason``; returns how many (refs not held are ignored: idempotent)."""
        count = 0
        for name in ("carry", "candidates"):
            rows = getattr(self, name)
            hit = np.fromiter(map(refs.__contains__, rows.refs), bool, len(rows))
            if hit.any():
                dropped = rows.take(hit)
                dropped.reasons = [reason] * len(dropped)
                self._drop(dropped)
                setattr(self, name, rows.take(~hit))
                count += len(dropped)
        return count

    def _count_dropped(self, rollouts: int, by_reason: collections.Counter) -> None:
        self.counters["groups_dropped"] += sum(by_reason.values())
        self.counters["rollouts_wasted"] += rollouts
        for reason, count in by_reason.items():
            self.dropped_by_reason[reason] += count

    # ------------------------------------------------------------------ batches
    def _drop_stale(self) -> None:
        """Apply ``max_staleness`` to the carry pool, per member (see the module docstring)."""
        p = self.policy
        if p.max_staleness is None or not self.carry:
            return
        # every carried group at once (their columns have group_size members: set_policy refuses
        # to change it while groups are held); masked members no longer count
        carry = self.carry
        stale = carry.valid & (self.model_version - carry.versions > p.max_staleness)
        hit = stale.any(axis=1)
        if not hit.any():
            return
        keep = ~hit
        valid = carry.valid.copy()  # never written in place: a commit may be pickling the old one
        for i in np.flatnonzero(hit).tolist():
            if p.stale_members == "mask" and (masked := self._mask_stale(carry, i, stale[i])) is not None:
                valid[i] = masked
                keep[i] = True
        carry = carry.with_valid(valid)
        dropped = carry.take(~keep)
        dropped.reasons = [GroupReason.STALE.label] * len(dropped)
        self._drop(dropped)
        if p.requeue_stale:
            self.requeue.extend(dropped.task_ids)
        self.carry = carry.take(keep)

    def _mask_stale(self, rows: GroupRows, i: int, stale: np.ndarray) -> np.ndarray | None:
        """Mask the stale members of group ``i`` of ``rows`` if it stays usable (enough members,
        still informative): its new (n,) valid flags (its rollouts flagged, on copies), else None."""
        values, valid = rows.values[i], rows.valid[i] & ~stale
        if valid.sum() < self.policy.min_valid_group_size:
            return None
        f = self.policy.filter
        if f.enabled:
            keep, _ = classify_groups(
                values[None], std_tol=f.std_tol, correct_threshold=f.correct_threshold,
                wrong_threshold=f.wrong_threshold, band=f.band, valid=valid[None],
            )
            if not keep[0]:
                return None
        if rows.rollouts[i]:
            rows.rollouts[i] = flagged(rows.rollouts[i], {"dso_masked": "stale", "dso_loss_weight": 0.0}, lambda r: stale[r.eid.run])
        self.counters["rollouts_masked"] += int(stale.sum())
        return valid

    def _release(self, groups: GroupRows, padding: int, partial: bool) -> Batch:
        """Release ``groups`` and the last ``padding`` candidates (as padding) as the next batch;
        the other candidates are dropped."""
        cut = len(self.candidates) - padding
        pad = self.candidates.take(slice(cut, None))
        self._drop(self.candidates.take(slice(None, cut)))
        if padding:
            pad.padding = [True] * padding
            pad.rollouts = [flagged(r, {"dso_padding": True, "dso_loss_weight": 0.0}) if r else r for r in pad.rollouts]
        if len(groups):  # trained on next: their pass rates move, so their evidence counts less
            self.passrate.discount(groups.task_index, self.policy.passrate_trained_discount)
            self._touch(groups.task_index)
        c = self.counters
        c["groups_emitted"] += len(groups)
        c["groups_padded"] += padding
        c["rollouts_wasted"] += sum(pad.sizes)
        c["batches_emitted"] += 1
        c["batches_partial"] += int(partial)
        trained = groups.rewards[groups.valid].tolist()  # in group then run order: the same sum as group by group
        c["reward_sum_trained"] += float(sum(trained))
        c["reward_count_trained"] += len(trained)
        w = self.window
        self.last_batch = {
            "batch_id": self.batch_id,
            "mean_reward_all": _ratio(w["reward_sum_all"], w["reward_count_all"]),
            "mean_reward_kept": _ratio(w["reward_sum_kept"], w["reward_count_kept"]),
            "mean_reward_trained": _ratio(float(sum(trained)), len(trained)),
            "coverage": _ratio(len(trained), w["rollouts"]),
            "rollouts_trained": len(trained),
            "rollouts_generated": w["rollouts"],
        }
        self.window = self._new_window()
        rounds = max(0, self.rounds_submitted - 1)
        self.rounds_per_batch = (self.rounds_per_batch + [rounds])[-ROUNDS_KEPT:]
        batch = Batch(self.batch_id, GroupRows.concat(groups, pad), partial=partial, rounds=rounds, model_version=self.model_version)
        self.batch_id += 1
        self.rounds_started = 0
        self.rounds_submitted = 0
        self.dropped_task_ids = []
        self.candidates = GroupRows.empty(self.policy.group_size)
        return batch

    def try_emit(self) -> Batch | None:
        """Release a batch of exactly ``target_groups`` informative groups if the carry pool holds them.

        Surplus groups stay in the carry pool for the next batch (dropped only when stale).
        """
        self._drop_stale()
        k = self.policy.target_groups
        if len(self.carry) < k:
            return None
        groups, self.carry = self.carry.take(slice(None, k)), self.carry.take(slice(k, None))
        return self._release(groups, 0, partial=False)

    def close_at_cap(self) -> Batch:
        """Close the open batch when the cap is reached, per ``policy.on_cap``.

        ``pad``: the kept groups plus the most recent dropped groups as padding (batch of
        exactly ``target_groups`` when enough dropped groups exist, else flagged partial);
        ``partial``: the kept groups only, flagged partial;
        ``raise``: raises :class:`ReplenishCapError` and changes nothing.
        """
        self._drop_stale()
        p = self.policy
        kept = self.carry.take(slice(None, p.target_groups))
        if p.on_cap == "raise":
            raise ReplenishCapError(
                f"max_replenish_rounds: batch {self.batch_id} has {len(kept)} of {p.target_groups} informative "
                f"groups after {max(0, self.rounds_submitted - 1)} replenish rounds (cap {p.max_replenish_rounds})"
            )
        self.counters["cap_hits"] += 1
        self.carry = self.carry.take(slice(len(kept), None))
        padding = min(p.target_groups - len(kept), len(self.candidates)) if p.on_cap == "pad" else 0
        partial = len(kept) + padding < p.target_groups
        return self._release(kept, padding, partial=partial)

    # ------------------------------------------------------------------ views
    def stats(self) -> Stats:
        """The live counters as one typed record (see :class:`orchestrator.core.stats.Stats`)."""
        c = dict(self.counters)
        held = len(self.carry) + len(self.candidates)
        emitted_inf = c["groups_emitted"]
        rollouts = c["rollouts_initial"] + c["rollouts_replenish"] + c["rollouts_screen_stopped"]
        c.update(
            groups_held=held,
            groups_carried=len(self.carry),
            classified_by_reason=dict(self.classified_by_reason),
            dropped_by_reason=dict(self.dropped_by_reason),
            keep_ratio=c["groups_kept_classified"] / c["groups_submitted"] if c["groups_submitted"] else None,
            mean_reward_all=c["reward_sum_all"] / c["reward_count_all"] if c["reward_count_all"] else None,
            mean_reward_kept=c["reward_sum_kept"] / c["reward_count_kept"] if c["reward_count_kept"] else None,
            mean_reward_trained=_ratio(c["reward_sum_trained"], c["reward_count_trained"]),
            coverage=_ratio(c["reward_count_trained"], rollouts),
            last_batch=BatchStats(**self.last_batch) if self.last_batch else None,
            exhausted=self.exhausted(),
            rollouts_total=rollouts,
            rollouts_per_emitted_group=rollouts / emitted_inf if emitted_inf else None,
            rounds_per_batch=list(self.rounds_per_batch),
            batch_id=self.batch_id,
            policy_revision=self.policy_revision,
            model_version=self.model_version,
            epoch=self.epoch,
            predicted_keep_rate=self.predicted_keep_rate(),
            selection=self.policy.selection,
            selection_metrics=self.selection.metrics(),
            last_round=LastRound(**self.last_round) if self.last_round else None,
            rollouts_dropped_share=c["rollouts_wasted"] / rollouts if rollouts else None,
            rounds_predicted_keep_rate=c["round_predicted_informative"] / c["round_groups"] if c["round_groups"] else None,
            rounds_realised_keep_rate=c["round_realised_informative"] / c["round_groups"] if c["round_groups"] else None,
            replenish_paused=self.policy.replenish_paused,
        )
        return Stats(**c)

    def task_stats(self, task_id: str) -> TaskStats:
        """History of one task, its pass-rate estimate and when it is next eligible.

        ``estimate``: the Beta posterior at the current model version, its mean and the
        predicted chance that the task's next group is informative. ``next_eligible_epoch``:
        the first epoch (of the active selection) in which the task may be picked (skip-rule
        cooldown); with ``informative`` selection, ``revisit_due_in_picks`` says after how many
        more picks the task is drawn first (0 = due now).

        Raises :class:`UnknownTaskError`.
        """
        i = self.task_index(task_id)
        extra = self.selection.task_row(i, self._context())
        return TaskStats(
            task_id=task_id,
            **self.history.row(i),
            estimate=TaskEstimate(**self.passrate.row(i, self.model_version, self.policy.group_size)),
            epoch=self.epoch,
            next_eligible_epoch=max(self.epoch, int(self.history.skip_until_epoch[i])),
            revisit_due_in_picks=extra.get("revisit_due_in_picks"),
            selection_row=extra,
        )

    # ------------------------------------------------------------------ state
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
