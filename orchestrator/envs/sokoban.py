"""Sokoban as a multi-turn text environment for GiGPO rollouts (textarena's generator and moves).

Source. The rooms and the move rules are textarena's own Sokoban (``textarena.envs.Sokoban``,
installed, works offline): :func:`make_tasks` calls its level generator
``textarena.envs.Sokoban.utils.generate_room`` (a random-walk room topology, boxes placed away
from corner deadlocks, then reverse play - the player *pulls* boxes off their targets - so every
room is solvable), exactly as ``SokobanEnv.reset`` does (``num_steps = int(1.7 * (h + w))``), and
:func:`run_episodes` moves the player with ``SokobanEnv._push`` (textarena's transition
function: walk onto floor or an empty target; push a box one cell when the cell behind it is
floor or an empty target; otherwise nothing moves). textarena's state representation: two
integer grids, ``room_fixed`` (0 wall, 1 floor, 2 target) and ``room_state`` (the same plus 3
box on target, 4 box off target, 5 player), and ``player_position``. We do not use textarena's
``SokobanEnv.step``/``SinglePlayerState`` loop, because its game rules do not fit one policy
call per turn over many trajectories (see "Where we differ").

Tasks. One task is one room (walls, targets, boxes, player start); seeds whose room equals an
earlier one are skipped, so tasks are distinct. Default 6x6 with one box (the size GiGPO's
Sokoban runs use, verl-agent's ``dim_room=(6, 6)``, ``num_boxes=1``).

Rewards (textarena's outcome rule, paid on the step where it happens): the step that puts the
last box on a target gets 1.0 and ends the trajectory (``terminated``, ``success = 1``); when
``max_steps`` runs out, the last step gets textarena's turn-limit reward, the fraction of boxes
on targets (0 with one box), with ``success = 0``; every other step gets 0.

Where we differ from textarena (deliberately): a move into a wall, or a push of a box into a
wall or another box, is a valid no-op (the state is unchanged, ``info["blocked"] = True``),
not an "invalid move" that ends the game on the second in a row; ``info["invalid_action"]``
marks only answers that are not one of the four action words (the agent stays, reward 0).
The answer is the bare word (``up``), not textarena's bracketed ``[up]`` / ``[w]``.

The anchor state of a step is the hash (:func:`orchestrator.anchors.state_hash.text_hash`) of the
:func:`canonical_state` it acted from: the room layout (walls, floor, targets), the sorted box
cells and the player's cell - never the rendered
prompt, turn counter or history - so all n trajectories of a task share their first state (one
anchor group of size n), and the same arrangement reached along different paths lands in the
same group. Boxes are interchangeable, as in the game.

Grid drawn here (plain text, one space between cells)::

    # # # # # #
    # _ P _ # #
    # _ X _ # #
    # _ _ # # #
    # _ _ O # #
    # # # # # #

``#`` wall, ``_`` floor, ``O`` empty target, ``X`` box, ``*`` box on a target, ``P`` the player
(also when standing on a target). :func:`run_episodes` has the contract of
:func:`orchestrator.envs.frozenlake.run_episodes`; the policies (:func:`random_act`,
:func:`engine_act`) are shared with FrozenLake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from orchestrator.anchors.state_hash import text_hash
from orchestrator.core.types import Experience, Task
from orchestrator.envs.lockstep import Act, EnvError, distinct_tasks, run_lockstep
from orchestrator.envs.policies import engine_act, random_act

__all__ = [
    "ACTIONS", "KIND", "Act", "EnvError", "canonical_state", "engine_act", "make_tasks", "random_act", "render_grid",
    "run_episodes", "task_from_grid",
]

ACTIONS: tuple[str, ...] = ("up", "down", "left", "right")
"""Action words in textarena's ``SokobanEnv.action_space`` order."""

KIND = "sokoban"

SYSTEM_PROMPT = (
    "Sokoban. P is you, # is a wall, X is a box, O is a target, * is a box on a target. "
    "Push every box onto a target; you can push, not pull. Answer with one word: up, down, left or right."
)

_LAYOUT_CHARS = {0: "#", 1: "_", 2: "O"}
_LAYOUT_CODES = {v: k for k, v in _LAYOUT_CHARS.items()}

Cell = tuple[int, int]


def canonical_state(layout: Sequence[str], boxes: Sequence[Sequence[int]], player: Sequence[int]) -> str:
    """The canonical text of a Sokoban state, whose :func:`~orchestrator.anchors.state_hash.text_hash`
    is the step's ``env_state_hash``.

    Args:
        layout: the fixed room, one string per row of ``#`` (wall), ``_`` (floor), ``O`` (target).
        boxes: box cells ``(row, col)``, any order (sorted here: boxes are interchangeable).
        player: the player's cell ``(row, col)``.
    Returns:
        the layout rows joined by newlines, ``|boxes=`` the sorted cells and ``|@row,col``;
        independent of turn number, history and prompt wording.
    """
    cells = ";".join(f"{r},{c}" for r, c in sorted((int(r), int(c)) for r, c in boxes))
    return "\n".join(layout) + f"|boxes={cells}|@{int(player[0])},{int(player[1])}"


def render_grid(layout: Sequence[str], boxes: Sequence[Sequence[int]], player: Sequence[int]) -> str:
    """The room as space-separated cells (see the module docstring for the symbols)."""
    box_set = {(int(r), int(c)) for r, c in boxes}
    pr, pc = int(player[0]), int(player[1])
    lines = []
    for r, row in enumerate(layout):
        cells = []
        for c, ch in enumerate(row):
            if (r, c) == (pr, pc):
                cells.append("P")
            elif (r, c) in box_set:
                cells.append("*" if ch == "O" else "X")
            else:
                cells.append(ch)
        lines.append(" ".join(cells))
    return "\n".join(lines)


def make_prompt(layout: Sequence[str], boxes: Sequence[Sequence[int]], player: Sequence[int]) -> list[dict[str, str]]:
    """The chat messages for one turn: short system rules and the current grid."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": render_grid(layout, boxes, player) + "\nYour move?"},
    ]


def _task(layout: list[str], boxes: list[Cell], player: Cell, *, task_id: str | None = None, **meta: Any) -> Task:
    boxes = sorted(boxes)
    if task_id is None:
        h, w = len(layout), len(layout[0])
        task_id = f"{KIND}{h}x{w}b{len(boxes)}-{text_hash(canonical_state(layout, boxes, player))[:10]}"
    return Task(
        task_id=task_id,
        prompt=make_prompt(layout, boxes, player),
        answer="",
        kind=KIND,
        meta={"layout": layout, "boxes": [list(b) for b in boxes], "player": list(player), **meta},
    )


def task_from_grid(rows: Sequence[str], task_id: str | None = None) -> Task:
    """A task from a drawn room, cells without spaces: ``#`` ``_`` ``O`` ``X`` ``*`` ``P``.

    ``P`` stands on floor. Meant for hand-built rooms (tests, examples).

    Raises:
        EnvError: ragged rows, an unknown symbol, not exactly one ``P``, no box, or fewer
            targets than boxes.
    """
    if not rows or len({len(r) for r in rows}) != 1:
        raise EnvError(f"task_from_grid: rows must be non-empty and of equal length, got {list(rows)!r}")
    layout, boxes, players = [], [], []
    for r, row in enumerate(rows):
        line = []
        for c, ch in enumerate(row):
            if ch in "X*":
                boxes.append((r, c))
            elif ch == "P":
                players.append((r, c))
            elif ch not in _LAYOUT_CODES:
                raise EnvError(f"task_from_grid: unknown symbol {ch!r} at row {r}, col {c}")
            line.append({"X": "_", "*": "O", "P": "_"}.get(ch, ch))
        layout.append("".join(line))
    targets = sum(row.count("O") for row in layout)
    if len(players) != 1 or not boxes or targets < len(boxes):
        raise EnvError(f"task_from_grid: need one P, >= 1 box and as many targets; got {len(players)} P, "
                       f"{len(boxes)} boxes, {targets} targets")
    return _task(layout, boxes, players[0], task_id=task_id)


def make_tasks(num_tasks: int, *, size: int = 6, num_boxes: int = 1, seed: int = 0) -> list[Task]:
    """``num_tasks`` distinct Sokoban rooms from textarena's generator as :class:`Task` objects.

    Room k comes from ``textarena.envs.Sokoban.utils.generate_room(dim=(size, size),
    num_steps=int(1.7 * (size + size)), num_boxes=num_boxes, seed=seed + k, tries=100)`` for
    k = 0, 1, ... (``SokobanEnv.reset``'s call, with 100 instead of 1000 generator tries per
    seed, so a size that cannot hold the boxes fails in seconds, not minutes; a seed that
    succeeds gives the same room either way). A seed whose generator gives up, or whose room
    (layout, boxes, player) equals an earlier one, is skipped: seeds 25 and 36 give the same
    6x6 one-box room.

    Args:
        num_tasks: >= 1.
        size: room side including the outer wall, >= 5 (textarena's default is 6).
        num_boxes: boxes (and targets), >= 1.
        seed: first room seed.
    Returns:
        Tasks with ``kind="sokoban"``, ``task_id="sokoban{size}x{size}b{num_boxes}-<sha1[:10]>"``
        (of the initial state), ``prompt`` = the first turn's messages, ``answer=""`` and
        ``meta`` = ``{"layout": list of row strings, "boxes": [[row, col], ...] (sorted),
        "player": [row, col], "size", "num_boxes", "room_seed"}``.
    Raises:
        ValueError: bad arguments, or fewer distinct rooms than asked within
            ``20 * num_tasks + 200`` seeds.
    """
    from textarena.envs.Sokoban.utils import generate_room

    if num_tasks < 1:
        raise ValueError(f"num_tasks must be >= 1, got {num_tasks}")
    if size < 5:
        raise ValueError(f"size must be >= 5 (a 4x4 room has only corner cells for a box), got {size}")
    if num_boxes < 1:
        raise ValueError(f"num_boxes must be >= 1, got {num_boxes}")
    def draw(room_seed: int) -> tuple[str, Any] | None:
        try:
            fixed, state, _ = generate_room(dim=(size, size), num_steps=int(1.7 * (size + size)), num_boxes=num_boxes,
                                            seed=room_seed, tries=100)
        except (RuntimeError, RuntimeWarning):
            return None
        layout = ["".join(_LAYOUT_CHARS[int(v)] for v in row) for row in fixed]
        boxes = sorted((int(r), int(c)) for r, c in np.argwhere((state == 3) | (state == 4)))
        pr, pc = (int(x) for x in np.argwhere(state == 5)[0])
        key = text_hash(canonical_state(layout, boxes, (pr, pc)))
        return key, lambda: _task(layout, boxes, (pr, pc), size=size, num_boxes=num_boxes, room_seed=room_seed)

    tasks = distinct_tasks(num_tasks, seed, 20 * num_tasks + 200, draw)
    if len(tasks) == num_tasks:
        return tasks
    raise ValueError(f"only {len(tasks)} distinct {size}x{size} rooms with {num_boxes} box(es) found, asked for {num_tasks}")


def _new_env(layout: Sequence[str], boxes: Sequence[Sequence[int]], player: Sequence[int]) -> Any:
    """A textarena ``SokobanEnv`` holding this state (its grids), ready for ``_push``."""
    from textarena.envs.Sokoban.env import SokobanEnv

    fixed = np.array([[_LAYOUT_CODES[ch] for ch in row] for row in layout], dtype=int)
    state = fixed.copy()
    for r, c in boxes:
        state[r, c] = 3 if fixed[r, c] == 2 else 4
    state[player[0], player[1]] = 5
    env = SokobanEnv(dim_room=fixed.shape, num_boxes=len(boxes))
    env.room_fixed, env.room_state, env.player_position = fixed, state, np.array(player)
    return env


def _env_state(env: Any) -> tuple[list[Cell], Cell]:
    boxes = sorted((int(r), int(c)) for r, c in np.argwhere((env.room_state == 3) | (env.room_state == 4)))
    return boxes, (int(env.player_position[0]), int(env.player_position[1]))


class _State(NamedTuple):
    """One trajectory: textarena's env (mutable) and the room, boxes and player (fixed per state)."""

    env: Any
    layout: list[str]
    boxes: list[Cell]
    player: Cell


class _Sokoban:
    """Sokoban behind :class:`orchestrator.envs.lockstep.LockstepEnv` (textarena's ``SokobanEnv._push``)."""

    action_order = "up, down, left, right"
    num_actions = 4
    choices_distinct_ignoring_case = True
    info_keys = (
        "env_state_hash", "invalid_action", "blocked", "box_pushed", "action", "state_text", "boxes_on_targets",
        "last", "terminated", "truncated", "model_version",
    )

    def reset(self, task: Task, run: int) -> _State:
        missing = [k for k in ("layout", "boxes", "player") if not task.meta.get(k)]
        if missing:
            raise EnvError(f"task {task.task_id!r}: meta{missing!r} (the Sokoban room) is missing")
        layout = [str(row) for row in task.meta["layout"]]
        env = _new_env(layout, task.meta["boxes"], task.meta["player"])
        return _State(env, layout, *_env_state(env))

    def prompt(self, s: _State) -> list[dict[str, str]]:
        return make_prompt(s.layout, s.boxes, s.player)

    def state_hash(self, s: _State) -> str:
        return text_hash(canonical_state(s.layout, s.boxes, s.player))

    def render(self, s: _State) -> str:
        return render_grid(s.layout, s.boxes, s.player)

    def step(self, s: _State, action: int | None, last_turn: bool) -> tuple[_State, float, bool, dict[str, Any]]:
        moved = pushed = False
        if action is not None:
            moved, pushed = s.env._push(ACTIONS[action])  # textarena's transition function
        on_target, solved = s.env._check_if_all_boxes_on_target()
        terminated = bool(solved)
        reward = 1.0 if terminated else (on_target / len(s.boxes) if last_turn else 0.0)
        extra = {"blocked": action is not None and not moved, "box_pushed": bool(pushed), "boxes_on_targets": int(on_target)}
        return _State(s.env, s.layout, *_env_state(s.env)), float(reward), terminated, extra


def run_episodes(tasks: Sequence[Task], n: int, act: Act, *, max_steps: int = 15, round_tag: str = "", model_version: int = 0,
                 choices: Sequence[str] = ACTIONS) -> list[Experience]:
    """Roll out ``n`` trajectories of every task in lockstep; one Experience per step.

    The contract of :func:`orchestrator.envs.frozenlake.run_episodes`. Each turn, every live
    trajectory gets :func:`make_prompt` of its current state and the policy is called once for
    all of them. The answer (stripped, lower-cased) must be one of ``choices`` (in
    :data:`ACTIONS` order: up, down, left, right); anything else is an invalid action: the
    agent stays, reward 0, ``info["invalid_action"] = True``. A valid move that is blocked
    (wall, or a box against a wall or box) changes nothing (``info["blocked"] = True``). A
    trajectory ends when every box is on a target (reward 1) or after ``max_steps`` turns
    (the last step's reward: the fraction of boxes on targets). All n runs of a task start
    from the same room: Sokoban has no randomness after generation.

    Args:
        tasks: Sokoban tasks from :func:`make_tasks` or :func:`task_from_grid`
            (``meta["layout"]``, ``meta["boxes"]``, ``meta["player"]`` required).
        n, act, max_steps, round_tag, model_version: as in
            :func:`orchestrator.envs.frozenlake.run_episodes` (trajectories per task, >= 1; the
            policy ``act(prompts, choices)``, one dict with ``text``, ``token_ids``,
            ``prompt_token_ids``, ``logprobs`` per prompt; the turn limit, >= 1; stored in
            ``eid.round_tag``; stored in ``info["model_version"]``).
        choices: the action words, one per textarena action (4).
    Returns:
        Experiences ordered by (task order, run, step) with ``eid.task/run/step/round_tag``,
        ``tokens = prompt_token_ids + token_ids``, ``prompt_length``, ``logprobs``,
        ``reward`` (step reward), ``response_text``; ``info``: ``env_state_hash`` (of the
        state *before* the action), ``invalid_action``, ``blocked``, ``box_pushed``,
        ``action`` (word or None), ``state_text`` (the grid), ``boxes_on_targets``
        (after the action), ``last``, ``terminated``, ``truncated``, ``model_version``;
        ``metrics``: ``success`` (1.0 when the trajectory solved the room, on every step of
        it), ``invalid_action`` (0/1).
    Raises:
        EnvError: a task without its room in ``meta``, duplicate task ids, or a policy answer
            list of the wrong length or without ``text``.
        ValueError: ``n < 1``, ``max_steps < 1`` or not 4 distinct choices.
    """
    return run_lockstep(tasks, n, act, env=_Sokoban(), max_steps=max_steps, round_tag=round_tag,
                        model_version=model_version, choices=choices)
