"""Groups into :class:`~orchestrator.core.machine.OrchestratorCore`: :class:`Submit`.

Judge and validate each group (the list route, :meth:`Submit.submit`, and the table route,
:meth:`Submit.submit_table` with :func:`orchestrator.core.table.check_table`; both with the row
rules of :mod:`orchestrator.core.validate` and the ``group_validity`` mode of
:mod:`orchestrator.core.modes`), count it in its round, classify it
(:func:`algos.dapo.classify_groups`), and keep it (carry pool, padding candidates) or drop it
with a reason; held groups can be dropped as lost (:meth:`Submit.drop_held`).
"""

from __future__ import annotations

import collections
import itertools
import logging
import operator

import numpy as np

from algos.dapo import InvalidGroupError, classify_groups
from orchestrator.core.errors import short_repr
from orchestrator.core.outcomes import GroupOutcome
from orchestrator.core.rounds import Rounds
from orchestrator.core.rows import GroupRows, flagged
from orchestrator.core.shared import OpenBatch, Run, Tally
from orchestrator.core.table import CheckedTable, check_table, table_error
from orchestrator.core.tasks import TaskColumns
from orchestrator.core.types import Group, GroupTable, Purpose, UnknownTaskError
from orchestrator.core.validate import check_group, member_problem, wrong_size

log = logging.getLogger("trinity_dso.core")

_LABELS = {int(r): r.label for r in GroupOutcome}
_consume = collections.deque(maxlen=0).extend
_TASK = operator.attrgetter("task_id")


class Submit:
    """Validate, count, classify, carry or drop submitted groups; a part of
    :class:`~orchestrator.core.machine.OrchestratorCore`.

    Args:
        run: the policy (filter, validity, skip rules) and the model version (raised by a newer group).
        tasks: the per-task columns a group updates (history, pass-rate evidence).
        tally: the counters and the batch's reward sums.
        batch: the open batch whose held groups and rounds a group joins.
        rounds: the rounds part (the selections learn from groups; open rounds and tasks in flight close).
    """

    def __init__(self, run: Run, tasks: TaskColumns, tally: Tally, batch: OpenBatch, rounds: Rounds) -> None:
        self.run, self.tasks, self.tally, self.batch, self.rounds = run, tasks, tally, batch, rounds

    def judge_name(self, group: Group) -> str:
        """The judged value of a group: ``policy.filter.judge``, with ``auto`` resolved.

        ``auto`` judges ``metrics["accuracy"]`` (the unshaped outcome DAPO's scorers write) when
        any rollout of the group carries it, else the reward.
        """
        judge = self.run.policy.filter.judge
        if judge != "auto":
            return judge
        return "accuracy" if any("accuracy" in r.metrics for r in group.rollouts) else "reward"

    def judge_rows(self, group: Group) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(n,) judged values by run (NaN where unusable), (n,) valid flags, and the problems found
        (:func:`orchestrator.core.validate.member_problem` of each rollout, in order)."""
        n, bound, task = self.run.policy.group_size, self.run.policy.max_abs_reward, group.task_id
        judge = self.judge_name(group)
        values = np.full(n, np.nan)
        valid = np.zeros(n, dtype=bool)
        problems = []
        for r in group.rollouts:
            reward = r.reward
            value = reward if judge == "reward" else r.metrics.get(judge)
            problem = member_problem(reward, value, judge, bound, r.eid.run, task)
            if problem is not None:
                problems.append(problem)
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
                oversize id), structure (empty, too many or, unless the ``group_validity`` mode
                accepts short groups, too few rollouts; duplicate or out-of-range runs; another
                task's experience) or values (:func:`orchestrator.core.validate.member_problem`,
                judged by the ``group_validity`` mode: ``reject`` refuses any problem, ``mask``
                fewer than ``min_valid_group_size`` usable members).
        """
        p = self.run.policy
        n = p.group_size
        validity = p.mode("group_validity")
        check_group(g)
        self.tasks.task_index(g.task_id)
        if not g.rollouts:
            raise InvalidGroupError(f"rollouts: group of task {g.task_id!r} is empty")
        if len(g.rollouts) > n or (len(g.rollouts) < n and not validity.accepts_short):
            raise InvalidGroupError(wrong_size(g.task_id, len(g.rollouts), n))
        runs = [r.eid.run for r in g.rollouts]
        if len(set(runs)) != len(runs):
            dup = next(x for x in runs if runs.count(x) > 1)
            raise InvalidGroupError(f"eid.run: duplicate run id {dup} in group of task {g.task_id!r}")
        if min(runs) < 0 or max(runs) >= n:
            raise InvalidGroupError(f"eid.run: run ids {sorted(runs)} of task {g.task_id!r} not in [0, {n})")
        other = next((r.eid.task for r in g.rollouts if r.eid.task != g.task_id), None)
        if other is not None:
            raise InvalidGroupError(f"eid.task: experience of task {other!r} in group of task {g.task_id!r}")
        values, valid, problems = self.judge_rows(g)
        refusal = validity.refusal(g.task_id, int(valid.sum()), p, problems)
        if refusal is not None:
            raise InvalidGroupError(refusal)
        return values, valid

    def fill_columns(self, g: Group, values: np.ndarray, valid: np.ndarray) -> None:
        """Set a checked rollouts group's member columns (by run) from its rollouts."""
        n = self.run.policy.group_size
        rewards = np.full(n, np.nan)
        runs = [r.eid.run for r in g.rollouts]
        rewards[runs] = [np.nan if r.reward is None else float(r.reward) for r in g.rollouts]
        present = [int(r.info.get("model_version", g.model_version)) for r in g.rollouts]
        versions = np.full(n, max(present), dtype=np.int64)  # absent members: no effect on min / max
        versions[runs] = present
        g.rewards, g.values, g.valid, g.versions, g.size = rewards, values, valid, versions, len(g.rollouts)

    def check_table(self, table: GroupTable) -> CheckedTable:
        """:func:`orchestrator.core.table.check_table` under the current policy and task set (no state change)."""
        return check_table(table, self.run.policy, self.tasks.index)

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
            self.fill_columns(g, values, valid)
        rnd, purpose = self._count_round(new_round)
        self.rounds.came_back([g.task_id for g in groups if isinstance(g, Group)])
        for g in groups:
            if isinstance(g, Group):
                g.purpose, g.round = purpose, rnd
        bad = set()
        for g, err in invalid:
            log.warning("dropped invalid group of task %r: %s", g.task_id, err)
            bad.add(id(g))
            g.reason = GroupOutcome.INVALID.label
            self._count_invalid(purpose, [g.size])
        accepted = [g for g in groups if id(g) not in bad] if bad else groups
        if accepted:
            for g in accepted:
                if not g.valid.all():  # flagged on copies: the submitter's rollouts stay as they were
                    g.rollouts = flagged(g.rollouts, {"dso_masked": "invalid", "dso_loss_weight": 0.0},
                                         lambda r, valid=g.valid: not valid[r.eid.run] and not r.info.get("dso_masked"))
            idx = np.fromiter(map(self.tasks.index.__getitem__, map(_TASK, accepted)), np.int64, len(accepted))
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
        self.rounds.came_back(rows.task_ids)
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
        rows.reasons = [GroupOutcome.INVALID.label if b else next(labels) for b in bad.tolist()]
        return rows

    def _count_round(self, new_round: bool) -> tuple[int, Purpose]:
        """Count one submission as a round of the open batch, whoever planned it: its round
        number and purpose (``new_round=False``: the round of the previous submission)."""
        if new_round or self.batch.rounds_submitted == 0:
            rnd = self.batch.rounds_submitted
            self.batch.rounds_submitted += 1
            if rnd > 0:
                self.tally.counters["replenish_rounds"] += 1
        else:
            rnd = self.batch.rounds_submitted - 1
        return rnd, "initial" if rnd == 0 else "replenish"

    def _count_invalid(self, purpose: Purpose, sizes: list[int]) -> None:
        """Count groups dropped as invalid on submit (of ``sizes`` rollouts each)."""
        c, label, size = self.tally.counters, GroupOutcome.INVALID.label, sum(sizes)
        c["groups_submitted"] += len(sizes)
        c["rollouts_initial" if purpose == "initial" else "rollouts_replenish"] += size
        self.tally.window["rollouts"] += size
        self.tally.classified_by_reason[label] += len(sizes)
        self._count_dropped(size, collections.Counter({label: len(sizes)}))

    def _accept(self, rows: GroupRows) -> None:
        """Classify checked groups on their member columns and hold them (carry pool or
        candidates); sets ``rows.reasons``. All rows of one call share ``purpose``."""
        f = self.run.policy.filter
        idx, raw, values, valid, all_versions = rows.task_index, rows.rewards, rows.values, rows.valid, rows.versions
        rewards = np.where(valid, raw, 0.0)
        if f.enabled:
            keep, reasons = classify_groups(
                values, std_tol=f.std_tol, correct_threshold=f.correct_threshold, wrong_threshold=f.wrong_threshold,
                band=f.band, valid=valid,
            )
        else:
            keep = np.ones(len(rows), dtype=bool)
            reasons = np.full(len(rows), GroupOutcome.INFORMATIVE, dtype=np.int8)
        versions = all_versions.min(axis=1)
        correct = valid & (np.nan_to_num(values, nan=-np.inf) >= f.correct_threshold)
        self.tasks.history.update(idx, rewards, correct, reasons, versions, valid=valid)
        # the estimate predicts DAPO's informative event (0 < correct < n, Eq. 11), whatever the
        # filter kept: with the filter off every group is kept, and a band keeps fewer
        n_correct, n_valid = correct.sum(axis=1), valid.sum(axis=1)
        self.tasks.passrate.observe(idx, n_correct, n_valid, (n_correct > 0) & (n_correct < n_valid), versions)
        self.rounds.observe(idx, keep, reasons == GroupOutcome.ALL_CORRECT, n_correct, n_valid, versions)
        self.rounds.close_rounds(idx, keep)
        self.run.model_version = max(self.run.model_version, int(all_versions.max()))
        if self.run.policy.skip_after_all_correct or self.run.policy.skip_after_all_wrong:
            self._apply_skip_rules(np.unique(idx))
        self.tasks.touch(idx)  # the history (skip rules included) and the pass-rate evidence

        c, w = self.tally.counters, self.tally.window
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
                self.tally.classified_by_reason[_LABELS[code]] += count
        c["rollouts_initial" if rows.purposes[0] == "initial" else "rollouts_replenish"] += size
        w["rollouts"] += size
        informative = reasons == GroupOutcome.INFORMATIVE
        if informative.all():
            self.batch.carry = GroupRows.concat(self.batch.carry, rows)
            return
        self.batch.carry = GroupRows.concat(self.batch.carry, rows.take(informative))
        dropped = rows.take(~informative)
        self.batch.dropped_task_ids.extend(dropped.task_ids)
        candidates = GroupRows.concat(self.batch.candidates, dropped)
        overflow = len(candidates) - self.run.policy.target_groups
        if overflow > 0:
            self.drop(candidates.take(slice(None, overflow)))
            candidates = candidates.take(slice(overflow, None))
        self.batch.candidates = candidates

    def _apply_skip_rules(self, idx: np.ndarray) -> None:
        p, h = self.run.policy, self.tasks.history
        hit = np.zeros(len(idx), dtype=bool)
        if p.skip_after_all_correct:
            hit |= h.consec_all_correct[idx] >= p.skip_after_all_correct
        if p.skip_after_all_wrong:
            hit |= h.consec_all_wrong[idx] >= p.skip_after_all_wrong
        t = idx[hit]
        # counted from the epoch the task was drawn in (its group may come back after the order
        # entered the next epoch); a task never drawn here (groups submitted from elsewhere): now
        drawn = self.tasks.pick_epoch[t]
        h.skip_until_epoch[t] = np.where(drawn >= 0, drawn, self.rounds.epoch) + 1 + p.cooldown_epochs
        h.consec_all_correct[t] = 0
        h.consec_all_wrong[t] = 0

    def drop(self, rows: GroupRows) -> None:
        """Count held groups dropped, each under its own ``reason``, in one pass."""
        if len(rows):
            self._count_dropped(sum(rows.sizes), collections.Counter(rows.reasons))

    def drop_held(self, refs: set[str], reason: str) -> int:
        """Drop the held groups (carry pool and padding candidates) whose ``ref`` is in ``refs``,
        counted under ``reason``; returns how many (refs not held are ignored: idempotent)."""
        count = 0
        for name in ("carry", "candidates"):
            rows = getattr(self.batch, name)
            hit = np.fromiter(map(refs.__contains__, rows.refs), bool, len(rows))
            if hit.any():
                dropped = rows.take(hit)
                dropped.reasons = [reason] * len(dropped)
                self.drop(dropped)
                setattr(self.batch, name, rows.take(~hit))
                count += len(dropped)
        return count

    def _count_dropped(self, rollouts: int, by_reason: collections.Counter) -> None:
        self.tally.counters["groups_dropped"] += sum(by_reason.values())
        self.tally.counters["rollouts_wasted"] += rollouts
        for reason, count in by_reason.items():
            self.tally.dropped_by_reason[reason] += count
