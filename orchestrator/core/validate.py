"""The one validation layer for groups and experiences arriving at the orchestrator.

Groups come from other processes (Trinity's pipeline, rollout workers, user code) as plain
dataclasses (:mod:`orchestrator.core.types`). Before any state changes, each is checked
against the pydantic models below (strict types: ``"3"`` is not an int, a ``numpy.int64`` or
``numpy.float32`` is not JSON-safe and is refused), so nothing is accepted that a later step
(the filter, the advantage, the sink, the state file, the REST stats) cannot use or store.
Errors are :class:`~algos.dapo.InvalidGroupError` naming the field, the task and the value,
each truncated (:func:`orchestrator.core.errors.short_repr`).
"""

from __future__ import annotations

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
them, ``mask`` masks the member; see ``OrchestratorCore._check_group``)."""
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
