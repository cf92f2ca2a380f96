"""DAPO mathematics as pure, vectorised functions (arXiv 2503.14476).

Nothing here keeps state, does I/O or knows about Ray: every function maps arrays to arrays.
Equation numbers refer to the DAPO paper, v1 (Yu et al., 2025).

Group classification works on a regular ``(G, n)`` matrix: G groups (one task each) of n
rollouts. Advantages work on flat ``(N,)`` rollouts with integer group ids, so that ragged
batches (e.g. a trainer batch assembled from several rounds) need no padding.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Literal

import numpy as np
import torch

from algos.checks import check_number
from algos.groups import Norm, StdConvention, check_norm, normalise_in_groups

LossAggMode = Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
EmptySeqs = Literal["skip", "count"]
"""Whether a sequence without any response token (a padding group's, a masked member's) counts
in the ``B`` of the ``seq-*`` loss modes: ``"skip"`` (default) leaves it out, as verl's
``agg_loss`` does ("exclude fully masked sequences"), so zero-weight sequences change nothing;
``"count"`` counts every row, as Trinity 0.6's ``aggregate_loss`` (``seq_losses.mean()``) does."""
EMPTY_SEQS: tuple[str, ...] = ("skip", "count")


class InvalidGroupError(ValueError):
    """A group's rewards or shape cannot be used (NaN reward, wrong size, bad ids)."""


class GroupReason(IntEnum):
    """Why a group was kept or dropped by the dynamic-sampling filter (DAPO Eq. 11).

    The integer codes are stable: they are stored in state dicts and batch files. Codes 6-8 are
    the orchestrator's own drop reasons (stale, invalid, lost), not the filter's:
    ``orchestrator.core.outcomes.GroupOutcome`` holds them with these.
    """

    INFORMATIVE = 0
    ALL_CORRECT = 1
    ALL_WRONG = 2
    ZERO_VARIANCE = 3
    SINGLETON = 4
    OUT_OF_BAND = 5

    @property
    def label(self) -> str:
        return self.name.lower()


def _check_finite(values: np.ndarray, what: str) -> None:
    bad = ~np.isfinite(values)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise InvalidGroupError(f"{what}: non-finite value {values[idx]!r} at index {idx}")


def classify_groups(
    values: np.ndarray,
    *,
    std_tol: float = 1e-6,
    correct_threshold: float = 1.0,
    wrong_threshold: float = 0.0,
    band: tuple[float, float] | None = None,
    valid: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Dynamic-sampling filter: keep groups whose judged values are not all equal.

    DAPO Eq. 11 constrains every kept prompt to ``0 < |{o_i : is_equivalent(a, o_i)}| < G``,
    i.e. neither all rollouts correct nor all wrong. The reference implementation (verl's
    ``DAPO`` ray trainer) keeps a group when ``np.std(metric) > 0``; we use the population
    standard deviation (ddof=0) in float64 with a tolerance, so float noise around equal
    rewards (e.g. ``0.1 + 0.2`` vs ``0.3``) cannot make a group look informative.

    ``std_tol = 0`` means exact equality: a group is all equal when its largest and smallest
    judged values are the same float, compared as values (seven rewards of 0.35 have a
    float64 std of ~5.6e-17, which a std test would call informative).

    Judge the right value: pass the per-rollout accuracy rather than the shaped reward when
    an overlong penalty (Eq. 13) is applied, or a constant-accuracy group with different
    lengths would look informative.

    Args:
        values: (G, n) float. The judged value of each rollout (reward or a metric).
        std_tol: a group whose population std is ``<= std_tol`` counts as all equal; 0 means
            max == min exactly. >= 0.
        correct_threshold: an all-equal group with values ``>= correct_threshold`` is
            ``all_correct`` (DAPO rewards are +1 correct / -1 wrong, so 1.0).
        wrong_threshold: an all-equal group with values ``<= wrong_threshold`` is
            ``all_wrong``; other all-equal groups are ``zero_variance``.
        band: optional ``(lo, hi)`` band-pass on the group mean for non-binary rewards: an
            otherwise informative group is kept only if ``lo < mean < hi`` (open interval),
            else ``out_of_band``.
        valid: optional (G, n) bool. Members judged (masked members, e.g. a NaN reward under
            the ``mask`` group-validity policy, are left out of every statistic; their
            ``values`` may be NaN). A group with fewer than 2 valid members is ``singleton``.
    Returns:
        keep: (G,) bool. True exactly for ``informative`` groups.
        reason: (G,) int8. A :class:`GroupReason` code per group.
    Raises:
        InvalidGroupError: ``values`` is not 2-D, is empty, or holds NaN/inf in a valid
            member (names the index).
        ValueError: ``std_tol`` negative or not finite, a threshold or band end not finite, or
            ``band`` with ``lo >= hi`` (names the parameter and value).
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[0] == 0 or v.shape[1] == 0:
        raise InvalidGroupError(f"values: expected a non-empty (G, n) matrix, got shape {v.shape}")
    ok = np.ones(v.shape, dtype=bool) if valid is None else np.asarray(valid, dtype=bool)
    if ok.shape != v.shape:
        raise InvalidGroupError(f"valid: shape {ok.shape} differs from values {v.shape}")
    _check_finite(np.where(ok, v, 0.0), "values")
    check_number("std_tol", std_tol, ge=0.0)
    check_number("correct_threshold", correct_threshold)
    check_number("wrong_threshold", wrong_threshold)
    if band is not None:
        if len(band) != 2:
            raise ValueError(f"band: expected (lo, hi), got {band!r}")
        check_number("band[0]", band[0])
        check_number("band[1]", band[1])
        if not band[0] < band[1]:
            raise ValueError(f"band: must satisfy lo < hi, got {band}")

    G = v.shape[0]
    count = ok.sum(axis=1)
    safe = np.maximum(count, 1)
    x = np.where(ok, v, 0.0)
    mean = x.sum(axis=1) / safe
    lo = np.where(ok, v, np.inf).min(axis=1)
    hi = np.where(ok, v, -np.inf).max(axis=1)
    if std_tol == 0:
        equal = hi == lo
    else:
        std = np.sqrt((np.where(ok, v - mean[:, None], 0.0) ** 2).sum(axis=1) / safe)
        equal = std <= std_tol
    reason = np.full(G, GroupReason.INFORMATIVE, dtype=np.int8)
    if band is not None:
        reason[(mean <= band[0]) | (mean >= band[1])] = GroupReason.OUT_OF_BAND
    reason[equal] = GroupReason.ZERO_VARIANCE
    reason[equal & (lo >= correct_threshold)] = GroupReason.ALL_CORRECT
    reason[equal & (hi <= wrong_threshold)] = GroupReason.ALL_WRONG
    reason[count < 2] = GroupReason.SINGLETON
    return reason == GroupReason.INFORMATIVE, reason


def overlong_penalty(
    response_lengths: np.ndarray,
    *,
    max_response_length: int,
    cache_length: int,
    penalty_factor: float = 1.0,
) -> np.ndarray:
    """Soft overlong punishment, DAPO Eq. 13.

    With ``L_max = max_response_length`` and ``L_cache = cache_length``::

        R_length(|y|) = 0                                   if |y| <= L_max - L_cache
                      = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                      = -1                                  if L_max < |y|

    The penalty is added to the rule-based reward; it is multiplied by ``penalty_factor``
    (verl's ``overlong_penalty_factor``; the paper uses 1). The middle branch equals 0 at
    its left end and -1 at ``|y| = L_max``, so the function is continuous.

    Args:
        response_lengths: (N,) int. Response length in tokens (EOS included).
        max_response_length: L_max in tokens, > 0.
        cache_length: L_cache in tokens, in (0, L_max] (the paper uses 4096 of 20480).
        penalty_factor: scale of the penalty, >= 0.
    Returns:
        (N,) float64 in ``[-penalty_factor, 0]``.
    Raises:
        ValueError: ``cache_length`` not a whole number in (0, max_response_length],
            ``max_response_length`` not a whole number > 0, a negative or non-finite factor, or a
            negative or non-finite length (names the parameter and value).
    """
    check_number("max_response_length", max_response_length, gt=0, integer=True)
    check_number("cache_length", cache_length, gt=0, integer=True)
    if cache_length > max_response_length:
        raise ValueError(f"cache_length: must be <= max_response_length={max_response_length}, got {cache_length!r}")
    check_number("penalty_factor", penalty_factor, ge=0.0)
    lengths = np.asarray(response_lengths, dtype=np.float64)
    bad = ~(np.isfinite(lengths) & (lengths >= 0))
    if bad.any():
        i = tuple(int(k) for k in np.argwhere(bad)[0])
        raise ValueError(f"response_lengths: length {lengths[i].item()!r} at index {i} is not a finite number >= 0")
    start = max_response_length - cache_length
    ramp = (start - lengths) / cache_length
    penalty = np.where(lengths <= start, 0.0, np.where(lengths <= max_response_length, ramp, -1.0))
    return penalty_factor * penalty


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    *,
    norm: Norm = "std",
    eps: float = 1e-6,
    std: StdConvention = "sample",
    valid: torch.Tensor | None = None,
) -> torch.Tensor:
    """Group-relative advantages, the GRPO baseline that DAPO keeps (DAPO Eq. 9).

    ``A_i = (r_i - mean(r_group)) / (std(r_group) + eps)`` with the sample std by default
    (ddof=1, as ``torch.std`` in verl's ``compute_grpo_outcome_advantage``), the population
    std (ddof=0) with ``std="population"``, or ``A_i = r_i - mean`` when ``norm="none"``
    (Dr. GRPO's choice). Statistics are accumulated in float64 with segment sums, so groups
    of equal rewards get exactly zero.

    Args:
        rewards: (N,) float. One scalar reward per rollout.
        group_ids: (N,) int64 in [0, G). The group (task) of each rollout.
        norm: ``"std"`` or ``"none"``.
        eps: added to the std, > 0.
        std: ``"sample"`` (ddof 1, default) or ``"population"`` (ddof 0), see :data:`StdConvention`.
        valid: optional (N,) bool. Members outside the baseline (masked rollouts): they get
            advantage 0 and are left out of their group's mean and std; their reward may be NaN.
    Returns:
        (N,) float64. Zero for every member of a singleton or zero-variance group (counting
        valid members only) and for every masked member.
    Raises:
        InvalidGroupError: a reward is NaN or infinite (names its index), or shapes differ.
        ValueError: unknown ``norm`` or ``std``, or ``eps`` negative or not finite.
    """
    check_norm(norm, eps, std)
    r = torch.as_tensor(rewards, dtype=torch.float64).reshape(-1)
    g = torch.as_tensor(group_ids, dtype=torch.int64).reshape(-1)
    if r.shape != g.shape:
        raise InvalidGroupError(f"rewards has shape {tuple(r.shape)} but group_ids {tuple(g.shape)}")
    if valid is not None:
        ok = torch.as_tensor(valid, dtype=torch.bool).reshape(-1)
        if ok.shape != r.shape:
            raise InvalidGroupError(f"valid has shape {tuple(ok.shape)} but rewards {tuple(r.shape)}")
        if r.numel() and not ok.all():
            adv = torch.zeros_like(r)
            if ok.any():
                adv[ok] = group_advantages(r[ok], g[ok], norm=norm, eps=eps, std=std)
            return adv
    bad = ~torch.isfinite(r)
    if bad.any():
        i = int(bad.nonzero()[0])
        raise InvalidGroupError(f"rewards: non-finite value {float(r[i])!r} at index {i} (group {int(g[i])})")
    return torch.from_numpy(normalise_in_groups(r.numpy(), g.numpy(), norm=norm, eps=eps, std=std))


def _check_agg_args(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, empty_seqs: str) -> None:
    """Raise ``ValueError`` naming the argument for an unknown mode or ``empty_seqs``, or for
    ``loss_mat`` and ``mask`` not of one (B, T) shape."""
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode: must be one of {list(LOSS_AGG_MODES)}, got {mode!r}")
    if empty_seqs not in EMPTY_SEQS:
        raise ValueError(f"empty_seqs: must be one of {list(EMPTY_SEQS)}, got {empty_seqs!r}")
    if loss_mat.shape != mask.shape or loss_mat.ndim != 2:
        raise ValueError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)}: expected equal (B, T) shapes")


def aggregate_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggMode = "token-mean",
    *,
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    norm_length: float | None = None,
    empty_seqs: EmptySeqs = "skip",
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar, exactly as over the whole batch when split in micro-batches.

    With ``m`` the mask, ``N`` the response tokens and ``B`` the sequences of the *whole*
    (mini-)batch, and ``L`` a fixed length::

        token-mean               sum_{i,t} m l / N                      (DAPO Eq. 12; the default)
        seq-mean-token-mean      (1 / B) sum_i [sum_t m l / sum_t m]    (GRPO's per-sequence mean)
        seq-mean-token-sum-norm  (1 / B) sum_i [sum_t m l] / L          (Dr. GRPO, arXiv 2503.20783, Sec. 3.2)

    Every mode is a sum of per-token or per-sequence terms divided by a whole-batch constant,
    so when a batch is cut into micro-batches of any (uneven) sizes and each is called with
    the batch's ``global_tokens = N`` and ``global_seqs = B``, the micro-batch results add up
    to the whole-batch value exactly (up to float rounding). Without them, ``N`` and ``B`` are
    the micro-batch's own (a mean over the micro-batch, like Trinity's ``aggregate_loss``).

    ``B`` counts the sequences with at least one response token (``empty_seqs="skip"``, the
    default, as verl's ``agg_loss``: "exclude fully masked sequences"): a padding group or a
    masked member, whose mask is all zero, has zero loss weight under every mode and does not
    dilute the others, so a batch closed at the cap with k of K groups kept is not scaled by
    k / K. ``empty_seqs="count"`` counts every row (Trinity 0.6's ``aggregate_loss``:
    ``seq_losses.mean()`` over the micro-batch). ``token-mean`` is the same under both.

    Differences from the references: verl's and Trinity's ``seq-mean-token-sum-norm`` divide
    the token sum by ``L`` only (no ``1 / B``), which scales the loss by the batch size; ours
    follows the paper's ``1 / G`` and equals theirs divided by ``B``.

    Args:
        loss_mat: (B_mb, T) float. Per-token loss of this micro-batch.
        mask: (B_mb, T) bool or {0, 1}. Response tokens that count (0 on padding and on
            masked rollouts).
        mode: one of :data:`LOSS_AGG_MODES`.
        global_tokens: N, response tokens of the whole batch, finite, > 0 and at least this
            micro-batch's own count; default ``mask.sum()`` (``token-mean`` only).
        global_seqs: B, sequences of the whole batch (counted per ``empty_seqs``), finite, > 0
            and at least this micro-batch's own count; default the micro-batch's (``seq-*`` modes).
        norm_length: L in tokens, finite, > 0; required for ``seq-mean-token-sum-norm`` (keep it
            constant through training, e.g. the response budget ``max_tokens``).
        empty_seqs: ``"skip"`` or ``"count"``, see :data:`EmptySeqs`.
    Returns:
        () float, differentiable in ``loss_mat``. 0 for an empty mask without ``global_tokens``
        or ``global_seqs``.
    Raises:
        ValueError: unknown mode or ``empty_seqs``, shapes differ, a count or length that is not
            a finite number > 0, a global count below the micro-batch's own (the micro-batch
            would weigh more than the whole batch), or ``seq-mean-token-sum-norm`` without
            ``norm_length`` (names the parameter and value).
    """
    _check_agg_args(loss_mat, mask, mode, empty_seqs)
    for name, value in (("global_tokens", global_tokens), ("global_seqs", global_seqs), ("norm_length", norm_length)):
        if value is not None:
            check_number(name, value, gt=0.0)
    m = mask.to(loss_mat.dtype)
    masked = torch.where(m > 0, loss_mat, torch.zeros_like(loss_mat)) * m
    if mode == "token-mean":
        if global_tokens is None:
            return masked.sum() / m.sum().clamp(min=1.0)
        own = float(m.sum())
        if global_tokens < own:
            raise ValueError(
                f"global_tokens: {global_tokens!r} is below this micro-batch's own {own:g} response tokens "
                "(it must count the whole batch's)"
            )
        return masked.sum() / float(global_tokens)
    tokens = m.sum(dim=-1)
    counted = (tokens > 0).to(loss_mat.dtype) if empty_seqs == "skip" else torch.ones_like(tokens)
    if global_seqs is None:
        seqs = counted.sum().clamp(min=1.0)
    else:
        own = float(counted.sum())
        if global_seqs < own:
            raise ValueError(
                f"global_seqs: {global_seqs!r} is below this micro-batch's own {own:g} sequences "
                f"(empty_seqs={empty_seqs!r}; it must count the whole batch's)"
            )
        seqs = float(global_seqs)
    if mode == "seq-mean-token-mean":
        per_seq = masked.sum(dim=-1) / tokens.clamp(min=1.0)
        return per_seq.sum() / seqs
    if norm_length is None:
        raise ValueError("norm_length: seq-mean-token-sum-norm needs a fixed length L (e.g. the response budget max_tokens)")
    return masked.sum() / (seqs * float(norm_length))


BATCH_COUNTS = ("rows", "seqs", "tokens")
"""The columns of :func:`batch_loss_counts` / the ``counts`` of :func:`batch_share_loss`."""


def batch_loss_counts(mask: torch.Tensor) -> torch.Tensor:
    """The whole (mini-)batch's counts that every loss mode divides by, to carry with each row.

    Args:
        mask: (B, T) bool or {0, 1}. Response tokens that count (all zero on padding rows and
            masked members).
    Returns:
        (3,) float64: ``rows`` B (every row), ``seqs`` (rows with at least one response token),
        ``tokens`` N (response tokens). Columns in :data:`BATCH_COUNTS` order.
    Raises:
        ValueError: ``mask`` is not 2-D.
    """
    if mask.ndim != 2:
        raise ValueError(f"mask: expected a (B, T) matrix, got shape {tuple(mask.shape)}")
    tokens = mask.to(torch.float64).sum(dim=-1)
    return torch.stack([torch.tensor(float(mask.shape[0]), dtype=torch.float64), (tokens > 0).sum().to(torch.float64), tokens.sum()])


def batch_share_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: LossAggMode,
    counts: torch.Tensor,
    *,
    norm_length: float | None = None,
    empty_seqs: EmptySeqs = "skip",
) -> torch.Tensor:
    """This micro-batch's exact share of its whole batch's loss, each row normalised by the
    counts of the batch it belongs to (carried with the row, :func:`batch_loss_counts`).

    With row ``i`` of a batch of ``B_i`` counted sequences and ``N_i`` response tokens::

        token-mean               sum_i [sum_t m l] / N_i                 (DAPO Eq. 12)
        seq-mean-token-mean      sum_i c_i [sum_t m l / sum_t m] / B_i   (GRPO's per-sequence mean)
        seq-mean-token-sum-norm  sum_i c_i [sum_t m l] / (L B_i)         (Dr. GRPO, arXiv 2503.20783, Sec. 3.2)

    ``c_i`` is 1 for a row with response tokens, and for an empty row 1 under
    ``empty_seqs="count"`` (then ``B_i`` is ``rows``) and 0 under ``"skip"`` (``B_i`` is
    ``seqs``). Every term is a per-row quantity over a whole-batch constant, so the shares of
    any split of the batch into micro-batches (uneven, padding first, last or spread) add up to
    :func:`aggregate_loss` of the whole batch: verl's rule (``agg_loss`` with
    ``global_batch_info``: each micro-batch's loss divided by the global token or sequence
    count, the micro-batches summed, not averaged). Trinity 0.6's ``aggregate_loss`` divides by
    the micro-batch's own counts instead.

    Args:
        loss_mat: (B_mb, T) float. Per-token loss of this micro-batch.
        mask: (B_mb, T) bool or {0, 1}.
        mode: one of :data:`LOSS_AGG_MODES`.
        counts: (B_mb, 3) float. Per row, the ``rows``, ``seqs`` and ``tokens`` of its whole batch.
        norm_length: L, required for ``seq-mean-token-sum-norm``.
        empty_seqs: ``"skip"`` or ``"count"``, see :data:`EmptySeqs`.
    Returns:
        () float, differentiable in ``loss_mat``. 0 for rows whose batch has no token (or no
        counted sequence).
    Raises:
        ValueError: unknown mode or ``empty_seqs``, shapes differ, ``counts`` not (B_mb, 3) or
            holding a value that is negative or not finite, a row's count below what the row
            itself holds (a non-empty row of a batch of 0 tokens), or no ``norm_length`` for
            ``seq-mean-token-sum-norm``.
    """
    _check_agg_args(loss_mat, mask, mode, empty_seqs)
    c = torch.as_tensor(counts, dtype=torch.float64)
    if c.shape != (loss_mat.shape[0], 3):
        raise ValueError(f"counts: expected shape {(loss_mat.shape[0], 3)} (rows, seqs, tokens per row), got {tuple(c.shape)}")
    if not bool(torch.isfinite(c).all()) or bool((c < 0).any()):
        raise ValueError(f"counts: every count must be finite and >= 0, got {c.tolist()}")
    if mode == "seq-mean-token-sum-norm":
        if norm_length is None:
            raise ValueError("norm_length: seq-mean-token-sum-norm needs a fixed length L (e.g. the response budget max_tokens)")
        check_number("norm_length", norm_length, gt=0.0)
    m = mask.to(loss_mat.dtype)
    row_sum = (torch.where(m > 0, loss_mat, torch.zeros_like(loss_mat)) * m).sum(dim=-1)
    tokens = m.sum(dim=-1)
    if mode == "token-mean":
        divisor, own = c[:, 2], tokens
    else:
        divisor = c[:, 0] if empty_seqs == "count" else c[:, 1]
        own = torch.ones_like(tokens) if empty_seqs == "count" else (tokens > 0).to(tokens.dtype)
    short = (own.to(torch.float64) > divisor)
    if bool(short.any()):
        i = int(torch.nonzero(short)[0])
        raise ValueError(f"counts: row {i} holds {float(own[i]):g} of what its batch counts as {float(divisor[i]):g} "
                         f"({mode}, empty_seqs={empty_seqs!r}); the counts must be the whole batch's")
    if mode == "seq-mean-token-mean":
        row_sum = row_sum / tokens.clamp(min=1.0)
    elif mode == "seq-mean-token-sum-norm":
        row_sum = row_sum / float(norm_length)
    weight = torch.where(divisor > 0, 1.0 / divisor.clamp(min=1.0), torch.zeros_like(divisor)).to(loss_mat.dtype)
    return (row_sum * weight).sum()


def _check_clip_args(logprobs, old_logprobs, advantages, response_mask, eps_low, eps_high, dual_clip) -> None:
    """Raise ``ValueError`` naming the parameter for clip parameters that are not finite or out
    of range, or for tensors of different shapes."""
    check_number("eps_low", eps_low, ge=0.0, lt=1.0)
    check_number("eps_high", eps_high, ge=0.0)
    if dual_clip is not None:
        check_number("dual_clip", dual_clip, gt=1.0)
    shapes = {tuple(t.shape) for t in (logprobs, old_logprobs, advantages, response_mask)}
    if len(shapes) != 1:
        raise ValueError(f"logprobs, old_logprobs, advantages, response_mask shapes differ: {shapes}")


def clip_higher_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
    loss_agg_mode: LossAggMode = "token-mean",
    global_tokens: float | None = None,
    global_seqs: float | None = None,
    norm_length: float | None = None,
    empty_seqs: EmptySeqs = "skip",
    counts: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clip-higher PPO surrogate, token-level averaging by default (DAPO Eq. 10 and Sec. 3.1, 3.3).

    Per token, with ``ratio = exp(logprobs - old_logprobs)``::

        l = max(-A * ratio, -A * clip(ratio, 1 - eps_low, 1 + eps_high))

    and, when ``dual_clip = c`` (Ye et al. 2020, verl's ``clip_ratio_c``, typically 3), for
    ``A < 0`` only: ``l = min(l, -A * c)``. By default the loss is the mean over all response
    tokens of the batch (token-level policy-gradient loss, DAPO Eq. 12), not a mean of
    per-sequence means; ``loss_agg_mode`` and the global counts are passed to
    :func:`aggregate_loss` (exact across micro-batches).

    Args:
        logprobs, old_logprobs: (B, T) float. Per-token log-probabilities of the current and
            the behaviour policy.
        advantages: (B, T) float. Per-token advantages.
        response_mask: (B, T) bool or {0,1}. 1 on response tokens.
        eps_low, eps_high: clip range, ``0 <= eps_low < 1``, ``eps_high >= 0`` (paper: 0.2, 0.28).
        dual_clip: lower bound c > 1 on the ratio's effect for negative advantages, or None.
        loss_agg_mode, global_tokens, global_seqs, norm_length, empty_seqs: see :func:`aggregate_loss`.
        counts: (B, 3) float, or None. Each row's whole-batch ``rows``, ``seqs``, ``tokens``:
            the loss is then this micro-batch's share of its batch's loss
            (:func:`batch_share_loss`) and ``global_tokens`` / ``global_seqs`` must be None.
    Returns:
        loss: () float. The aggregated loss.
        clip_fraction: () float. Fraction of response tokens where the clip was active.
    Raises:
        ValueError: clip parameters not finite or out of range (names the parameter), or shapes differ.
    """
    _check_clip_args(logprobs, old_logprobs, advantages, response_mask, eps_low, eps_high, dual_clip)
    mask = response_mask.to(logprobs.dtype)
    # masked tokens: log-ratio 0 before exp, so a padding token with a huge log-ratio cannot give
    # inf * 0 = NaN in the loss or its gradient
    ratio = torch.exp(torch.where(response_mask.bool(), logprobs - old_logprobs, torch.zeros((), dtype=logprobs.dtype)))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    clip_active = (clipped > unclipped).to(logprobs.dtype)
    if dual_clip is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * dual_clip), loss)
    if counts is not None:
        if global_tokens is not None or global_seqs is not None:
            raise ValueError("counts: give either per-row counts or global_tokens / global_seqs, not both")
        agg = batch_share_loss(loss, mask, loss_agg_mode, counts, norm_length=norm_length, empty_seqs=empty_seqs)
    else:
        agg = aggregate_loss(
            loss, mask, loss_agg_mode, global_tokens=global_tokens, global_seqs=global_seqs, norm_length=norm_length,
            empty_seqs=empty_seqs,
        )
    return agg, (clip_active * mask).sum() / mask.sum().clamp(min=1.0)


def clip_higher_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    dual_clip: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clip-higher surrogate (DAPO Eq. 10), before aggregation.

    Same formula as :func:`clip_higher_policy_loss`. The log-ratio is set to 0 on masked
    tokens *before* the exponential, so a padding token with a huge log-ratio gives a
    finite (zero) loss and a zero gradient instead of ``inf * 0 = NaN``.

    Args:
        logprobs, old_logprobs, advantages: (B, T) float.
        response_mask: (B, T) bool or {0, 1}.
        eps_low, eps_high, dual_clip: as :func:`clip_higher_policy_loss`.
    Returns:
        loss: (B, T) float, 0 on masked tokens.
        flags: (B, T) float {0, 1} masks, 0 on masked tokens: ``clip_high`` (A > 0 and
        ratio > 1 + eps_high: the upper bound is active), ``clip_low`` (A < 0 and ratio <
        1 - eps_low), ``dual_clip`` (A < 0 and the dual-clip bound is active).
    Raises:
        ValueError: clip parameters out of range or shapes differ.
    """
    _check_clip_args(logprobs, old_logprobs, advantages, response_mask, eps_low, eps_high, dual_clip)
    mask = response_mask.bool()
    zero = torch.zeros((), dtype=logprobs.dtype)
    log_ratio = torch.where(mask, logprobs - old_logprobs, zero)
    adv = torch.where(mask, advantages.to(logprobs.dtype), zero)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    loss = torch.maximum(unclipped, clipped)
    flags = {
        "clip_high": (mask & (adv > 0) & (ratio > 1.0 + eps_high)).to(logprobs.dtype),
        "clip_low": (mask & (adv < 0) & (ratio < 1.0 - eps_low)).to(logprobs.dtype),
    }
    if dual_clip is not None:
        bound = -adv * dual_clip
        flags["dual_clip"] = (mask & (adv < 0) & (loss > bound)).to(logprobs.dtype)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    else:
        flags["dual_clip"] = torch.zeros_like(loss)
    return torch.where(mask, loss, zero), flags
