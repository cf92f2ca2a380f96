"""TrinityBatchTrainer on hand-made Trinity experiences and the tiny Llama (transformers only, no engine)."""

from __future__ import annotations

import pytest
import torch
from trinity.common.experience import EID, Experience

import orchestrator.trinity.plugin  # noqa: F401  (registers dso_grpo and dso_clip_higher)
from algos.dapo import LOSS_AGG_MODES
from orchestrator.train.tiny import build_tiny_llama
from orchestrator.train.trainer import PolicyTrainer, TrainerConfig
from orchestrator.train.trinity_trainer import TrinityBatchTrainer, TrinityStepConfig, pack_trinity


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("tiny"), hidden=64, layers=1)


def exp(task: str, run: int, prompt: list[int], response: list[int], reward: float, *, padding: bool = False) -> Experience:
    mask = torch.zeros(len(response)) if padding else torch.ones(len(response))
    return Experience(eid=EID(batch=0, task=task, run=run), tokens=torch.tensor(prompt + response),
                      logprobs=torch.full((len(response),), -2.0), prompt_length=len(prompt), reward=reward,
                      action_mask=mask, advantages=torch.zeros(len(response)),
                      info={"dso_padding": True} if padding else {})


def batch() -> list[Experience]:
    # two groups of 2 with uneven response lengths (1..4 tokens), one padding group of 2
    return [exp("a", 0, [5, 6], [7], 1.0), exp("a", 1, [5, 6], [8, 9, 10], -1.0),
            exp("b", 0, [6], [7, 7], 1.0), exp("b", 1, [6], [9, 9, 9, 2], -1.0),
            exp("p", 0, [5], [7, 8], 1.0, padding=True), exp("p", 1, [5], [9], -1.0, padding=True)]


def test_pack_puts_each_response_token_at_its_next_token_position():
    data = pack_trinity(batch()[:2])
    # tokens [5 6 7] and [5 6 8 9 10]: response token t is predicted at position prompt_length - 1 + t
    assert data["positions"].tolist() == [[1, 0, 0], [1, 2, 3]]
    assert data["action_mask"].tolist() == [[True, False, False], [True, True, True]]
    assert data["input_ids"].tolist() == [[5, 6, 7, 0, 0], [5, 6, 8, 9, 10]]


def placed(order: str) -> list[Experience]:
    """``batch()`` with its padding group first, last (as released) or spread among the kept rows."""
    b = batch()
    kept, pad = b[:4], b[4:]
    return {"first": pad + kept, "last": kept + pad, "spread": [kept[0], pad[0], kept[1], kept[2], pad[1], kept[3]]}[order]


def grads(model_dir, micro: int, *, mode: str = "token-mean", empty: str = "skip", order: str = "last") -> tuple[float, list]:
    args = {"loss_agg_mode": mode, "loss_agg_empty_seqs": empty}
    if mode == "seq-mean-token-sum-norm":
        args["loss_agg_norm_length"] = 4
    policy = PolicyTrainer(model_dir, TrainerConfig(mini_batches=1))
    trainer = TrinityBatchTrainer(policy, TrinityStepConfig(train_batch_size=6, mini_batches=1, micro_batch_size=micro,
                                                            policy_loss_fn_args=args))
    metrics = trainer.train(placed(order))
    assert metrics["padding_groups"] == 1 and metrics["padding_tokens"] == 0 and metrics["tokens"] == 10
    return metrics["loss"], [p.grad.clone() for p in policy.model.parameters()]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("empty", ["skip", "count"])
@pytest.mark.parametrize("order", ["first", "last", "spread"])
def test_micro_batches_give_the_whole_mini_batch_loss_and_gradient(model_dir, mode, empty, order):
    """Micro-batches of 1, 2 and 3 rows (uneven tokens, padding-only micro-batches among them)
    against the whole mini-batch of 6, for every loss mode, both empty-sequence rules and every
    padding placement: the same loss and gradient to 1e-6 relative."""
    whole_loss, whole = grads(model_dir, 6, mode=mode, empty=empty, order=order)
    scale = max(float(g.abs().max()) for g in whole)
    assert scale > 0
    for micro in (1, 2, 3):
        loss, split = grads(model_dir, micro, mode=mode, empty=empty, order=order)
        assert loss == pytest.approx(whole_loss, rel=1e-6), f"micro-batches of {micro}"
        assert max(float((a - b).abs().max()) for a, b in zip(whole, split)) <= 1e-6 * scale, f"micro-batches of {micro}"


def test_padding_rows_leave_the_seq_mean_loss_of_the_kept_rows_unchanged(model_dir):
    """skip: the padding group is out of the sequence count, so the batch's seq-mean loss is
    that of its four kept rows alone, micro-batches of 2 with the padding last included."""
    b = batch()
    args = {"loss_agg_mode": "seq-mean-token-mean"}
    with_padding = TrinityBatchTrainer(PolicyTrainer(model_dir, TrainerConfig(mini_batches=1)),
                                       TrinityStepConfig(train_batch_size=6, mini_batches=1, micro_batch_size=2,
                                                         policy_loss_fn_args=args)).train(b)
    alone = TrinityBatchTrainer(PolicyTrainer(model_dir, TrainerConfig(mini_batches=1)),
                                TrinityStepConfig(train_batch_size=4, mini_batches=1, micro_batch_size=4,
                                                  policy_loss_fn_args=args)).train(batch()[:4])
    assert with_padding["loss"] == pytest.approx(alone["loss"], rel=1e-6)


def test_advantages_come_from_trinitys_registry_and_padding_gets_none(model_dir):
    policy = PolicyTrainer(model_dir, TrainerConfig(mini_batches=1))
    trainer = TrinityBatchTrainer(policy, TrinityStepConfig(train_batch_size=6))
    exps = batch()
    metrics = trainer.train(exps)
    by = {(e.eid.task, e.eid.run): e for e in exps}
    # GRPO: rewards (1, -1) -> mean 0, unbiased std sqrt(2): advantages +-1/sqrt(2) on every token
    assert by[("a", 0)].advantages.tolist() == pytest.approx([2 ** -0.5], abs=1e-5)
    assert by[("b", 1)].advantages.tolist() == pytest.approx([-(2 ** -0.5)] * 4, abs=1e-5)
    assert by[("p", 0)].advantages.tolist() == [0.0, 0.0]  # zero action mask: zero token advantage
    assert metrics["advantage_max_abs_diff"] == pytest.approx(2 ** -0.5, abs=1e-5)  # the inputs carried zeros


def test_a_batch_of_the_wrong_size_is_refused(model_dir):
    trainer = TrinityBatchTrainer(PolicyTrainer(model_dir, TrainerConfig(mini_batches=1)), TrinityStepConfig(train_batch_size=8))
    with pytest.raises(ValueError, match="6 experiences, train_batch_size is 8"):
        trainer.train(batch())


def test_a_batch_of_padding_only_leaves_the_weights_as_they_were(model_dir):
    # an orchestrator releases such a batch when its replenish rounds found no informative group
    policy = PolicyTrainer(model_dir, TrainerConfig(mini_batches=1))
    trainer = TrinityBatchTrainer(policy, TrinityStepConfig(train_batch_size=2))
    before = [p.detach().clone() for p in policy.model.parameters()]
    metrics = trainer.train(batch()[4:])
    assert (metrics["padding_groups"], metrics["tokens"]) == (1, 0.0)
    assert all(torch.equal(a, p) for a, p in zip(before, policy.model.parameters()))
