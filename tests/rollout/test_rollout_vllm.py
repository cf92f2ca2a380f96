"""A real vLLM engine in a Ray actor, on the tiny random model (orchestrator.rollout.engine).

One module-scoped fixture starts local Ray and one engine (30-60 s on two cores); every test
reuses the groups it produced.
"""

from __future__ import annotations

import pytest

from orchestrator.rollout.engine import VLLMRolloutSource, start_engine
from orchestrator.rollout.model import build_tiny_model, ensure_smollm2
from orchestrator.rollout.source import SamplingConfig
from orchestrator.tasks.generators import default_task_set

pytestmark = pytest.mark.slow

N = 4
MAX_TOKENS = 8
CHOICES = ["left", "down", "right", "up"]


@pytest.fixture(scope="module")
def engine(tmp_path_factory, ray_local):
    tiny = build_tiny_model(tmp_path_factory.mktemp("tiny"), ensure_smollm2())
    handle = start_engine(tiny, max_model_len=512)
    yield handle
    ray_local.kill(handle)


@pytest.fixture(scope="module")
def rollout(engine):
    ts = default_task_set(seed=0, size=3, mix={"parity": 1, "compare": 1, "champ": 1})
    src = VLLMRolloutSource(engine, ts, SamplingConfig(max_tokens=MAX_TOKENS, seed=0))
    tasks = [ts.get(i) for i in ts.task_ids]
    return ts, src, src.generate(tasks, N, model_version=3, round_tag="b0r0")


def _experiences(groups):
    return [e for g in groups for e in g.rollouts]


def test_one_group_per_task_in_order(rollout):
    ts, _, groups = rollout
    assert [g.task_id for g in groups] == ts.task_ids


def test_runs_are_0_to_n_minus_1(rollout):
    _, _, groups = rollout
    assert all([e.eid.run for e in g.rollouts] == list(range(N)) for g in groups)


def test_eid_carries_task_and_batch(rollout):
    _, _, groups = rollout
    assert all((e.eid.task, e.eid.round_tag, e.eid.step) == (g.task_id, "b0r0", 0) for g in groups for e in g.rollouts)


def test_prompt_length_matches_chat_template(rollout):
    ts, _, groups = rollout
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ensure_smollm2())
    for g in groups:
        text = tok.apply_chat_template(ts.get(g.task_id).prompt, add_generation_prompt=True, tokenize=False)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert all(e.prompt_length == len(ids) and e.tokens[: e.prompt_length] == ids for e in g.rollouts)


def test_logprobs_one_per_response_token(rollout):
    _, _, groups = rollout
    assert all(len(e.logprobs) == len(e.tokens) - e.prompt_length == e.metrics["response_length"]
               for e in _experiences(groups))


def test_response_within_budget(rollout):
    _, _, groups = rollout
    assert all(1 <= e.metrics["response_length"] <= MAX_TOKENS for e in _experiences(groups))


def test_logprobs_non_positive(rollout):
    _, _, groups = rollout
    assert max(lp for e in _experiences(groups) for lp in e.logprobs) <= 0.0


def test_model_version_in_info_and_group(rollout):
    _, _, groups = rollout
    assert all(g.model_version == 3 and all(e.info["model_version"] == 3 for e in g.rollouts) for g in groups)


def test_reward_is_rule_reward_of_text(rollout):
    ts, _, groups = rollout
    for g in groups:
        for e in g.rollouts:
            reward, metrics = ts.score(ts.get(g.task_id), e.response_text)
            assert (e.reward, e.metrics["accuracy"]) == (reward, metrics["accuracy"])


def test_same_seed_and_tag_reproduce_samples(rollout):
    ts, src, groups = rollout
    again = src.generate([ts.get(ts.task_ids[0])], N, model_version=3, round_tag="b0r0")
    assert [e.tokens for e in again[0].rollouts] == [e.tokens for e in groups[0].rollouts]


def test_chat_choice_returns_one_of_the_choices(engine):
    import ray

    prompts = [[{"role": "user", "content": f"Move {i}: which way?"}] for i in range(6)]
    out = ray.get(engine.chat_choice.remote(prompts, CHOICES, 1.0, 0))
    assert len(out) == 6 and all(o["text"] in CHOICES for o in out)


def test_chat_choice_logprobs_match_tokens(engine):
    import ray

    out = ray.get(engine.chat_choice.remote([[{"role": "user", "content": "Go?"}]], CHOICES, 1.0, 1))[0]
    assert len(out["logprobs"]) == len(out["token_ids"]) >= 1 and max(out["logprobs"]) <= 0.0


def test_orchestrator_actor_fills_batch_from_real_engine(engine, tmp_path):
    """The main path end to end: orchestrator actor -> vLLM engine actor -> sink.

    A random tiny model answers at random, so most groups are all-wrong; the policy keeps
    every group (band-free filter on a constant-free value: response length) so the batch
    contents can be checked exactly.
    """
    import ray

    from orchestrator.service.actor import get_or_create_orchestrator
    from orchestrator.service.sink import SQLiteSink

    ts = default_task_set(seed=1, size=6, mix={"parity": 1, "compare": 1})
    src = VLLMRolloutSource(engine, ts, SamplingConfig(max_tokens=MAX_TOKENS, seed=0))
    policy = {"target_groups": 2, "group_size": N, "max_replenish_rounds": 2, "filter": {"judge": "accuracy"}}
    actor = get_or_create_orchestrator(policy, ts, src, sink=SQLiteSink(tmp_path / "b.db"), name="dso-vllm-e2e")
    try:
        batch = ray.get(actor.next_batch.remote())
        stats = ray.get(actor.get_stats.remote())
    finally:
        ray.kill(actor)
    assert len(batch.groups) == 2  # exact size: informative groups, or padding at the cap
    assert batch.rounds <= 2 and (batch.num_padding == 0 or batch.rounds == 2)
    for g in batch.groups:
        assert g.task_id in ts and [e.eid.run for e in g.rollouts] == list(range(N))
        assert g.reason in ("informative", "all_wrong", "all_correct") and g.padding == (g.reason != "informative")
        for e in g.rollouts:
            assert e.reward in (1.0, -1.0) and e.metrics["accuracy"] == (e.reward > 0)
            assert len(e.tokens) - e.prompt_length == len(e.logprobs) <= MAX_TOKENS
    rows = SQLiteSink(tmp_path / "b.db").read_batch(0)
    assert len(rows) == 2 * N and {r["task"] for r in rows} == {g.task_id for g in batch.groups}
    assert stats.groups_submitted == stats.groups_emitted + stats.groups_padded + stats.groups_dropped + stats.groups_held
