"""The orchestrator's state machine: keep or drop groups, plan replenish rounds, assemble batches.

Pure Python and numpy: no Ray, no I/O, no clock. The Ray actor (``orchestrator.service.actor``) is a
thin shell that feeds it rollouts and forwards its batches.

Where things live: :class:`OrchestratorCore` (here: construction, policy and model version,
stats views) is composed of parts, one job each. Each part is given in its constructor the
shared state it reads (:mod:`orchestrator.core.shared`: the policy and model version, the open
batch, the counters; :mod:`orchestrator.core.tasks`: the per-task columns) and the parts it
calls; none reads another's attributes through ``self``:

- :mod:`orchestrator.core.rounds` (``core.rounds``): task selection, end of data, round plans,
  open rounds, the hand-out of tasks to an attached explorer;
- :mod:`orchestrator.core.submit` (``core.intake``): groups in (judging, validity, the list and
  table routes, classification, carry or drop, counters);
- :mod:`orchestrator.core.release` (``core.release``): batches out (staleness at assembly,
  padding, ``on_cap``);
- :mod:`orchestrator.core.state` (``core.snapshot``): save, load and the version-1 migration.

The core's attributes and methods say which part owns each (``core.carry`` is
``core.batch.carry``, ``core.plan_round`` is ``core.rounds.plan_round``).

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

from typing import Any

import numpy as np

from orchestrator.core.errors import DataExhaustedError, ReplenishCapError, short_repr  # noqa: F401 - importers find them here
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.release import ROUNDS_KEPT, Release, rollout_lags  # noqa: F401
from orchestrator.core.rounds import OPEN_ROUNDS_KEPT, RoundPlan, Rounds  # noqa: F401
from orchestrator.core.rows import GroupRows, flagged  # noqa: F401
from orchestrator.core.shared import OpenBatch, Run, Tally
from orchestrator.core.state import CoreState, group_from_dict, group_to_dict, json_safe  # noqa: F401
from orchestrator.core.stats import BatchStats, LastRound, Stats, TaskEstimate, TaskStats, ratio
from orchestrator.core.submit import Submit
from orchestrator.core.tasks import TaskColumns
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


def _owned(part: str, name: str, settable: bool = False) -> property:
    """``core.<name>``: the attribute or method ``name`` of the part that owns it."""

    def get(self: OrchestratorCore) -> Any:
        return getattr(getattr(self, part), name)

    def put(self: OrchestratorCore, value: Any) -> None:
        setattr(getattr(self, part), name, value)

    return property(get, put if settable else None, doc=f"``{part}.{name}``")


class OrchestratorCore:
    """Dynamic-sampling state machine for one training run.

    Composed of parts, each given in its constructor the shared state it reads
    (:mod:`orchestrator.core.shared`: :class:`Run`, :class:`OpenBatch`, :class:`Tally`; and the
    per-task :class:`~orchestrator.core.tasks.TaskColumns`) and the parts it calls:
    :class:`Rounds` (``rounds``), :class:`Submit` (``intake``), :class:`Release` (``release``)
    and :class:`CoreState` (``snapshot``). The attributes and methods below name the part
    that owns each.

    Args:
        policy: the resampling policy (replaceable at run time with :meth:`set_policy`).
        task_ids: every task id of the task set, in a stable order.
        seed: seeds the per-epoch task order.
        task_tags: each task's difficulty tag (pass-rate priors by tag), or None.
        task_texts: each task's prompt text (read by ``pass_predictor``), or None.
    Raises:
        ValueError: empty or duplicate task ids.
    """

    def __init__(self, policy: ResamplingPolicy, task_ids: list[str], seed: int = 0, task_tags: list[str] | None = None,
                 task_texts: list[str] | None = None):
        if not task_ids:
            raise ValueError("task_ids: the task set is empty")
        if len(set(task_ids)) != len(task_ids):
            raise ValueError("task_ids: duplicate task ids")
        run = self.run = Run(policy)
        tasks = self.tasks = TaskColumns(task_ids, seed, policy.passrate_half_life, task_tags, task_texts)
        tally = self.tally = Tally()
        batch = self.batch = OpenBatch(policy.group_size)
        self.rounds = Rounds(run, tasks, tally, batch, view=self)
        self.intake = Submit(run, tasks, tally, batch, self.rounds)
        self.release = Release(run, tasks, tally, batch, self.intake, view=self)
        self.snapshot = CoreState(run, tasks, tally, batch, self.rounds, self.intake)

    # who owns what: the shared state
    policy = _owned("run", "policy", settable=True)
    policy_revision = _owned("run", "policy_revision", settable=True)
    model_version = _owned("run", "model_version", settable=True)
    task_ids = _owned("tasks", "task_ids")
    seed = _owned("tasks", "seed")
    history = _owned("tasks", "history")
    passrate = _owned("tasks", "passrate")
    pick_epoch = _owned("tasks", "pick_epoch", settable=True)
    task_index = _owned("tasks", "task_index")
    task_texts = _owned("tasks", "texts")
    set_task_texts = _owned("tasks", "set_texts")
    touched_rows = _owned("tasks", "touched_rows")
    counters = _owned("tally", "counters", settable=True)
    classified_by_reason = _owned("tally", "classified_by_reason")
    dropped_by_reason = _owned("tally", "dropped_by_reason")
    rounds_per_batch = _owned("tally", "rounds_per_batch")
    window = _owned("tally", "window")
    last_batch = _owned("tally", "last_batch")
    carry = _owned("batch", "carry", settable=True)
    candidates = _owned("batch", "candidates", settable=True)
    batch_id = _owned("batch", "batch_id")
    rounds_started = _owned("batch", "rounds_started")
    rounds_submitted = _owned("batch", "rounds_submitted")
    dropped_task_ids = _owned("batch", "dropped_task_ids", settable=True)
    requeue = _owned("batch", "requeue")
    # the rounds part: task selection, round plans, screens, tasks handed out
    selections = _owned("rounds", "selections")
    selection = _owned("rounds", "selection")
    epoch = _owned("rounds", "epoch")
    open_rounds = _owned("rounds", "open_rounds")
    last_round = _owned("rounds", "last_round")
    in_flight = _owned("rounds", "in_flight")
    requeued = _owned("rounds", "requeued")
    predicted_informative = _owned("rounds", "predicted_informative")
    predicted_keep_rate = _owned("rounds", "predicted_keep_rate")
    select_tasks = _owned("rounds", "select_tasks")
    epochs_done = _owned("rounds", "epochs_done")
    rollouts_left = _owned("rounds", "rollouts_left")
    exhausted = _owned("rounds", "exhausted")
    missing_groups = _owned("rounds", "missing_groups")
    cap_reached = _owned("rounds", "cap_reached")
    replenish_blocked = _owned("rounds", "replenish_blocked")
    plan_round = _owned("rounds", "plan_round")
    screen_plan = _owned("rounds", "screen_plan")
    record_screens = _owned("rounds", "record_screens")
    answer_reused = _owned("rounds", "answer_reused")
    answer_screen = _owned("rounds", "answer_screen")
    answer_top_up = _owned("rounds", "answer_top_up")
    next_tasks = _owned("rounds", "next_tasks")
    requeue_in_flight = _owned("rounds", "requeue_in_flight")
    # the intake part: groups in
    judge_name = _owned("intake", "judge_name")
    check_groups = _owned("intake", "check_groups")
    check_table = _owned("intake", "check_table")
    validate = _owned("intake", "validate")
    submit = _owned("intake", "submit")
    submit_table = _owned("intake", "submit_table")
    drop_held = _owned("intake", "drop_held")
    # the release part: batches out
    try_emit = _owned("release", "try_emit")
    close_at_cap = _owned("release", "close_at_cap")
    finish = _owned("release", "finish")
    # the snapshot part: save and load
    held_groups = _owned("snapshot", "held_groups")
    state = _owned("snapshot", "state")
    state_dict = _owned("snapshot", "state_dict")
    load_state_dict = _owned("snapshot", "load_state_dict")

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
        self.rounds.use_policy(policy)  # may refuse it (e.g. unknown selection options): nothing changed yet
        self.policy = policy
        self.policy_revision += 1
        self.passrate.half_life = policy.passrate_half_life
        return self.policy_revision

    def reset(self) -> None:
        """Back to a new core's state (the same policy, task ids, seed and task tags), in place: the
        parts that hold this core keep it (the actor after a failed first commit)."""
        self.__init__(self.policy, self.task_ids, seed=self.seed, task_tags=self.passrate.task_tags(),
                      task_texts=self.task_texts)

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
        extra = self.selection.task_row(i, self.rounds.context())
        return TaskStats(
            task_id=task_id,
            **self.history.row(i),
            estimate=TaskEstimate(**self.passrate.row(i, self.model_version, self.policy.group_size)),
            epoch=self.epoch,
            next_eligible_epoch=max(self.epoch, int(self.history.skip_until_epoch[i])),
            revisit_due_in_picks=extra.get("revisit_due_in_picks"),
            selection_row=extra,
        )
