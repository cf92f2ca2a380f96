"""Batches out of :class:`~orchestrator.core.machine.OrchestratorCore`: :class:`Release`.

When a batch is assembled (:meth:`Release.try_emit`, :meth:`Release.close_at_cap`,
:meth:`Release.finish` at the end of data), the carry pool's groups are judged for staleness
against the model version of the moment (``stale_members``: drop the group, or mask its stale
members; see the module docstring of :mod:`orchestrator.core.machine`), a short batch is padded
(or released partial, or refused, per ``on_cap``), and the batch's statistics are recorded.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from orchestrator.core.outcomes import GroupOutcome
from orchestrator.core.rows import GroupRows, flagged
from orchestrator.core.shared import OpenBatch, Run, Tally
from orchestrator.core.stats import ratio
from orchestrator.core.submit import Submit
from orchestrator.core.tasks import TaskColumns
from orchestrator.core.types import Batch

ROUNDS_KEPT = 256
"""Replenish rounds of the most recent batches kept in ``stats()`` (the metrics histogram has all)."""


def rollout_lags(batch: Batch) -> np.ndarray:
    """Staleness lag, in model versions, of every trained rollout of a batch (not padding, not masked).

    ``lag = batch.model_version - rollout model version`` (see the module docstring).
    Returns:
        (R,) int64, in group then run order, from the batch's member columns at once.
    """
    versions, valid, padding = batch.columns("versions", "valid", "padding")
    trained = valid & ~padding[:, None]
    return batch.model_version - versions[trained].astype(np.int64)


class Release:
    """Staleness at assembly, padding and release of batches; a part of
    :class:`~orchestrator.core.machine.OrchestratorCore`.

    Args:
        run: the policy (target, staleness, on_cap) and the model version batches are judged at.
        tasks: the pass-rate evidence, discounted for the groups trained on.
        tally: the counters and the batch's reward sums (reset at each release).
        batch: the open batch, released and started afresh.
        intake: counts the groups dropped at release (stale, surplus candidates).
        view: the core, as the ``stale_members`` and ``on_cap`` modes read it (:mod:`orchestrator.core.modes`).
    """

    def __init__(self, run: Run, tasks: TaskColumns, tally: Tally, batch: OpenBatch, intake: Submit, view: Any) -> None:
        self.run, self.tasks, self.tally, self.batch, self.intake, self.view = run, tasks, tally, batch, intake, view

    def _drop_stale(self) -> None:
        """Apply ``max_staleness`` to the carry pool, per member (see the module docstring): a
        group with stale members is dropped as ``stale`` unless the ``stale_members`` mode
        (:data:`orchestrator.core.modes.STALE_MEMBERS`) keeps it."""
        p = self.run.policy
        if p.max_staleness is None or not self.batch.carry:
            return
        # every carried group at once (their columns have group_size members: set_policy refuses
        # to change it while groups are held); masked members no longer count
        carry = self.batch.carry
        stale = carry.valid & (self.run.model_version - carry.versions > p.max_staleness)
        hit = stale.any(axis=1)
        if not hit.any():
            return
        keep = ~hit
        valid = carry.valid.copy()  # never written in place: a commit may be pickling the old one
        mode = p.mode("stale_members")
        for i in np.flatnonzero(hit).tolist():
            if (masked := mode.keep(self.view, carry, i, stale[i])) is not None:
                valid[i] = masked
                keep[i] = True
        carry = carry.with_valid(valid)
        dropped = carry.take(~keep)
        dropped.reasons = [GroupOutcome.STALE.label] * len(dropped)
        self.intake.drop(dropped)
        if p.requeue_stale:
            self.batch.requeue.extend(dropped.task_ids)
        self.batch.carry = carry.take(keep)

    def _release(self, groups: GroupRows, padding: int, partial: bool) -> Batch:
        """Release ``groups`` and the last ``padding`` candidates (as padding) as the next batch;
        the other candidates are dropped."""
        cut = len(self.batch.candidates) - padding
        pad = self.batch.candidates.take(slice(cut, None))
        self.intake.drop(self.batch.candidates.take(slice(None, cut)))
        if padding:
            pad.padding = [True] * padding
            pad.rollouts = [flagged(r, {"dso_padding": True, "dso_loss_weight": 0.0}) if r else r for r in pad.rollouts]
        if len(groups):  # trained on next: their pass rates move, so their evidence counts less
            self.tasks.passrate.discount(groups.task_index, self.run.policy.passrate_trained_discount)
            self.tasks.touch(groups.task_index)
        c = self.tally.counters
        c["groups_emitted"] += len(groups)
        c["groups_padded"] += padding
        c["rollouts_wasted"] += sum(pad.sizes)
        c["batches_emitted"] += 1
        c["batches_partial"] += int(partial)
        trained = groups.rewards[groups.valid].tolist()  # in group then run order: the same sum as group by group
        c["reward_sum_trained"] += float(sum(trained))
        c["reward_count_trained"] += len(trained)
        w = self.tally.window
        self.tally.last_batch = {
            "batch_id": self.batch.batch_id,
            "mean_reward_all": ratio(w["reward_sum_all"], w["reward_count_all"]),
            "mean_reward_kept": ratio(w["reward_sum_kept"], w["reward_count_kept"]),
            "mean_reward_trained": ratio(float(sum(trained)), len(trained)),
            "coverage": ratio(len(trained), w["rollouts"]),
            "rollouts_trained": len(trained),
            "rollouts_generated": w["rollouts"],
        }
        self.tally.window = self.tally.new_window()
        rounds = max(0, self.batch.rounds_submitted - 1)
        self.tally.rounds_per_batch = (self.tally.rounds_per_batch + [rounds])[-ROUNDS_KEPT:]
        batch = Batch(self.batch.batch_id, GroupRows.concat(groups, pad), partial=partial, rounds=rounds, model_version=self.run.model_version)
        self.batch.batch_id += 1
        self.batch.rounds_started = 0
        self.batch.rounds_submitted = 0
        self.batch.dropped_task_ids = []
        self.batch.candidates = GroupRows.empty(self.run.policy.group_size)
        return batch

    def try_emit(self) -> Batch | None:
        """Release a batch of exactly ``target_groups`` informative groups if the carry pool holds them.

        Surplus groups stay in the carry pool for the next batch (dropped only when stale).
        """
        self._drop_stale()
        k = self.run.policy.target_groups
        if len(self.batch.carry) < k:
            return None
        groups, self.batch.carry = self.batch.carry.take(slice(None, k)), self.batch.carry.take(slice(k, None))
        return self._release(groups, 0, partial=False)

    def close_at_cap(self) -> Batch:
        """Close the open batch when the cap is reached, per ``policy.on_cap``.

        The mode (:data:`orchestrator.core.modes.ON_CAP`) says how many padding candidates join
        the kept groups: ``pad`` the most recent dropped groups as padding (batch of exactly
        ``target_groups`` when enough dropped groups exist, else flagged partial); ``partial``
        none (the kept groups only, flagged partial); ``raise`` raises :class:`ReplenishCapError`
        and changes nothing.
        """
        self._drop_stale()
        p = self.run.policy
        kept = self.batch.carry.take(slice(None, p.target_groups))
        padding = p.mode("on_cap").padding(self.view, kept)
        self.tally.counters["cap_hits"] += 1
        self.batch.carry = self.batch.carry.take(slice(len(kept), None))
        partial = len(kept) + padding < p.target_groups
        return self._release(kept, padding, partial=partial)

    def finish(self) -> Batch | None:
        """At the end of data: release what is kept as the last batch, per ``on_cap``.

        Returns:
            the last batch (``pad``: kept groups plus padding; ``partial``: kept groups only),
            or None when no informative group is held (the padding candidates are dropped).
        Raises:
            ReplenishCapError: ``on_cap='raise'`` and a short batch is held (nothing changes).
        """
        self._drop_stale()
        if not self.batch.carry:
            self.intake.drop(self.batch.candidates)
            self.batch.candidates = GroupRows.empty(self.run.policy.group_size)
            return None
        return self.close_at_cap()
