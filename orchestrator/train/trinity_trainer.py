"""The CPU trainer's step on a batch read from Trinity's buffer, through Trinity's own registries.

Trinity's trainer (verl) needs CUDA; on CPU this does what it does with a batch of
``train_batch_size`` Trinity ``Experience`` objects (arXiv 2503.14476, Algorithm 1, one
rollout step):

1. advantages through Trinity's ``ADVANTAGE_FN`` registry (``algorithm.advantage_fn``, e.g.
   ``dso_grpo``), called with Trinity's protocol ``fn(exps) -> (exps, metrics)``. With
   ``dso_dapo`` Trinity computes them in the explorer's pipeline
   (``compute_advantage_in_trainer = False``) and a verl trainer would use the pipeline's; here
   they are computed again on the trainer side and compared with the pipeline's
   (``advantage_max_abs_diff``: the seam between pipeline and trainer, checked every batch);
2. ``mini_batches`` optimizer updates, each over micro-batches of ``micro_batch_size``
   sequences, the loss of each micro-batch from Trinity's ``POLICY_LOSS_FN`` registry
   (``algorithm.policy_loss_fn``, e.g. ``dso_clip_higher``) called as verl's actor calls it
   (``logprob``, ``old_logprob``, ``action_mask``, ``advantages``, each (b, T)).

Micro-batches: every micro-batch's loss is its exact share of the mini-batch's loss, and the
shares are summed (verl >= 0.8's engine, ``forward_backward_batch``): the loss function gets
each row's mini-batch counts (``dso_batch_counts``: rows, sequences with response tokens,
response tokens; :func:`algos.dapo.batch_loss_counts`, computed here per mini-batch as verl's
actor computes ``global_batch_info``) and divides by them, not by the micro-batch's own
(:func:`algos.dapo.batch_share_loss`). So the loss and gradient of a mini-batch are the same for
every micro-batch size and wherever padding rows fall, under every ``loss_agg_mode`` and both
``loss_agg_empty_seqs``. A loss function without that argument (Trinity's own) gets
Trinity's legacy weighting instead: its micro-batch mean times the micro-batch's share of the
mini-batch's tokens (``token-mean``, as ``fix_actor_microbatch_loss_scale``) or rows.

Zero-weight experiences: padding groups (``info["dso_padding"]``) and masked members
(``info["dso_masked"]``) reach the trainer with an all-zero ``action_mask`` (the operator sets
it); they add nothing to the token count or the loss. A micro-batch whose mask is all zero is
not run at all (its loss would be 0 / 0).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from algos.dapo import batch_loss_counts
from orchestrator.train.trainer import PolicyTrainer, TrainStepError, token_logprobs
from orchestrator.trinity.loss import COUNTS_FIELD


class TrinityStepConfig(BaseModel):
    """How a batch from Trinity's buffer is trained on (the names are Trinity's ``algorithm`` fields)."""

    model_config = ConfigDict(extra="forbid")

    train_batch_size: int = Field(ge=1, description="Experiences per batch read from the buffer (Trinity's buffer.train_batch_size).")
    advantage_fn: str = Field("dso_grpo", description="Name in Trinity's ADVANTAGE_FN registry.")
    advantage_fn_args: dict = Field(default_factory=dict)
    policy_loss_fn: str = Field("dso_clip_higher", description="Name in Trinity's POLICY_LOSS_FN registry.")
    policy_loss_fn_args: dict = Field(default_factory=dict)
    mini_batches: int = Field(2, ge=1, description="Optimizer updates per batch (the policy's mini-batches).")
    micro_batch_size: int = Field(16, ge=1, description="Sequences per forward/backward pass.")


def pack_trinity(exps: list) -> dict[str, torch.Tensor]:
    """Right-padded tensors of Trinity experiences (single-turn: tokens = prompt + response).

    Returns:
        ``input_ids`` (B, L) int64, ``attention_mask`` (B, L) int64, ``positions`` (B, T) int64
        (index into the next-token log-probs (B, L - 1) of each response token), ``action_mask``
        (B, T) bool, ``old_logprob`` (B, T) float32, ``advantages`` (B, T) float32; T the
        longest response, zero beyond each experience's own.
    Raises:
        ValueError: an experience's ``logprobs``, ``action_mask`` or ``advantages`` is not one per
            response token (names the experience's eid).
    """
    B = len(exps)
    L = max(len(e.tokens) for e in exps)
    T = max(len(e.tokens) - e.prompt_length for e in exps)
    ids = torch.zeros((B, L), dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T), dtype=torch.bool)
    old = torch.zeros((B, T), dtype=torch.float32)
    adv = torch.zeros((B, T), dtype=torch.float32)
    for i, e in enumerate(exps):
        n, p = len(e.tokens), e.prompt_length
        t = n - p
        for name in ("logprobs", "action_mask", "advantages"):
            v = getattr(e, name)
            if v is None or len(v) != t:
                raise ValueError(f"experience {e.eid}: {name} has {None if v is None else len(v)} entries for {t} response tokens")
        ids[i, :n] = torch.as_tensor(e.tokens, dtype=torch.long)
        attn[i, :n] = 1
        pos[i, :t] = torch.arange(p - 1, n - 1)
        mask[i, :t] = torch.as_tensor(e.action_mask).bool()
        old[i, :t] = torch.as_tensor(e.logprobs, dtype=torch.float32)
        adv[i, :t] = torch.as_tensor(e.advantages, dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": attn, "positions": pos, "action_mask": mask, "old_logprob": old,
            "advantages": adv}


class TrinityBatchTrainer:
    """Trains a :class:`~orchestrator.train.trainer.PolicyTrainer`'s model on batches of Trinity experiences.

    Args:
        policy: the model, optimizer and reference (its ``config`` gives ``max_grad_norm`` and ``seed``).
        config: :class:`TrinityStepConfig`.
    Raises:
        KeyError: a name not in Trinity's registries (import ``orchestrator.trinity.plugin`` first).
    """

    def __init__(self, policy: PolicyTrainer, config: TrinityStepConfig):
        from trinity.algorithm import ADVANTAGE_FN, POLICY_LOSS_FN

        self.policy = policy
        self.config = config
        adv_cls, loss_cls = ADVANTAGE_FN.get(config.advantage_fn), POLICY_LOSS_FN.get(config.policy_loss_fn)
        if adv_cls is None or loss_cls is None:
            raise KeyError(f"advantage_fn {config.advantage_fn!r} or policy_loss_fn {config.policy_loss_fn!r} is not registered in Trinity")
        self.advantage_fn = adv_cls(**{**adv_cls.default_args(), **config.advantage_fn_args})
        self.loss_fn = loss_cls(**{**loss_cls.default_args(), **config.policy_loss_fn_args})
        self.token_mean = getattr(self.loss_fn, "loss_agg_mode", "token-mean") == "token-mean"
        self.takes_counts = COUNTS_FIELD in getattr(self.loss_fn, "_select_keys", ())
        self._rng = np.random.default_rng(policy.config.seed)

    def train(self, exps: list) -> dict[str, Any]:
        """One rollout step on exactly ``train_batch_size`` experiences.

        Returns:
            ``advantage_max_abs_diff`` (trainer's vs pipeline's token advantages), ``zero_weight``
            (experiences with an all-zero action mask), ``padding_groups``, ``padding_tokens``
            (their loss-weighted tokens: 0), ``tokens``, ``sequences``, and the means over the
            updates of ``loss``, ``pg_clipfrac``, ``ppo_kl``, ``entropy``, ``grad_norm``.
        Raises:
            ValueError: the batch is not ``train_batch_size`` experiences.
            TrainStepError: a non-finite loss or gradient; the weights are those of before the call.
        """
        if len(exps) != self.config.train_batch_size:
            raise ValueError(f"batch: {len(exps)} experiences, train_batch_size is {self.config.train_batch_size}")
        before = {id(e): e.advantages.clone() for e in exps}
        exps, adv_metrics = self.advantage_fn(exps)  # Trinity's protocol; grouped order
        diff = max(float((e.advantages - before[id(e)]).abs().max()) if len(e.advantages) else 0.0 for e in exps)
        data = pack_trinity(exps)
        padding = {e.eid.tid for e in exps if (e.info or {}).get("dso_padding")}
        padding_tokens = int(sum(int(torch.as_tensor(e.action_mask).sum()) for e in exps if (e.info or {}).get("dso_padding")))
        order = self._rng.permutation(len(exps))
        minis = [torch.as_tensor(np.sort(c)) for c in np.array_split(order, self.config.mini_batches) if len(c)]
        snap = self.policy._snapshot()
        sums: dict[str, float] = {}
        try:
            for rows in minis:
                for k, v in self._update(data, rows).items():
                    sums[k] = sums.get(k, 0.0) + v
        except TrainStepError:
            self.policy._restore(snap)
            raise
        out = {k: v / len(minis) for k, v in sums.items()}
        out.update(
            advantage_max_abs_diff=diff,
            zero_weight=int(sum(1 for e in exps if not torch.as_tensor(e.action_mask).any())),
            padding_groups=len(padding), padding_tokens=padding_tokens,
            tokens=float(data["action_mask"].sum()), sequences=float(len(exps)),
            reward_mean=float(np.mean([e.reward for e in exps if not (e.info or {}).get("dso_padding")] or [math.nan])),
            **{f"adv/{k}": v for k, v in adv_metrics.items()},
        )
        return out

    def _update(self, data: dict[str, torch.Tensor], rows: torch.Tensor) -> dict[str, float]:
        model, cfg = self.policy.model, self.config
        mask_all = data["action_mask"][rows]
        mini_tokens, mini_seqs = float(mask_all.sum()), float(len(rows))
        counts = batch_loss_counts(mask_all).to(torch.float32)
        self.policy.optimizer.zero_grad(set_to_none=True)
        acc = {"loss": 0.0, "pg_clipfrac": 0.0, "ppo_kl": 0.0, "entropy": 0.0}
        for start in range(0, len(rows), cfg.micro_batch_size):
            idx = rows[start: start + cfg.micro_batch_size]
            mask = data["action_mask"][idx]
            tokens = float(mask.sum())
            if tokens == 0:  # only zero-weight experiences: nothing to learn, and 0 / 0 to avoid
                continue
            lp_all, ent_all = token_logprobs(model, data["input_ids"][idx], data["attention_mask"][idx])
            pos = data["positions"][idx]
            lp, ent = lp_all.gather(1, pos), ent_all.gather(1, pos)
            extra = {COUNTS_FIELD: counts.expand(len(idx), 3)} if self.takes_counts else {}
            loss, metrics = self.loss_fn(logprob=lp, old_logprob=data["old_logprob"][idx], action_mask=mask,
                                         advantages=data["advantages"][idx], **extra)
            if self.takes_counts:  # the micro-batch's share of the mini-batch loss: summed
                weight = 1.0
            else:  # Trinity's legacy actor: a micro-batch mean, weighted by its share
                weight = tokens / mini_tokens if self.token_mean else len(idx) / mini_seqs
            if not torch.isfinite(loss):
                raise TrainStepError(f"step {self.policy.step}: loss is {loss.item()} (micro-batch rows {idx.tolist()[:8]}...)")
            (loss * weight).backward()
            acc["loss"] += float(loss.detach()) * weight
            acc["pg_clipfrac"] += metrics["pg_clipfrac"] * tokens / mini_tokens  # token means: token-weighted
            acc["ppo_kl"] += metrics["ppo_kl"] * tokens / mini_tokens
            acc["entropy"] += float((ent.detach() * mask).sum()) / mini_tokens
        for name, p in model.named_parameters():
            if p.grad is not None and not torch.isfinite(p.grad).all():
                raise TrainStepError(f"step {self.policy.step}: non-finite gradient in {name}")
        acc["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), self.policy.config.max_grad_norm))
        self.policy.optimizer.step()
        self.policy.step += 1
        return acc
