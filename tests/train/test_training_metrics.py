"""Training metrics reach the orchestrator actor and its Prometheus exposition."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from orchestrator.core.policy import ResamplingPolicy
from orchestrator.rollout.scripted import ScriptedTasks
from orchestrator.service.actor import Orchestrator
from orchestrator.service.metrics import DSOMetrics

ROOT = Path(__file__).resolve().parents[2]


def _samples(text: str) -> dict:
    return {(s.name, frozenset(s.labels.items())): s.value for f in text_string_to_metric_families(text) for s in f.samples}


def test_training_gauges_are_absent_until_a_trainer_reports():
    s = _samples(DSOMetrics().exposition())
    assert s[("dso_train_steps_total", frozenset())] == 0
    assert not [k for k in s if k[0] in ("dso_train_heldout_accuracy", "dso_train_pg_clipfrac", "dso_train_entropy_nats")]


def test_report_training_is_exported_by_the_actor():
    actor = Orchestrator(ResamplingPolicy(target_groups=1, group_size=2), ScriptedTasks(["t0"]), metrics=DSOMetrics())
    row = {"entropy": 0.4, "pg_clipfrac": 0.02, "pg_clipfrac_lower": 0.05, "kl_ref": 0.1, "reward_mean": 0.25,
           "reward_std_group": 0.8, "heldout_acc": 0.55, "model_version": 3, "sync_seconds": 0.01, "dropped": {"x": 1}}
    actor.report_training(3, row)
    actor.report_training(4, {**row, "model_version": 4})
    s = _samples(asyncio.run(actor.metrics_text()))
    assert s[("dso_train_steps_total", frozenset())] == 2
    assert s[("dso_train_heldout_accuracy", frozenset())] == 0.55
    assert s[("dso_train_model_version", frozenset())] == 4
    assert s[("dso_train_pg_clipfrac", frozenset({("bound", "lower")}))] == 0.05
    assert s[("dso_train_weight_sync_seconds_count", frozenset())] == 2
    assert actor.get_training()["step"] == 4 and "dropped" not in actor.get_training()


def test_dashboard_has_a_training_row_on_the_exported_names():
    dash = json.loads((ROOT / "deploy/grafana/dashboards/trinity-dso.json").read_text())
    rows = [p for p in dash["panels"] if p["type"] == "row"]
    assert any("Training" in r["title"] for r in rows)
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for name in ("dso_train_heldout_accuracy", "dso_train_entropy_nats", "dso_train_kl_ref_nats", "dso_train_pg_clipfrac",
                 "dso_train_reward_mean", "dso_train_reward_group_std", "dso_train_model_version"):
        assert name in exprs


def test_gigpo_step_measures_are_exported_as_gauges():
    actor = Orchestrator(ResamplingPolicy(target_groups=1, group_size=2), ScriptedTasks(["t0"]), metrics=DSOMetrics())
    actor.report_training(1, {"success_rate": 0.25, "heldout_success": 0.125, "episode_length": 5.5,
                              "anchor_group_fraction": 0.75, "mean_abs_step_advantage": 0.5, "mean_abs_episode_advantage": 0.875})
    s = _samples(asyncio.run(actor.metrics_text()))
    assert s[("dso_train_success_rate", frozenset())] == 0.25
    assert s[("dso_train_heldout_success_rate", frozenset())] == 0.125
    assert s[("dso_train_episode_length_steps", frozenset())] == 5.5
    assert s[("dso_gigpo_anchor_group_fraction", frozenset())] == 0.75
    assert s[("dso_gigpo_step_advantage_abs_mean", frozenset())] == 0.5
    assert s[("dso_gigpo_episode_advantage_abs_mean", frozenset())] == 0.875


def test_dashboard_has_a_gigpo_row_on_the_exported_names():
    dash = json.loads((ROOT / "deploy/grafana/dashboards/trinity-dso.json").read_text())
    assert any("GiGPO" in p["title"] for p in dash["panels"] if p["type"] == "row")
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p.get("targets", []))
    for name in ("dso_train_success_rate", "dso_train_heldout_success_rate", "dso_gigpo_anchor_group_fraction",
                 "dso_gigpo_step_advantage_abs_mean", "dso_gigpo_episode_advantage_abs_mean", "dso_anchor_group_size_bucket",
                 "dso_train_episode_length_steps"):
        assert name in exprs
