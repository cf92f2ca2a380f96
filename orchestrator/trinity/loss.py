"""The ``dso_clip_higher`` policy loss for Trinity: DAPO's clip-higher, token-level loss."""

from __future__ import annotations

import torch
from trinity.algorithm.policy_loss_fn import PolicyLossFn

from algos.dapo import LOSS_AGG_MODES, aggregate_loss, clip_higher_policy_loss


class DsoClipHigherPolicyLossFn(PolicyLossFn):
    """``dso_clip_higher``: DAPO's clip-higher surrogate, :func:`algos.dapo.clip_higher_policy_loss`.

    Per token, ``ratio = exp(logprob - old_logprob)``,
    ``l = max(-A * ratio, -A * clip(ratio, 1 - clip_range_low, 1 + clip_range_high))``, and with
    ``clip_ratio_c = c`` (dual clip, Ye et al. 2020) ``l = min(l, -A * c)`` where ``A < 0``.
    The per-token loss is reduced by :func:`algos.dapo.aggregate_loss` over the micro-batch:
    ``token-mean`` (default, DAPO Eq. 12), ``seq-mean-token-mean`` or
    ``seq-mean-token-sum-norm`` (Dr. GRPO, with the fixed length ``loss_agg_norm_length``).

    Same argument names as Trinity's ``ppo`` loss, so YAMLs carry over. Differences from
    Trinity's ``ppo``: dual clip is optional (``None`` disables it; Trinity's is always on at
    3.0), the log-ratio is not clamped to [-20, 20], and ``seq-mean-token-sum-norm`` also
    averages over sequences (see :func:`algos.dapo.aggregate_loss`).

    Args:
        backend: Trinity trainer backend whose tensor names are mapped (``"verl"``).
        clip_range_low, clip_range_high: eps_low in [0, 1), eps_high >= 0 (paper: 0.2, 0.28).
        clip_ratio_c: dual-clip bound c > 1, or None.
        loss_agg_mode: one of ``token-mean``, ``seq-mean-token-mean``,
            ``seq-mean-token-sum-norm`` (Trinity writes ``algorithm.loss_agg_mode`` here).
        loss_agg_norm_length: L in tokens for ``seq-mean-token-sum-norm`` (keep it constant,
            e.g. the response budget); required with that mode.
    Raises:
        ValueError: clip values out of range, an unknown ``loss_agg_mode`` (the valid ones are
            listed), or ``seq-mean-token-sum-norm`` without a positive length.
    """

    def __init__(
        self,
        backend: str = "verl",
        clip_range_low: float = 0.2,
        clip_range_high: float = 0.28,
        clip_ratio_c: float | None = None,
        loss_agg_mode: str = "token-mean",
        loss_agg_norm_length: int | None = None,
    ) -> None:
        super().__init__(backend=backend)
        if not 0 <= clip_range_low < 1 or clip_range_high < 0:
            raise ValueError(
                f"clip_range_low/clip_range_high: need 0 <= low < 1 and high >= 0, got {clip_range_low}, {clip_range_high}"
            )
        if clip_ratio_c is not None and clip_ratio_c <= 1:
            raise ValueError(f"clip_ratio_c: must be > 1 or null, got {clip_ratio_c}")
        if loss_agg_mode not in LOSS_AGG_MODES:
            raise ValueError(f"loss_agg_mode: must be one of {list(LOSS_AGG_MODES)}, got {loss_agg_mode!r}")
        if loss_agg_mode == "seq-mean-token-sum-norm" and not (loss_agg_norm_length and loss_agg_norm_length > 0):
            raise ValueError(
                f"loss_agg_norm_length: seq-mean-token-sum-norm needs a fixed length > 0, got {loss_agg_norm_length!r}"
            )
        self.loss_agg_norm_length = None if loss_agg_norm_length is None else int(loss_agg_norm_length)
        self.clip_range_low = float(clip_range_low)
        self.clip_range_high = float(clip_range_high)
        self.clip_ratio_c = None if clip_ratio_c is None else float(clip_ratio_c)
        self.loss_agg_mode = loss_agg_mode

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        **kwargs,
    ) -> tuple[torch.Tensor, dict]:
        """Loss and metrics for one micro-batch.

        Args:
            logprob, old_logprob: (B, T) float. Current and behaviour log-probs of response tokens.
            action_mask: (B, T) bool or {0, 1}. Response tokens that count.
            advantages: (B, T) float.
        Returns:
            loss: () float, differentiable in ``logprob``.
            metrics: ``pg_loss``, ``pg_clipfrac`` (share of tokens where the clip bound was
            active), ``pg_clipfrac_lower`` (share where the dual clip was active), ``ppo_kl``
            (token mean of ``old_logprob - logprob``).
        """
        loss, clipfrac = clip_higher_policy_loss(
            logprob,
            old_logprob,
            advantages,
            action_mask,
            eps_low=self.clip_range_low,
            eps_high=self.clip_range_high,
            dual_clip=self.clip_ratio_c,
            loss_agg_mode=self.loss_agg_mode,
            norm_length=self.loss_agg_norm_length,
        )
        with torch.no_grad():
            mask = action_mask.to(logprob.dtype)
            denom = mask.sum().clamp(min=1.0)
            ppo_kl = aggregate_loss(old_logprob - logprob, action_mask, "token-mean")
            lower = torch.zeros((), dtype=logprob.dtype)
            if self.clip_ratio_c is not None:
                ratio = torch.exp(logprob - old_logprob)
                surrogate = torch.maximum(
                    -advantages * ratio,
                    -advantages * torch.clamp(ratio, 1 - self.clip_range_low, 1 + self.clip_range_high),
                )
                hit = (advantages < 0) & (surrogate > -advantages * self.clip_ratio_c)
                lower = (hit.to(logprob.dtype) * mask).sum() / denom
        metrics = {
            "pg_loss": float(loss.detach()),
            "pg_clipfrac": float(clipfrac),
            "pg_clipfrac_lower": float(lower),
            "ppo_kl": float(ppo_kl),
        }
        return loss, metrics

    @classmethod
    def default_args(cls) -> dict:
        return {
            "clip_range_low": 0.2,
            "clip_range_high": 0.28,
            "clip_ratio_c": None,
            "loss_agg_mode": "token-mean",
            "loss_agg_norm_length": None,
        }


