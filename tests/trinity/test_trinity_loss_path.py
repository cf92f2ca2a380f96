"""``dso_clip_higher`` through Trinity's actor loss paths: the loss and gradient of a mini-batch do
not depend on its micro-batch size or on where its padding rows fall."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from trinity.algorithm import POLICY_LOSS_FN
from trinity.common.experience import EID, Experience

import orchestrator.trinity.plugin  # noqa: F401  (registers dso_clip_higher)
from algos.dapo import LOSS_AGG_MODES
from orchestrator.trinity.loss import COUNTS_FIELD
from orchestrator.trinity.operator import stamp_batch_counts

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
VERL = Path(sys.prefix) / "verl-engine"
CASES = [(m, e) for m in LOSS_AGG_MODES for e in ("skip", "count")]


# ------------------------------------------------------------------ verl >= 0.8: the engine path
@pytest.fixture(scope="module")
def engine_results() -> dict:
    """Every case of ``verl_engine_loss.py`` (Trinity's ``TrinityPolicyLoss`` in verl 0.8's
    micro-batch loop), run once in a process that has verl 0.8.0 on its path."""
    if not (VERL / "verl").is_dir():
        pytest.skip(f"verl 0.8.0 is not in {VERL}: `make install` puts it there")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), os.environ.get("PYTHONPATH", ""), str(VERL)]))
    out = subprocess.run([sys.executable, str(HERE / "verl_engine_loss.py")], env=env, capture_output=True, text=True,
                         timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


@pytest.mark.parametrize("mode,empty", CASES)
@pytest.mark.parametrize("placement", ["first", "last", "spread"])
def test_engine_path_micro_batches_give_the_whole_mini_batch_loss_and_gradient(engine_results, mode, empty, placement):
    whole_loss, whole_grad = engine_results[f"{mode}/{empty}/{placement}/6"]
    assert whole_loss != 0.0 and any(g != 0.0 for g in whole_grad)
    scale = max(abs(g) for g in whole_grad)
    for micro in (1, 2, 3):
        loss, grad = engine_results[f"{mode}/{empty}/{placement}/{micro}"]
        assert loss == pytest.approx(whole_loss, rel=1e-6), f"micro-batches of {micro}"
        assert max(abs(a - b) for a, b in zip(grad, whole_grad)) <= 1e-6 * scale, f"micro-batches of {micro}"


# ------------------------------------------------------------------ hand-computed small case
def exp(task: str, run: int, n: int, *, padding: bool = False) -> Experience:
    return Experience(eid=EID(batch=0, task=task, run=run), tokens=torch.arange(1, n + 2), prompt_length=1,
                      logprobs=torch.zeros(n), reward=0.0, action_mask=torch.zeros(n) if padding else torch.ones(n),
                      advantages=torch.zeros(n), info={"dso_padding": True} if padding else {})


def test_the_operator_stamps_the_released_batchs_counts_and_trinitys_custom_field():
    exps = [exp("a", 0, 1), exp("a", 1, 3), exp("p", 0, 2, padding=True), exp("p", 1, 1, padding=True)]
    stamp_batch_counts(exps)
    assert [e.info[COUNTS_FIELD] for e in exps] == [[4.0, 2.0, 4.0]] * 4  # 4 rows, 2 with tokens, 1 + 3 tokens
    assert {(f.source_field, f.destination_field, f.data_type) for e in exps for f in e.custom_fields} == {
        (COUNTS_FIELD, COUNTS_FIELD, torch.float32)}


def test_the_counts_survive_trinitys_queue_serialisation():
    exps = [exp("a", 0, 2), exp("p", 0, 1, padding=True)]
    stamp_batch_counts(exps)
    back = Experience.deserialize_many(Experience.serialize_many(exps))
    assert [e.info[COUNTS_FIELD] for e in back] == [[2.0, 1.0, 2.0]] * 2
    assert [[(f.source_field, f.data_type) for f in e.custom_fields] for e in back] == [[(COUNTS_FIELD, torch.float32)]] * 2


def legacy_update(fn, lp, old, adv, mask, micro: int, counts: torch.Tensor | None, token_fix: bool) -> torch.Tensor:
    """Trinity 0.6's ``trinity/trainer/verl_legacy/dp_actor.py`` ``update_policy`` on one
    mini-batch (verl < 0.8, one rank): ``micro_batches = mini_batch.split(micro)``, each
    micro-batch's policy loss times ``1 / gradient_accumulation`` (``micro / mini``), or with
    ``fix_actor_microbatch_loss_scale`` and token-mean ``tokens / mini-batch tokens``, summed.
    (verl < 0.8 does not install beside Trinity 0.6 here: this is that loop, line for line.)"""
    rows = lp.shape[0]
    ga = rows // micro
    mini_tokens = mask.sum()
    total = torch.zeros(())
    for s in range(0, rows, micro):
        sl = slice(s, s + micro)
        kw = {COUNTS_FIELD: counts[sl]} if counts is not None else {}
        loss, _ = fn(logprob=lp[sl], old_logprob=old[sl], action_mask=mask[sl], advantages=adv[sl], **kw)
        scale = mask[sl].sum() / mini_tokens if token_fix else 1.0 / ga
        total = total + loss * scale
    return total


def small_batch():
    """Two kept rows (2 and 1 response tokens, per-token losses -A * ratio = 1, 2 | 4 with
    ratio 1) and two padding rows, padding last."""
    lp = torch.zeros((4, 2), dtype=torch.float64, requires_grad=True)
    old = torch.zeros((4, 2), dtype=torch.float64)
    adv = torch.tensor([[-1.0, -2.0], [-4.0, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0], [0, 0], [0, 0]], dtype=torch.float64)
    return lp, old, adv, mask


def test_seq_mean_with_padding_last_in_two_micro_batches_by_hand():
    """seq-mean-token-mean, skip: the whole mini-batch's loss is ((1 + 2) / 2 + 4 / 1) / 2 = 2.75
    (the two padding rows count for nothing). Trinity's legacy actor with micro-batches of 2:
    before, the kept micro-batch's own mean 2.75 and the padding one's 0, each times 1/2: 1.375,
    the un-padded loss scaled by k / K = 1/2. With the counts: 2.75."""
    fn = POLICY_LOSS_FN.get("dso_clip_higher")(loss_agg_mode="seq-mean-token-mean", loss_agg_empty_seqs="skip")
    fn.convention = "legacy"  # as under verl < 0.8
    lp, old, adv, mask = small_batch()
    before = legacy_update(fn, lp, old, adv, mask, 2, None, token_fix=False)
    assert float(before) == pytest.approx(1.375)
    counts = torch.tensor([[4.0, 2.0, 3.0]] * 4)
    after = legacy_update(fn, lp, old, adv, mask, 2, counts, token_fix=False)
    assert float(after) == pytest.approx(2.75)


def test_three_kept_rows_and_one_padding_row_weigh_each_kept_row_equally_by_hand():
    """seq-mean-token-mean, skip, micro-batches of 2, rows [a, b | c, pad] with per-row means
    1, 2, 4: the whole loss is (1 + 2 + 4) / 3 = 7/3. Before: (1.5 + 4) / 2 = 2.75 (row c
    weighted twice). With the counts: 7/3, under both trainer conventions."""
    fn = POLICY_LOSS_FN.get("dso_clip_higher")(loss_agg_mode="seq-mean-token-mean")
    lp = torch.zeros((4, 1), dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[-1.0], [-2.0], [-4.0], [0.0]], dtype=torch.float64)
    mask = torch.tensor([[1], [1], [1], [0]], dtype=torch.float64)
    counts = torch.tensor([[4.0, 3.0, 3.0]] * 4)
    fn.convention = "legacy"
    assert float(legacy_update(fn, lp, lp.detach(), adv, mask, 2, None, False)) == pytest.approx(2.75)
    assert float(legacy_update(fn, lp, lp.detach(), adv, mask, 2, counts, False)) == pytest.approx(7 / 3)
    fn.convention = "sum"  # verl >= 0.8: micro-batch losses summed as returned
    summed = sum(fn(logprob=lp[s], old_logprob=lp.detach()[s], action_mask=mask[s], advantages=adv[s],
                    **{COUNTS_FIELD: counts[s]})[0] for s in (slice(0, 2), slice(2, 4)))
    assert float(summed) == pytest.approx(7 / 3)


@pytest.mark.parametrize("mode,empty", CASES)
@pytest.mark.parametrize("order", [[2, 3, 0, 1], [0, 1, 2, 3], [0, 2, 1, 3]], ids=["first", "last", "spread"])
@pytest.mark.parametrize("micro", [1, 2, 4])
def test_legacy_path_micro_batches_give_the_whole_mini_batch_loss_and_gradient(mode, empty, order, micro):
    """verl < 0.8 (``dp_actor.update_policy``, with ``fix_actor_microbatch_loss_scale`` for
    token-mean as our ``check_config`` sets it): the sum over micro-batches of 1, 2 and 4 rows
    equals the whole mini-batch's loss and gradient, padding placed first, last or spread."""
    args = {"loss_agg_mode": mode, "loss_agg_empty_seqs": empty}
    if mode == "seq-mean-token-sum-norm":
        args["loss_agg_norm_length"] = 2
    fn = POLICY_LOSS_FN.get("dso_clip_higher")(**args)
    fn.convention = "legacy"
    lp, old, adv, mask = small_batch()
    idx = torch.tensor(order)
    counts = torch.tensor([[4.0, 2.0, 3.0]] * 4)
    base = torch.tensor([[0.1, -0.3], [0.2, 0.0], [0.0, 0.0], [0.0, 0.0]], dtype=torch.float64)
    results = []
    for m in (4, micro):
        leaf = base[idx].clone().requires_grad_(True)
        loss = legacy_update(fn, leaf, old[idx], adv[idx], mask[idx], m, counts, token_fix=mode == "token-mean")
        loss.backward()
        results.append((float(loss), leaf.grad.clone()))
    (whole, g_whole), (split, g_split) = results
    assert whole != 0.0
    assert split == pytest.approx(whole, rel=1e-9)
    assert torch.allclose(g_split, g_whole, rtol=1e-9, atol=1e-12)
