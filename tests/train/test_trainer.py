"""PolicyTrainer.train_on on the tiny FrozenLake Llama (transformers only, no engine)."""

from __future__ import annotations

import math

import pytest
import torch

from orchestrator.envs import frozenlake
from orchestrator.train.tiny import FROZENLAKE_ACTIONS, FROZENLAKE_CHARS, FROZENLAKE_TEMPLATE, build_tiny_llama
from orchestrator.train.trainer import PolicyTrainer, TrainerConfig


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("fl"), chars=FROZENLAKE_CHARS, chat_template=FROZENLAKE_TEMPLATE)


@pytest.fixture
def exps():
    letter = FROZENLAKE_CHARS.index("L") + 3  # after the 3 special tokens

    def act(prompts, choices):
        return [{"text": "L", "token_ids": [letter], "prompt_token_ids": [7, 4, 9], "logprobs": [-1.0]} for _ in prompts]

    return frozenlake.run_episodes(frozenlake.make_tasks(1), 2, act, max_steps=2, choices=FROZENLAKE_ACTIONS)


def test_train_on_rejects_a_nan_advantage_naming_task_run_and_step(model_dir, exps):
    trainer = PolicyTrainer(model_dir, TrainerConfig(mini_batches=1))
    before = [p.detach().clone() for p in trainer.model.parameters()]
    adv = torch.zeros(len(exps))
    adv[3] = math.nan
    e = exps[3]
    with pytest.raises(ValueError, match=rf"task {e.eid.task!r} run {e.eid.run} step {e.eid.step}"):
        trainer.train_on(exps, adv)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters()))


def test_train_on_rejects_advantages_of_the_wrong_length(model_dir, exps):
    with pytest.raises(ValueError, match=r"advantages: expected shape \(4,\) for 4 experiences, got \(3,\)"):
        PolicyTrainer(model_dir, TrainerConfig(mini_batches=1)).train_on(exps, torch.zeros(3))


def test_entropy_bonus_is_the_whole_loss_when_advantages_are_zero(model_dir, exps):
    # zero advantages: the clipped surrogate is 0, so loss = -coef * token-mean entropy
    m = PolicyTrainer(model_dir, TrainerConfig(mini_batches=1, entropy_coef=0.5)).train_on(exps, torch.zeros(len(exps)))
    assert m["entropy"] > 0
    assert m["loss"] == pytest.approx(-0.5 * m["entropy"], rel=1e-5)
    plain = PolicyTrainer(model_dir, TrainerConfig(mini_batches=1)).train_on(exps, torch.zeros(len(exps)))
    assert plain["loss"] == 0.0
