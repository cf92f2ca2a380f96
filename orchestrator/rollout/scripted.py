"""A deterministic rollout source for tests, dry runs and load tests: no model involved.

Rewards come from a script per task, so keep/drop decisions are known in advance.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from itertools import count
from typing import TYPE_CHECKING

from orchestrator.core.types import Experience, ExperienceId, Group, Task, UnknownTaskError

if TYPE_CHECKING:
    import numpy as np


class ScriptedTasks:
    """A task set of bare ids (tasks without prompts), with the ``task_ids`` / ``get`` interface."""

    def __init__(self, task_ids: Sequence[str]):
        self.task_ids = list(task_ids)
        self._known = set(self.task_ids)

    def __len__(self) -> int:
        return len(self.task_ids)

    def get(self, task_id: str) -> Task:
        if task_id not in self._known:
            raise UnknownTaskError(f"task_id: unknown task {task_id!r}")
        return Task(task_id=task_id, prompt=[], answer="")


class ScriptedRolloutSource:
    """Rolls out tasks by script: rewards per task, cycling through a list of reward vectors.

    Args:
        script: task id -> list of reward vectors (one per call for that task, cycling), each
            of length n. A task missing from the script gets ``default``.
        default: reward vector for unscripted tasks (must have length n when used).
    The metric ``accuracy`` is 1.0 where the reward is > 0, else 0.0; ``response_length`` is
    the run index + 1 (tokens), so tests can check it travels through.
    """

    metric_names: tuple[str, ...] = ("accuracy", "response_length")
    """Metrics each rollout carries (``filter.judge`` is checked against them)."""

    def __init__(self, script: dict[str, list[list[float]]] | None = None, default: list[float] | None = None):
        self.script = script or {}
        self.default = default
        self.calls: dict[str, int] = {}
        self._ids = count()

    def rewards_for(self, task_id: str) -> list[float]:
        k = self.calls.get(task_id, 0)
        self.calls[task_id] = k + 1
        vectors = self.script.get(task_id)
        if not vectors:
            if self.default is None:
                raise KeyError(f"task_id: no script for task {task_id!r} and no default")
            return list(self.default)
        return list(vectors[k % len(vectors)])

    def generate(self, tasks: list[Task], n: int, *, model_version: int = 0, round_tag: str = "") -> list[Group]:
        groups = []
        for task in tasks:
            rewards = self.rewards_for(task.task_id)
            if len(rewards) != n:
                raise ValueError(f"script for task {task.task_id!r} has {len(rewards)} rewards, expected n={n}")
            rollouts = [
                Experience(
                    eid=ExperienceId(task=task.task_id, run=run, round_tag=round_tag),
                    tokens=[1, 2, 3] + [4] * (run + 1),
                    prompt_length=3,
                    logprobs=[-0.5] * (run + 1),
                    reward=float(r),
                    response_text=f"scripted #{next(self._ids)}",
                    info={"model_version": model_version},
                    metrics={"accuracy": float(r > 0), "response_length": float(run + 1)},
                )
                for run, r in enumerate(rewards)
            ]
            groups.append(Group(task_id=task.task_id, rollouts=rollouts, model_version=model_version))
        return groups


class BernoulliRolloutSource:
    """Rollouts whose correctness is drawn per task: run i of task t is correct with p[t].

    A stand-in for a model with known per-task pass rates, for benchmarks of the sampling
    policy (how many rollouts an informative group costs). Rewards are DAPO's +1 / -1
    (arXiv 2503.14476, Sec. 2.4); ``metrics["accuracy"]`` is 1.0 or 0.0.

    Args:
        pass_rates: task id -> probability in [0, 1] that one rollout is correct.
        seed: seeds the draws (numpy ``default_rng``).
    """

    metric_names: tuple[str, ...] = ("accuracy",)
    """Metrics each rollout carries (``filter.judge`` is checked against them)."""

    def __init__(self, pass_rates: dict[str, float], seed: int = 0):
        import numpy as np

        self.pass_rates = dict(pass_rates)
        self._rng = np.random.default_rng(seed)

    def generate(self, tasks: list[Task], n: int, *, model_version: int = 0, round_tag: str = "") -> list[Group]:
        import numpy as np

        p = np.array([self.pass_rates[t.task_id] for t in tasks], dtype=np.float64)[:, None]  # (G, 1), also for G = 0
        correct = self._rng.random((len(tasks), n)) < p
        return [
            Group(
                task_id=task.task_id,
                rollouts=[
                    Experience(
                        eid=ExperienceId(task=task.task_id, run=run, round_tag=round_tag),
                        reward=1.0 if ok else -1.0,
                        info={"model_version": model_version},
                        metrics={"accuracy": float(ok)},
                    )
                    for run, ok in enumerate(row)
                ],
                model_version=model_version,
            )
            for task, row in zip(tasks, correct.tolist(), strict=True)
        ]

    def answer_probability(self, tasks: list[Task]) -> np.ndarray:
        """(k,) float64: each task's pass rate, exactly (what a model's answer likelihood estimates;
        :meth:`orchestrator.rollout.engine.VLLMRolloutSource.answer_probability`)."""
        import numpy as np

        return np.array([self.pass_rates[t.task_id] for t in tasks], dtype=np.float64)


PATTERNS = ("informative", "all_correct", "all_wrong")
"""Kinds of scripted group (DAPO rewards +1 / -1)."""


def reward_pattern(kind: str, n: int) -> list[float]:
    """The ``n`` rewards of one scripted group: ``all_correct`` (all +1), ``all_wrong`` (all -1)
    or ``informative`` (+1, -1, +1, ...; a single +1 when ``n == 1``).

    Raises:
        ValueError: unknown ``kind`` (names it).
    """
    if kind == "all_correct":
        return [1.0] * n
    if kind == "all_wrong":
        return [-1.0] * n
    if kind == "informative":
        return [1.0 if i % 2 == 0 else -1.0 for i in range(n)]
    raise ValueError(f"kind: unknown scripted group kind {kind!r}; expected one of {PATTERNS}")


def scripted_mix(task_ids: list[str], n: int, mix: dict[str, float], seed: int = 0, cycle: int = 4) -> dict[str, list[list[float]]]:
    """Reward scripts drawing each task's groups from ``mix`` (DAPO rewards +1 / -1).

    Each task cycles through ``cycle`` draws of informative ([+1, -1, ...]), all_correct
    (all +1) or all_wrong (all -1) groups of ``n`` rewards.
    """
    total = sum(mix.values())
    if total <= 0:
        raise ValueError(f"mix: weights must sum to > 0, got {mix}")
    kinds, weights = list(mix), [w / total for w in mix.values()]
    rng = random.Random(seed)
    return {t: [reward_pattern(rng.choices(kinds, weights)[0], n) for _ in range(cycle)] for t in task_ids}


