"""The one validation layer for groups and experiences arriving at the orchestrator.

Groups come from other processes (Trinity's pipeline, rollout workers, user code) as plain
dataclasses (:mod:`orchestrator.core.types`). Before any state changes, each is checked
against the pydantic models below (strict types: ``"3"`` is not an int, a ``numpy.int64`` or
``numpy.float32`` is not JSON-safe and is refused), so nothing is accepted that a later step
(the filter, the advantage, the sink, the state file, the REST stats) cannot use or store.
Errors are :class:`~algos.dapo.InvalidGroupError` naming the field, the task and the value,
each truncated (:func:`orchestrator.core.errors.short_repr`).

The rules both submit routes share are worded here, once: an unknown task
(:func:`unknown_task`), a group of the wrong size (:func:`wrong_size`), and each member's
reward and judged value (:func:`member_problem`). The list route (``Submit._check_group`` in
:mod:`orchestrator.core.submit`) applies them to a group's rollouts one by one; the table route
(:func:`orchestrator.core.table.check_table`) tests its columns at once and words the first
problem of each invalid row with them. What a group with unusable members gets is the
``group_validity`` mode's (:data:`orchestrator.core.modes.GROUP_VALIDITY`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from algos.dapo import InvalidGroupError
from orchestrator.core.errors import field_path, short_repr

MAX_ID_CHARS = 1024
"""Longest task id or round tag accepted."""

MAX_INT32 = 2**31 - 1
"""Upper bound of run, step, token ids and model versions (stored as 32-bit-safe integers)."""


def _plain_number(value: Any) -> Any:
    # numpy.float32 / numpy.int64 convert to float under pydantic but not under json.dumps
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a Python int or float, got {type(value).__module__}.{type(value).__qualname__}")
    return value


_STRICT = ConfigDict(strict=True, extra="forbid", allow_inf_nan=False, from_attributes=True)
Number = Annotated[float, Field(allow_inf_nan=True), BeforeValidator(_plain_number)]
"""A Python int or float; NaN and infinities pass here: the core judges them (``reject`` refuses
them, ``mask`` masks the member; see :func:`member_problem`)."""
Count = Annotated[int, Field(ge=0, le=MAX_INT32), BeforeValidator(_plain_number)]


class ExperienceIdIn(BaseModel):
    model_config = _STRICT

    task: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    run: Count
    step: Count
    round_tag: str = Field(max_length=MAX_ID_CHARS)


class ExperienceIn(BaseModel):
    """One rollout as accepted: plain Python numbers (``metrics`` JSON-safe), a ``dict`` ``info``."""

    model_config = _STRICT

    eid: ExperienceIdIn
    # long lists: checked by pydantic-core alone (strict int refuses numpy integers); their
    # element types are checked in check_group without a Python call per element
    tokens: list[Annotated[int, Field(ge=0, le=MAX_INT32)]]
    prompt_length: Count
    logprobs: list[Annotated[float, Field(allow_inf_nan=True)]]  # -inf is a valid log-probability
    reward: Number | None  # None: no reward (refused under group_validity "reject", masked under "mask")
    response_text: str
    info: dict[str, Any]  # free-form (e.g. a trajectory's step experiences); the sink writes it with default=str
    metrics: dict[str, Number]


class GroupIn(BaseModel):
    """One group as accepted (shape and ids are checked by ``OrchestratorCore.validate``)."""

    model_config = _STRICT

    task_id: str = Field(min_length=1, max_length=MAX_ID_CHARS)
    rollouts: list[ExperienceIn]
    model_version: Count
    purpose: Literal["initial", "replenish"]
    round: Count
    reason: str
    padding: bool
    key: str


def check_group(group: Any) -> None:
    """Check one group's types and storable values (the core then checks its shape, and its
    rewards against ``max_abs_reward`` and finiteness).

    Args:
        group: a :class:`~orchestrator.core.types.Group` (any object with its attributes).
    Raises:
        InvalidGroupError: the first problem, e.g. ``rollouts.3.reward: ... (got '1') in group
            of task 't7'``.
    """
    task = short_repr(getattr(group, "task_id", None))
    try:
        GroupIn.model_validate(group)
    except ValidationError as err:
        e = err.errors(include_url=False)[0]
        raise InvalidGroupError(
            f"{field_path(e['loc']) or 'group'}: {e['msg'].removeprefix('Value error, ')} (got {short_repr(e.get('input'))}) "
            f"in group of task {task}"
        ) from None
    for i, r in enumerate(group.rollouts):
        if r.logprobs:
            odd = set(map(type, r.logprobs)) - {float, int}  # e.g. numpy.float32: not JSON-safe
            if odd:
                raise InvalidGroupError(
                    f"rollouts.{i}.logprobs: expected Python floats, got {sorted(t.__qualname__ for t in odd)} in run "
                    f"{r.eid.run} of task {task}"
                )
            if np.isnan(np.asarray(r.logprobs, dtype=np.float64)).any():
                raise InvalidGroupError(f"rollouts.{i}.logprobs: NaN in run {r.eid.run} of task {task}")


def unknown_task(task: Any, num_tasks: int) -> str:
    """The message of a task id outside a task set of ``num_tasks`` tasks."""
    return f"task_id: unknown task {short_repr(task)} (task set has {num_tasks} tasks)"


def wrong_size(task: str, size: int, group_size: int) -> str:
    """The message of a group of task ``task`` with ``size`` rollouts where ``group_size`` are expected."""
    return f"rollouts: group of task {task!r} has {size} rollouts, expected group_size={group_size}"


def member_problem(reward: Any, value: Any, judge: str, max_abs: float, run: int, task: str,
                   missing: str = "missing") -> str | None:
    """The first problem of one member of a group, or None when it is usable.

    In order: a missing (None), non-finite or non-numeric reward, or one above ``max_abs``
    (``max_abs_reward``); a missing judged value (None), or one that is non-finite, non-numeric
    or above ``max_abs``.

    Args:
        reward: the member's reward.
        value: its judged value (the reward itself when the filter judges the reward).
        judge: the judged value's name (``filter.judge``, ``auto`` resolved where the route can).
        run, task: where the member is (named in the message).
        missing: how a missing judged value is worded (the table route cannot tell a missing
            metric from a NaN one: ``"missing or not a number"``).
    """
    if reward is None:
        what = "reward: missing (None)"
    elif not isinstance(reward, (int, float)) or not math.isfinite(reward):
        what = f"reward: non-finite value {reward!r}"
    elif abs(reward) > max_abs:
        what = f"reward: |{reward!r}| exceeds max_abs_reward={max_abs:g}"
    elif value is None:
        return f"metrics[{judge!r}]: {missing} in run {run} of task {task!r} (the filter judges it)"
    elif not isinstance(value, (int, float)) or not math.isfinite(value) or abs(value) > max_abs:
        what = f"{judge}: non-finite or absurd value {value!r}"
    else:
        return None
    return f"{what} in run {run} of task {task!r}"
