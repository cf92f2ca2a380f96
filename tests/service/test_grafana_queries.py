"""The Grafana dashboard's queries, evaluated by a real Prometheus that scrapes a live run.

Every panel's targets and every annotation of ``deploy/grafana/dashboards/trinity-dso.json`` run
against Debian's ``prometheus`` (``make test`` installs it where the user is root; otherwise the
test skips, saying why), scraping the REST service's ``/metrics`` every second while a scripted
run moves: batches, weight syncs, a policy change over REST, a trainer's reports (the training
and GiGPO rows) and anchor batches in a private Redis (the anchor and Redis panels). Grafana's
variables are substituted as Grafana does for a Prometheus data source. Each query must return a
non-empty result with a finite value and the labels its legend and selector name; the failures are
listed by panel title.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import ray

from orchestrator.anchors.index import AnchorStep
from orchestrator.anchors.owner import anchor_index_from_spec
from orchestrator.rollout.scripted import BernoulliRolloutSource
from orchestrator.service.metrics import POLICY_INFO_FIELDS

pytestmark = pytest.mark.skipif(
    shutil.which("prometheus") is None,
    reason="prometheus binary not installed (Debian: apt-get install prometheus; `make test` does it as root)")

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "trinity-dso.json"
DSO_TOKEN = "grafana-token"
SCRAPE_S = 1
"""Prometheus' scrape interval here, also the data source's "scrape interval" Grafana reads."""
RUN_S = 15
TASKS = [f"t{i:02d}" for i in range(40)]
PASS_RATES = {t: (0.0, 0.15, 0.5, 0.85, 1.0)[i % 5] for i, t in enumerate(TASKS)}
POLICY = {"target_groups": 4, "group_size": 4, "max_replenish_rounds": 3, "answer_screen": True, "max_staleness": 1}
ANCHOR_STEPS = [AnchorStep("t00", 0, 0, "a", 1.0, last=True), AnchorStep("t00", 1, 0, "a", 0.0),
                AnchorStep("t00", 1, 1, "b", 0.0, last=True), AnchorStep("t01", 0, 0, "a", 1.0, last=True)]


# --------------------------------------------------------------------------- the dashboard's queries


def grafana_vars(dashboard: dict, step_s: int, range_s: int) -> dict[str, str]:
    """Grafana's built-in variables for a Prometheus data source, and the dashboard's own (current value).

    ``$__interval`` is the query step (``step_s``); ``$__rate_interval`` is
    ``max($__interval + scrape interval, 4 * scrape interval)`` (Grafana's documentation,
    "Prometheus template variables"), with the scrape interval of the Prometheus here.
    """
    out = {"__interval": f"{step_s}s", "__interval_ms": str(step_s * 1000),
           "__rate_interval": f"{max(step_s + SCRAPE_S, 4 * SCRAPE_S)}s",
           "__range": f"{range_s}s", "__range_s": str(range_s), "__range_ms": str(range_s * 1000)}
    for var in dashboard.get("templating", {}).get("list", []):
        current = var.get("current", {}).get("value", "")
        out[var["name"]] = "|".join(current) if isinstance(current, list) else str(current)
    return out


def substitute(expr: str, variables: dict[str, str]) -> str:
    """``$name``, ``${name}`` and ``[[name]]`` replaced (longest names first); an unknown one is left as is."""
    for name in sorted(variables, key=len, reverse=True):
        expr = re.sub(rf"\$\{{{name}\}}|\[\[{name}\]\]|\${name}(?![A-Za-z0-9_])", variables[name], expr)
    return expr


def dashboard_queries(dashboard: dict) -> list[dict]:
    """Every panel target (rows' nested panels included) and annotation with an ``expr``.

    Returns dicts: ``where`` (the panel title and refId, or the annotation's name), ``expr``,
    ``labels`` (those the legend names, ``{{label}}``), ``instant``, ``step`` (annotations: theirs).
    """
    panels = [p for top in dashboard["panels"] for p in [top, *top.get("panels", [])]]
    out = []
    for p in panels:
        for t in p.get("targets", []):
            labels = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", t.get("legendFormat", "")))
            if "dso_resampling_policy_info" in t["expr"]:  # the table panel's columns; filter_band is ""
                labels |= set(POLICY_INFO_FIELDS) - {"filter_band"}  # without a band: Prometheus drops empty labels
            out.append({"where": f"panel {p['title']!r} ({t['refId']})", "expr": t["expr"], "labels": labels,
                        "instant": bool(t.get("instant")), "step": None})
    for a in dashboard["annotations"]["list"]:
        if "expr" in a:
            out.append({"where": f"annotation {a['name']!r}", "expr": a["expr"], "labels": set(), "instant": False,
                        "step": a.get("step")})
    return out


def selector_labels(expr: str) -> dict[str, str] | None:
    """The labels every series of a bare selector (``dso_x{a="b"}``) keeps: its matchers and the scrape's
    ``job``; None for any other expression."""
    m = re.fullmatch(r"\s*dso_\w+\s*(?:\{(.*)\})?\s*", expr)
    return {"job": "trinity-dso", **dict(re.findall(r'(\w+)="([^"]*)"', m.group(1) or ""))} if m else None


def seconds(step: str | None) -> int:
    if step is None:
        return SCRAPE_S
    m = re.fullmatch(r"(\d+)([sm])", step)
    assert m, f"step {step!r}"
    return int(m.group(1)) * (60 if m.group(2) == "m" else 1)


def failures(prom: str, queries: list[dict], dashboard: dict, start: float, end: float) -> list[str]:
    """What is wrong with each query over [start, end], one line each, naming its panel or annotation."""
    out = []
    for q in queries:
        step = seconds(q["step"])
        expr = substitute(q["expr"], grafana_vars(dashboard, step, int(end - start)))
        if "$" in expr or "[[" in expr:
            out.append(f"{q['where']}: a variable is left after substitution: {expr}")
            continue
        if q["instant"]:
            r = httpx.get(f"{prom}/api/v1/query", params={"query": expr, "time": end}, timeout=30)
        else:
            r = httpx.get(f"{prom}/api/v1/query_range",
                          params={"query": expr, "start": start, "end": end, "step": step}, timeout=30)
        body = r.json()
        if body.get("status") != "success":
            out.append(f"{q['where']}: Prometheus refused {expr!r}: {body.get('error')}")
            continue
        series = body["data"]["result"]
        values = [float(v) for s in series for v in ([s["value"][1]] if "value" in s else [x[1] for x in s["values"]])]
        if not series:
            out.append(f"{q['where']}: no series for {expr!r}")
        elif not any(math.isfinite(v) for v in values):
            out.append(f"{q['where']}: only NaN or infinite values for {expr!r}")
        kept = selector_labels(expr) or {}
        for s in series:
            missing = sorted(q["labels"] - set(s["metric"])) + sorted(f"{k}={v}" for k, v in kept.items()
                                                                      if s["metric"].get(k) != v)
            if missing:
                out.append(f"{q['where']}: series {s['metric']} of {expr!r} lacks labels {missing}")
    return out


# --------------------------------------------------------------------------- Prometheus and the run


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def actor(dso_service, redis_server):
    """A fresh orchestrator behind the service, with an anchor index in a private Redis."""
    return dso_service.orchestrator(POLICY, tasks=TASKS, source=BernoulliRolloutSource(PASS_RATES, seed=0),
                                    anchor_index={"redis_url": redis_server.url, "prefix": "dso-grafana"})


@pytest.fixture
def prometheus(dso_service, actor, tmp_path):
    """Debian's prometheus scraping the service every second; yields its base URL once the target is up."""
    binary = shutil.which("prometheus")
    target = dso_service.url.removeprefix("http://")
    (tmp_path / "prometheus.yml").write_text(
        f"global: {{scrape_interval: {SCRAPE_S}s, evaluation_interval: {SCRAPE_S}s}}\n"
        f"scrape_configs:\n  - job_name: trinity-dso\n    metrics_path: /metrics\n"
        f"    static_configs: [{{targets: ['{target}']}}]\n"
    )
    port = free_port()
    log = tmp_path / "prometheus.log"
    proc = subprocess.Popen(
        [binary, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=log.open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"prometheus exited with {proc.returncode}: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, "Prometheus never scraped the service (up == 1)"
            try:
                up = httpx.get(f"{url}/api/v1/query", params={"query": 'up{job="trinity-dso"} == 1'}, timeout=5).json()
                if up["data"]["result"]:
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def trainer_and_anchor_step(spec: dict):
    """A step's side work: an anchor batch written and retired (anchor, Redis panels), a trainer report
    (training and GiGPO rows)."""
    index = anchor_index_from_spec(spec)

    def step(i: int, handle) -> None:
        key = f"b{i}"
        ray.get(handle.anchor_register.remote(key))
        index.insert(key, ANCHOR_STEPS)
        ray.get(handle.anchor_drop.remote(key))
        ray.get(handle.report_training.remote(i, {
            "entropy": 1.0 / i, "kl_ref": 0.01 * i, "reward_mean": 0.1, "reward_std_group": 0.9, "heldout_acc": 0.3,
            "model_version": i // 2, "pg_clipfrac": 0.02, "pg_clipfrac_lower": 0.01, "pg_clipfrac_dual": 0.0,
            "sync_seconds": 0.05, "success_rate": 0.4, "heldout_success": 0.35, "episode_length": 5.0,
            "anchor_group_fraction": 0.6, "mean_abs_step_advantage": 0.3, "mean_abs_episode_advantage": 0.5}))

    return step


def test_every_dashboard_query_returns_data_from_a_live_run(dso_service, actor, prometheus, live_run):
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 50
    run = live_run(actor, pause_s=0.2, on_step=trainer_and_anchor_step(ray.get(actor.anchor_spec.remote())))
    start = time.time()
    run.go()
    time.sleep(RUN_S / 4)
    r = httpx.patch(f"{dso_service.url}/v1/policy", json={"max_replenish_rounds": 2},
                    headers={"Authorization": f"Bearer {DSO_TOKEN}"}, timeout=30)
    assert r.status_code == 200, r.text
    time.sleep(RUN_S * 3 / 4)
    run.hold()
    time.sleep(3 * SCRAPE_S)  # the last counters scraped
    end = time.time()
    assert run.steps >= 10
    wrong = failures(prometheus, queries, dashboard, start, end)
    assert not wrong, "dashboard queries without data:\n" + "\n".join(wrong)
    # the same check fails, naming the panel, on a misspelt label value and on a legend label the series lack
    broken = [dict(q, expr=q["expr"].replace('groups="kept"', 'groups="kep"')) for q in queries if 'groups="kept"' in q["expr"]]
    broken += [dict(q, labels=q["labels"] | {"reasons"}) for q in queries if "reason" in q["labels"]]
    found = failures(prometheus, broken, dashboard, start, end)
    assert any("'Mean reward: all groups vs kept groups' (B): no series" in f for f in found), found
    assert any("'Groups dropped per second, by drop reason' (A): series" in f and "['reasons']" in f for f in found), found
