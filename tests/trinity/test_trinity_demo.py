"""``trinity-dso trinity-demo``, short: Trinity-RFT 0.6.0's explorer and queue, our CPU trainer, a live PATCH.

One module fixture runs the demo once (1,024 rollouts: 16 explore steps of 8 tasks x 8) with the
session's Ray and Ray Serve; after the trainer's second batch it PATCHes the policy over HTTP
with a band that drops groups. Each test checks one promise of the demo's JSON.

Here (not in tests/jobs/) because tests/trinity/conftest.py sets the environment every Ray
worker of a Trinity run needs before the session's Ray starts.
"""

from __future__ import annotations

import httpx
import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

BAND = (0.3, 0.7)


@pytest.fixture(scope="module")
def demo(tmp_path_factory, ray_local, serve_http):
    from orchestrator.jobs.trinity_demo import TrinityDemoConfig, run_trinity_demo

    seen: dict = {}

    def on_batch(row: dict, urls: dict) -> None:
        if row["step"] == 2:
            seen["policy_before"] = httpx.get(urls["policy"], timeout=30).json()
            seen["patch"] = httpx.patch(urls["policy"], json={"filter": {"band": list(BAND)}}, timeout=30)
            seen["version_at_patch"] = row["model_version"]
            seen["metrics_url"] = urls["metrics"]
        if row["step"] == 3:
            seen["metrics"] = httpx.get(urls["metrics"], timeout=30).text

    cfg = TrinityDemoConfig(out_dir=tmp_path_factory.mktemp("trinity-demo"), rollout_budget=1024, eval_every=1000,
                            heldout_size=64, eval_samples=2)
    seen["summary"] = run_trinity_demo(cfg, serve_url=serve_http, on_batch=on_batch, log=print)
    seen["out"] = cfg.out_dir
    return seen


def test_every_batch_the_trainer_read_is_train_batch_size(demo):
    s = demo["summary"]
    assert s["batches_read"] >= 3
    assert s["invariants"]["every_batch_is_train_batch_size"] and s["invariants"]["batch_sizes"] == [64]
    assert all(row["experiences"] == 64 for row in s["steps"])


def test_no_experience_is_read_twice(demo):
    inv = demo["summary"]["invariants"]
    assert inv["experiences_read_twice"] == 0
    assert inv["experiences_read"] == 64 * demo["summary"]["batches_read"]


def test_every_sync_passes_the_check_and_the_model_version_advances(demo):
    s = demo["summary"]
    inv = s["invariants"]
    assert inv["syncs"] == s["batches_read"] == inv["syncs_passed"] and inv["sync_max_abs_diff"] <= 1e-3
    assert s["model_version_end"] == s["batches_read"]
    # Trinity's runners stamped the versions the trainer set: later batches carry later stamps
    assert s["steps"][-1]["stamped_versions"][1] > s["steps"][0]["stamped_versions"][1]


def test_the_trainers_advantages_through_trinitys_registry_equal_the_pipelines(demo):
    assert demo["summary"]["trinity"]["advantage_fn"] == "dso_grpo"
    assert demo["summary"]["invariants"]["advantage_max_abs_diff"] <= 1e-6


def test_padding_groups_carry_no_loss_weight(demo):
    assert demo["summary"]["invariants"]["padding_tokens_with_loss"] == 0


def test_a_rest_patch_changes_the_groups_the_trainer_reads(demo):
    assert demo["patch"].status_code == 200, demo["patch"].text
    assert demo["patch"].json()["revision"] == demo["policy_before"]["revision"] + 1
    groups = [g for row in demo["summary"]["steps"] for g in row["groups"] if not g["padding"]]
    before = [g for row in demo["summary"]["steps"][:2] for g in row["groups"] if not g["padding"]]
    after = [g for g in groups if g["model_version"] > demo["version_at_patch"]]  # rolled out after the PATCH
    assert any(not BAND[0] < g["accuracy"] < BAND[1] for g in before)  # without the band, such groups were kept
    assert after, "no group rolled out after the PATCH reached the trainer"
    assert all(BAND[0] < g["accuracy"] < BAND[1] for g in after), [g["accuracy"] for g in after]
    assert demo["summary"]["stats"]["dropped_by_reason"]["out_of_band"] > 0


def test_the_run_writes_json_curves_and_metrics(demo):
    out = demo["out"]
    assert (out / "trinity_demo.json").is_file() and (out / "curves.png").stat().st_size > 0
    prom = (out / "metrics.prom").read_text()
    assert "dso_groups_emitted_total" in prom and 'dso_groups_dropped_total{reason="out_of_band"}' in prom
    assert "dso_groups_emitted_total" in demo["metrics"]  # /metrics served live during the run
