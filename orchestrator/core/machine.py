"""The orchestrator's state machine: keep or drop groups, plan replenish rounds, assemble batches.

Pure Python and numpy: no Ray, no I/O, no clock. The Ray actor (``orchestrator.service.actor``) is a
thin shell that feeds it rollouts and forwards its batches.

Where things live: :class:`OrchestratorCore` (here: construction, policy and model version,
stats views) is composed of parts, one job each:

- :mod:`orchestrator.core.rounds`: task selection, end of data, round plans, open rounds, the
  hand-out of tasks to an attached explorer;
- :mod:`orchestrator.core.submit`: groups in (judging, validity, the list and table routes,
  classification, carry or drop, counters);
- :mod:`orchestrator.core.release`: batches out (staleness at assembly, padding, ``on_cap``);
- :mod:`orchestrator.core.state`: save, load and the version-1 migration.

The policy's modes are strategy objects the parts look up by the policy's value, one registry
per extension point: :mod:`orchestrator.core.modes` (``group_validity``, ``stale_members``,
``replenish``, ``on_cap``) and :mod:`orchestrator.core.selection` (``selection``).

How a held group is checkpointed (packed as columns, written once with the commit that made it
held, released by a later one): see the docstring of :mod:`orchestrator.service.store`, and
:mod:`orchestrator.service.persist` for what each commit takes from the core.

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

import numpy as np

from algos.dapo import GroupReason
from orchestrator.core.errors import DataExhaustedError, ReplenishCapError, short_repr  # noqa: F401 - importers find them here
from orchestrator.core.history import TaskHistory
from orchestrator.core.passrate import PassRateEstimate
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.release import ROUNDS_KEPT, Release, rollout_lags  # noqa: F401
from orchestrator.core.rounds import OPEN_ROUNDS_KEPT, RoundPlan, Rounds  # noqa: F401
from orchestrator.core.rows import GroupRows, flagged  # noqa: F401
from orchestrator.core.selection import TaskSelection
from orchestrator.core.selections import make_selection
from orchestrator.core.state import CoreState, group_from_dict, group_to_dict, json_safe  # noqa: F401
from orchestrator.core.stats import COUNTERS, BatchStats, LastRound, Stats, TaskEstimate, TaskStats, ratio
from orchestrator.core.submit import Submit
from orchestrator.core.types import Experience, ExperienceId
from orchestrator.core.validate import MAX_INT32


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


class OrchestratorCore(Rounds, Submit, Release, CoreState):
    """Dynamic-sampling state machine for one training run.

    Args:
        policy: the resampling policy (replaceable at run time with :meth:`set_policy`).
        task_ids: every task id of the task set, in a stable order.
        seed: seeds the per-epoch task order.
    Raises:
        ValueError: empty or duplicate task ids.
    """

    def __init__(self, policy: ResamplingPolicy, task_ids: list[str], seed: int = 0, task_tags: list[str] | None = None,
                 task_texts: list[str] | None = None):
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
        self.task_texts: list[str] | None = None  # each task's prompt text, for selections that read prompts
        if task_texts is not None:
            self.set_task_texts(task_texts)
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
        # the answer screen's tally of the round being planned (Rounds.answer_top_up); not kept in
        # checkpoints: it lives from plan_round to the round's rollouts, within one next_batch call
        self.answer_tally: dict[str, float] = {"scored": 0, "expected": 0.0}
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

    def set_task_texts(self, texts: list[str]) -> None:
        """Set each task's prompt text (task order), read by selections that learn from prompts
        (``pass_predictor``); kept in the checkpoint.

        Raises:
            ValueError: not one string per task (the count or the first bad index is named).
        """
        texts = list(texts)
        if len(texts) != len(self.task_ids):
            raise ValueError(f"task_texts: expected one per task ({len(self.task_ids)}), got {len(texts)}")
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise ValueError(f"task_texts: expected strings, got {short_repr(texts[bad])} at index {bad}")
        self.task_texts = texts

    def set_model_version(self, version: int) -> None:
        """Record the trainer's newest model version (model weights); used for staleness.

        Raises:
            ValueError: not an integer in [0, 2**31 - 1].
        """
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or not 0 <= version <= MAX_INT32:
            raise ValueError(f"model_version: expected an integer in [0, {MAX_INT32}], got {short_repr(version)}")
        self.model_version = max(self.model_version, int(version))

    # ------------------------------------------------------------------ views (tasks and rounds: rounds.py; groups in: submit.py; batches out: release.py)
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
            mean_reward_trained=ratio(c["reward_sum_trained"], c["reward_count_trained"]),
            coverage=ratio(c["reward_count_trained"], rollouts),
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
