"""Deployment files validated without Docker or Kubernetes: they parse and agree with each other.

The compose file's services, ports and volumes; the Prometheus scrape targets; Grafana's
provisioning; the KubeRay RayService; every ``trinity-dso serve`` config (validated by the
same pydantic model the service uses).
"""

import json
import re
from pathlib import Path

import pytest
import yaml

from orchestrator.service.app import create_app
from orchestrator.service.config import ServeConfig

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
SERVE_CONFIGS = [ROOT / "examples/service/service.yaml", ROOT / "deploy/compose/service.yaml", ROOT / "deploy/ray/service.yaml"]


def load(path: Path):
    return yaml.safe_load(path.read_text())


@pytest.fixture(scope="module")
def compose() -> dict:
    return load(COMPOSE)


def published(service: dict) -> dict[int, tuple[str, int]]:
    """container port -> (host ip, host port) of a compose service's ``ports``."""
    out = {}
    for spec in service.get("ports", []):
        parts = str(spec).split(":")
        assert len(parts) == 3, f"port {spec!r}: publish as HOST_IP:HOST:CONTAINER"
        out[int(parts[2])] = (parts[0], int(parts[1]))
    return out


def bind_mounts(service: dict) -> list[tuple[str, str]]:
    return [(v.split(":")[0], v.split(":")[1]) for v in service.get("volumes", []) if v.startswith(("./", "/"))]


def test_compose_has_the_four_services_wired(compose):
    services = compose["services"]
    assert set(services) == {"ray-head", "redis", "prometheus", "grafana"}
    for name, svc in services.items():
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{name} depends on unknown service {dep}"
    assert "orchestrator" not in services and "trinity-dso serve" in " ".join(services["ray-head"]["command"])
    assert services["ray-head"]["environment"]["DSO_REDIS_URL"].startswith("redis://redis:6379")


def test_compose_ports_are_loopback_and_match_the_configs(compose):
    services = compose["services"]
    serve_cfg = ServeConfig.model_validate(load(ROOT / "deploy/compose/service.yaml"))
    head = published(services["ray-head"])
    assert serve_cfg.service.port in head and 8265 in head
    assert published(services["prometheus"]) == {9090: ("127.0.0.1", 9090)}
    assert published(services["grafana"]) == {3000: ("127.0.0.1", 3000)}
    assert published(services["redis"]) == {6379: ("127.0.0.1", 6379)}
    for svc in services.values():
        assert all(ip == "127.0.0.1" for ip, _ in published(svc).values())
    # inside the container the service must listen beyond loopback for Prometheus to reach it
    assert serve_cfg.service.host == "0.0.0.0"
    assert "--metrics-export-port=8080" in services["ray-head"]["command"][2]


def test_compose_volumes_exist_and_are_declared(compose):
    services = compose["services"]
    named = set(compose.get("volumes", {}))
    used = set()
    for name, svc in services.items():
        for src, _ in bind_mounts(svc):
            assert (ROOT / src).exists(), f"{name}: bind mount source {src} does not exist"
        for v in svc.get("volumes", []):
            if not v.startswith(("./", "/")):
                used.add(v.split(":")[0])
    assert used == named, f"named volumes used {used} vs declared {named}"
    # the config the ray-head command reads is the one mounted
    targets = {t: s for s, t in bind_mounts(services["ray-head"])}
    assert targets["/etc/trinity-dso/service.yaml"] == "./deploy/compose/service.yaml"
    assert "/etc/trinity-dso/service.yaml" in services["ray-head"]["command"][2]
    dockerfile = ROOT / services["ray-head"]["build"]["dockerfile"]
    assert dockerfile.exists()


def test_prometheus_scrapes_the_rest_service_by_compose_name(compose):
    prom_mounts = {t: s for s, t in bind_mounts(compose["services"]["prometheus"])}
    cfg = load(ROOT / prom_mounts["/etc/prometheus/prometheus.yml"])
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    dso = jobs["trinity-dso"]
    assert dso["metrics_path"] == "/metrics"
    assert "/metrics" in {r.path for r in create_app().routes}
    serve_port = ServeConfig.model_validate(load(ROOT / "deploy/compose/service.yaml")).service.port
    assert dso["static_configs"][0]["targets"] == [f"ray-head:{serve_port}"]
    assert jobs["ray"]["static_configs"][0]["targets"] == ["ray-head:8080"]


def test_grafana_provisioning_points_at_the_dashboard_and_prometheus(compose):
    mounts = {t: s for s, t in bind_mounts(compose["services"]["grafana"])}
    prov = ROOT / mounts["/etc/grafana/provisioning"]
    ds = load(prov / "datasources" / "prometheus.yml")["datasources"][0]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    provider = load(prov / "dashboards" / "trinity-dso.yml")["providers"][0]
    dash_dir = provider["options"]["path"]
    assert dash_dir in mounts, "dashboard folder of the provider is not mounted"
    dashboards = list((ROOT / mounts[dash_dir]).glob("*.json"))
    assert [d.name for d in dashboards] == ["trinity-dso.json"]
    dash = json.loads(dashboards[0].read_text())
    uids = {t["datasource"]["uid"] for p in dash["panels"] for t in p["targets"]}
    uids |= {a["datasource"]["uid"] for a in dash["annotations"]["list"] if "expr" in a}
    assert uids == {ds["uid"]}
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for word in ("dropped", "keep ratio", "rounds per batch", "fill time", "wasted", "anchor", "redis"):
        assert word in titles
    assert any("dso_resampling_policy_revision" in a.get("expr", "") for a in dash["annotations"]["list"])


def test_kuberay_rayservice_parses_and_its_serve_config_validates():
    docs = list(yaml.safe_load_all((ROOT / "deploy/kuberay/rayservice.yaml").read_text()))
    rs = next(d for d in docs if d["kind"] == "RayService")
    assert rs["apiVersion"] == "ray.io/v1"
    serve_cfg = yaml.safe_load(rs["spec"]["serveConfigV2"])
    app = serve_cfg["applications"][0]
    assert app["import_path"] == "orchestrator.service.serve:build_app"
    cfg = ServeConfig.model_validate(app["args"])
    assert serve_cfg["http_options"]["port"] == cfg.service.port == 8000
    head = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in head["ports"]}
    assert ports["serve"] == 8000 and ports["metrics"] == 8080
    assert any(e["name"] == cfg.service.auth_token_env for e in head["env"])
    import ray

    assert rs["spec"]["rayClusterConfig"]["rayVersion"] == ray.__version__
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= set(ports)


def test_kuberay_keeps_the_state_file_on_a_persistent_volume_claim_of_the_same_file():
    docs = list(yaml.safe_load_all((ROOT / "deploy/kuberay/rayservice.yaml").read_text()))
    rs = next(d for d in docs if d["kind"] == "RayService")
    cfg = ServeConfig.model_validate(yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"])
    pod = rs["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if cfg.orchestrator.checkpoint_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claims = [d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"]
    assert volume["persistentVolumeClaim"]["claimName"] in claims


def test_ray_cluster_file_parses_and_starts_the_service():
    cluster = load(ROOT / "deploy/ray/cluster.yaml")
    assert cluster["provider"]["type"] == "local"
    assert any("trinity-dso serve --config deploy/ray/service.yaml" in c for c in cluster["head_start_ray_commands"])


def test_the_image_takes_torchs_cpu_wheels_unless_told_otherwise():
    args = dict(line.split()[1].split("=", 1) for line in (ROOT / "deploy/Dockerfile").read_text().splitlines()
                if line.startswith("ARG ") and "=" in line)
    assert args["PIP_EXTRA_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"  # PyPI's torch is the CUDA build


def test_ray_cluster_file_runs_the_ray_that_make_install_put_in_the_venv():
    cluster = load(ROOT / "deploy/ray/cluster.yaml")
    assert cluster["setup_commands"] == ["cd ~/trinity-dso && make install"]
    commands = cluster["head_start_ray_commands"] + cluster["worker_start_ray_commands"]
    starts = [c for c in commands if re.search(r"\bray (start|stop)\b", c)]
    assert len(starts) == 4 and all("~/trinity-dso/.venv/bin/ray " in c for c in starts)


@pytest.mark.parametrize("path", SERVE_CONFIGS, ids=lambda p: str(p.relative_to(ROOT)))
def test_serve_configs_validate(path):
    cfg = ServeConfig.model_validate(load(path))
    assert cfg.orchestrator is not None
    assert cfg.orchestrator.name == cfg.service.actor_name and cfg.orchestrator.namespace == cfg.service.namespace


def test_example_binds_loopback():
    assert ServeConfig.model_validate(load(ROOT / "examples/service/service.yaml")).service.host == "127.0.0.1"
    assert ServeConfig().service.host == "127.0.0.1"


def test_prometheus_loads_the_mounted_alert_rules(compose):
    prom_mounts = {t: s for s, t in bind_mounts(compose["services"]["prometheus"])}
    cfg = load(ROOT / prom_mounts["/etc/prometheus/prometheus.yml"])
    assert cfg["rule_files"] == ["/etc/prometheus/alerts.yml"]
    rules = [r for g in load(ROOT / prom_mounts["/etc/prometheus/alerts.yml"])["groups"] for r in g["rules"]]
    assert [r["alert"] for r in rules] == ["TrinityDsoDown", "TrinityDsoErrors"]
    assert all(r["labels"]["severity"] in ("critical", "warning") and r["annotations"]["summary"] for r in rules)
    # the down alert watches the scrape job that prometheus.yml defines
    assert 'job="trinity-dso"' in rules[0]["expr"] and "trinity-dso" in {j["job_name"] for j in cfg["scrape_configs"]}
