"""Prometheus metrics: the module on a real state machine, and the live /metrics endpoint of the REST service.

Expositions are parsed with prometheus_client's own text parser. The last test scrapes the
service with a real Prometheus server when the ``prometheus`` binary is installed.
"""

import json
import pickle
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import ray
import yaml
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.core.machine import OrchestratorCore
from orchestrator.core.policy import ResamplingPolicy
from orchestrator.core.stats import Stats
from orchestrator.rollout.scripted import ScriptedRolloutSource, ScriptedTasks
from orchestrator.service import metrics as M
from orchestrator.service.metrics import DSOMetrics

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "trinity-dso.json"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
DSO_TOKEN = "metrics-token"
MIXED, WRONG = [1.0, -1.0], [-1.0, -1.0]


def snapshot(**changes) -> Stats:
    """The stats of a fresh core with some fields changed."""
    return OrchestratorCore(ResamplingPolicy(), ["t0"]).stats().model_copy(update=changes)


def samples(text: str) -> dict:
    """{(sample name, frozenset(labels)): value} of a Prometheus text exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(scrape: dict, name: str, **labels) -> float:
    return scrape[(name, frozenset(labels.items()))]


def run_core_batch(core: OrchestratorCore, source: ScriptedRolloutSource, tasks: ScriptedTasks, metrics: DSOMetrics):
    """Fill one batch the way the actor does (without Ray), feeding the metrics hook."""
    while True:
        batch = core.try_emit()
        if batch is not None:
            metrics.update(core.stats(), core.policy)
            metrics.observe_batch(batch)
            return batch
        plan = core.plan_round()
        groups = source.generate([tasks.get(t) for t in plan.task_ids], core.policy.group_size)
        for g in groups:
            g.purpose, g.round = plan.purpose, plan.round
        core.submit(groups)
        metrics.update(core.stats(), core.policy)


# --------------------------------------------------------------------------- the module, no Ray


def test_every_series_exists_at_zero_before_any_event():
    s = samples(DSOMetrics().exposition())
    for outcome in ("informative", "all_correct", "all_wrong", "zero_variance", "singleton", "out_of_band", "stale"):
        assert value(s, "dso_groups_classified_total", outcome=outcome) == 0
    for reason in M.DROP_REASONS:
        assert value(s, "dso_groups_dropped_total", reason=reason) == 0
    for purpose in ("initial", "replenish"):
        assert value(s, "dso_rollouts_total", purpose=purpose) == 0
    for op in M.REDIS_OPS:
        assert value(s, "dso_redis_op_errors_total", op=op) == 0
        assert value(s, "dso_redis_op_duration_seconds_count", op=op) == 0
    assert value(s, "dso_batch_fill_seconds_count") == 0 and ("dso_keep_ratio", frozenset()) not in s


def test_names_follow_prometheus_rules():
    text = DSOMetrics().exposition()
    for fam in text_string_to_metric_families(text):
        assert fam.name.startswith("dso_"), fam.name
        for s in fam.samples:
            assert not {"task", "task_id"} & set(s.labels), s
            if fam.type == "counter":
                assert s.name.endswith(("_total", "_created")), s.name
        if fam.type == "histogram":
            assert fam.name.endswith(("_seconds", "_rounds", "_size", "_versions")), fam.name
    assert "dso_resampling_policy_revision" in text and "dso_model_version" in text


def test_counters_follow_the_state_machine_exactly():
    tasks = ScriptedTasks(["t0", "t1"])
    source = ScriptedRolloutSource({"t0": [WRONG, MIXED], "t1": [WRONG, MIXED]})
    core = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=2, min_keep_rate=1.0), tasks.task_ids)
    m = DSOMetrics()
    m.update(core.stats(), core.policy)
    batch = run_core_batch(core, source, tasks, m)
    assert batch.rounds == 1
    s = samples(m.exposition())
    # round 0: t0, t1 all wrong; replenish round 1: both mixed -> emitted; the wrong pair dropped at release
    assert value(s, "dso_groups_classified_total", outcome="informative") == 2
    assert value(s, "dso_groups_classified_total", outcome="all_wrong") == 2
    assert value(s, "dso_groups_dropped_total", reason="all_wrong") == 2
    assert value(s, "dso_groups_emitted_total") == 2
    assert value(s, "dso_rollouts_total", purpose="initial") == 4
    assert value(s, "dso_rollouts_total", purpose="replenish") == 4
    assert value(s, "dso_rollouts_wasted_total") == 4
    assert value(s, "dso_replenish_rounds_total") == 1 and value(s, "dso_batches_total") == 1
    assert value(s, "dso_batch_replenish_rounds_bucket", le="0.0") == 0
    assert value(s, "dso_batch_replenish_rounds_bucket", le="1.0") == 1
    assert value(s, "dso_keep_ratio") == 0.5
    assert value(s, "dso_reward_mean", groups="all") == -0.5 and value(s, "dso_reward_mean", groups="kept") == 0.0


def test_undefined_gauges_are_absent_not_nan():
    # one all-wrong group: all = -1, nothing kept, nothing trained -> kept / trained series absent;
    # coverage is defined (0 of 2 rollouts trained), the last batch's is not (no batch yet)
    core = OrchestratorCore(ResamplingPolicy(target_groups=1, group_size=2), ["t0"])
    m = DSOMetrics()
    core.submit(ScriptedRolloutSource({"t0": [WRONG]}).generate([ScriptedTasks(["t0"]).get("t0")], 2))
    m.update(core.stats(), core.policy)
    s = samples(m.exposition())
    assert value(s, "dso_reward_mean", groups="all") == -1.0
    for groups in ("kept", "trained"):
        assert ("dso_reward_mean", frozenset({("groups", groups)})) not in s
    assert value(s, "dso_coverage") == 0.0 and ("dso_batch_coverage", frozenset()) not in s
    assert "# TYPE dso_batch_reward_mean gauge" in m.exposition()


def test_trained_reward_coverage_and_per_batch_gauges():
    # round 0: t0, t1 all wrong; round 1: both mixed -> batch of 2 groups (4 trained rollouts, reward 0)
    # cumulative coverage 4 / 8; last batch: all = (-4 + 0) / 8, kept 0, trained 0, coverage 4 / 8
    tasks = ScriptedTasks(["t0", "t1"])
    source = ScriptedRolloutSource({"t0": [WRONG, MIXED], "t1": [WRONG, MIXED]})
    core = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=2, min_keep_rate=1.0), tasks.task_ids)
    m = DSOMetrics()
    run_core_batch(core, source, tasks, m)
    s = samples(m.exposition())
    assert value(s, "dso_reward_mean", groups="trained") == 0.0 and value(s, "dso_coverage") == 0.5
    assert value(s, "dso_batch_reward_mean", groups="all") == -0.5
    assert value(s, "dso_batch_reward_mean", groups="kept") == 0.0 and value(s, "dso_batch_coverage") == 0.5


def test_staleness_lag_histogram_counts_trained_rollouts():
    # two rollouts of model version 1 in a batch assembled at version 3: lag 2 each
    core = OrchestratorCore(ResamplingPolicy(target_groups=1, group_size=2), ["t0"])
    groups = ScriptedRolloutSource({"t0": [MIXED]}).generate([ScriptedTasks(["t0"]).get("t0")], 2, model_version=1)
    core.submit(groups)
    core.set_model_version(3)
    m = DSOMetrics()
    m.observe_batch(core.try_emit())
    s = samples(m.exposition())
    assert value(s, "dso_rollout_staleness_lag_versions_bucket", le="1.0") == 0
    assert value(s, "dso_rollout_staleness_lag_versions_bucket", le="2.0") == 2


def test_round_keep_rates_predicted_against_realised_and_dropped_share():
    tasks = ScriptedTasks(["t0", "t1"])
    source = ScriptedRolloutSource({"t0": [WRONG, MIXED], "t1": [WRONG, MIXED]})
    core = OrchestratorCore(ResamplingPolicy(target_groups=2, group_size=2, min_keep_rate=1.0), tasks.task_ids)
    m = DSOMetrics()
    m.update(core.stats(), core.policy)
    s = samples(m.exposition())
    assert value(s, "dso_round_informative_groups_total", kind="predicted") == 0
    assert ("dso_round_keep_rate", frozenset({("kind", "realised")})) not in s  # absent before any round
    assert ("dso_rollouts_dropped_ratio", frozenset()) not in s
    run_core_batch(core, source, tasks, m)
    s = samples(m.exposition())
    # round 0: nothing seen, uniform prior, 1 - 2/3 = 1/3 predicted per task, both all wrong;
    # round 1: the prior learnt from two all-wrong first groups predicts ~0, both informative
    assert value(s, "dso_round_groups_total") == 4
    assert value(s, "dso_round_informative_groups_total", kind="realised") == 2
    assert value(s, "dso_round_informative_groups_total", kind="predicted") == pytest.approx(2 / 3, abs=1e-3)
    assert value(s, "dso_round_keep_rate", kind="realised") == 1.0
    assert value(s, "dso_round_keep_rate", kind="predicted") == pytest.approx(0.0, abs=1e-3)
    assert value(s, "dso_rollouts_dropped_ratio") == 0.5  # 4 wasted of 8


def test_array_histogram_counts_each_value_in_its_le_bucket():
    # bounds 0, 1, 2, 4: 0 -> le 0; 1, 1 -> le 1; 2 -> le 2; 3 -> le 4; 40 -> +Inf only
    h = M.ArrayHistogram("x_lag", "doc", (0, 1, 2, 4))
    h.observe_many([1, 0, 40, 2, 1])
    h.observe_many([3])
    h.observe_many([])
    fam = next(h.collect())
    got = {(s.name, s.labels.get("le")): s.value for s in fam.samples}
    assert [got[("x_lag_bucket", le)] for le in ("0.0", "1.0", "2.0", "4.0", "+Inf")] == [1, 3, 4, 5, 6]
    assert got[("x_lag_count", None)] == 6 and got[("x_lag_sum", None)] == 47


def test_array_histogram_exposes_what_prometheus_clients_histogram_exposes():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    values = [0, 0, 1, 2, 2, 3, 5, 7, 8, 9, 17, 33, 100, 0.5]
    mine, theirs = CollectorRegistry(), CollectorRegistry()
    h = M.ArrayHistogram("dso_lag", "Lag.", M.LAG_BUCKETS)
    mine.register(h)
    ref = Histogram("dso_lag", "Lag.", buckets=M.LAG_BUCKETS, registry=theirs)
    h.observe_many(values)
    for v in values:
        ref.observe(v)
    reference = {k: v for k, v in samples(generate_latest(theirs).decode()).items() if not k[0].endswith("_created")}
    assert samples(generate_latest(mine).decode()) == reference


def test_array_histogram_refuses_bounds_out_of_order():
    with pytest.raises(ValueError, match="buckets"):
        M.ArrayHistogram("x", "doc", (1, 1, 2))


def test_a_snapshot_going_backwards_never_decreases_a_counter():
    m = DSOMetrics()
    m.update(snapshot(batches_emitted=5))
    m.update(snapshot(batches_emitted=2))  # e.g. an older checkpoint: new baseline
    m.update(snapshot(batches_emitted=3))
    assert value(samples(m.exposition()), "dso_batches_total") == 6


def test_policy_revision_and_info():
    m = DSOMetrics()
    policy = ResamplingPolicy(target_groups=3, replenish_paused=True, filter={"band": (0.1, 0.9)})
    m.update(snapshot(policy_revision=4, model_version=7, replenish_paused=True), policy)
    s = samples(m.exposition())
    assert value(s, "dso_resampling_policy_revision") == 4 and value(s, "dso_model_version") == 7
    info = [labels for (name, labels), v in s.items() if name == "dso_resampling_policy_info"]
    assert len(info) == 1
    labels = dict(info[0])
    assert labels["target_groups"] == "3" and labels["replenish_paused"] == "true"
    assert labels["filter_band"] == "[0.1, 0.9]" and labels["max_staleness"] == ""


def test_anchor_and_redis_hooks_record_into_the_current_metrics():
    m = DSOMetrics()
    M.set_current(m)
    M.observe_redis_op("insert", 0.002)
    M.observe_redis_op("insert", 0.2, error=True)
    M.observe_redis_op("weird-op", 0.001)
    with pytest.raises(ConnectionError), M.redis_op("query"):
        raise ConnectionError("down")
    M.set_anchor_stats(12, [1, 3, 8])
    s = samples(m.exposition())
    assert value(s, "dso_redis_op_duration_seconds_count", op="insert") == 2
    assert value(s, "dso_redis_op_errors_total", op="insert") == 1
    assert value(s, "dso_redis_op_duration_seconds_count", op="other") == 1
    assert value(s, "dso_redis_op_errors_total", op="query") == 1
    assert value(s, "dso_anchor_index_entries") == 12
    assert value(s, "dso_anchor_group_size_count") == 3 and value(s, "dso_anchor_group_size_sum") == 12
    assert value(s, "dso_anchor_group_size_bucket", le="2.0") == 1


def test_metrics_pickle_until_first_use():
    m = pickle.loads(pickle.dumps(DSOMetrics()))
    m.update(snapshot(batches_emitted=1))
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(m)


# --------------------------------------------------------------------------- the live endpoint


@pytest.fixture
def live(dso_service):
    """A fresh actor behind the module's REST app: two tasks, wrong then mixed."""
    handle = dso_service.orchestrator({"target_groups": 2, "group_size": 2, "min_keep_rate": 1.0},
                                      {"t0": [WRONG, MIXED], "t1": [WRONG, MIXED]})
    with httpx.Client(base_url=dso_service.url, timeout=30) as client:
        yield handle, client


def scrape(client) -> dict:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    return samples(r.text)


def test_scrape_before_and_after_a_scripted_batch_differs_by_exactly_its_counts(live):
    handle, client = live
    ray.get(handle.next_batch.remote())
    before = scrape(client)
    ray.get(handle.next_batch.remote())  # again: 2 wrong groups, one replenish round, 2 mixed groups
    after = scrape(client)
    expected = {
        ("dso_groups_classified_total", ("outcome", "informative")): 2,
        ("dso_groups_classified_total", ("outcome", "all_wrong")): 2,
        ("dso_groups_classified_total", ("outcome", "all_correct")): 0,
        ("dso_groups_dropped_total", ("reason", "all_wrong")): 2,
        ("dso_groups_dropped_total", ("reason", "stale")): 0,
        ("dso_groups_emitted_total", None): 2,
        ("dso_groups_padded_total", None): 0,
        ("dso_rollouts_total", ("purpose", "initial")): 4,
        ("dso_rollouts_total", ("purpose", "replenish")): 4,
        ("dso_rollouts_wasted_total", None): 4,
        ("dso_replenish_rounds_total", None): 1,
        ("dso_batches_total", None): 1,
        ("dso_cap_hits_total", None): 0,
        ("dso_batch_replenish_rounds_count", None): 1,
        ("dso_batch_replenish_rounds_sum", None): 1,
        ("dso_batch_fill_seconds_count", None): 1,
    }
    for (name, label), delta in expected.items():
        key = (name, frozenset([label]) if label else frozenset())
        assert after[key] - before[key] == delta, (name, label)
    assert after[("dso_keep_ratio", frozenset())] == 0.5


def test_rest_policy_change_shows_in_the_scrape(live):
    _handle, client = live
    assert value(scrape(client), "dso_resampling_policy_revision") == 0
    r = client.patch("/v1/policy", json={"target_groups": 3}, headers={"Authorization": f"Bearer {DSO_TOKEN}"})
    assert r.status_code == 200
    s = scrape(client)
    assert value(s, "dso_resampling_policy_revision") == 1
    info = next(dict(labels) for (name, labels) in s if name == "dso_resampling_policy_info")
    assert info["target_groups"] == "3"


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dash["annotations"]["list"] if "expr" in a]
    return exprs


def alert_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def test_every_metric_an_alert_rule_reads_exists_in_a_live_scrape(live):
    _handle, client = live
    names = {name for name, _ in scrape(client)}
    used = {m for r in alert_rules() for m in re.findall(r"\bdso_[a-z0-9_]+", r["expr"])}
    assert used == {"dso_errors_total"} and used <= names


def test_every_metric_in_the_dashboard_exists_in_a_live_scrape(live):
    handle, client = live
    ray.get(handle.next_batch.remote())
    # the training row's gauges are absent until a trainer reports (orchestrator/train)
    ray.get(handle.report_training.remote(1, {"entropy": 0.5, "kl_ref": 0.0, "reward_mean": 0.0, "reward_std_group": 1.0,
                                              "heldout_acc": 0.5, "model_version": 1, "pg_clipfrac": 0.0,
                                              "pg_clipfrac_lower": 0.0, "pg_clipfrac_dual": 0.0, "sync_seconds": 0.01}))
    # ... and the GiGPO row's until a GiGPO trainer does (orchestrator/jobs/gigpo_train.py)
    ray.get(handle.report_training.remote(2, {"success_rate": 0.5, "heldout_success": 0.25, "episode_length": 4.0,
                                              "anchor_group_fraction": 0.9, "mean_abs_step_advantage": 0.3,
                                              "mean_abs_episode_advantage": 0.4}))
    names = {name for name, _ in scrape(client)}
    exprs = dashboard_exprs()
    used = {m for e in exprs for m in re.findall(r"\bdso_[a-z0-9_]+", e)}
    assert len(used) >= 20
    missing = sorted(used - names)
    assert not missing, f"dashboard names metrics the service does not export: {missing}"
    # label filters in the dashboard use label values the service exports
    for e in exprs:
        for label, val in re.findall(r'(\w+)="([^"]+)"', e):
            assert any((label, val) in labels for _, labels in scrape(client)), (label, val, e)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_real_prometheus_scrapes_the_service(live, tmp_path, dso_service):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus binary not installed (Debian: apt-get install prometheus)")
    handle, _client = live
    ray.get(handle.next_batch.remote())
    ray.get(handle.next_batch.remote())
    target = dso_service.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{ALERTS}']\n"
        f"scrape_configs:\n  - job_name: trinity-dso\n    metrics_path: /metrics\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = _free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
    )
    try:
        deadline, result = time.monotonic() + 60, []
        while time.monotonic() < deadline and not result:
            time.sleep(0.5)
            if proc.poll() is not None:  # a config or rule file it refuses ends it at once
                errors = [x for x in (tmp_path / "prometheus.log").read_text().splitlines() if "level=error" in x]
                pytest.fail(f"prometheus exited with {proc.returncode}: {errors}")
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": "dso_batches_total"}, timeout=5)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                result = r.json()["data"]["result"]
        assert result, "Prometheus never scraped dso_batches_total"
        assert float(result[0]["value"][1]) == 2.0 and result[0]["metric"]["job"] == "trinity-dso"
        r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query",
                      params={"query": 'sum(dso_groups_classified_total{outcome="informative"})'}, timeout=5)
        assert float(r.json()["data"]["result"][0]["value"][1]) == 4.0
        # the repository's alert rules load and evaluate (health "ok"), and none fires on a healthy service
        deadline, rules = time.monotonic() + 30, []
        while time.monotonic() < deadline and (not rules or any(x["health"] == "unknown" for x in rules)):
            time.sleep(0.5)  # "unknown" until a rule's first evaluation
            data = httpx.get(f"http://127.0.0.1:{port}/api/v1/rules", timeout=5).json()["data"]["groups"]
            rules = [x for g in data for x in g["rules"]]
        assert {x["name"] for x in rules} == {r["alert"] for r in alert_rules()}
        assert all(x["health"] == "ok" and x["state"] == "inactive" for x in rules), rules
    finally:
        proc.terminate()
        proc.wait(timeout=30)
