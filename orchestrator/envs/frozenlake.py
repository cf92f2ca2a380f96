"""FrozenLake as a multi-turn text environment for GiGPO rollouts.

Each task is one gymnasium ``FrozenLake-v1`` map (non-slippery 4x4 by default, from
``generate_random_map``; seeds that give an already seen map are skipped, since different
seeds can give the same map). A trajectory is up to ``max_steps`` turns: the model sees the
grid as plain text (drawn here; the ``ansi`` render carries colour escapes) and answers one
action word. Rewards are gymnasium's: 1 on reaching G, else 0; a hole ends the episode.

The anchor state of a step is the hash (:func:`orchestrator.anchors.state_hash.text_hash`) of the
:func:`canonical_state` it acted from: the map and the agent's cell only - never the rendered
prompt, turn counter or history - so all n trajectories of a task share their first state (one
anchor group of size n), and any revisit of a cell, by any trajectory of the task, lands in
the same group.

:func:`run_episodes` steps all trajectories of all tasks in lockstep and calls the policy
once per turn for every live trajectory: ``act(prompts, choices) -> list[dict]`` where each
dict has ``text``, ``token_ids``, ``prompt_token_ids`` and ``logprobs`` (the shape of
``VLLMEngine.chat_choice`` in :mod:`orchestrator.rollout.engine`; :func:`engine_act` adapts the Ray
actor, :func:`random_act` is a seeded random policy for tests and fast demos).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from orchestrator.anchors.state_hash import text_hash
from orchestrator.core.types import Experience, Task
from orchestrator.envs.lockstep import BASE_INFO_KEYS, Act, EnvError, distinct_tasks, run_lockstep

ACTIONS: tuple[str, ...] = ("left", "down", "right", "up")
"""Action words in gymnasium's FrozenLake action order (0 left, 1 down, 2 right, 3 up)."""

KIND = "frozenlake"

SYSTEM_PROMPT = (
    "FrozenLake. P is you, F is ice, H is a hole, G is the goal. "
    "Reach G without stepping on H. Answer with one word: left, down, right or up."
)

def canonical_state(desc: Sequence[str], row: int, col: int) -> str:
    """The canonical text of an agent at (row, col) on map ``desc``, whose
    :func:`~orchestrator.anchors.state_hash.text_hash` is the step's ``env_state_hash``.

    The map rows joined by newlines plus ``@row,col``; independent of turn number, history and
    prompt wording.
    """
    return "\n".join(desc) + f"\n@{row},{col}"


def render_grid(desc: Sequence[str], row: int, col: int) -> str:
    """The map as space-separated letters, the agent's cell shown as ``P``.

    Example (agent on the start cell)::

        P F F F
        F H F H
        F F F H
        H F F G
    """
    lines = []
    for r, line in enumerate(desc):
        cells = ["P" if (r, c) == (row, col) else ch for c, ch in enumerate(line)]
        lines.append(" ".join(cells))
    return "\n".join(lines)


def make_prompt(desc: Sequence[str], row: int, col: int) -> list[dict[str, str]]:
    """The chat messages for one turn: short system rules and the current grid."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": render_grid(desc, row, col) + "\nYour move?"},
    ]


def make_tasks(num_tasks: int, *, size: int = 4, p: float = 0.8, seed: int = 0, is_slippery: bool = False) -> list[Task]:
    """``num_tasks`` distinct random FrozenLake maps as :class:`Task` objects.

    Maps come from ``gymnasium.envs.toy_text.frozen_lake.generate_random_map(size, p,
    seed=seed + k)`` for k = 0, 1, ...; a map equal to an earlier one is skipped.

    Args:
        num_tasks: >= 1.
        size: grid side, >= 2.
        p: probability that a cell is frozen (gymnasium's parameter), in (0, 1].
        seed: first map seed.
        is_slippery: gymnasium's slippery dynamics (default off).
    Returns:
        Tasks with ``kind="frozenlake"``, ``task_id="frozenlake{size}-<sha1[:10] of map>"``,
        ``prompt`` = the first turn's messages, ``answer=""`` and ``meta`` = ``{"desc":
        list of row strings, "size", "is_slippery", "map_seed"}``.
    Raises:
        ValueError: bad arguments, or fewer distinct maps than asked within
            ``100 * num_tasks + 1000`` seeds.
    """
    from gymnasium.envs.toy_text.frozen_lake import generate_random_map

    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    if size < 2:
        raise ValueError(f"size must be >= 2, got {size}")
    if not 0 < p <= 1:
        raise ValueError(f"p must be in (0, 1], got {p}")
    def draw(map_seed: int) -> tuple[tuple[str, ...], Any]:
        desc = [str(row) for row in generate_random_map(size=size, p=p, seed=map_seed)]
        digest = text_hash("\n".join(desc))[:10]
        return tuple(desc), lambda: Task(
            task_id=f"{KIND}{size}-{digest}",
            prompt=make_prompt(desc, 0, 0),
            answer="",
            kind=KIND,
            meta={"desc": desc, "size": size, "is_slippery": is_slippery, "map_seed": map_seed},
        )

    tasks = distinct_tasks(num_tasks, seed, 100 * num_tasks + 1000, draw)
    if len(tasks) == num_tasks:
        return tasks
    raise ValueError(f"only {len(tasks)} distinct {size}x{size} maps (p={p}) found, asked for {num_tasks}")


class _State(NamedTuple):
    """One trajectory: the gymnasium env (mutable) and the map and agent cell (fixed per state)."""

    env: Any
    desc: list[str]
    row: int
    col: int


class _FrozenLake:
    """FrozenLake behind :class:`orchestrator.envs.lockstep.LockstepEnv` (gymnasium's ``FrozenLakeEnv``)."""

    action_order = "left, down, right, up"
    num_actions = 4
    choices_distinct_ignoring_case = False
    info_keys = BASE_INFO_KEYS

    def reset(self, task: Task, run: int) -> _State:
        from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

        desc = task.meta.get("desc")
        if not desc:
            raise EnvError(f"task {task.task_id!r}: meta['desc'] (the FrozenLake map) is missing")
        env = FrozenLakeEnv(desc=list(desc), is_slippery=bool(task.meta.get("is_slippery", False)))
        obs, _ = env.reset(seed=run)
        return _State(env, list(desc), *divmod(int(obs), len(desc[0])))

    def prompt(self, s: _State) -> list[dict[str, str]]:
        return make_prompt(s.desc, s.row, s.col)

    def state_hash(self, s: _State) -> str:
        return text_hash(canonical_state(s.desc, s.row, s.col))

    def render(self, s: _State) -> str:
        return render_grid(s.desc, s.row, s.col)

    def step(self, s: _State, action: int | None, last_turn: bool) -> tuple[_State, float, bool, dict[str, Any]]:
        if action is None:
            return s, 0.0, False, {}
        obs, rew, terminated, _, _ = s.env.step(action)
        row, col = divmod(int(obs), len(s.desc[0]))
        return s._replace(row=row, col=col), float(rew), terminated, {}


def run_episodes(
    tasks: Sequence[Task],
    n: int,
    act: Act,
    *,
    max_steps: int = 12,
    round_tag: str = "",
    model_version: int = 0,
    choices: Sequence[str] = ACTIONS,
) -> list[Experience]:
    """Roll out ``n`` trajectories of every task in lockstep; one Experience per step.

    Each turn, every live trajectory gets :func:`make_prompt` of its current state and the
    policy is called once for all of them. The answer (stripped, lower-cased) must be one of
    ``choices`` (in gymnasium's action order); anything else is an invalid action: the
    agent stays, reward 0, ``info["invalid_action"] = True``. A trajectory ends on the goal
    (reward 1), in a hole, or after ``max_steps`` turns.

    Args:
        tasks: FrozenLake tasks from :func:`make_tasks` (``meta["desc"]`` required).
        n: trajectories per task, >= 1.
        act: the policy, ``act(prompts, choices) -> list[dict]`` with one dict per prompt
            holding ``text``, ``token_ids``, ``prompt_token_ids``, ``logprobs``.
        max_steps: turn limit per trajectory, >= 1.
        round_tag: stored in ``eid.round_tag``.
        model_version: stored in ``info["model_version"]``.
        choices: the action words, one per gymnasium action (4).
    Returns:
        Experiences ordered by (task order, run, step) with ``eid.task/run/step/round_tag``,
        ``tokens = prompt_token_ids + token_ids``, ``prompt_length``, ``logprobs``,
        ``reward`` (step reward), ``response_text``; ``info``: ``env_state_hash`` (of the
        state *before* the action), ``invalid_action``, ``action`` (word or None),
        ``state_text`` (the grid), ``last`` (final step of its trajectory), ``terminated``,
        ``truncated``, ``model_version``; ``metrics``: ``success`` (1.0 when the trajectory
        reached the goal, on every step of it), ``invalid_action`` (0/1).
    Raises:
        EnvError: a task without ``meta["desc"]``, duplicate task ids, or a policy answer
            list of the wrong length or without ``text``.
        ValueError: ``n < 1``, ``max_steps < 1`` or not 4 choices.
    """
    return run_lockstep(tasks, n, act, env=_FrozenLake(), max_steps=max_steps, round_tag=round_tag,
                        model_version=model_version, choices=choices)


def trinity_taskset_rows(count: int, *, size: int = 4, p: float = 0.8, first_seed: int = 0) -> list[dict[str, Any]]:
    """Rows of a taskset for Trinity-RFT's ``frozen_lake_workflow`` (its ``raw_task`` fields).

    Trinity's workflow draws the map itself from ``(size, p, seed)`` (its own
    ``generate_random_map``, which also checks the goal is reachable within ``env_max_steps``),
    so a row is just those three numbers; row k uses ``seed = first_seed + k``.

    Args:
        count: number of rows, >= 1.
        size: grid side, >= 2.
        p: probability that a cell is frozen, in (0, 1].
        first_seed: seed of the first row.
    Returns:
        ``[{"seed": int, "size": int, "p": float}, ...]``, ``count`` rows.
    Raises:
        ValueError: an argument out of range (named).
    """
    if count < 1:
        raise ValueError(f"count: must be >= 1, got {count}")
    if size < 2:
        raise ValueError(f"size: must be >= 2, got {size}")
    if not 0 < p <= 1:
        raise ValueError(f"p: must be in (0, 1], got {p}")
    return [{"seed": first_seed + k, "size": size, "p": p} for k in range(count)]
