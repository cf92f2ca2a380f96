"""``orchestrator.trinity.rule_workflow.DsoRuleWorkflow``: Trinity's simple workflow scored by the project's rule reward."""

from __future__ import annotations

import numpy as np
from trinity.common.workflows.workflow import SimpleWorkflow

from algos.dapo import overlong_penalty
from orchestrator.core.types import Task
from orchestrator.tasks.scoring import score_response


class DsoRuleWorkflow(SimpleWorkflow):
    """One chat of ``n`` responses per task (Trinity's ``simple_workflow``), each scored with
    DAPO's rule reward (arXiv 2503.14476, Eq. 7: +1 correct, -1 otherwise,
    :func:`orchestrator.tasks.scoring.score_response`) plus, when ``overlong_max`` is set, the
    soft overlong penalty (Eq. 13, :func:`algos.dapo.overlong_penalty`) on the response length
    in tokens (EOS included).

    The same reward as :class:`orchestrator.rollout.engine.VLLMRolloutSource` gives in
    ``make demo``. Trinity's ``simple_workflow`` cannot give it: its reward is the sum of the
    reward function's dict, and a reward function sees the text only (no token count).

    ``workflow_args`` (the taskset's): ``answer_format`` (default ``number``), ``overlong_max``
    (L_max, tokens; None: no penalty), ``overlong_cache`` (L_cache, tokens). The answer is the
    row's ``response_key`` column (``task.truth``).

    Each experience gets ``reward``, ``metrics = {"accuracy": 0/1, "response_length": tokens[,
    "overlong_penalty"]}``.
    """

    def reset(self, task) -> None:
        """Trinity's ``reset`` without its reward function (this workflow scores by itself)."""
        self.format_args = task.format_args
        self.system_prompt = task.format_args.system_prompt
        self.reply_prefix = task.format_args.reply_prefix
        self.reward_fn_args = task.reward_fn_args
        self.raw_task = task.raw_task
        self.task_desc = task.task_desc
        self.truth = task.truth

    def run(self) -> list:
        args = dict(self.task.workflow_args or {})
        messages = self.format_messages()
        responses = self.model.chat(messages, **self.rollout_args)
        task = Task(task_id=str(self.task_desc), prompt=messages, answer=str(self.truth),
                    meta={"format": args.get("answer_format", "number")})
        lengths = np.array([len(r.tokens) - r.prompt_length for r in responses])
        penalty = np.zeros(len(responses))
        if args.get("overlong_max"):
            penalty = overlong_penalty(lengths, max_response_length=int(args["overlong_max"]),
                                       cache_length=int(args.get("overlong_cache") or 1))
        for i, r in enumerate(responses):
            rule, metrics = score_response(task, r.response_text)
            metrics = {**metrics, "response_length": float(lengths[i])}
            if args.get("overlong_max"):
                metrics["overlong_penalty"] = float(penalty[i])
            r.metrics = {**(r.metrics or {}), **metrics}
            r.reward = float(rule + penalty[i])
            r.eid.run = i + self.run_id_base
        return responses
