"""The lockstep multi-turn rollout driver shared by the text environments (FrozenLake, Sokoban).

:func:`run_lockstep` rolls out ``n`` trajectories of every task, all of them a turn at a time:
each turn, every live trajectory's state is shown to the policy as a prompt, the policy is
called once for all of them (``act(prompts, choices) -> list[dict]``), each answer is parsed
into an action index (or an invalid action) and the environment steps that trajectory. One
:class:`~orchestrator.core.types.Experience` per step. Everything specific to an environment
(rooms, hashing, drawing, prompt text, move rules, extra ``info`` keys) sits behind the small
:class:`LockstepEnv` protocol; the public ``run_episodes`` of each environment module is a
thin wrapper around :func:`run_lockstep`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any, Protocol

from orchestrator.core.types import Experience, ExperienceId, Task

Act = Callable[[list[list[dict[str, str]]], list[str]], list[dict[str, Any]]]

BASE_INFO_KEYS: tuple[str, ...] = (
    "env_state_hash", "invalid_action", "action", "state_text", "last", "terminated", "truncated", "model_version",
)
"""The ``info`` keys every step gets, in the order an environment without extra keys stores them."""


class EnvError(ValueError):
    """Bad environment input: a task without a map, a policy answer of the wrong shape."""


class LockstepEnv(Protocol):
    """What :func:`run_lockstep` needs from an environment.

    A *state* is whatever :meth:`reset` and :meth:`step` return for one trajectory; it may hold
    a mutable simulator, but the parts that :meth:`prompt`, :meth:`state_hash` and
    :meth:`render` read must not change when :meth:`step` is called on it (step returns the
    new state).
    """

    action_order: str
    """The action words' order, for the ``choices`` error message (``"up, down, left, right"``)."""

    num_actions: int
    """How many action words ``choices`` must hold."""

    choices_distinct_ignoring_case: bool
    """Whether ``choices`` must be distinct after lower-casing (else: distinct as given)."""

    info_keys: tuple[str, ...]
    """The order of a step's ``info`` keys: :data:`BASE_INFO_KEYS` plus :meth:`step`'s extra keys (unlisted keys are dropped)."""

    def reset(self, task: Task, run: int) -> Any:
        """The start state of run ``run`` of ``task``; raises :class:`EnvError` when ``task.meta`` lacks the room."""

    def prompt(self, state: Any) -> list[dict[str, str]]:
        """The chat messages shown to the policy in ``state``."""

    def state_hash(self, state: Any) -> str:
        """The ``env_state_hash`` of ``state`` (the GiGPO anchor): the environment's canonical
        text of the state, hashed with :func:`orchestrator.anchors.state_hash.text_hash`."""

    def render(self, state: Any) -> str:
        """The grid text of ``state`` (``info["state_text"]``)."""

    def step(self, state: Any, action: int | None, last_turn: bool) -> tuple[Any, float, bool, dict[str, Any]]:
        """Apply action index ``action`` (``None``: an invalid answer, the agent stays).

        ``last_turn`` is true on the turn-limit turn. Returns ``(new_state, reward, terminated,
        extra_info)``; ``extra_info`` holds the environment's own ``info`` keys.
        """


def run_lockstep(
    tasks: Sequence[Task],
    n: int,
    act: Act,
    *,
    env: LockstepEnv,
    max_steps: int,
    round_tag: str,
    model_version: int,
    choices: Sequence[str],
) -> list[Experience]:
    """Roll out ``n`` trajectories of every task in lockstep; one Experience per step.

    Each turn, every live trajectory gets ``env.prompt`` of its current state and ``act`` is
    called once for all of them. The answer (stripped, lower-cased) must be one of ``choices``
    (lower-cased; its index is the action); anything else is an invalid action
    (``env.step(state, None, ...)``). A trajectory ends when ``env.step`` says terminated, or
    after ``max_steps`` turns (truncated).

    Returns:
        Experiences ordered by (task order, run, step) with ``eid.task/run/step/round_tag``,
        ``tokens = prompt_token_ids + token_ids``, ``prompt_length``, ``logprobs``, ``reward``,
        ``response_text``; ``info`` in ``env.info_keys`` order: ``env_state_hash`` and
        ``state_text`` of the state *before* the action, ``invalid_action``, ``action`` (word
        or None), ``last``, ``terminated``, ``truncated``, ``model_version`` and the step's
        extra keys; ``metrics``: ``invalid_action`` (0/1) and ``success`` (1.0 on every step
        of a trajectory whose last step terminated with a positive reward).
    Raises:
        EnvError: duplicate task ids, a task ``env.reset`` rejects, or a policy answer list of
            the wrong length or without ``text``.
        ValueError: ``n < 1``, ``max_steps < 1`` or not ``env.num_actions`` distinct choices.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    k = env.num_actions
    distinct = {c.lower() for c in choices} if env.choices_distinct_ignoring_case else set(choices)
    if len(choices) != k or len(distinct) != k:
        raise ValueError(f"choices must be {k} distinct action words ({env.action_order} order), got {choices!r}")
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        raise EnvError(f"task ids must be distinct, got {ids!r}")
    words = [c.lower() for c in choices]
    info_keys = env.info_keys

    states: list[Any] = []
    trajs: list[tuple[str, int, list[Experience]]] = []
    for t in tasks:
        for run in range(n):
            states.append(env.reset(t, run))
            trajs.append((t.task_id, run, []))
    live = list(range(len(states)))
    for turn in range(max_steps):
        if not live:
            break
        prompts = [env.prompt(states[i]) for i in live]
        answers = act(prompts, list(choices))
        if not isinstance(answers, list) or len(answers) != len(live):
            got = len(answers) if isinstance(answers, list) else type(answers).__name__
            raise EnvError(f"act returned {got} answers for {len(live)} prompts (turn {turn})")
        last_turn = turn + 1 >= max_steps
        still = []
        for i, ans in zip(live, answers, strict=True):
            if not isinstance(ans, dict) or "text" not in ans:
                raise EnvError(f"act answer for task {trajs[i][0]!r} run {trajs[i][1]} turn {turn} has no 'text': {ans!r}")
            word = str(ans["text"]).strip().lower()
            invalid = word not in words
            state = states[i]
            states[i], reward, terminated, extra = env.step(state, None if invalid else words.index(word), last_turn)
            terminated = bool(terminated)
            truncated = not terminated and last_turn
            last = terminated or truncated
            prompt_ids = [int(x) for x in ans.get("prompt_token_ids") or []]
            token_ids = [int(x) for x in ans.get("token_ids") or []]
            info = {
                "env_state_hash": env.state_hash(state),
                "invalid_action": invalid,
                "action": None if invalid else word,
                "state_text": env.render(state),
                "last": last,
                "terminated": terminated,
                "truncated": truncated,
                "model_version": model_version,
                **extra,
            }
            trajs[i][2].append(
                Experience(
                    eid=ExperienceId(task=trajs[i][0], run=trajs[i][1], step=turn, round_tag=round_tag),
                    tokens=prompt_ids + token_ids,
                    prompt_length=len(prompt_ids),
                    logprobs=[float(x) for x in ans.get("logprobs") or []],
                    reward=float(reward),
                    response_text=str(ans["text"]),
                    info={key: info[key] for key in info_keys},
                    metrics={"invalid_action": float(invalid)},
                )
            )
            if not last:
                still.append(i)
        live = still
    out: list[Experience] = []
    for _, _, steps in trajs:
        success = float(steps[-1].reward > 0 and steps[-1].info["terminated"])
        for e in steps:
            e.metrics["success"] = success
        out.extend(steps)
    return out


def distinct_tasks(
    num_tasks: int, seed: int, max_seeds: int, draw: Callable[[int], tuple[Hashable, Callable[[], Task]] | None]
) -> list[Task]:
    """Tasks from consecutive seeds ``seed, seed + 1, ...``, the first of each distinct instance.

    Generators can return the same map or room for different seeds (gymnasium's
    ``generate_random_map`` does); a repeated instance would make two tasks of one.

    Args:
        num_tasks: how many distinct tasks to return, >= 1.
        seed: first seed.
        max_seeds: seeds to try at most.
        draw: ``draw(seed) -> (key, build)``: the instance's canonical key and a function that
            builds its task, or None when that seed yields no instance.
    Returns:
        Up to ``num_tasks`` tasks in seed order; fewer when ``max_seeds`` ran out (the caller
        says what it asked for).
    """
    tasks: list[Task] = []
    seen: set[Hashable] = set()
    for k in range(max_seeds):
        got = draw(seed + k)
        if got is None or got[0] in seen:
            continue
        seen.add(got[0])
        tasks.append(got[1]())
        if len(tasks) == num_tasks:
            break
    return tasks
