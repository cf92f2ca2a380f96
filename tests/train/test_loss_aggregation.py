"""Loss aggregation in the trainer's path (per-token surrogate, then ``aggregate_loss``) and
through Trinity's policy-loss registry: exact across uneven micro-batches; masked tokens
cannot produce NaN. (Hand-computed aggregation values: tests/algos/test_dapo.py.)"""

from __future__ import annotations

import os

os.environ.setdefault("VLLM_PLUGINS", "none")

import pytest
import torch

from algos.dapo import LOSS_AGG_MODES, aggregate_loss, clip_higher_policy_loss, clip_higher_token_loss


def _batch(seed=0, B=7, T=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([1, 9, 2, 7, 3, 8, 5])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logits = torch.randn(B, T, generator=g, dtype=torch.float64)
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) - 0.1
    adv = torch.randn(B, 1, generator=g, dtype=torch.float64).expand(B, T).contiguous()
    return logits, old, adv, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_uneven_micro_batches_sum_to_the_single_batch_loss_and_gradient(mode):
    logits, old, adv, mask = _batch()
    splits = [slice(0, 1), slice(1, 5), slice(5, 7)]  # 1, 21 and 13 response tokens

    def loss_of(rows, **totals):
        lp = torch.nn.functional.logsigmoid(logits[rows]) + 0.3 * old[rows]  # any differentiable log-prob
        tok, _ = clip_higher_token_loss(lp, old[rows], adv[rows], mask[rows])
        return aggregate_loss(tok, mask[rows], mode, norm_length=9, **totals)

    logits.requires_grad_(True)
    full = loss_of(slice(None))
    (g_full,) = torch.autograd.grad(full, logits)
    totals = {"global_tokens": float(mask.sum()), "global_seqs": float(mask.shape[0])}
    parts = [loss_of(s, **totals) for s in splits]
    (g_parts,) = torch.autograd.grad(sum(parts), logits)
    assert float(sum(parts).detach()) == pytest.approx(float(full.detach()), rel=1e-12, abs=1e-12)
    assert torch.allclose(g_parts, g_full, rtol=1e-12, atol=1e-12)
    # the per-micro-batch mean with equal weights (what a naive loop does) is not exact here
    naive = sum(aggregate_loss(clip_higher_token_loss(torch.nn.functional.logsigmoid(logits[s]) + 0.3 * old[s], old[s],
                                                      adv[s], mask[s])[0], mask[s], mode, norm_length=9) for s in splits) / 3
    if mode != "seq-mean-token-sum-norm":
        assert abs(float(naive.detach()) - float(full.detach())) > 1e-3


def test_masked_token_with_huge_log_ratio_gives_zero_loss_and_zero_grad():
    lp = torch.tensor([[-0.5, 1000.0]], requires_grad=True)
    old = torch.tensor([[-0.5, -1000.0]])
    adv = torch.tensor([[-2.0, -2.0]])
    mask = torch.tensor([[True, False]])
    tok, flags = clip_higher_token_loss(lp, old, adv, mask, dual_clip=3.0)
    loss = aggregate_loss(tok, mask)
    loss.backward()
    assert loss.item() == pytest.approx(2.0)  # -A * ratio = 2 * 1 on the one real token
    assert tok[0, 1].item() == 0.0
    assert lp.grad[0, 1].item() == 0.0
    assert torch.isfinite(lp.grad).all()
    assert flags["clip_low"].sum() == 0


def test_clip_flags_count_upper_and_lower_bounds():
    # ratios e^0.4 = 1.49 (A > 0: upper clip), e^-0.4 = 0.67 (A < 0: lower clip), 1.0 (none)
    lp = torch.tensor([[0.4, -0.4, 0.0]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 1.0]])
    tok, flags = clip_higher_token_loss(lp, old, adv, torch.ones(1, 3, dtype=torch.bool))
    assert flags["clip_high"].tolist() == [[1.0, 0.0, 0.0]]
    assert flags["clip_low"].tolist() == [[0.0, 1.0, 0.0]]
    assert tok[0].tolist() == pytest.approx([-1.28, 0.8, -1.0])  # -A * clip(ratio): -1.28, +0.8; -1 * 1


# --------------------------------------------------------------------- Trinity's registry
def test_trinity_registry_loss_with_the_configured_micro_batch_scale_is_the_exact_token_mean(tmp_path):
    """``dso_clip_higher`` from Trinity's ``POLICY_LOSS_FN`` on micro-batches of 1, 21 and 13
    tokens. With ``trainer.fix_actor_microbatch_loss_scale`` (set by our ``check_config``),
    Trinity's dp_actor scales each micro-batch loss by ``its tokens / mini-batch tokens``
    (trinity/trainer/verl_legacy/dp_actor.py, ``update_policy``); the sum is then the
    single-batch token mean. Trinity's default scale ``1 / gradient_accumulation`` is not."""
    from omegaconf import OmegaConf
    from trinity.algorithm import POLICY_LOSS_FN
    from trinity.common.config import Config

    from orchestrator.trinity.algorithms import DsoDAPOAlgorithm
    from orchestrator.trinity.loss import DsoClipHigherPolicyLossFn

    path = tmp_path / "c.yaml"
    path.write_text("algorithm: {algorithm_type: dso_dapo, repeat_times: 4}\n"
                    "data_processor: {experience_pipeline: {operators: [{name: dso_orchestrator}]}}\n"
                    "synchronizer: {sync_style: trainer_driven, sync_method: nccl}\n")
    cfg = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), OmegaConf.load(path)))
    assert cfg.trainer.fix_actor_microbatch_loss_scale is False  # Trinity's default
    DsoDAPOAlgorithm.check_config(cfg)
    assert cfg.trainer.fix_actor_microbatch_loss_scale is True

    fn = POLICY_LOSS_FN.get("dso_clip_higher")(**DsoClipHigherPolicyLossFn.default_args())
    logits, old, adv, mask = _batch()
    lp = torch.nn.functional.logsigmoid(logits) + 0.3 * old
    full, _ = fn(logprob=lp, old_logprob=old, action_mask=mask, advantages=adv)
    assert float(full) == pytest.approx(float(clip_higher_policy_loss(lp, old, adv, mask)[0]))
    splits = [slice(0, 1), slice(1, 5), slice(5, 7)]
    mini_tokens = mask.sum().double()
    fixed = sum(fn(logprob=lp[s], old_logprob=old[s], action_mask=mask[s], advantages=adv[s])[0] * (mask[s].sum() / mini_tokens)
                for s in splits)
    default = sum(fn(logprob=lp[s], old_logprob=old[s], action_mask=mask[s], advantages=adv[s])[0] / len(splits)
                  for s in splits)
    assert float(fixed) == pytest.approx(float(full), rel=1e-12)
    assert abs(float(default) - float(full)) > 1e-3
