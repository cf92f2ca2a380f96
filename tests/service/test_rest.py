"""The REST service over real HTTP: a real Ray Serve app in front of a real orchestrator actor.

One Serve app for the module (``dso_service`` in conftest.py); each test gets a fresh actor
behind it (the service looks the actor up again by name).
"""

import httpx
import pytest
import ray

DSO_TOKEN = "test-token-7f3a"
AUTH = {"Authorization": f"Bearer {DSO_TOKEN}"}
MIXED, WRONG = [1.0, -1.0], [-1.0, -1.0]


@pytest.fixture
def svc(dso_service):
    return dso_service


@pytest.fixture
def http(dso_service):
    with httpx.Client(base_url=dso_service.url, timeout=30) as client:
        yield client


@pytest.fixture
def orch(svc):
    """Two tasks, first call all wrong then mixed; target 2 groups of 2, rounds sized exactly."""
    return svc.orchestrator({"target_groups": 2, "group_size": 2, "min_keep_rate": 1.0},
                            {"t0": [WRONG, MIXED], "t1": [WRONG, MIXED]})


def revision(http) -> int:
    return http.get("/v1/policy").json()["revision"]


def test_healthz_and_openapi(orch, http):
    r = http.get("/healthz")
    assert r.status_code == 200 and r.json()["status"] == "ok"
    spec = http.get("/openapi.json").json()
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    paths = spec["paths"]
    for p in ("/v1/policy", "/v1/stats", "/v1/tasks/{task_id}", "/v1/replenish/pause", "/v1/replenish/resume",
              "/healthz", "/metrics"):
        assert p in paths
    assert set(paths["/v1/policy"]) == {"get", "put", "patch"}


@pytest.mark.parametrize("page, script", [("/docs", "swagger-ui-bundle.js"), ("/redoc", "redoc.standalone.js")])
def test_the_docs_pages_load_their_scripts_from_the_service_not_a_cdn(http, page, script):
    html = http.get(page)
    assert html.status_code == 200 and "/openapi.json" in html.text
    urls = [u for u in html.text.replace("'", '"').split('"') if u.endswith((".js", ".css"))]
    assert urls and all(u.startswith("/") for u in urls), urls  # same origin: nothing fetched from elsewhere
    js = http.get(next(u for u in urls if u.endswith(script)))
    assert js.status_code == 200 and "javascript" in js.headers["content-type"] and len(js.content) > 500_000


def test_policy_round_trip_bumps_revision_and_etag(orch, http):
    r = http.get("/v1/policy")
    assert r.status_code == 200 and r.headers["etag"] == '"0"'
    assert r.json()["policy"]["target_groups"] == 2
    r = http.patch("/v1/policy", json={"target_groups": 3, "filter": {"std_tol": 0.01}}, headers=AUTH)
    assert r.status_code == 200 and r.headers["etag"] == '"1"'
    got = http.get("/v1/policy").json()
    assert got["revision"] == 1 and got["policy"]["target_groups"] == 3
    assert got["policy"]["filter"]["std_tol"] == 0.01 and got["policy"]["filter"]["judge"] == "auto"
    # PUT replaces the whole policy: every field, as GET returns it
    whole = got["policy"] | {"target_groups": 5, "filter": got["policy"]["filter"] | {"band": [-0.5, 0.5]}}
    r = http.put("/v1/policy", json=whole, headers=AUTH)
    assert r.status_code == 200 and r.json()["revision"] == 2
    assert http.get("/v1/policy").json()["policy"] == whole
    # the actor agrees
    assert ray.get(orch.get_policy.remote())["revision"] == 2


INVALID_PATCHES = [
    ({"target_groups": -1}, "target_groups"),
    ({"target_groups": "4"}, "target_groups"),
    ({"min_keep_rate": 0}, "min_keep_rate"),
    ({"on_cap": "explode"}, "on_cap"),
    ({"replenish_paused": 1}, "replenish_paused"),
    ({"filter": {"band": [0.1]}}, "filter.band"),
    ({"no_such_knob": 1}, "no_such_knob"),
    ({"filter": {"wrong_threshold": 2.0}}, "wrong_threshold"),  # cross-field: refused by the actor
    ({"target_groups": None}, "target_groups"),
]


def test_invalid_patch_is_422_naming_the_field_and_changes_nothing(orch, http):
    before = http.get("/v1/policy").json()
    for body, field in INVALID_PATCHES:
        r = http.patch("/v1/policy", json=body, headers=AUTH)
        assert r.status_code == 422, (body, r.text)
        assert field in r.json()["message"], (body, r.text)
        assert http.get("/v1/policy").json() == before


def test_an_answer_screen_the_source_cannot_serve_is_422_and_changes_nothing(orch, http):
    # the scripted source has no answer_probability: it cannot score answers
    before = http.get("/v1/policy").json()
    r = http.patch("/v1/policy", json={"screen": "answer"}, headers=AUTH)
    assert r.status_code == 422 and "screen: 'answer' needs a rollout source that scores answers" in r.json()["message"]
    assert http.get("/v1/policy").json() == before


def test_an_unknown_or_misplaced_option_of_every_mode_is_422_naming_it_and_changes_nothing(orch, http):
    from orchestrator.core.modes import MODES

    for field, registry in MODES.items():
        others = {k for cls in registry.values() for k in cls.Options.model_fields}
        for name, cls in registry.items():
            for option in ["no_such_option", *sorted(others - set(cls.Options.model_fields))]:
                message = refused(http, "PATCH", {field: name, f"{field}_options": {option: 0.5}})
                assert f"{field}_options.{option}: not an option of {field} {name!r}" in message, message


def test_an_old_informative_field_over_rest_is_422_saying_where_it_moved(orch, http):
    message = refused(http, "PATCH", {"selection": "informative", "selection_explore": 0.0})
    assert "selection_explore moved to selection_options.explore" in message, message


def test_invalid_put_is_422(orch, http):
    whole = http.get("/v1/policy").json()["policy"]
    r = http.put("/v1/policy", json=whole | {"group_size": 0}, headers=AUTH)
    assert r.status_code == 422 and r.json()["message"].startswith("group_size: Input should be greater than or equal to 1")
    assert revision(http) == 0


def refused(http, method: str, body: dict) -> str:
    """The 422 message of ``method /v1/policy`` with ``body``, checking that nothing changed."""
    before = http.get("/v1/policy").json()
    r = http.request(method, "/v1/policy", json=body, headers=AUTH)
    assert r.status_code == 422, r.text
    assert http.get("/v1/policy").json() == before
    return r.json()["message"]


def test_a_put_leaving_a_field_out_is_422_naming_it_and_changes_nothing(orch, http):
    whole = http.get("/v1/policy").json()["policy"] | {"target_groups": 5}
    del whole["max_replenish_rounds"]
    del whole["filter"]["std_tol"]
    assert refused(http, "PUT", whole) == (
        'PUT replaces the whole policy: send every field (the "policy" object of GET /v1/policy, without its '
        '"revision"), or PATCH the ones to change. filter.std_tol: Field required; max_replenish_rounds: Field required'
    )


def test_a_patch_of_gets_whole_body_is_422_saying_to_send_its_policy_object(orch, http):
    assert refused(http, "PATCH", http.get("/v1/policy").json()).startswith(
        'send the "policy" object of GET /v1/policy, not its whole body. '
        "revision: Extra inputs are not permitted; policy: Extra inputs are not permitted; valid fields: cooldown_epochs, "
    )


def test_a_dotted_field_name_is_422_showing_the_nested_object(orch, http):
    assert refused(http, "PATCH", {"filter.std_tol": 0.1}).startswith(
        'nested fields are objects: {"filter": {"std_tol": ...}}, not "filter.std_tol". '
        "filter.std_tol: Extra inputs are not permitted; valid fields: "
    )


def test_a_rejected_value_is_quoted_in_the_message(orch, http):
    assert refused(http, "PATCH", {"filter": {"std_tol": -1}}) == (
        "filter.std_tol: Input should be greater than or equal to 0 (got -1)"
    )


def test_an_unknown_field_is_answered_with_the_valid_ones(orch, http):
    message = refused(http, "PATCH", {"target_grups": 8})
    assert message.startswith("target_grups: Extra inputs are not permitted; valid fields: cooldown_epochs, filter, group_size, "
                              "group_validity, group_validity_options, ")
    assert "target_groups" in message


def test_a_cross_field_refusal_names_its_field_in_detail_once(orch, http):
    r = http.patch("/v1/policy", json={"filter": {"band": [0.9, 0.1]}}, headers=AUTH)
    assert r.status_code == 422 and r.json()["error"] == "invalid_policy"
    assert r.json()["message"] == "invalid resampling policy: filter: band must satisfy lo < hi, got (0.9, 0.1)"
    assert r.json()["detail"] == [{"loc": ["filter"], "msg": "band must satisfy lo < hi, got (0.9, 0.1)", "type": "value_error"}]


def test_bad_bodies_are_4xx_and_service_keeps_running(orch, http):
    cases = [
        ({"content": b'{"target_groups": 3', "headers": {"Content-Type": "application/json"}}, 400, "malformed JSON"),
        ({"content": b"[1, 2]", "headers": {"Content-Type": "application/json"}}, 422, "body"),
        ({"content": b"", "headers": {"Content-Type": "application/json"}}, 422, "body"),
        ({"content": b"target_groups=3", "headers": {"Content-Type": "text/plain"}}, 415, "Content-Type"),
        ({"json": {"filter": {"judge": "x" * 70_000}}}, 413, "exceeds the limit"),
    ]
    for kwargs, status, words in cases:
        kwargs.setdefault("headers", {})
        kwargs["headers"] = {**kwargs["headers"], **AUTH}
        r = http.patch("/v1/policy", **kwargs)
        assert r.status_code == status, (kwargs, r.text)
        assert words in r.json()["message"]
    assert revision(http) == 0
    r = http.patch("/v1/policy", json={}, headers=AUTH)  # nothing to change: answered, no new revision
    assert r.status_code == 200 and r.json()["revision"] == 0
    assert http.get("/healthz").status_code == 200


def test_oversized_chunked_body_is_413(orch, http):
    def chunks():
        for _ in range(40):
            yield b" " * 4096  # 160 KiB without a Content-Length

    r = http.patch("/v1/policy", content=chunks(), headers={**AUTH, "Content-Type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["message"]
    assert revision(http) == 0


def test_stale_if_match_is_409(orch, http):
    r = http.patch("/v1/policy", json={"target_groups": 3}, headers={**AUTH, "If-Match": '"0"'})
    assert r.status_code == 200 and r.headers["etag"] == '"1"'
    r = http.patch("/v1/policy", json={"target_groups": 4}, headers={**AUTH, "If-Match": '"0"'})
    assert r.status_code == 409 and "expected 0 but the policy is at revision 1" in r.json()["message"]
    whole = http.get("/v1/policy").json()["policy"] | {"target_groups": 4}
    r = http.put("/v1/policy", json=whole, headers={**AUTH, "If-Match": 'W/"0"'})
    assert r.status_code == 409
    assert http.get("/v1/policy").json()["policy"]["target_groups"] == 3
    for bad in ("abc", "null", "\u00b2", '"1" "2"'):  # superscript two: str.isdigit() but not int()
        r = http.patch("/v1/policy", json={"target_groups": 4}, headers={**AUTH, "If-Match": bad.encode()})
        assert r.status_code == 422 and "if-match" in r.json()["message"].lower()
    r = http.patch("/v1/policy", json={"target_groups": 4}, headers={**AUTH, "If-Match": '"1"'})
    assert r.status_code == 200 and r.json()["revision"] == 2


def test_auth_on_mutating_endpoints(orch, http):
    for method, path in (("PATCH", "/v1/policy"), ("PUT", "/v1/policy"), ("POST", "/v1/replenish/pause"),
                         ("POST", "/v1/replenish/resume")):
        body = {"target_groups": 3, "group_size": 2} if method != "POST" else None
        r = http.request(method, path, json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer"), (method, path)
        r = http.request(method, path, json=body, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 403, (method, path)
        r = http.request(method, path, json=body, headers={"Authorization": f"Basic {DSO_TOKEN}"})
        assert r.status_code == 401
    # unauthenticated requests are refused before the body is parsed
    assert http.patch("/v1/policy", content=b"{oops", headers={"Content-Type": "application/json"}).status_code == 401
    assert revision(http) == 0
    for path in ("/v1/policy", "/v1/stats", "/healthz", "/metrics"):
        assert http.get(path).status_code == 200


def test_task_history_and_unknown_task_404(orch, http):
    ray.get(orch.next_batch.remote())  # t0, t1 wrong, then both mixed
    r = http.get("/v1/tasks/t0")
    assert r.status_code == 200
    h = r.json()
    assert h["task_id"] == "t0" and h["groups"] == 2 and h["rollouts"] == 4 and h["informative"] == 1
    assert h["pass_rate"] == 0.25 and h["mean"] == -0.5
    r = http.get("/v1/tasks/nope")
    assert r.status_code == 404 and "nope" in r.json()["message"]


def test_stats_are_live(orch, http):
    s0 = http.get("/v1/stats").json()
    assert s0["groups_submitted"] == 0 and s0["keep_ratio"] is None
    ray.get(orch.next_batch.remote())
    s = http.get("/v1/stats").json()
    # round 0: t0, t1 all wrong; replenish round 1: t0, t1 mixed -> a batch of 2
    assert s["batches_emitted"] == 1 and s["groups_submitted"] == 4 and s["groups_emitted"] == 2
    assert s["classified_by_reason"]["all_wrong"] == 2 and s["replenish_rounds"] == 1
    assert s["rollouts_initial"] == 4 and s["rollouts_replenish"] == 4 and s["keep_ratio"] == 0.5


def test_pause_stops_replenish_rounds_and_resume_restarts_them(orch, http):
    r = http.post("/v1/replenish/pause", headers=AUTH)
    assert r.status_code == 200 and r.json()["policy"]["replenish_paused"] is True and r.json()["revision"] == 1
    assert ray.get(orch.next_batch.remote(timeout_s=1.0)) is None  # initial round only: 2 wrong groups
    s = http.get("/v1/stats").json()
    assert s["replenish_rounds"] == 0 and s["groups_submitted"] == 2 and s["replenish_paused"] is True
    r = http.post("/v1/replenish/resume", headers=AUTH)
    assert r.status_code == 200 and r.json()["policy"]["replenish_paused"] is False and r.json()["revision"] == 2
    batch = ray.get(orch.next_batch.remote(timeout_s=10.0))
    assert batch is not None and batch.rounds == 1 and len(batch.groups) == 2
    assert http.get("/v1/stats").json()["replenish_rounds"] == 1


def test_rest_policy_change_changes_the_next_batch(svc, http):
    # t0, t1: mean 0 ([1, -1]); t2, t3: mean 0.5 ([1, 0]); all informative under the default filter
    a, b = [1.0, -1.0], [1.0, 0.0]
    # the band judges the reward means (the scripted accuracy would be 0.5 for all four)
    orch = svc.orchestrator({"target_groups": 4, "group_size": 2, "min_keep_rate": 1.0, "filter": {"judge": "reward"}},
                            {"t0": [a], "t1": [a], "t2": [b], "t3": [b]})
    first = ray.get(orch.next_batch.remote())
    assert {g.task_id for g in first.groups} == {"t0", "t1", "t2", "t3"}
    assert http.get("/v1/stats").json()["classified_by_reason"]["out_of_band"] == 0
    r = http.patch("/v1/policy", json={"filter": {"band": [-0.25, 0.25]}}, headers=AUTH)
    assert r.status_code == 200
    second = ray.get(orch.next_batch.remote())
    assert len(second.groups) == 4 and {g.task_id for g in second.groups} <= {"t0", "t1"}
    s = http.get("/v1/stats").json()
    # round 0 of batch 2 rolls out all four tasks (one epoch): t2 and t3 at least are now out of band
    assert s["classified_by_reason"]["out_of_band"] >= 2
    assert s["dropped_by_reason"]["out_of_band"] == s["classified_by_reason"]["out_of_band"]
    assert s["replenish_rounds"] >= 1


def test_dead_actor_is_503_then_found_again(svc, http):
    svc.orchestrator({"target_groups": 2, "group_size": 2}, {"t0": [MIXED]})
    assert http.get("/healthz").status_code == 200
    svc.stop()
    r = http.get("/healthz")
    assert r.status_code == 503 and r.json()["status"] == "unavailable"
    r = http.get("/v1/stats")
    assert r.status_code == 503 and "not found" in r.json()["message"]
    svc.orchestrator({"target_groups": 3, "group_size": 2}, {"t0": [MIXED]})
    assert http.get("/healthz").status_code == 200
    assert http.get("/v1/policy").json()["policy"]["target_groups"] == 3


def test_cli_policy_and_status_go_through_the_rest_api(orch, svc):
    from typer.testing import CliRunner

    from orchestrator.cli.app import app

    runner = CliRunner()
    env = {"DSO_URL": svc.url, "DSO_API_TOKEN": ""}
    r = runner.invoke(app, ["policy", "get"], env=env)
    assert r.exit_code == 0 and '"revision": 0' in r.output
    r = runner.invoke(app, ["policy", "set", "target_groups=3", "filter.band=[-0.5, 0.5]", "replenish_paused=true"], env=env)
    assert r.exit_code == 1 and "401" in r.output
    r = runner.invoke(app, ["policy", "set", "target_groups=3", "filter.band=[-0.5, 0.5]", "replenish_paused=true",
                            "--token", DSO_TOKEN], env=env)
    assert r.exit_code == 0 and r.output.startswith("revision 1")
    p = ray.get(orch.get_policy.remote())["policy"]
    assert p["target_groups"] == 3 and p["filter"]["band"] == [-0.5, 0.5] and p["replenish_paused"] is True
    r = runner.invoke(app, ["policy", "set", "group_size=0", "--token", DSO_TOKEN], env=env)
    assert r.exit_code == 1 and "422" in r.output and "group_size" in r.output
    r = runner.invoke(app, ["policy", "set", "target_groups=4", "--if-match", "0", "--token", DSO_TOKEN], env=env)
    assert r.exit_code == 1 and "409" in r.output
    r = runner.invoke(app, ["status"], env=env)
    assert r.exit_code == 0 and "groups submitted" in r.output and "replenish paused" in r.output


def test_cli_prints_a_long_error_message_on_one_line(svc):
    from typer.testing import CliRunner

    from orchestrator.cli.app import app

    r = CliRunner().invoke(app, ["policy", "set", "max_replenish_rounds=banana", "--token", DSO_TOKEN],
                           env={"DSO_URL": svc.url, "DSO_API_TOKEN": ""})
    line = next(x for x in r.output.splitlines() if "HTTP 422" in x)
    assert r.exit_code == 1 and "max_replenish_rounds: Input should be a valid integer" in line


@pytest.mark.parametrize("token, status, hint", [("", 401, "set one"), ("wrong", 403, "it is not the service's")])
def test_cli_says_where_its_token_comes_from_when_refused(svc, token, status, hint):
    from typer.testing import CliRunner

    from orchestrator.cli.app import app

    r = CliRunner().invoke(app, ["policy", "set", "target_groups=3"], env={"DSO_URL": svc.url, "DSO_API_TOKEN": token})
    line = next(x for x in r.output.splitlines() if f"HTTP {status}" in x)
    assert r.exit_code == 1 and "DSO_API_TOKEN or --token" in line and hint in line


def test_cli_status_watch_into_a_file_prints_a_table_each_refresh(orch, svc, tmp_path):
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    cli = Path(sys.executable).parent / "trinity-dso"
    log = tmp_path / "status.log"
    with open(log, "wb") as out:  # a file, as `status --watch 2 > status.log`
        # Ctrl-C as in a terminal (a test run started in the background ignores SIGINT, and so would its children)
        proc = subprocess.Popen([str(cli), "status", "--watch", "0.3", "--url", svc.url], stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        deadline = time.monotonic() + 120
        while log.read_bytes().count(b"trinity-dso status") < 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    text = log.read_bytes().decode()
    assert proc.returncode == 0 and text.count("trinity-dso status") >= 3, text[-2000:]
    tables = text.split("trinity-dso status")[1:]
    assert len({t.count("\n") for t in tables}) == 1, text[-2000:]  # whole tables only: Ctrl-C cut none


def test_cli_assignments_parse_to_nested_typed_values():
    import typer

    from orchestrator.cli.service import parse_assignments

    got = parse_assignments(["target_groups=4", "filter.std_tol=0.01", "filter.band=[0.1, 0.9]", "max_staleness=null",
                             "replenish_paused=true", "on_cap=partial"])
    assert got == {"target_groups": 4, "filter": {"std_tol": 0.01, "band": [0.1, 0.9]}, "max_staleness": None,
                   "replenish_paused": True, "on_cap": "partial"}
    for bad in ("target_groups", "=4", "filter.=1"):
        with pytest.raises(typer.BadParameter, match="KEY=VALUE"):
            parse_assignments([bad])


def test_selection_switched_over_rest_mid_run(svc, http):
    tasks = [f"t{i}" for i in range(8)]
    script = {t: [MIXED] if i % 2 else [WRONG] for i, t in enumerate(tasks)}
    orch = svc.orchestrator({"target_groups": 2, "group_size": 2}, script, tasks=tasks)
    ray.get(orch.next_batch.remote())
    epoch_stats = http.get("/v1/stats").json()
    assert epoch_stats["selection"] == "epoch"
    r = http.patch("/v1/policy", json={"selection": "informative", "selection_options": {"explore": 0.0}}, headers=AUTH)
    assert r.status_code == 200 and r.json()["policy"]["selection"] == "informative"
    ray.get(orch.next_batch.remote())
    s = http.get("/v1/stats").json()
    assert s["selection"] == "informative" and s["selection_metrics"]["picks"] > 0
    assert s["last_round"]["predicted_keep_rate"] is not None
    row = http.get("/v1/tasks/t1").json()
    assert row["estimate"]["seen"] and 0.0 <= row["estimate"]["predicted_informative"] <= 1.0
    assert row["revisit_due_in_picks"] is not None and row["next_eligible_epoch"] >= row["epoch"]
    metrics = http.get("/metrics").text
    assert 'dso_round_keep_rate{kind="realised"}' in metrics and "dso_rollouts_dropped_ratio" in metrics
    assert 'selection="informative"' in metrics  # the policy info labels


def test_invalid_selection_over_rest_is_422_naming_the_field(orch, http):
    r = http.patch("/v1/policy", json={"selection": "greedy"}, headers=AUTH)
    assert r.status_code == 422 and "selection" in r.text
    assert http.get("/v1/policy").json()["policy"]["selection"] == "epoch"


def test_pass_predictor_over_rest_shows_its_prediction_per_task(svc, http):
    tasks = [f"t{i}" for i in range(8)]
    script = {t: [MIXED] if i % 2 else [WRONG] for i, t in enumerate(tasks)}
    orch = svc.orchestrator({"target_groups": 2, "group_size": 2}, script, tasks=tasks)
    r = http.patch("/v1/policy", json={"selection": "pass_predictor", "selection_options": {"floor": 0.2}}, headers=AUTH)
    assert r.status_code == 200 and r.json()["policy"]["selection_options"] == {"floor": 0.2}
    ray.get(orch.next_batch.remote())
    s = http.get("/v1/stats").json()
    assert s["selection"] == "pass_predictor" and s["selection_metrics"]["predictions_scored"] > 0
    seen = [t for t in tasks if http.get(f"/v1/tasks/{t}").json()["selection_row"]["own_evidence_rollouts"] > 0]
    row = http.get(f"/v1/tasks/{seen[0]}").json()["selection_row"]
    assert 0.0 < row["predicted_pass_rate"] < 1.0 and 0.2 <= row["keep_probability"] <= 1.0
    bad = http.patch("/v1/policy", json={"selection_options": {"floor": 2.0}}, headers=AUTH)
    assert bad.status_code == 422 and "selection_options.floor" in bad.text
