"""The orchestrator's typed views: :class:`Stats` (live counters) and :class:`TaskStats` (one task).

One record, produced by :meth:`orchestrator.core.machine.OrchestratorCore.stats`, read by
everyone else: it is the REST response model of ``GET /v1/stats``, the Prometheus metrics
loop over its fields, and the CLI tables print its fields under their ``title``. Nobody
re-types its keys. Counters are cumulative over the run and survive restarts (they are part
of the core's ``state_dict``).

Accounting invariant (checked by the tests)::

    groups_submitted == groups_emitted + groups_padded + groups_dropped + groups_held
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class LastRound(BaseModel):
    """The last round planned by the orchestrator whose groups have all been submitted."""

    model_config = ConfigDict(extra="forbid")

    round: str = Field(description="Round tag, 'b<batch>r<round>'.")
    tasks: int = Field(description="Tasks planned (one group each).")
    predicted_keep_rate: float = Field(description="Mean predicted informativeness of its tasks when planned (0..1).")
    realised_keep_rate: float = Field(description="Share of its groups that were informative (0..1).")


COUNTERS: tuple[str, ...] = (
    "groups_submitted",
    "groups_emitted",
    "groups_padded",
    "groups_dropped",
    "batches_emitted",
    "batches_partial",
    "cap_hits",
    "rollouts_initial",
    "rollouts_replenish",
    "rollouts_wasted",
    "groups_kept_classified",
    "replenish_rounds",
    "reward_sum_all",
    "reward_count_all",
    "reward_sum_kept",
    "reward_count_kept",
    "reward_sum_trained",
    "reward_count_trained",
    "rollouts_masked",
    "rollouts_planned",
    "rounds_completed",
    "round_groups",
    "round_predicted_informative",
    "round_realised_informative",
    "screens",
    "screens_stopped",
    "rollouts_screen_stopped",
    "answers_scored",
    "answers_reused",
    "answer_skips",
)
"""The cumulative counters the core keeps (``OrchestratorCore.counters``), in :class:`Stats` order."""


class BatchStats(BaseModel):
    """Reward metrics of one released batch, over the rounds since the previous release.

    ``all``: every valid rollout classified in those rounds; ``kept``: those of informative
    groups; ``trained``: the batch's non-padding, unmasked rollouts. ``coverage`` is trained
    rollouts / rollouts generated in those rounds. Null when its denominator is 0 (e.g. every
    group dropped: no kept or trained reward).
    """

    model_config = ConfigDict(extra="forbid")

    batch_id: int = Field(title="last batch released (id)")
    mean_reward_all: float | None = Field(title="batch mean reward: all groups")
    mean_reward_kept: float | None = Field(title="batch mean reward: informative groups")
    mean_reward_trained: float | None = Field(title="batch mean reward: trained rollouts")
    coverage: float | None = Field(title="batch coverage (trained / generated rollouts)")
    rollouts_trained: int = Field(title="batch rollouts trained")
    rollouts_generated: int = Field(title="batch rollouts generated")


class Stats(BaseModel):
    """Live counters of one orchestrator. ``title`` is the label the CLI tables print."""

    model_config = ConfigDict(extra="forbid")

    batch_id: int = Field(title="batch being filled", description="Id of the batch being filled.")
    batches_emitted: int = Field(title="batches emitted")
    batches_partial: int = Field(title="batches partial", description="Batches emitted smaller than target_groups (on_cap=partial).")
    groups_submitted: int = Field(title="groups submitted")
    groups_emitted: int = Field(title="groups emitted (informative)")
    groups_dropped: int = Field(title="groups dropped")
    dropped_by_reason: dict[str, int] = Field(title="dropped by reason")
    classified_by_reason: dict[str, int] = Field(title="classified by outcome")
    groups_kept_classified: int = Field(title="groups classified informative")
    groups_padded: int = Field(title="groups used as padding")
    groups_carried: int = Field(title="groups carried over", description="Informative groups waiting for a later batch.")
    groups_held: int = Field(title="groups held", description="Carried over plus the open batch's padding candidates.")
    rollouts_initial: int = Field(title="rollouts generated: initial")
    rollouts_replenish: int = Field(title="rollouts generated: replenish")
    rollouts_total: int = Field(title="rollouts generated: total", description="initial + replenish + rollouts_screen_stopped.")
    screens: int = Field(0, title="screens", description="Tasks screened (screen_options.rollouts rolled first).")
    screens_stopped: int = Field(0, title="screens stopped", description="Screens whose rollouts were all equal: the group was not completed.")
    rollouts_screen_stopped: int = Field(0, title="rollouts of stopped screens", description="Rollouts spent on screens that stopped (never trained on).")
    answers_scored: int = Field(0, title="answers scored", description="Tasks whose reference answer was scored (answer screen): one forward pass each, no rollout.")
    answers_reused: int = Field(0, title="answers reused", description="Tasks the answer screen decided on from a recent settled score (screen_options.reuse_versions), without a forward pass.")
    answer_skips: int = Field(0, title="answer-screen skips", description="Scored tasks not rolled out (answer screen): no rollout spent.")
    rollouts_wasted: int = Field(title="rollouts wasted", description="Rollouts of dropped groups.")
    rollouts_per_emitted_group: float | None = Field(title="rollouts per emitted informative group", description="Null before any.")
    keep_ratio: float | None = Field(title="keep rate (informative / classified)", description="Null before any group.")
    predicted_keep_rate: float = Field(
        title="predicted keep rate (all groups so far, smoothed)",
        description="Laplace-smoothed share of all groups classified informative so far, (k + 1) / (g + 2).",
    )
    replenish_rounds: int = Field(title="replenish rounds")
    rounds_per_batch: list[int] = Field(title="replenish rounds per batch (latest batches, oldest first)", description="The most recent batches, oldest first.")
    cap_hits: int = Field(title="cap hits")
    reward_sum_all: float = Field(title="reward sum: all groups")
    reward_count_all: int = Field(title="rewards counted: all groups")
    reward_sum_kept: float = Field(title="reward sum: informative groups")
    reward_count_kept: int = Field(title="rewards counted: informative groups")
    mean_reward_all: float | None = Field(title="mean reward: all groups", description="Null before any.")
    mean_reward_kept: float | None = Field(title="mean reward: informative groups (emitted or carried)", description="Null before any.")
    reward_sum_trained: float = Field(title="reward sum: trained rollouts")
    reward_count_trained: int = Field(title="rollouts trained", description="Non-padding, unmasked rollouts of emitted batches.")
    mean_reward_trained: float | None = Field(title="mean reward: trained rollouts", description="Null before any batch.")
    coverage: float | None = Field(
        title="coverage (trained / generated rollouts)", description="Share of generated rollouts that reached the trainer; null before any."
    )
    rollouts_masked: int = Field(title="rollouts masked", description="Members masked (invalid or stale): zero loss weight, out of the baseline.")
    rollouts_planned: int = Field(title="rollouts planned", description="group_size x tasks handed out; what max_rollouts counts.")
    last_batch: BatchStats | None = Field(None, title="last batch", description="Per-batch reward metrics of the last release; null before any.")
    exhausted: bool = Field(False, title="data exhausted", description="True once max_epochs or max_rollouts allow no further round.")
    replenish_paused: bool = Field(title="replenish paused")
    policy_revision: int = Field(title="resampling policy revision")
    model_version: int = Field(title="model version", description="Newest model weights version seen.")
    epoch: int = Field(title="epoch", description="Passes over the task set started (of the active selection).")
    anchor_index_up: bool | None = Field(
        None, title="anchor index (Redis) up",
        description="False during an outage of the Redis anchor index (the orchestrator's health check); null without one.",
    )
    anchor_index_outages: int = Field(0, title="anchor index outages", description="Outages of the Redis anchor index seen.")
    errors: dict[str, int] = Field(
        default_factory=dict, title="errors",
        description="Failures by kind since the actor's process started (dso_errors_total): commit, anchor_index, "
        "health_watch, operator, selector.",
    )
    last_error: dict[str, Any] | None = Field(
        None, title="last error",
        description="The last failure: time (Unix seconds), kind, message, step (the explore step, when known); null before any.",
    )
    selection: str = Field(title="task selection", description="policy.selection (a name in the selection registry).")
    selection_metrics: dict[str, float] = Field(title="task selection state", description="epoch; epoch: passed_over; informative: picks, revisits; greso: p_easy, p_hard.")
    rounds_completed: int = Field(title="planned rounds completed", description="Planned rounds whose groups all came back.")
    round_groups: int = Field(title="groups of completed planned rounds")
    round_predicted_informative: float = Field(title="informative groups predicted (completed planned rounds)", description="Sum of predicted chances.")
    round_realised_informative: int = Field(title="informative groups realised (completed planned rounds)")
    rounds_predicted_keep_rate: float | None = Field(title="keep rate of planned rounds: predicted", description="round_predicted_informative / round_groups; null before any.")
    rounds_realised_keep_rate: float | None = Field(title="keep rate of planned rounds: realised", description="round_realised_informative / round_groups; null before any.")
    last_round: LastRound | None = Field(title="last completed planned round", description="Null before any.")
    rollouts_dropped_share: float | None = Field(title="share of rollouts on dropped or padding groups", description="rollouts_wasted / rollouts_total; null before any.")


class TaskEstimate(BaseModel):
    """Pass-rate estimate of one task (``orchestrator.core.passrate``) at the current model version."""

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(description="Beta posterior parameter: population prior a0 plus decayed correct rollouts.")
    beta: float = Field(description="Beta posterior parameter: population prior b0 plus decayed incorrect rollouts.")
    pass_rate_mean: float = Field(description="Posterior mean pass rate alpha / (alpha + beta).")
    evidence_rollouts: float = Field(description="Decayed rollouts behind the estimate (0 for a task never seen).")
    predicted_informative: float = Field(description="Predicted chance that its next group of group_size is informative.")
    seen: bool
    tag: str = Field("", description="The task's difficulty tag (task meta 'family', else its kind); its prior is learned per tag.")
    prior_alpha: float = Field(0.0, description="a0 of the prior it shrinks to: its tag's (from that tag's first groups), else the population's.")
    prior_beta: float = Field(0.0, description="b0 of that prior.")


class TaskStats(BaseModel):
    """Reward history, pass-rate estimate and eligibility of one task (``GET /v1/tasks/{id}``)."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    groups: int
    informative: int
    rollouts: int
    correct: int
    mean: float = Field(description="Running mean reward of its rollouts.")
    m2: float = Field(description="Sum of squared deviations from the mean (Welford), for merging.")
    variance: float | None = Field(description="Unbiased reward variance; null below 2 rollouts.")
    pass_rate: float | None = Field(description="Correct / rollouts; null before any.")
    consec_all_correct: int
    consec_all_wrong: int
    last_model_version: int
    skip_until_epoch: int
    answer_prob: float | None = Field(None, description="Answer screen: the chance of the exact reference answer when last scored; null if never.")
    answer_prob_version: int = Field(-1, description="Answer screen: the model version of that score (-1: never scored).")
    estimate: TaskEstimate
    epoch: int = Field(description="The active selection's epoch now.")
    next_eligible_epoch: int = Field(description="First epoch in which the task may be picked (skip-rule cooldown).")
    revisit_due_in_picks: int | None = Field(
        None, description="'informative' selection: picks until the task is drawn first (0 = due now); null otherwise."
    )
    selection_row: dict[str, float | int] = Field(
        default_factory=dict, description="The active selection's own fields for this task (e.g. greso_keep_probability)."
    )


def ratio(num: float, den: float) -> float | None:
    """``num / den``, None when ``den`` is 0 (a rate with nothing to count)."""
    return num / den if den else None
