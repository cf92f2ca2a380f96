"""Data records that flow through the orchestrator: experiences, groups and batches.

Field names follow Trinity-RFT's ``trinity.common.experience.Experience`` (``eid`` with
``task`` / ``run`` / ``step``, ``tokens``, ``prompt_length``, ``logprobs``, ``reward``,
``info``, ``metrics``) so the Trinity plugin can pass experiences through unchanged.
Plain dataclasses (not pydantic): they are data, created by the thousand per step, and
must pickle cheaply across Ray.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Purpose = Literal["initial", "replenish"]


@dataclass
class ExperienceId:
    """Identity of one rollout (or one step of a multi-turn rollout).

    Attributes:
        task: the task id (one prompt or environment instance).
        run: index of the rollout within its group, in [0, n).
        step: turn index within a multi-turn trajectory; 0 for single-turn rollouts.
        round_tag: the explore step / round that produced it (free-form, e.g. ``"b3r1"``).
    """

    task: str
    run: int = 0
    step: int = 0
    round_tag: str = ""


@dataclass
class Experience:
    """One rollout: prompt plus response tokens, behaviour log-probs and its reward.

    Attributes:
        eid: identity (task, run, step, batch).
        tokens: prompt followed by response token ids, length ``prompt_length + T``.
        prompt_length: number of prompt tokens at the start of ``tokens``.
        logprobs: (T,) behaviour-policy log-probabilities of the response tokens, in nats.
        reward: scalar reward of the rollout (after any shaping).
        response_text: decoded response.
        info: free-form metadata (``model_version``, ``env_state_hash``, padding flags...).
        metrics: per-rollout numeric metrics (e.g. ``accuracy`` in {0, 1}, ``response_length``).
    """

    eid: ExperienceId
    tokens: list[int] = field(default_factory=list)
    prompt_length: int = 0
    logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0
    response_text: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class Group:
    """The n rollouts of one task from one round, as judged together by the filter.

    Attributes:
        task_id: the task all rollouts share.
        rollouts: exactly n experiences with distinct ``eid.run`` in [0, n).
        model_version: model weights version that produced the rollouts.
        purpose: ``initial`` (first round of a batch) or ``replenish``.
        round: replenish round within its batch (0 for the initial round).
        reason: filter outcome label (``informative``, ``all_correct``, ...); set on submit.
        padding: True when emitted only to keep the batch shape (zero loss weight).
        key: storage key given by the orchestrator on submit (:func:`group_key`, or a unique
            ``anon:`` key for a group without a round tag).
    """

    task_id: str
    rollouts: list[Experience]
    model_version: int = 0
    purpose: Purpose = "initial"
    round: int = 0
    reason: str = ""
    padding: bool = False
    key: str = ""


def group_key(group: Group) -> str | None:
    """The identity of a group: ``task \x1f round tags \x1f runs``, or None without a round tag.

    A group is the same group when its task, its rollouts' round tags (``eid.round_tag``) and
    its run ids are the same: a retried submit of it is recognised and not counted twice.
    Groups whose rollouts carry no round tag have no identity (every submit is new).
    """
    tags = sorted({r.eid.round_tag for r in group.rollouts})
    if tags == [""] or not tags:
        return None
    runs = ",".join(str(r.eid.run) for r in sorted(group.rollouts, key=lambda r: r.eid.run))
    return f"{group.task_id}\x1f{'|'.join(tags)}\x1f{runs}"


@dataclass
class Batch:
    """One train batch released by the orchestrator.

    Attributes:
        batch_id: consecutive id from 0.
        groups: exactly ``target_groups`` groups unless ``partial``.
        partial: True when the replenish cap was hit under ``on_cap="partial"``.
        rounds: replenish rounds spent on this batch (the initial round not counted).
        model_version: the orchestrator's model version when emitted.
        fill_seconds: wall time from the batch's first round to its release.
    """

    batch_id: int
    groups: list[Group]
    partial: bool = False
    rounds: int = 0
    model_version: int = 0
    fill_seconds: float = 0.0

    @property
    def num_padding(self) -> int:
        return sum(g.padding for g in self.groups)


class UnknownTaskError(KeyError, ValueError):
    """A task id is not in the task set (a ``KeyError`` and a ``ValueError``)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class InvalidTaskError(ValueError):
    """A task cannot be scored (unknown answer format, duplicate id, empty prompt)."""


@dataclass
class Task:
    """One prompt (or environment instance) with what is needed to score a response.

    Attributes:
        task_id: stable, unique id within its task set.
        prompt: the chat messages (``[{"role": ..., "content": ...}]``) sent to the model.
        answer: the reference answer.
        kind: the family the task comes from (e.g. ``parity``, ``champ``), used for scoring.
        meta: anything else the scorer needs. Single-turn tasks built here carry
            ``format`` (one of :data:`ANSWER_FORMATS`) and ``source`` (e.g.
            ``"reasoning_gym:syllogism"``, ``"champ:P_Combinatorics_17"``, ``"generated"``);
            reasoning-gym tasks also ``rg_dataset`` and ``rg_entry`` (the generator's entry,
            passed to its scorer).
    """

    task_id: str
    prompt: list[dict[str, str]]
    answer: str
    kind: str = ""
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def answer_format(self) -> str:
        """``meta["format"]``, or ``""`` when the task has none."""
        return str(self.meta.get("format", ""))


class TaskSetLike(Protocol):
    """What the orchestrator needs of a task set: stable ids and a lookup.

    ``get`` raises :class:`UnknownTaskError` for an id outside the set.
    """

    task_ids: list[str]

    def get(self, task_id: str) -> Task: ...
