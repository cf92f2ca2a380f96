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

Accounting invariant (checked by the tests)::

    groups_submitted == groups_emitted + groups_padded + groups_dropped + groups_held

where ``groups_held`` are the carry pool plus the current batch's padding candidates.
Every group is emitted once, used once as padding, or dropped once with a reason.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from algos.dapo import GroupReason, InvalidGroupError, classify_groups
from orchestrator.core.history import TaskHistory
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.stats import COUNTERS, Stats, TaskStats
from orchestrator.core.types import Batch, Experience, ExperienceId, Group, Purpose, UnknownTaskError

ROUNDS_KEPT = 256
"""Replenish rounds of the most recent batches kept in ``stats()`` (the metrics histogram has all)."""


class ReplenishCapError(RuntimeError):
    """The replenish-round cap was hit under ``on_cap='raise'``. The open batch is kept."""


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


def group_to_dict(group: Group) -> dict:
    return dataclasses.asdict(group)


def group_from_dict(data: dict) -> Group:
    rollouts = [Experience(**{**r, "eid": ExperienceId(**r["eid"])}) for r in data["rollouts"]]
    return Group(**{**data, "rollouts": rollouts})


class OrchestratorCore:
    """Dynamic-sampling state machine for one training run.

    Args:
        policy: the resampling policy (replaceable at run time with :meth:`set_policy`).
        task_ids: every task id of the task set, in a stable order.
        seed: seeds the per-epoch task order.
    Raises:
        ValueError: empty or duplicate task ids.
    """

    def __init__(self, policy: ResamplingPolicy, task_ids: list[str], seed: int = 0):
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
        self.model_version = 0  # newest model version (model weights) seen
        # task order
        self.epoch = 0
        self.cursor = 0
        # the open batch
        self.batch_id = 0
        self.rounds_started = 0  # rounds planned for the open batch (cap, same_tasks)
        self.rounds_submitted = 0  # rounds submitted into the open batch (purpose, counters)
        self.dropped_task_ids: list[str] = []
        # tasks handed to an external explorer (next_tasks) whose groups have not come back yet
        self.in_flight: list[str] = []
        self.requeued: list[str] = []  # in-flight tasks of an explorer that restarted: handed out first
        self.carry: list[Group] = []
        self.candidates: list[Group] = []
        # counters (cumulative)
        self.counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)  # cumulative, see Stats
        self.classified_by_reason = {r.label: 0 for r in GroupReason}
        self.dropped_by_reason = {r.label: 0 for r in GroupReason if r != GroupReason.INFORMATIVE}
        self.rounds_per_batch: list[int] = []

    # ------------------------------------------------------------------ policy
    def set_policy(self, policy: ResamplingPolicy) -> int:
        """Replace the policy; it applies from the next round. Returns the new revision.

        Raises:
            ValueError: ``group_size`` changed while groups are held (they would be ragged).
        """
        if policy.group_size != self.policy.group_size and (self.carry or self.candidates):
            raise ValueError(
                f"group_size: cannot change from {self.policy.group_size} to {policy.group_size} "
                f"while {len(self.carry) + len(self.candidates)} groups are held"
            )
        self.policy = policy
        self.policy_revision += 1
        return self.policy_revision

    def set_model_version(self, version: int) -> None:
        """Record the trainer's newest model version (model weights); used for staleness."""
        self.model_version = max(self.model_version, int(version))

    # ------------------------------------------------------------------ tasks
    def task_index(self, task_id: str) -> int:
        try:
            return self._index[task_id]
        except KeyError:
            raise UnknownTaskError(f"task_id: unknown task {task_id!r} (task set has {len(self.task_ids)} tasks)") from None

    def _epoch_order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(len(self.task_ids))

    def select_tasks(self, count: int) -> list[str]:
        """Next ``count`` tasks in epoch order, skipping tasks in a history cooldown.

        Each epoch is a seeded permutation of the task set. A task skipped by the rules
        ``skip_after_all_correct`` / ``skip_after_all_wrong`` sits out ``cooldown_epochs``.
        When every task is cooling down, the order moves to the next epoch (at most
        ``cooldown_epochs + 1`` epochs ahead), so selection always terminates.
        """
        chosen: list[str] = []
        idle_epochs = 0
        while len(chosen) < count and idle_epochs <= self.policy.cooldown_epochs + 1:
            rest = self._epoch_order(self.epoch)[self.cursor :]
            eligible = np.flatnonzero(self.history.skip_until_epoch[rest] <= self.epoch)
            take = eligible[: count - len(chosen)]
            chosen.extend(self.task_ids[i] for i in rest[take])
            idle_epochs = 0 if len(take) else idle_epochs + 1
            if len(chosen) == count and len(take):
                self.cursor += int(take[-1]) + 1
            else:
                self.cursor = len(self.task_ids)
            if self.cursor >= len(self.task_ids):
                self.epoch += 1
                self.cursor = 0
        return chosen

    # ------------------------------------------------------------------ rounds
    def predicted_keep_rate(self) -> float:
        """Laplace-smoothed share of groups classified informative so far: (k + 1) / (g + 2)."""
        c = self.counters
        return (c["groups_kept_classified"] + 1) / (c["groups_submitted"] + 2)

    def missing_groups(self) -> int:
        return max(0, self.policy.target_groups - len(self.carry))

    def cap_reached(self) -> bool:
        """True when the open batch may not start another replenish round."""
        cap = self.policy.max_replenish_rounds
        return cap > 0 and self.rounds_started > cap and self.missing_groups() > 0

    def replenish_blocked(self) -> bool:
        """True when the next round would be a replenish round and replenishment is paused."""
        return self.policy.replenish_paused and self.rounds_started > 0

    def plan_round(self) -> RoundPlan:
        """Plan the next round: only the missing count, sized by the predicted keep rate.

        ``count = min(ceil(missing / max(min_keep_rate, p_keep)), max_tasks_per_round)``.
        With ``replenish='same_tasks'``, replenish rounds re-roll this batch's dropped tasks
        first (oldest first; not those a skip rule has just put in cooldown) and top up with
        fresh tasks.
        """
        missing = self.missing_groups()
        rnd = self.rounds_started
        purpose: Purpose = "initial" if rnd == 0 else "replenish"
        if missing == 0:
            return RoundPlan([], purpose, rnd, self.batch_id)
        p = max(self.policy.min_keep_rate, self.predicted_keep_rate())
        count = min(math.ceil(missing / p), self.policy.max_tasks_per_round)
        task_ids: list[str] = []
        if rnd > 0 and self.policy.replenish == "same_tasks":
            skip_until = self.history.skip_until_epoch
            rerolls = [t for t in self.dropped_task_ids if skip_until[self._index[t]] <= self.epoch]
            task_ids, self.dropped_task_ids = rerolls[:count], rerolls[count:]
        task_ids += self.select_tasks(count - len(task_ids))
        self.rounds_started += 1
        return RoundPlan(task_ids, purpose, rnd, self.batch_id)

    def next_tasks(self, count: int) -> list[str]:
        """Exactly ``count`` tasks for one step of an external explorer (Trinity reads a fixed number).

        Order: tasks requeued after an explorer restart (:meth:`requeue_in_flight`), then with
        ``replenish='same_tasks'`` this batch's dropped tasks (not those a skip rule has just
        put in cooldown), then fresh tasks in epoch order (:meth:`select_tasks`). Every task
        handed out stays "in flight" until its group is submitted.

        Raises:
            ValueError: ``count`` < 1.
        """
        if count < 1:
            raise ValueError(f"count: must be >= 1, got {count}")
        tasks, self.requeued = self.requeued[:count], self.requeued[count:]
        if self.policy.replenish == "same_tasks" and len(tasks) < count:
            skip_until = self.history.skip_until_epoch
            rerolls = [t for t in self.dropped_task_ids if skip_until[self._index[t]] <= self.epoch]
            take = rerolls[: count - len(tasks)]
            tasks += take
            self.dropped_task_ids = rerolls[len(take):]
        while len(tasks) < count:  # select_tasks may fall short when every task cools down
            more = self.select_tasks(count - len(tasks))
            tasks += more if more else self.task_ids[: count - len(tasks)]
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
    def _judged(self, group: Group) -> list[float]:
        judge = self.policy.filter.judge
        if judge == "reward":
            return [r.reward for r in group.rollouts]
        try:
            return [r.metrics[judge] for r in group.rollouts]
        except KeyError:
            run = next(r.eid.run for r in group.rollouts if judge not in r.metrics)
            raise InvalidGroupError(
                f"metrics[{judge!r}]: missing in run {run} of task {group.task_id!r} (the filter judges it)"
            ) from None

    def validate(self, groups: list[Group]) -> np.ndarray:
        """Check groups before any state changes; raise naming the field, task and value.

        Returns:
            (G, n) float64: the judged value (``policy.filter.judge``) of every rollout.

        Raises:
            UnknownTaskError: a task id outside the task set.
            InvalidGroupError: empty group, wrong size, duplicate or out-of-range run ids,
                experiences of another task, non-finite reward or judged value.
        """
        n = self.policy.group_size
        judged_rows = []
        for g in groups:
            self.task_index(g.task_id)
            if not g.rollouts:
                raise InvalidGroupError(f"rollouts: group of task {g.task_id!r} is empty")
            if len(g.rollouts) != n:
                raise InvalidGroupError(
                    f"rollouts: group of task {g.task_id!r} has {len(g.rollouts)} rollouts, expected group_size={n}"
                )
            runs = [r.eid.run for r in g.rollouts]
            if len(set(runs)) != n:
                dup = next(x for x in runs if runs.count(x) > 1)
                raise InvalidGroupError(f"eid.run: duplicate run id {dup} in group of task {g.task_id!r}")
            if min(runs) < 0 or max(runs) >= n:
                raise InvalidGroupError(f"eid.run: run ids {sorted(runs)} of task {g.task_id!r} not in [0, {n})")
            other = next((r.eid.task for r in g.rollouts if r.eid.task != g.task_id), None)
            if other is not None:
                raise InvalidGroupError(f"eid.task: experience of task {other!r} in group of task {g.task_id!r}")
            for r in g.rollouts:
                if not math.isfinite(r.reward):
                    raise InvalidGroupError(f"reward: non-finite value {r.reward!r} in run {r.eid.run} of task {g.task_id!r}")
            judged = self._judged(g)
            bad = next((v for v in judged if not math.isfinite(v)), None)
            if bad is not None:
                raise InvalidGroupError(f"{self.policy.filter.judge}: non-finite value {bad!r} in task {g.task_id!r}")
            judged_rows.append(judged)
        return np.array(judged_rows, dtype=np.float64)

    def submit(self, groups: list[Group]) -> list[Group]:
        """Classify and take ownership of groups (all validated first; a rejected call changes nothing).

        Args:
            groups: G groups of exactly ``group_size`` rollouts.
        Returns:
            the same groups, with ``reason`` set to the filter's label.
        Raises:
            see :meth:`validate`.
        """
        if not groups:
            return []
        values = self.validate(groups)
        f = self.policy.filter
        rewards = np.array([[r.reward for r in g.rollouts] for g in groups], dtype=np.float64)
        keep, reasons = classify_groups(
            values, std_tol=f.std_tol, correct_threshold=f.correct_threshold, wrong_threshold=f.wrong_threshold, band=f.band
        )
        idx = np.array([self.task_index(g.task_id) for g in groups], dtype=np.int64)
        versions = np.array([g.model_version for g in groups], dtype=np.int64)
        self.history.update(idx, rewards, values >= f.correct_threshold, reasons, versions)
        self.model_version = max(self.model_version, int(versions.max()))
        self._apply_skip_rules(np.unique(idx))

        c = self.counters
        n = self.policy.group_size
        purpose: Purpose = "initial" if self.rounds_submitted == 0 else "replenish"
        if purpose == "replenish":
            c["replenish_rounds"] += 1
        rnd = self.rounds_submitted
        self.rounds_submitted += 1
        for g in groups:
            if g.task_id in self.in_flight:
                self.in_flight.remove(g.task_id)
        c["groups_submitted"] += len(groups)
        c["groups_kept_classified"] += int(keep.sum())
        c["reward_sum_all"] += float(rewards.sum())
        c["reward_count_all"] += rewards.size
        c["reward_sum_kept"] += float(rewards[keep].sum())
        c["reward_count_kept"] += int(keep.sum()) * n
        for g, code in zip(groups, reasons):
            g.reason = GroupReason(int(code)).label
            g.purpose, g.round = purpose, rnd
            self.classified_by_reason[g.reason] += 1
            c["rollouts_initial" if purpose == "initial" else "rollouts_replenish"] += n
            if code == GroupReason.INFORMATIVE:
                self.carry.append(g)
            else:
                self.dropped_task_ids.append(g.task_id)
                self.candidates.append(g)
        overflow = len(self.candidates) - self.policy.target_groups
        if overflow > 0:
            for g in self.candidates[:overflow]:
                self._drop(g, g.reason)
            self.candidates = self.candidates[overflow:]
        return groups

    def _apply_skip_rules(self, idx: np.ndarray) -> None:
        p, h = self.policy, self.history
        hit = np.zeros(len(idx), dtype=bool)
        if p.skip_after_all_correct:
            hit |= h.consec_all_correct[idx] >= p.skip_after_all_correct
        if p.skip_after_all_wrong:
            hit |= h.consec_all_wrong[idx] >= p.skip_after_all_wrong
        t = idx[hit]
        h.skip_until_epoch[t] = self.epoch + 1 + p.cooldown_epochs
        h.consec_all_correct[t] = 0
        h.consec_all_wrong[t] = 0

    def _drop(self, group: Group, reason: str) -> None:
        self.counters["groups_dropped"] += 1
        self.counters["rollouts_wasted"] += len(group.rollouts)
        self.dropped_by_reason[reason] += 1

    # ------------------------------------------------------------------ batches
    def _drop_stale(self) -> None:
        s = self.policy.max_staleness
        if s is None:
            return
        fresh = []
        for g in self.carry:
            if g.model_version < self.model_version - s:
                g.reason = GroupReason.STALE.label
                self._drop(g, g.reason)
            else:
                fresh.append(g)
        self.carry = fresh

    def _release(self, groups: list[Group], padding: list[Group], partial: bool) -> Batch:
        for g in padding:
            g.padding = True
            for r in g.rollouts:
                r.info["dso_padding"] = True
                r.info["dso_loss_weight"] = 0.0
        for g in self.candidates:
            if not any(g is p for p in padding):
                self._drop(g, g.reason)
        c = self.counters
        c["groups_emitted"] += len(groups)
        c["groups_padded"] += len(padding)
        c["rollouts_wasted"] += sum(len(g.rollouts) for g in padding)
        c["batches_emitted"] += 1
        c["batches_partial"] += int(partial)
        rounds = max(0, self.rounds_submitted - 1)
        self.rounds_per_batch = (self.rounds_per_batch + [rounds])[-ROUNDS_KEPT:]
        batch = Batch(self.batch_id, groups + padding, partial=partial, rounds=rounds, model_version=self.model_version)
        self.batch_id += 1
        self.rounds_started = 0
        self.rounds_submitted = 0
        self.dropped_task_ids = []
        self.candidates = []
        return batch

    def try_emit(self) -> Batch | None:
        """Release a batch of exactly ``target_groups`` informative groups if the carry pool holds them.

        Surplus groups stay in the carry pool for the next batch (dropped only when stale).
        """
        self._drop_stale()
        k = self.policy.target_groups
        if len(self.carry) < k:
            return None
        groups, self.carry = self.carry[:k], self.carry[k:]
        return self._release(groups, [], partial=False)

    def close_at_cap(self) -> Batch:
        """Close the open batch when the cap is reached, per ``policy.on_cap``.

        ``pad``: the kept groups plus the most recent dropped groups as padding (batch of
        exactly ``target_groups`` when enough dropped groups exist, else flagged partial);
        ``partial``: the kept groups only, flagged partial;
        ``raise``: raises :class:`ReplenishCapError` and changes nothing.
        """
        self._drop_stale()
        p = self.policy
        kept = self.carry[: p.target_groups]
        if p.on_cap == "raise":
            raise ReplenishCapError(
                f"max_replenish_rounds: batch {self.batch_id} has {len(kept)} of {p.target_groups} informative "
                f"groups after {max(0, self.rounds_submitted - 1)} replenish rounds (cap {p.max_replenish_rounds})"
            )
        self.counters["cap_hits"] += 1
        self.carry = self.carry[len(kept) :]
        padding: list[Group] = []
        if p.on_cap == "pad":
            need = p.target_groups - len(kept)
            padding = self.candidates[len(self.candidates) - need :] if need else []
        partial = len(kept) + len(padding) < p.target_groups
        return self._release(kept, padding, partial=partial)

    # ------------------------------------------------------------------ views
    def stats(self) -> Stats:
        """The live counters as one typed record (see :class:`orchestrator.core.stats.Stats`)."""
        c = dict(self.counters)
        held = len(self.carry) + len(self.candidates)
        emitted_inf = c["groups_emitted"]
        rollouts = c["rollouts_initial"] + c["rollouts_replenish"]
        c.update(
            groups_held=held,
            groups_carried=len(self.carry),
            classified_by_reason=dict(self.classified_by_reason),
            dropped_by_reason=dict(self.dropped_by_reason),
            keep_ratio=c["groups_kept_classified"] / c["groups_submitted"] if c["groups_submitted"] else None,
            mean_reward_all=c["reward_sum_all"] / c["reward_count_all"] if c["reward_count_all"] else None,
            mean_reward_kept=c["reward_sum_kept"] / c["reward_count_kept"] if c["reward_count_kept"] else None,
            rollouts_total=rollouts,
            rollouts_per_emitted_group=rollouts / emitted_inf if emitted_inf else None,
            rounds_per_batch=list(self.rounds_per_batch),
            batch_id=self.batch_id,
            policy_revision=self.policy_revision,
            model_version=self.model_version,
            epoch=self.epoch,
            predicted_keep_rate=self.predicted_keep_rate(),
            replenish_paused=self.policy.replenish_paused,
        )
        return Stats(**c)

    def task_stats(self, task_id: str) -> TaskStats:
        """History of one task. Raises :class:`UnknownTaskError`."""
        return TaskStats(task_id=task_id, **self.history.row(self.task_index(task_id)))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict:
        """Everything needed to resume: JSON-serialisable."""
        return {
            "version": 1,
            "policy": self.policy.model_dump(mode="json"),
            "policy_revision": self.policy_revision,
            "task_ids": list(self.task_ids),
            "seed": self.seed,
            "history": self.history.state_dict(),
            "model_version": self.model_version,
            "epoch": self.epoch,
            "cursor": self.cursor,
            "batch_id": self.batch_id,
            "rounds_started": self.rounds_started,
            "rounds_submitted": self.rounds_submitted,
            "in_flight": list(self.in_flight),
            "requeued": list(self.requeued),
            "dropped_task_ids": list(self.dropped_task_ids),
            "carry": [group_to_dict(g) for g in self.carry],
            "candidates": [group_to_dict(g) for g in self.candidates],
            "counters": dict(self.counters),
            "classified_by_reason": dict(self.classified_by_reason),
            "dropped_by_reason": dict(self.dropped_by_reason),
            "rounds_per_batch": list(self.rounds_per_batch),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict`. Raises ValueError when the task set differs."""
        if state["task_ids"] != self.task_ids:
            raise ValueError("task_ids: the saved state belongs to a different task set")
        self.policy = ResamplingPolicy.parse(state["policy"])
        self.policy_revision = state["policy_revision"]
        self.seed = state["seed"]
        self.history.load_state_dict(state["history"])
        for key in ("model_version", "epoch", "cursor", "batch_id", "rounds_started"):
            setattr(self, key, state[key])
        self.rounds_submitted = int(state.get("rounds_submitted", self.rounds_started))
        self.in_flight = list(state.get("in_flight", []))
        self.requeued = list(state.get("requeued", []))
        self.dropped_task_ids = list(state["dropped_task_ids"])
        self.carry = [group_from_dict(g) for g in state["carry"]]
        self.candidates = [group_from_dict(g) for g in state["candidates"]]
        self.counters = dict(state["counters"])
        self.classified_by_reason = dict(state["classified_by_reason"])
        self.dropped_by_reason = dict(state["dropped_by_reason"])
        self.rounds_per_batch = list(state["rounds_per_batch"])
