"""The ``dso_clip_higher`` policy loss for Trinity: DAPO's clip-higher, token-level loss."""

from __future__ import annotations

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from trinity.algorithm.policy_loss_fn import PolicyLossFn

from algos.dapo import EmptySeqs, LossAggMode, aggregate_loss, clip_higher_policy_loss

COUNTS_FIELD = "dso_batch_counts"
"""The batch field (and ``Experience.info`` key, carried by a Trinity ``CustomField``) holding each
row's whole-batch ``rows``, ``seqs`` and ``tokens`` (:func:`algos.dapo.batch_loss_counts`), set
where a batch is released (:meth:`orchestrator.trinity.operator.OrchestratorOperator.expand`)."""


def trainer_convention() -> str:
    """How the installed Trinity trainer weights the micro-batch losses it accumulates.

    ``"sum"``: verl >= 0.8 (Trinity 0.6's engine path, ``trinity/trainer/verl/losses.py``; and
    our CPU trainer): each micro-batch's loss is back-propagated as returned (verl's engine,
    ``forward_backward_batch``), gradients averaged over data-parallel ranks. ``"legacy"``:
    verl < 0.8 (Trinity's ``trinity/trainer/verl_legacy/dp_actor.py``, ``update_policy``): the
    loss is multiplied by ``rows / ppo_mini_batch_size`` (``1 / gradient_accumulation``), or for
    ``token-mean`` with ``fix_actor_microbatch_loss_scale`` (which our ``check_config`` sets) by
    ``tokens / mini-batch tokens x world size``.
    """
    from trinity.trainer import is_verl_legacy

    return "legacy" if is_verl_legacy() else "sum"


def _world_size() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


class ClipHigherLossArgs(BaseModel):
    """``policy_loss_fn_args`` of ``dso_clip_higher``, validated at construction (every number
    finite; each range from DAPO Sec. 3.1 and the dual clip of Ye et al. 2020)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    backend: str = Field("verl", description="Trinity trainer backend whose tensor names are mapped.")
    clip_range_low: float = Field(0.2, ge=0.0, lt=1.0, description="eps_low, in [0, 1) (paper: 0.2).")
    clip_range_high: float = Field(0.28, ge=0.0, description="eps_high, >= 0 (paper: 0.28, clip-higher).")
    clip_ratio_c: float | None = Field(None, gt=1.0, description="Dual-clip bound c > 1 (verl: 3), or None (off, the paper).")
    loss_agg_mode: LossAggMode = Field("token-mean", description="See algos.dapo.aggregate_loss (DAPO Eq. 12: token-mean).")
    loss_agg_norm_length: int | None = Field(
        None, gt=0, description="L in tokens for seq-mean-token-sum-norm (required there; keep it constant, e.g. max_tokens)."
    )
    loss_agg_empty_seqs: EmptySeqs = Field(
        "skip", description="Sequences without response tokens (padding, masked members) in the seq-* divisor: 'skip' "
        "(verl's agg_loss) or 'count' (Trinity 0.6's aggregate_loss); see algos.dapo.EmptySeqs."
    )

    @model_validator(mode="after")
    def _norm_length(self) -> ClipHigherLossArgs:
        if self.loss_agg_mode == "seq-mean-token-sum-norm" and self.loss_agg_norm_length is None:
            raise ValueError("loss_agg_norm_length: seq-mean-token-sum-norm needs a fixed length > 0, got None")
        return self


class DsoClipHigherPolicyLossFn(PolicyLossFn):
    """``dso_clip_higher``: DAPO's clip-higher surrogate, :func:`algos.dapo.clip_higher_policy_loss`.

    Per token, ``ratio = exp(logprob - old_logprob)``,
    ``l = max(-A * ratio, -A * clip(ratio, 1 - clip_range_low, 1 + clip_range_high))``, and with
    ``clip_ratio_c = c`` (dual clip, Ye et al. 2020) ``l = min(l, -A * c)`` where ``A < 0``.
    The per-token loss is reduced as ``token-mean`` (default, DAPO Eq. 12),
    ``seq-mean-token-mean`` or ``seq-mean-token-sum-norm`` (Dr. GRPO, with the fixed length
    ``loss_agg_norm_length``) over the *whole* batch, whatever the micro-batches: each row
    carries its batch's counts (``dso_batch_counts``, set by the ``dso_orchestrator`` operator
    at release), the micro-batch returns its exact share of the batch's loss
    (:func:`algos.dapo.batch_share_loss`, verl's ``global_batch_info`` rule) times the
    data-parallel world size, and under verl < 0.8 divided by the scale Trinity's legacy actor
    applies (:func:`trainer_convention`). So the loss and gradient of a mini-batch do not depend
    on its micro-batch size or on where padding rows fall. Trinity 0.6's own
    ``aggregate_loss`` (its ``ppo`` loss) divides by the micro-batch's own token or sequence
    count; without ``dso_batch_counts`` (a direct call) this loss does the same.

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
        loss_agg_empty_seqs: ``"skip"`` (default; verl's ``agg_loss``) leaves sequences without
            response tokens (padding groups, masked members: all-zero ``action_mask``) out of
            the ``seq-*`` modes' sequence count, so they have zero loss weight as documented;
            ``"count"`` counts them (Trinity 0.6's ``aggregate_loss``), which scales the loss of
            a batch closed at the cap with k of K groups kept by k / K.
    Raises:
        ValueError, naming the field and value: a value that is not
            finite or out of range, an unknown ``loss_agg_mode`` or ``loss_agg_empty_seqs``, or
            ``seq-mean-token-sum-norm`` without a positive length (:class:`ClipHigherLossArgs`).
    """

    def __init__(
        self,
        backend: str = "verl",
        clip_range_low: float = 0.2,
        clip_range_high: float = 0.28,
        clip_ratio_c: float | None = None,
        loss_agg_mode: str = "token-mean",
        loss_agg_norm_length: int | None = None,
        loss_agg_empty_seqs: str = "skip",
    ) -> None:
        try:
            args = ClipHigherLossArgs(
                backend=backend, clip_range_low=clip_range_low, clip_range_high=clip_range_high, clip_ratio_c=clip_ratio_c,
                loss_agg_mode=loss_agg_mode, loss_agg_norm_length=loss_agg_norm_length,
                loss_agg_empty_seqs=loss_agg_empty_seqs,
            )
        except ValidationError as err:  # one line naming the YAML key and the value
            e = err.errors(include_url=False)[0]
            msg = e["msg"].removeprefix("Value error, ")
            if e["loc"]:
                msg = f"{'.'.join(map(str, e['loc']))}: {msg}, got {e.get('input')!r}"
            raise ValueError(msg) from None
        super().__init__(backend=backend)
        self.args = args
        self.loss_agg_norm_length = args.loss_agg_norm_length
        self.clip_range_low = args.clip_range_low
        self.clip_range_high = args.clip_range_high
        self.clip_ratio_c = args.clip_ratio_c
        self.loss_agg_mode = args.loss_agg_mode
        self.loss_agg_empty_seqs = args.loss_agg_empty_seqs
        self.convention = trainer_convention()

    def __call__(  # type: ignore[override]
        self,
        logprob: torch.Tensor,
        old_logprob: torch.Tensor,
        action_mask: torch.Tensor,
        advantages: torch.Tensor,
        dso_batch_counts: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, dict]:
        """Loss and metrics for one micro-batch.

        Args:
            logprob, old_logprob: (B, T) float. Current and behaviour log-probs of response tokens.
            action_mask: (B, T) bool or {0, 1}. Response tokens that count.
            advantages: (B, T) float.
            dso_batch_counts: (B, 3) float, or None. Each row's whole-batch rows, seqs, tokens
                (:data:`COUNTS_FIELD`); None: the micro-batch's own counts (Trinity's ``aggregate_loss``).
        Returns:
            loss: () float, differentiable in ``logprob``. With counts, under verl >= 0.8 and
            our CPU trainer, the micro-batch's share of the batch loss x world size (the
            shares add up to the batch's loss); under verl < 0.8, that share divided by the
            legacy actor's micro-batch scale.
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
            empty_seqs=self.loss_agg_empty_seqs,
            counts=dso_batch_counts,
        )
        if dso_batch_counts is not None:
            loss = loss * self._scale(dso_batch_counts, action_mask)
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

    def _scale(self, counts: torch.Tensor, action_mask: torch.Tensor) -> float:
        """The factor turning the micro-batch's share of its batch's loss into what the trainer
        expects (:func:`trainer_convention`): ``world size`` when the trainer sums micro-batch
        losses (verl >= 0.8); under verl < 0.8, ``world size / legacy scale``:
        ``rows of the batch / rows of the micro-batch`` (``1 / gradient_accumulation`` =
        ``rows / (ppo_mini_batch_size / world size)``), or for ``token-mean`` (token scale
        ``tokens / batch tokens x world size``) ``batch tokens / micro-batch tokens``.
        Batch sizes are read from the first row (every row of a released batch carries the same)."""
        if self.convention == "sum":
            return float(_world_size())
        c = torch.as_tensor(counts, dtype=torch.float64)[0]
        if self.loss_agg_mode == "token-mean":
            own = float(torch.as_tensor(action_mask).sum())
            return float(c[2]) / own if own > 0 else 0.0
        return float(c[0]) / action_mask.shape[0]

    @classmethod
    def default_args(cls) -> dict:
        return {
            "clip_range_low": 0.2,
            "clip_range_high": 0.28,
            "clip_ratio_c": None,
            "loss_agg_mode": "token-mean",
            "loss_agg_norm_length": None,
            "loss_agg_empty_seqs": "skip",
        }


