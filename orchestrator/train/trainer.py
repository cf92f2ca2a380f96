"""A small policy-gradient trainer for CPU that consumes the orchestrator's batches.

One :meth:`PolicyTrainer.train_batch` call is one rollout step of DAPO (arXiv 2503.14476,
Algorithm 1): the group-relative advantages of the batch's groups (Eq. 9,
:func:`algos.dapo.group_advantages`), then ``mini_batches`` optimizer updates with the
clip-higher surrogate (Eq. 10, :func:`algos.dapo.clip_higher_token_loss`) aggregated by
:func:`algos.dapo.aggregate_loss` (token-mean, Eq. 12, by default). Every mini-batch may be
split into micro-batches of any token counts: each micro-batch's loss is aggregated with the
mini-batch's totals, so the accumulated gradient equals the single-batch gradient exactly.

The behaviour log-probs are the rollouts' own (vLLM's, carried in ``Experience.logprobs``),
as Trinity does (``old_log_prob = rollout_log_probs``); after a weight sync they equal the
trainer's to 1e-3 (tested), so the importance ratio starts at 1 for fresh rollouts and is
off-policy-corrected for carried-over ones.

GRPO baselines use the same class: ``eps_high = eps_low`` (symmetric clip) and
``loss_agg = "seq-mean-token-mean"``; dynamic sampling is the orchestrator's business.

It is an embedded default for CPU machines; on a GPU cluster Trinity trains through the plugin.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from algos.dapo import LOSS_AGG_MODES, EmptySeqs, aggregate_loss, clip_higher_token_loss, group_advantages
from orchestrator.core.types import Batch, Experience


class TrainStepError(RuntimeError):
    """A step produced a non-finite loss or gradient; the message names the step and tensor.

    The weights are restored to the start of the step before it is raised.
    """


class TrainerConfig(BaseModel):
    """Settings of :class:`PolicyTrainer`. Defaults are DAPO's (Sec. 4.1) where it speaks."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    lr: float = Field(3e-4, gt=0, description="AdamW learning rate (DAPO: 1e-6 for a 32B model; the tiny policy: 3e-4, measured; 1e-3 first lost 15 points).")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay (DAPO: 0.1).")
    eps_low: float = Field(0.2, ge=0, lt=1, description="Lower clip range epsilon_low (DAPO: 0.2).")
    eps_high: float = Field(0.28, ge=0, description="Upper clip range epsilon_high (DAPO: 0.28; GRPO: = eps_low).")
    dual_clip: float | None = Field(None, gt=1, description="Dual-clip bound c for negative advantages (verl: 3); None = off.")
    loss_agg: str = Field("token-mean", description=f"Loss aggregation, one of {LOSS_AGG_MODES} (DAPO: token-mean).")
    loss_agg_empty_seqs: EmptySeqs = Field(
        "skip", description="seq-* modes: sequences without response tokens (padding, masked members) 'skip' the divisor "
        "(verl's agg_loss) or 'count' in it (Trinity 0.6's aggregate_loss); see algos.dapo.EmptySeqs.")
    adv_norm: str = Field("std", description="Group advantage normalisation: 'std' (GRPO/DAPO) or 'none' (Dr. GRPO).")
    norm_length: int | None = Field(None, gt=0, description="L of seq-mean-token-sum-norm (Dr. GRPO), tokens; default the longest response of the first batch.")
    mini_batches: int = Field(2, ge=1, description="Optimizer updates per train batch (DAPO: 16 = 512 prompts / 32; here 2).")
    micro_batch_seqs: int = Field(64, ge=1, description="Sequences per forward/backward pass (memory only: exact aggregation).")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping by global norm (DAPO/verl: 1.0).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus: loss - coef * entropy, aggregated like the loss "
                                                       "(verl's entropy_coeff; DAPO: 0).")
    seed: int = Field(0, description="Seeds the mini-batch shuffle.")

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.loss_agg not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg must be one of {LOSS_AGG_MODES}, got {self.loss_agg!r}")
        if self.adv_norm not in ("std", "none"):
            raise ValueError(f"adv_norm must be 'std' or 'none', got {self.adv_norm!r}")
        return self


def pack(experiences: list[Experience], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded tensors of a list of single-turn experiences.

    Returns:
        ``input_ids`` (B, L) int64, ``attention_mask`` (B, L) int64, ``response_mask``
        (B, L - 1) bool (True where token t + 1 is a response token: the positions whose
        next-token log-prob is trained), ``old_logprobs`` (B, L - 1) float32 (behaviour
        log-probs at those positions, 0 elsewhere).
    Raises:
        ValueError: an experience has ``len(logprobs) != len(tokens) - prompt_length``
            (names the task and run).
    """
    width = max(len(e.tokens) for e in experiences)
    B = len(experiences)
    ids = torch.full((B, width), pad_id, dtype=torch.long)
    attn = torch.zeros((B, width), dtype=torch.long)
    resp = torch.zeros((B, width - 1), dtype=torch.bool)
    old = torch.zeros((B, width - 1), dtype=torch.float32)
    for i, e in enumerate(experiences):
        T = len(e.tokens) - e.prompt_length
        if len(e.logprobs) != T or e.prompt_length < 1:
            raise ValueError(f"experience {e.eid.task!r} run {e.eid.run}: {len(e.logprobs)} logprobs for {T} response "
                             f"tokens (prompt_length {e.prompt_length})")
        ids[i, : len(e.tokens)] = torch.tensor(e.tokens)
        attn[i, : len(e.tokens)] = 1
        resp[i, e.prompt_length - 1 : len(e.tokens) - 1] = True
        old[i, e.prompt_length - 1 : len(e.tokens) - 1] = torch.tensor(e.logprobs, dtype=torch.float32)
    return {"input_ids": ids, "attention_mask": attn, "response_mask": resp, "old_logprobs": old}


def has_trainable(batch: Batch) -> bool:
    """Whether ``batch`` holds a member to train on: a group that is not padding with a member
    that is not masked (``info["dso_masked"]``). An orchestrator releases a batch of padding
    only when its replenish rounds found no informative group (every task solved or never
    solved); a training loop skips such a batch instead of calling :meth:`PolicyTrainer.train_batch`."""
    return any(not e.info.get("dso_masked") for g in batch.groups if not g.padding for e in g.rollouts)


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each next token and the entropy of each next-token distribution.

    Returns:
        logprobs: (B, L - 1) float, ``log p(input_ids[:, t + 1] | input_ids[:, :t + 1])``.
        entropy: (B, L - 1) float, nats.
    """
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1)
    lp = logp.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return lp, entropy


class PolicyTrainer:
    """Trains a causal LM (transformers) on orchestrator batches.

    Args:
        model_dir: a local transformers model directory (the starting weights).
        config: :class:`TrainerConfig`.
    Attributes:
        model: the trained model (float32, train mode).
        reference: a frozen copy of the starting weights (KL to the initial policy).
        step: optimizer updates done so far.
    """

    def __init__(self, model_dir: str | Path, config: TrainerConfig | None = None):
        from transformers import AutoModelForCausalLM

        self.config = config or TrainerConfig()
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        self.model.train()
        for module in self.model.modules():  # no dropout: the ratio must be 1 on fresh rollouts
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0
        self.reference = copy.deepcopy(self.model).eval().requires_grad_(False)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay)
        self.pad_id = int(self.model.config.pad_token_id or 0)
        self.step = 0
        self.batches = 0
        self.norm_length: float | None = self.config.norm_length
        self._rng = np.random.default_rng(self.config.seed)

    # ------------------------------------------------------------------ state
    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """(name, detached tensor) of every parameter, transformers' names (for the engine)."""
        return [(k, v.detach().clone()) for k, v in self.model.state_dict().items()]

    def _snapshot(self) -> tuple[dict, dict]:
        return copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict())

    def _restore(self, snap: tuple[dict, dict]) -> None:
        self.model.load_state_dict(snap[0])
        self.optimizer.load_state_dict(snap[1])

    # ------------------------------------------------------------------ one batch
    def train_batch(self, batch: Batch) -> dict[str, float]:
        """One rollout step: advantages, then ``mini_batches`` optimizer updates.

        Padding groups (``Group.padding``) and masked members (``info["dso_masked"]``), both of
        zero loss weight, are left out of the loss and of the group baselines.

        Returns:
            metrics (means over the updates): ``loss``, ``entropy`` (nats, token mean),
            ``pg_clipfrac`` (tokens with the upper clip active), ``pg_clipfrac_lower`` (lower
            clip active), ``pg_clipfrac_dual``, ``kl_ref`` (k3 estimator of KL(pi || pi_init),
            token mean, Schulman 2020), ``ppo_kl`` (token mean of old - new log-prob),
            ``grad_norm``, ``reward_mean``, ``reward_std_group`` (mean of the groups'
            population stds), ``accuracy_mean``, ``response_length``, ``tokens``, ``sequences``.
        Raises:
            TrainStepError: non-finite loss or gradient (names step and tensor); the weights and
                optimizer state are those of before the call.
            ValueError: the batch holds no trainable group or member.
        """
        groups = [g for g in batch.groups if not g.padding]
        if not groups:
            raise ValueError(f"batch {batch.batch_id}: no trainable group (all {len(batch.groups)} are padding)")
        # masked members (invalid or stale, ``info["dso_masked"]``) have zero loss weight and stay
        # out of their group's baseline: they are left out here entirely
        pairs = [(i, e) for i, g in enumerate(groups) for e in g.rollouts if not e.info.get("dso_masked")]
        if not pairs:
            raise ValueError(f"batch {batch.batch_id}: every member of the {len(groups)} trainable groups is masked")
        exps = [e for _, e in pairs]
        rewards = torch.tensor([e.reward for e in exps], dtype=torch.float64)
        gids = torch.tensor([i for i, _ in pairs], dtype=torch.int64)
        metrics = self.train_on(exps, group_advantages(rewards, gids, norm=self.config.adv_norm))
        count = np.bincount(gids.numpy()).astype(float)
        mean = np.bincount(gids.numpy(), rewards.numpy()) / np.maximum(count, 1)
        var = np.bincount(gids.numpy(), (rewards.numpy() - mean[gids.numpy()]) ** 2) / np.maximum(count, 1)
        metrics.update(
            reward_mean=float(rewards.mean()),
            reward_std_group=float(np.sqrt(var[count > 0]).mean()),
            accuracy_mean=float(np.mean([e.metrics.get("accuracy", math.nan) for e in exps])),
        )
        return metrics

    def train_on(self, experiences: list[Experience], advantages: torch.Tensor) -> dict[str, float]:
        """``mini_batches`` optimizer updates on experiences whose advantages are given.

        The advantage-agnostic half of :meth:`train_batch`: GiGPO (arXiv 2505.10978, Eq. 8)
        passes ``A^E + omega * A^S`` per step, one experience per environment step, each
        broadcast over its response tokens (verl-agent's ``compute_gigpo_outcome_advantage``
        does the same broadcast).

        Args:
            experiences: B single-turn experiences (tokens, prompt_length, behaviour logprobs).
            advantages: (B,) float, one per experience.
        Returns:
            the update metrics of :meth:`train_batch` (``loss`` ... ``grad_norm``, means over the
            updates) plus ``response_length``, ``tokens`` and ``sequences``.
        Raises:
            ValueError: empty input, ``advantages`` not of shape (B,) or not finite (names the
                first bad row's task, run and step).
            TrainStepError: as :meth:`train_batch`; the weights are restored.
        """
        B = len(experiences)
        adv_seq = torch.as_tensor(advantages).reshape(-1).float()
        if B == 0 or adv_seq.numel() != B:
            raise ValueError(f"advantages: expected shape ({B},) for {B} experiences, got {tuple(torch.as_tensor(advantages).shape)}")
        bad = torch.nonzero(~torch.isfinite(adv_seq)).flatten()
        if len(bad):
            e = experiences[int(bad[0])]
            raise ValueError(f"advantages: non-finite value {float(adv_seq[bad[0]])} for task {e.eid.task!r} run {e.eid.run} "
                             f"step {e.eid.step}")
        data = pack(experiences, self.pad_id)
        if self.norm_length is None:  # fixed for the whole run (Dr. GRPO's constant L)
            self.norm_length = float(data["response_mask"].sum(dim=1).max())
        order = self._rng.permutation(B)
        minis = [torch.as_tensor(np.sort(c)) for c in np.array_split(order, self.config.mini_batches) if len(c)]

        snap = self._snapshot()
        sums: dict[str, float] = {}
        try:
            for mini in minis:
                sums = _add(sums, self._update(data, adv_seq, mini))
        except TrainStepError:
            self._restore(snap)
            raise
        self.batches += 1
        metrics = {k: v / len(minis) for k, v in sums.items()}
        metrics.update(
            response_length=float(data["response_mask"].sum(dim=1).float().mean()),
            tokens=float(data["response_mask"].sum()),
            sequences=float(B),
        )
        return metrics

    def _update(self, data: dict[str, torch.Tensor], adv_seq: torch.Tensor, rows: torch.Tensor) -> dict[str, float]:
        cfg = self.config
        mask_all = data["response_mask"][rows]
        total_tokens = max(float(mask_all.sum()), 1.0)  # an all-padding mini-batch: loss 0, not a refusal
        # B of the seq-* modes, counted as aggregate_loss counts it (empty sequences skipped by default)
        counted = mask_all.sum(dim=1) > 0 if cfg.loss_agg_empty_seqs == "skip" else torch.ones(len(rows), dtype=torch.bool)
        total_seqs = max(float(counted.sum()), 1.0)
        self.optimizer.zero_grad(set_to_none=True)
        acc = {"loss": 0.0, "entropy": 0.0, "pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0, "pg_clipfrac_dual": 0.0,
               "kl_ref": 0.0, "ppo_kl": 0.0}
        for start in range(0, len(rows), cfg.micro_batch_seqs):
            idx = rows[start : start + cfg.micro_batch_seqs]
            ids, attn = data["input_ids"][idx], data["attention_mask"][idx]
            mask = data["response_mask"][idx]
            old = data["old_logprobs"][idx]
            adv = adv_seq[idx].unsqueeze(1).expand_as(old)
            lp, ent = token_logprobs(self.model, ids, attn)
            tok_loss, flags = clip_higher_token_loss(lp, old, adv, mask, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                                                     dual_clip=cfg.dual_clip)
            if cfg.entropy_coef:  # verl's dp_actor: policy_loss = pg_loss - entropy_coeff * agg_loss(entropy)
                tok_loss = tok_loss - cfg.entropy_coef * ent
            loss = aggregate_loss(tok_loss, mask, cfg.loss_agg, global_tokens=total_tokens, global_seqs=total_seqs,
                                  norm_length=self.norm_length, empty_seqs=cfg.loss_agg_empty_seqs)
            if not torch.isfinite(loss):
                raise TrainStepError(f"step {self.step}: loss is {loss.item()} (micro-batch rows {idx.tolist()[:8]}...)")
            loss.backward()
            with torch.no_grad():
                ref_lp, _ = token_logprobs(self.reference, ids, attn)
                m = mask.float()
                d = ref_lp - lp
                k3 = torch.where(mask, torch.exp(d) - d - 1.0, torch.zeros(()))
                acc["loss"] += float(loss)
                acc["entropy"] += float((ent * m).sum()) / max(total_tokens, 1.0)
                acc["pg_clipfrac"] += float(flags["clip_high"].sum()) / max(total_tokens, 1.0)
                acc["pg_clipfrac_lower"] += float(flags["clip_low"].sum()) / max(total_tokens, 1.0)
                acc["pg_clipfrac_dual"] += float(flags["dual_clip"].sum()) / max(total_tokens, 1.0)
                acc["kl_ref"] += float(k3.sum()) / max(total_tokens, 1.0)
                acc["ppo_kl"] += float(((old - lp) * m).sum()) / max(total_tokens, 1.0)
        for name, p in self.model.named_parameters():
            if p.grad is not None and not torch.isfinite(p.grad).all():
                raise TrainStepError(f"step {self.step}: non-finite gradient in {name}")
        acc["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
        self.optimizer.step()
        self.step += 1
        return acc

    # ------------------------------------------------------------------ views
    @torch.no_grad()
    def logprobs_of(self, experiences: list[Experience]) -> list[list[float]]:
        """The trainer's log-probs of each experience's response tokens (for sync checks)."""
        data = pack(experiences, self.pad_id)
        lp, _ = token_logprobs(self.model, data["input_ids"], data["attention_mask"])
        return [lp[i][data["response_mask"][i]].tolist() for i in range(len(experiences))]


def _add(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a.get(k, 0.0) + v for k, v in b.items()}
