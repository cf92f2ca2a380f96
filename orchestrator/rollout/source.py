"""The rollout-source protocol, sampling and overlong settings, and turning samples into groups.

Behaviour log-probs are the model's own log-softmax of the sampled token (vLLM's default
``logprobs_mode="raw_logprobs"``; the HF source computes the same from the raw logits), in
nats, one per response token, EOS included. They equal the sampling distribution's
log-probs only at temperature 1 and top_p 1, the settings DAPO trains with.
"""

from __future__ import annotations

import zlib
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.core.types import Experience, ExperienceId, Group, Task
from orchestrator.tasks.taskset import TaskSet


class RolloutError(RuntimeError):
    """The engine returned something unusable (wrong number of samples, a choice outside the list)."""


class RolloutSource(Protocol):
    """Anything that can roll out tasks.

    ``generate(tasks, n, model_version=..., round_tag=...)`` returns one :class:`Group` per
    task, in the order of ``tasks``, each with exactly ``n`` experiences whose ``eid.run`` is
    ``0..n-1``, ``eid.task == task.task_id``, reward and metrics set by the task's scorer,
    and ``info["model_version"] == model_version``. ``metric_names`` (optional) lists the
    metrics each rollout carries; the orchestrator refuses a ``filter.judge`` outside it.
    """

    def generate(self, tasks: list[Task], n: int, *, model_version: int = 0, round_tag: str = "") -> list[Group]: ...


# --------------------------------------------------------------------------- configs


class OverlongConfig(BaseModel):
    """Soft overlong punishment (DAPO Eq. 13), added to the rule reward when configured.

    Passed to :func:`algos.dapo.overlong_penalty`; see it for the formula.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_response_length: int = Field(gt=0, description="L_max in tokens (DAPO: 20480).")
    cache_length: int = Field(gt=0, description="L_cache in tokens, <= max_response_length (DAPO: 4096).")
    penalty_factor: float = Field(1.0, ge=0, description="Scale of the penalty (DAPO: 1.0).")

    @model_validator(mode="after")
    def _cache_within_max(self) -> OverlongConfig:
        if self.cache_length > self.max_response_length:
            raise ValueError(
                f"cache_length={self.cache_length} must be <= max_response_length={self.max_response_length}"
            )
        return self


class SamplingConfig(BaseModel):
    """Sampling parameters of a rollout source.

    Defaults are DAPO's training rollouts (verl DAPO recipe: temperature 1.0, top_p 1.0), with
    a short response budget for a 135M model on CPU.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    temperature: float = Field(1.0, ge=0, description="Softmax temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass, in (0, 1].")
    max_tokens: int = Field(24, ge=1, description="Response budget in tokens, EOS included.")
    seed: int | None = Field(
        0,
        description="Base seed. The seed of one group is derived from it, the task id, the "
        "model version and the batch tag (so replenish rounds draw new samples); run i of "
        "the group uses seed + i (vLLM's parallel sampling). None: unseeded.",
    )
    overlong: OverlongConfig | None = Field(None, description="DAPO overlong shaping; None disables it.")

    @model_validator(mode="after")
    def _check_overlong_budget(self) -> SamplingConfig:
        """The overlong ramp must be reachable: Eq. 13 penalises from L_max - L_cache, so a
        response budget at or below that start makes the penalty dead (checked at config time)."""
        o = self.overlong
        if o is None:
            return self
        start = o.max_response_length - o.cache_length
        if self.max_tokens <= start:
            raise ValueError(
                f"max_tokens ({self.max_tokens}) must be > overlong.max_response_length - overlong.cache_length "
                f"({o.max_response_length} - {o.cache_length} = {start}): no response could reach the penalty"
            )
        return self

    def group_seed(self, task_id: str, model_version: int, round_tag: str) -> int | None:
        """Deterministic 31-bit seed of one group, or None when :attr:`seed` is None."""
        if self.seed is None:
            return None
        key = f"{self.seed}|{task_id}|{model_version}|{round_tag}".encode()
        return zlib.crc32(key) & 0x7FFF_FFFF

    def vllm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``vllm.SamplingParams`` (without n and seed)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}


# --------------------------------------------------------------------------- groups


def _groups_from_samples(
    tasks: list[Task],
    samples: list[list[dict[str, Any]]],
    n: int,
    task_set: TaskSet,
    sampling: SamplingConfig,
    model_version: int,
    round_tag: str,
) -> list[Group]:
    from algos.dapo import overlong_penalty

    if len(samples) != len(tasks):
        raise RolloutError(f"got samples for {len(samples)} tasks, expected {len(tasks)}")
    groups = []
    for task, task_samples in zip(tasks, samples):
        if len(task_samples) != n:
            raise RolloutError(f"task {task.task_id!r}: {len(task_samples)} samples, expected n={n}")
        lengths = np.array([len(s["token_ids"]) for s in task_samples], dtype=np.int64)
        if sampling.overlong is not None:
            penalties = overlong_penalty(
                lengths,
                max_response_length=sampling.overlong.max_response_length,
                cache_length=sampling.overlong.cache_length,
                penalty_factor=sampling.overlong.penalty_factor,
            )
        rollouts = []
        for run, s in enumerate(task_samples):
            reward, metrics = task_set.score(task, s["text"])
            metrics = {**metrics, "response_length": float(lengths[run])}
            if sampling.overlong is not None:
                metrics["overlong_penalty"] = float(penalties[run])
                reward += float(penalties[run])
            rollouts.append(
                Experience(
                    eid=ExperienceId(task=task.task_id, run=run, step=0, round_tag=round_tag),
                    tokens=list(s["prompt_token_ids"]) + list(s["token_ids"]),
                    prompt_length=len(s["prompt_token_ids"]),
                    logprobs=list(s["logprobs"]),
                    reward=float(reward),
                    response_text=s["text"],
                    info={"model_version": model_version, "finish_reason": s["finish_reason"]},
                    metrics=metrics,
                )
            )
        groups.append(Group(task_id=task.task_id, rollouts=rollouts, model_version=model_version))
    return groups


