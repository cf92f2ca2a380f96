"""``dso_frozenlake_steps``: Trinity-RFT's FrozenLake workflow, one experience per environment step.

Trinity 0.6.0's ``frozen_lake_workflow``
(``trinity/common/workflows/envs/frozen_lake/workflow.py``, ``FrozenLakeWorkflow``) returns one
concatenated experience per trajectory and no state hash, so GiGPO (arXiv 2505.10978) sees every
trajectory as a single step and its step-level advantage A_S is 0. This workflow plays the same
game and emits one Trinity ``Experience`` per turn, written the way Trinity's own step-wise
ALFWorld workflow (``StepWiseAlfworldWorkflow`` in ``envs/alfworld/alfworld_workflow.py``) writes
its GiGPO metadata. What is the same as Trinity's FrozenLake workflow, so that a taskset row means
the same game under either workflow:

* the map: a row ``{"seed", "size", "p"}`` (``raw_task``) is drawn by Trinity's own
  ``frozen_lake.utils.generate_random_map(size, p, seed, max_steps=env_max_steps)``, or
  ``workflow_args.desc`` is used as given; dynamics are gymnasium's ``FrozenLakeEnv`` on that map
  (``is_slippery`` from ``workflow_args``), reset with the row's seed;
* the dialogue: Trinity's ``SYSTEM_PROMPT``, its user message per turn ("Current Observation (k)
  ..." with the grid rendered as Trinity renders it, the "invalid" hint and the steps left), the
  reply parsed as Trinity parses it (the last `````...````` block: Left / Down / Right / Up or 1-4);
  an unparseable reply is an invalid action (the agent stays, reward 0);
* the token budget: turn t may generate at most ``max_tokens`` minus the tokens the dialogue has
  grown since the first prompt; when nothing is left the episode stops (truncated).

Per step t of run r (the experience of the model's reply at turn t):

* ``eid.run = run_id_base + r``, ``eid.step = t`` (0, 1, ... consecutive);
* ``tokens``: the exact token ids the engine was prompted with (the whole dialogue so far) plus the
  ids it generated; ``prompt_length``: the length of the first turn's prompt (system message and
  first observation), so the response part spans the later turns of the dialogue;
* ``action_mask`` (given explicitly: Trinity's ``multi_turn`` experience type) over that response
  part: 1 exactly on the tokens generated at turn t, 0 on earlier turns (earlier replies are
  trained through their own step's experience, with their own advantage); ``logprobs`` likewise
  (the engine's sampling log-probs on the generated tokens, 0 elsewhere, as Trinity's
  ``MultiTurnWorkflow`` zeroes them off the mask);
* ``info["env_state_hash"]``: :func:`orchestrator.anchors.state_hash.text_hash` of
  :func:`orchestrator.envs.frozenlake.canonical_state`, the map and the cell the agent acted
  *from* (never the prompt text: it carries a turn counter), so all runs of a task share their
  first anchor state and revisits of a cell land in the same anchor group;
* ``info["step_reward"]``: gymnasium's reward of that step (1 on reaching G, else 0);
  ``info["is_action_valid"]`` (False for an unparseable reply, verl-agent's key, read by
  ``dso_gigpo``'s ``action_valid_key``); ``info["action"]`` (the word or None);
  ``info["env_state_text"]`` (the rendered grid);
* on the last step of a run: ``info["episode_return"]`` (the sum of the step rewards) and
  ``info["terminated"]`` / ``info["truncated"]``; ``reward`` is the episode return on every step
  (Trinity's ``RewardPropagationWorkflow`` convention, for GRPO-style consumers), ``metrics`` hold
  ``success``, ``episode_return`` and ``env_steps``.

``dso_gigpo`` (:class:`orchestrator.trinity.advantage.gigpo.DsoGiGPOAdvantageFn`, keys ``step_reward``
and ``env_state_hash``) reads exactly these fields: groups by ``eid.tid``, trajectories by
``eid.rid``, step order by ``eid.step``; the orchestrator's operator sums ``step_reward`` per run.

The workflow is repeatable (``can_repeat``): one instance plays the task's ``repeat_times`` runs
concurrently (each with its own environment) and numbers them itself, so every error names the
task, the run and the step: :class:`FrozenLakeStepsError`.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import asdict
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from trinity.common.experience import EID, Experience
from trinity.common.workflows.workflow import MultiTurnWorkflow, Task

from orchestrator.anchors.state_hash import text_hash
from orchestrator.envs.frozenlake import canonical_state
from orchestrator.trinity.registry import WORKFLOW_NAME

ACTION_WORDS: dict[str, int] = {"left": 0, "down": 1, "right": 2, "up": 3}
"""Reply word -> gymnasium action (Trinity's ``DIRECTION_MAP`` 1-4 minus one)."""

INVALID_HINT = (
    "\nYour last response is invalid. Your position didn't change at all. You may need to recheck your thinking "
    "process, action outputted, and the format of response. Remember, you should only output the NEXT ACTION at "
    "each interation in the ``` ```. For example, if you want to move up, you should output ```Up```."
)
"""Trinity's hint after a turn that left the observation unchanged (verbatim, typo included)."""

DEFAULT_MAX_TOKENS = 10240
"""Trinity's FrozenLake response budget when neither the rollout args nor the model config set one."""


class FrozenLakeStepsError(ValueError):
    """A malformed task or an engine answer this workflow cannot use; names task, run and step."""


# ---------------------------------------------------------------------------------- config
class FrozenLakeRow(BaseModel):
    """One taskset row (``raw_task``), as :func:`orchestrator.envs.frozenlake.trinity_taskset_rows`
    writes it. Trinity's workflow defaults a missing ``size`` to 1, for which its map generator
    never returns (start and goal must differ); here ``seed`` and ``size`` are required."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    seed: int
    size: int = Field(ge=2)
    p: float = Field(0.8, gt=0.0, le=1.0)


class FrozenLakeStepsArgs(BaseModel):
    """``workflow_args`` of ``dso_frozenlake_steps`` (the keys of Trinity's FrozenLake workflow).

    Attributes:
        env_max_steps: the drawn map's goal must be reachable within this many moves (Trinity's
            ``generate_random_map(max_steps=...)``).
        agent_max_steps: turns per episode.
        is_slippery: gymnasium's slippery dynamics.
        desc: a fixed map (rows of ``S F H G``, one ``S`` and one ``G``) instead of the row's.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    env_max_steps: int = Field(8, ge=1)
    agent_max_steps: int = Field(10, ge=1)
    is_slippery: bool = False
    desc: list[str] | None = None

    @field_validator("desc")
    @classmethod
    def _check_desc(cls, desc: list[str] | None) -> list[str] | None:
        if desc is None:
            return None
        if not desc or any(not isinstance(r, str) or len(r) != len(desc[0]) or not r for r in desc):
            raise ValueError(f"desc: rows must be non-empty strings of equal length, got {desc!r}")
        cells = "".join(desc)
        if set(cells) - set("SFHG"):
            raise ValueError(f"desc: cells must be S, F, H or G, got {sorted(set(cells) - set('SFHG'))}")
        if cells.count("S") != 1 or cells.count("G") != 1:
            raise ValueError(f"desc: needs exactly one S and one G, got {cells.count('S')} S and {cells.count('G')} G")
        return list(desc)


# ---------------------------------------------------------------------------------- the game
def parse_action(response: str) -> int | None:
    """gymnasium action (0 left, 1 down, 2 right, 3 up) of a reply, or None (invalid).

    As Trinity's ``FrozenLakeWorkflow._parse_model_response``: the content of the last
    `````...````` block, lower-cased; a direction word, or a digit 1-4 in Trinity's numbering
    (1 left, 2 down, 3 right, 4 up).
    """
    matches = re.findall(r"```(.*?)```", response, re.DOTALL)
    if not matches:
        return None
    text = matches[-1].strip().lower()
    if text in ACTION_WORDS:
        return ACTION_WORDS[text]
    if text.isdigit() and 1 <= int(text) <= 4:
        return int(text) - 1
    return None


def render(desc: list[str], row: int, col: int) -> str:
    """The grid as Trinity's ``FrozenLakeWorkflow.render("tiny_rgb_array")`` draws it: ``P`` the
    agent, ``_`` ice (and the start), ``O`` a hole, ``G`` the goal, ``X`` the agent in a hole,
    ``√`` the agent on the goal; each cell ``" c \\t"``."""
    from trinity.common.workflows.envs.frozen_lake.utils import GRID_LOOKUP

    code = {"S": 1, "F": 1, "H": 2, "G": 3}
    lines = []
    for r, line in enumerate(desc):
        cells = []
        for c, ch in enumerate(line):
            k = code[ch]
            if (r, c) == (row, col):
                k = 4 if ch == "H" else 5 if ch == "G" else 0
            cells.append(GRID_LOOKUP[k])
        lines.append("".join(cells))
    return "\n".join(lines)


class FrozenLakeEpisode:
    """One run's environment: gymnasium's ``FrozenLakeEnv`` on ``desc``, reset with ``seed``.

    Attributes:
        desc: the map rows; row, col: the agent's cell; done: on G or in H.
    """

    def __init__(self, desc: list[str], *, is_slippery: bool, seed: int) -> None:
        from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv

        self.desc = list(desc)
        self.env = FrozenLakeEnv(desc=self.desc, is_slippery=is_slippery)
        obs, _ = self.env.reset(seed=seed)
        self.row, self.col = divmod(int(obs), len(self.desc[0]))
        self.done = False

    def state_hash(self) -> str:
        """The anchor state: the hash of the map and cell's
        :func:`~orchestrator.envs.frozenlake.canonical_state` (as the embedded FrozenLake's)."""
        return text_hash(canonical_state(self.desc, self.row, self.col))

    def render(self) -> str:
        return render(self.desc, self.row, self.col)

    def step(self, action: int | None) -> float:
        """Apply ``action`` (None: stay, reward 0); returns the reward and sets ``done``."""
        if action is None:
            return 0.0
        obs, reward, terminated, _, _ = self.env.step(action)
        self.row, self.col = divmod(int(obs), len(self.desc[0]))
        self.done = bool(terminated)
        return float(reward)

    @property
    def success(self) -> bool:
        return self.desc[self.row][self.col] == "G"


def draw_map(row: FrozenLakeRow, env_max_steps: int) -> list[str]:
    """The map Trinity's FrozenLake workflow plays for ``row`` (its own generator, same arguments)."""
    from trinity.common.workflows.envs.frozen_lake.utils import generate_random_map

    desc, _goal = generate_random_map(size=row.size, p=row.p, seed=row.seed, max_steps=env_max_steps)
    return [str(r) for r in desc]


def step_experience(
    engine_exp: Experience, first_prompt: torch.Tensor, *, run: int, step: int, info: dict[str, Any]
) -> Experience:
    """The step's ``multi_turn`` experience from the engine's single-turn one.

    ``prompt_length`` is the length of the token prefix this step's prompt shares with the first
    turn's prompt (the whole first prompt for chat templates whose rendering of a longer dialogue
    extends the shorter one, as ChatML's does); ``action_mask`` and ``logprobs`` cover the tokens
    after it, non-zero only on the tokens generated at this step.
    """
    tokens = torch.as_tensor(engine_exp.tokens)
    gen_start = int(engine_exp.prompt_length)
    n = min(gen_start, int(first_prompt.numel()))
    same = (tokens[:n] == first_prompt[:n]).to(torch.int64)
    p0 = int(same.cumprod(0).sum()) if n else 0
    p0 = max(p0, 1)
    length = int(tokens.numel()) - p0
    mask = torch.zeros(length, dtype=torch.bool)
    mask[gen_start - p0:] = True
    logprobs = torch.zeros(length, dtype=torch.float32)
    logprobs[gen_start - p0:] = torch.as_tensor(engine_exp.logprobs, dtype=torch.float32)
    return Experience(
        eid=EID(run=run, step=step),
        tokens=tokens,
        logprobs=logprobs,
        prompt_length=p0,
        action_mask=mask,
        prompt_text=engine_exp.prompt_text,
        response_text=engine_exp.response_text,
        truncate_status=engine_exp.truncate_status,
        info=info,
    )


# ---------------------------------------------------------------------------------- the workflow
class DsoFrozenLakeStepsWorkflow(MultiTurnWorkflow):
    """Trinity's FrozenLake game, one ``Experience`` per step (see the module docstring).

    Registered as ``dso_frozenlake_steps`` (``buffer.explorer_input.default_workflow_type``), also
    reachable as ``orchestrator.trinity.workflow.DsoFrozenLakeStepsWorkflow``.

    Raises (from ``run_async``):
        FrozenLakeStepsError: a malformed row or ``workflow_args``, the engine returning no reply,
            or an episode without any step; the message names task, run and step.
    """

    can_reset: bool = False
    can_repeat: bool = True
    is_async: bool = True

    def __init__(self, *, task: Task, model: Any, auxiliary_models: list | None = None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.repeat_times = 1
        self.run_id_base = 0

    # -- naming
    def _where(self, run: int | str = "-", step: int | str = "-") -> str:
        t = self.task
        row = (t.index or {}).get("index", "?") if isinstance(t.index, dict) else "?"
        return f"{WORKFLOW_NAME}: task {t.batch_id}/{t.task_id} (taskset row {row}), run {run}, step {step}"

    def _config(self) -> tuple[list[str], FrozenLakeStepsArgs, int]:
        """Map, arguments and reset seed; raises FrozenLakeStepsError naming the task and first run."""
        where = self._where(self.run_id_base, 0)
        try:
            args = FrozenLakeStepsArgs(**(self.task.workflow_args or {}))
        except ValidationError as exc:
            raise FrozenLakeStepsError(f"{where}: bad workflow_args: {_errors(exc)}") from None
        raw = self.task.raw_task
        if raw is not None and not isinstance(raw, dict):
            raise FrozenLakeStepsError(f"{where}: raw_task must be a mapping with seed, size, p; got {raw!r}")
        if args.desc is not None:  # a fixed map: the row only gives the reset seed (Trinity's default 42)
            seed = (raw or {}).get("seed", 42)
            if not _is_int(seed):
                raise FrozenLakeStepsError(f"{where}: bad taskset row {raw!r}: seed: must be an integer")
            return args.desc, args, int(seed)
        try:
            row = FrozenLakeRow(**(raw or {}))
        except ValidationError as exc:
            raise FrozenLakeStepsError(f"{where}: bad taskset row {raw!r}: {_errors(exc)}") from None
        return draw_map(row, args.env_max_steps), args, row.seed

    def _budget(self) -> int:
        ra = self.task.rollout_args
        if getattr(ra, "max_tokens", None):
            return int(ra.max_tokens)
        cfg = getattr(self.model, "config", None)
        return int(getattr(cfg, "max_response_tokens", None) or DEFAULT_MAX_TOKENS)

    async def run_async(self) -> list[Experience]:
        """Play ``repeat_times`` runs concurrently; their experiences, run by run, step by step."""
        desc, args, seed = self._config()
        runs = [self.run_id_base + k for k in range(max(1, int(self.repeat_times)))]
        results = await asyncio.gather(*(self._episode(desc, args, seed, run) for run in runs))
        return [e for exps in results for e in exps]

    async def _episode(self, desc: list[str], args: FrozenLakeStepsArgs, seed: int, run: int) -> list[Experience]:
        from trinity.common.workflows.envs.frozen_lake.utils import SYSTEM_PROMPT

        env = FrozenLakeEpisode(desc, is_slippery=args.is_slippery, seed=seed)
        messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT}]
        budget = self._budget()
        sampling = {k: v for k, v in asdict(self.task.rollout_args).items() if v is not None}
        exps: list[Experience] = []
        rewards: list[float] = []
        first_prompt: torch.Tensor | None = None
        first_len = 0
        last_obs: str | None = None
        truncated = False
        for t in range(args.agent_max_steps):
            where = self._where(run, t)
            obs = env.render()
            content = (
                f"Current Observation ({t}): \n{obs}\n"
                "You have not achieved the goal, P has not reached G yet. Please give the next action."
            )
            if t > 0 and last_obs == obs:
                content += INVALID_HINT
            content += f"\nThe maximum number of steps remaining is {args.agent_max_steps - t}."
            messages.append({"role": "user", "content": content})
            if t == 0:
                max_tokens = budget
            else:
                max_tokens = budget - (await self.model.get_message_token_len(messages) - first_len)
            if max_tokens <= 0:
                messages.pop()
                truncated = True
                break
            anchor = env.state_hash()
            try:
                replies = await self.model.chat_async(messages, **{**sampling, "n": 1, "max_tokens": max_tokens})
            except Exception as exc:
                raise FrozenLakeStepsError(f"{where}: the model call failed: {exc!r}") from exc
            if not replies or replies[0].tokens is None or replies[0].logprobs is None:
                raise FrozenLakeStepsError(f"{where}: the engine returned no reply with tokens and logprobs ({replies!r})")
            reply = replies[0]
            text = reply.response_text or ""
            if t == 0:
                first_prompt = torch.as_tensor(reply.tokens)[: int(reply.prompt_length)].clone()
                first_len = await self.model.get_message_token_len(messages)
            messages.append({"role": "assistant", "content": text})
            action = parse_action(text)
            reward = env.step(action)
            rewards.append(reward)
            last_obs = obs
            info = {
                "env_state_hash": anchor,
                "env_state_text": obs,
                "step_reward": reward,
                "is_action_valid": action is not None,
                "action": None if action is None else list(ACTION_WORDS)[action],
            }
            exps.append(step_experience(reply, first_prompt, run=run, step=t, info=info))
            if env.done:
                break
        if not exps:
            raise FrozenLakeStepsError(
                f"{self._where(run, 0)}: no step was played (the response budget of {budget} tokens is used up "
                "before the first turn)"
            )
        total = float(sum(rewards))
        last = exps[-1]
        last.info.update(episode_return=total, terminated=env.done, truncated=truncated or not env.done)
        metrics = {"success": float(env.success), "episode_return": total, "env_steps": float(len(exps))}
        for e in exps:
            e.reward = total
            e.metrics = dict(metrics)
        return exps


def _errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(x) for x in e['loc']) or '(row)'}: {e['msg']}" for e in exc.errors())


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
