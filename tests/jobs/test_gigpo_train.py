"""The GiGPO training job end to end: real vLLM engine, real orchestrator actor and anchor index
(memory and Redis), real advantage workers, real trainer and weight sync, on the tiny FrozenLake policy."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families
from transformers import AutoTokenizer

from orchestrator.envs import frozenlake
from orchestrator.jobs.gigpo_compare import ARMS, arm_config
from orchestrator.jobs.gigpo_train import GiGPOTrainConfig, run_gigpo_training
from orchestrator.train.tiny import FROZENLAKE_ACTIONS, FROZENLAKE_CHARS, FROZENLAKE_TEMPLATE, build_tiny_llama


def _samples(text: str) -> dict:
    return {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples}


@pytest.fixture(scope="module")
def tiny_frozenlake(tmp_path_factory):
    return build_tiny_llama(tmp_path_factory.mktemp("fl"), chars=FROZENLAKE_CHARS, chat_template=FROZENLAKE_TEMPLATE)


def test_the_frozenlake_policy_sees_the_grid_as_one_row_string(tiny_frozenlake):
    tok = AutoTokenizer.from_pretrained(tiny_frozenlake)
    prompt = frozenlake.make_prompt(["SFFF", "FHFH", "FFFH", "HFFG"], 1, 2)
    assert tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True) == "SFFF|FHPH|FFFH|HFFG="
    assert [tok.convert_ids_to_tokens(tok.convert_tokens_to_ids(a)) for a in FROZENLAKE_ACTIONS] == list(FROZENLAKE_ACTIONS)


def test_comparison_arms_change_only_what_they_name(tmp_path):
    base = arm_config("gigpo", 1, tmp_path)
    assert base.gigpo.omega == 1.0 and base.gigpo.norm == "std" and base.advantage == "gigpo" and base.trainer.seed == 1
    assert arm_config("omega0", 1, tmp_path).gigpo.omega == 0.0
    assert arm_config("multi_step_grpo", 1, tmp_path).advantage == "multi_step_grpo"
    assert arm_config("gigpo_norm_none", 1, tmp_path).gigpo.norm == "none"
    assert set(ARMS) == {"gigpo", "omega0", "multi_step_grpo", "gigpo_norm_none"}


def _short(tmp_path, **kw) -> GiGPOTrainConfig:
    # 2 steps of 4 maps x 4 runs; warm start kept short; its own cache directory
    return GiGPOTrainConfig(out_dir=tmp_path / "run", train_maps=4, heldout_maps=4, n=4, max_turns=6, warm_steps=5,
                            rollout_budget=32, eval_every=1, eval_runs=2, **kw)


@pytest.mark.slow
def test_a_short_gigpo_run_trains_through_the_orchestrators_memory_index(tmp_path, monkeypatch, ray_local):
    monkeypatch.setenv("TRINITY_DSO_CACHE", str(tmp_path / "cache"))
    s = run_gigpo_training(_short(tmp_path))
    assert s["backend"] == "memory" and s["steps_done"] == 2 and s["trajectories"] == 32
    assert s["sync"]["count"] == 2 and s["sync"]["max_abs_diff"] <= 1e-3
    first = s["steps"][0]
    # the 4 runs of a map all start on its start cell: at least those steps share an anchor group
    assert first["anchor_group_fraction"] >= 16 / (16 * first["episode_length"]) - 1e-9
    assert first["model_version"] == 1 and s["steps"][1]["model_version"] == 2
    assert all(st["max_abs_diff_vs_pure"] <= 1e-9 for st in s["steps"])
    assert len(s["evals"]) == 3 and (tmp_path / "run" / "gigpo_curves.png").is_file()
    m = _samples((tmp_path / "run" / "metrics.prom").read_text())
    assert m[("dso_train_steps_total", frozenset())] == 2
    assert m[("dso_gigpo_anchor_group_fraction", frozenset())] == pytest.approx(s["steps"][-1]["anchor_group_fraction"])
    assert m[("dso_anchor_group_size_count", frozenset())] > 0  # the index's groups, recorded at each batch drop


@pytest.mark.slow
def test_a_short_gigpo_run_uses_redis_when_configured_and_leaves_no_batch_behind(tmp_path, monkeypatch, ray_local, redis_url):
    import redis

    monkeypatch.setenv("TRINITY_DSO_CACHE", str(tmp_path / "cache"))
    s = run_gigpo_training(_short(tmp_path, redis_url=redis_url, advantage="multi_step_grpo"))
    assert s["backend"] == "redis" and s["steps_done"] == 2
    client = redis.Redis.from_url(redis_url)
    prefix = s["anchor_prefix"]
    assert prefix.startswith("dso:gigpo-train-")
    assert [k for k in client.scan_iter(match=f"{prefix}:*", count=1000) if b"{" in k] == []  # every batch dropped
