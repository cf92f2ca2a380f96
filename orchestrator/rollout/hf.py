"""A transformers ``generate`` rollout source, for fast tests and as a reference for the vLLM engine."""

from __future__ import annotations

import os
from typing import Any

from orchestrator.core.types import Group, Task
from orchestrator.rollout.source import SamplingConfig, _groups_from_samples
from orchestrator.tasks.taskset import TaskSet


class HFRolloutSource:
    """A :class:`RolloutSource` on transformers ``generate``, in-process (for fast tests).

    Args:
        model: local model directory (e.g. :func:`orchestrator.rollout.model.build_tiny_model`).
        task_set: scores the responses.
        sampling: sampling parameters (``temperature == 0`` is greedy).
    """

    metric_names: tuple[str, ...] = ("accuracy",)
    """Metrics each rollout carries (``filter.judge`` is checked against them)."""

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

    def generate(self, tasks: list[Task], n: int, *, model_version: int = 0, round_tag: str = "") -> list[Group]:
        """Same contract as :meth:`VLLMRolloutSource.generate` (one ``generate`` call per task).

        Raises:
            ValueError: ``n < 1``.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        samples = [
            self._sample_task(t, n, self.sampling.group_seed(t.task_id, model_version, round_tag)) for t in tasks
        ]
        return _groups_from_samples(tasks, samples, n, self.task_set, self.sampling, model_version, round_tag)
