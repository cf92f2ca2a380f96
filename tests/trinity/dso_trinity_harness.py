"""Test harness for running Trinity-RFT 0.6.0's own Explorer loop on CPU.

Imported by Trinity's Ray workers (workflow runners, the rollout coordinator), so
``tests/trinity/conftest.py`` puts this directory on ``PYTHONPATH`` before Ray starts.

The model actor that works around Trinity 0.6.0's broken ``engine_type: external`` lives in
the product (:mod:`orchestrator.trinity.cpu_v060`, the module for that Trinity version on CPU);
its names are re-exported here (``EngineModel``, ``EngineModelActor``, ``start_engine_model``)
for the tests that import them from the harness. What stays here is test-only: a reward by
label and a multi-turn workflow.
"""

from __future__ import annotations

import hashlib
from typing import Any

from trinity.common.rewards.reward_fn import RewardFn
from trinity.common.workflows.workflow import Workflow

from orchestrator.trinity.cpu_v060 import EngineModel, EngineModelActor, start_engine_model

__all__ = ["EngineModel", "EngineModelActor", "LabelReward", "WalkWorkflow", "start_engine_model"]


class LabelReward(RewardFn):
    """Reward of the harness taskset, by the row's label (the ``response_key`` column).

    ``always``: 1 (an all-correct group), ``never``: 0 (all wrong), ``coin``: 1 when a hash of
    the response text is even (a random tiny model makes such groups mostly informative),
    ``split``: NaN for the group's first response (Trinity makes one instance per task and
    scores its responses in order), then 1, 0, 1, ... (informative on the others).
    """

    def __init__(self, **kwargs: Any) -> None:
        self.calls = 0

    def __call__(self, response: str, truth: str | None = None, **kwargs: Any) -> dict[str, float]:
        self.calls += 1
        if truth == "always":
            return {"accuracy": 1.0}
        if truth == "never":
            return {"accuracy": 0.0}
        if truth == "split":
            return {"accuracy": float("nan") if self.calls == 1 else float(self.calls % 2 == 0)}
        return {"accuracy": float(hashlib.sha256(response.encode()).digest()[0] % 2)}


class WalkWorkflow(Workflow):
    """A multi-turn workflow: a walk on a line, one Trinity experience per turn (for GiGPO).

    The agent starts at 0; each turn the model replies and the parity of a hash of its reply
    moves it +1 or -1. Reaching ``goal`` (the row's ``goal``, default 2) gives step reward 1 and
    ends the episode; otherwise the walk ends after ``turns`` turns (default 3). Each
    experience carries ``eid.step`` (the turn), ``info["step_reward"]`` and
    ``info["env_state_hash"]`` (the position before the move), so GiGPO's anchor states recur
    across a group's trajectories; ``reward`` is the trajectory's total.
    """

    can_repeat = False
    is_async = False

    def run(self) -> list:
        raw = self.task.raw_task or {}
        goal, turns = int(raw.get("goal", 2)), int(raw.get("turns", 3))
        pos, exps = 0, []
        for t in range(turns):
            messages = [{"role": "user", "content": f"You are at {pos}; the goal is {goal}. Left or right?"}]
            (exp,) = self.model.chat(messages, n=1, temperature=1.0, max_tokens=4)
            move = 1 if hashlib.sha256(exp.response_text.encode()).digest()[0] % 2 else -1
            reward = 1.0 if pos + move == goal else 0.0
            exp.eid.step = t
            exp.info = {**(exp.info or {}), "step_reward": reward, "env_state_hash": f"pos{pos}"}
            exps.append(exp)
            pos += move
            if reward:
                break
        total = sum(e.info["step_reward"] for e in exps)
        for e in exps:
            e.reward = total
        return exps
