"""The live page (``GET /dashboard``) in a real headless Chromium, during a live run of the actor.

Needs Debian's ``chromium`` (``make test`` installs it where the user is root; otherwise these
tests skip, saying why) and the ``playwright`` package, which drives that browser (no browser is
downloaded). The page polls every 0.5 s here (``?refresh=0.5``).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

import httpx
import pytest
import ray

from orchestrator.rollout.scripted import BernoulliRolloutSource

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "runs" / "tests" / "dashboard.png"
DSO_TOKEN = "dashboard-token"
TASKS = [f"t{i:02d}" for i in range(40)]
PASS_RATES = {t: (0.0, 0.15, 0.5, 0.85, 1.0)[i % 5] for i, t in enumerate(TASKS)}
POLICY = {"target_groups": 4, "group_size": 4, "max_replenish_rounds": 3, "answer_screen": True, "max_staleness": 1}
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]


def chromium() -> str | None:
    return os.environ.get("DSO_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


pytestmark = pytest.mark.skipif(
    chromium() is None, reason="chromium not installed (Debian: apt-get install chromium; `make test` does it as root)")


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless Chromium with a fresh profile, driven by Playwright; one per module."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed (the `dev` extra)")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=chromium(), headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1200})
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def actor(dso_service):
    return dso_service.orchestrator(POLICY, tasks=TASKS, source=BernoulliRolloutSource(PASS_RATES, seed=0))


@pytest.fixture
def page(browser, dso_service, actor):
    """The dashboard, loaded and showing its first poll."""
    tab = browser.new_page()
    tab.goto(f"{dso_service.url}/dashboard?refresh=0.5")
    tab.wait_for_selector('#status[data-state="live"]', timeout=30_000)
    yield tab
    tab.close()


def rest(dso_service) -> httpx.Client:
    return httpx.Client(base_url=dso_service.url, timeout=30)


def shown(page) -> dict[str, str]:
    """{stats key (dotted): the text the page shows for it}."""
    return page.eval_on_selector_all("[data-stat]", "els => Object.fromEntries(els.map(e => [e.dataset.stat, e.textContent]))")


def lookup(stats: dict, dotted: str):
    for key in dotted.split("."):
        stats = stats[key]
    return stats


def wait_refreshes(page, n: int = 2) -> None:
    """Wait until the page has polled ``n`` more times, the last one successfully."""
    now = int(page.get_attribute("body", "data-refreshes"))
    page.wait_for_function("n => Number(document.body.dataset.refreshes) >= n", arg=now + n, timeout=30_000)
    assert page.get_attribute("#status", "data-state") == "live", page.inner_text("#status")


def assert_page_shows(page, stats: dict) -> None:
    """Every number on the page equals the stats' (to the 3 decimals it shows)."""
    seen = shown(page)
    assert len(seen) >= 15, seen
    for key, text in seen.items():
        value = lookup(stats, key)
        if value is None:
            assert text == "–", (key, text)
        elif isinstance(value, int) and not isinstance(value, bool):
            assert text == str(value), (key, text, value)
        else:
            assert abs(float(text) - value) <= 5e-4, (key, text, value)


def held_and_compared(page, run, client) -> dict:
    """Hold the run, let the page poll twice, compare it with GET /v1/stats, let the run go on."""
    run.hold()
    wait_refreshes(page)
    stats = client.get("/v1/stats").json()
    assert_page_shows(page, stats)
    run.go()
    return stats


def test_the_page_shows_the_numbers_of_v1_stats_as_the_run_moves(page, actor, dso_service, live_run):
    run = live_run(actor, pause_s=0.15).go()
    with rest(dso_service) as client:
        first = held_and_compared(page, run, client)
        seen = [first]
        deadline, steered = time.monotonic() + 9, False
        while time.monotonic() < deadline:
            time.sleep(2)
            seen.append(held_and_compared(page, run, client))
            if not steered:  # a user steers the run over REST: the page marks the new revision
                steered = client.patch("/v1/policy", json={"max_replenish_rounds": 2},
                                       headers={"Authorization": f"Bearer {DSO_TOKEN}"}).status_code == 200
    run.hold()
    wait_refreshes(page)
    last = seen[-1]
    # the run moved between the comparisons: batches, kept and dropped groups, screens, model version
    assert [s["batches_emitted"] for s in seen] == sorted(s["batches_emitted"] for s in seen)
    assert last["batches_emitted"] >= first["batches_emitted"] + 10
    assert last["groups_dropped"] > first["groups_dropped"] and last["groups_emitted"] > first["groups_emitted"]
    assert last["answer_skips"] > first["answer_skips"] and last["model_version"] >= 5
    assert page.locator("canvas").count() == 5
    assert page.locator("#revision-marks li").all_inner_texts()[0].startswith("revision 1 at ")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOT), full_page=True)
    print(f"screenshot: {SCREENSHOT}")


def test_a_policy_change_made_from_the_page_shows_in_v1_stats_and_in_the_revision_marks(page, dso_service):
    with rest(dso_service) as client:
        before = client.get("/v1/stats").json()["policy_revision"]
        page.select_option("#policy-field", "max_replenish_rounds")
        page.fill("#policy-value", "5")
        page.fill("#policy-token", DSO_TOKEN)
        page.click("#policy-apply")
        page.wait_for_selector('#policy-result[data-ok="true"]', timeout=30_000)
        assert client.get("/v1/stats").json()["policy_revision"] == before + 1
        assert client.get("/v1/policy").json()["policy"]["max_replenish_rounds"] == 5
    page.wait_for_selector(f'#revision-marks li[data-revision="{before + 1}"]', timeout=30_000)
    assert page.inner_text('[data-stat="policy_revision"]') == str(before + 1)
    assert page.inner_text("#policy-revision") == str(before + 1)
    assert page.inner_text('#policy-table tr[data-field="max_replenish_rounds"] td:last-child') == "5"
    # the token was sent, not stored
    stored = page.evaluate("() => [localStorage.length, sessionStorage.length, document.cookie]")
    assert stored == [0, 0, ""] and not page.context.cookies() and DSO_TOKEN not in page.url


def test_a_change_with_a_wrong_token_is_refused_on_the_page_and_changes_nothing(page, dso_service):
    with rest(dso_service) as client:
        before = client.get("/v1/policy").json()
        page.select_option("#policy-field", "filter.judge")
        page.fill("#policy-value", '"accuracy"')
        page.fill("#policy-token", "not-the-token")
        page.click("#policy-apply")
        page.wait_for_selector('#policy-result[data-ok="false"]', timeout=30_000)
        assert re.match(r"403 forbidden: Authorization: bearer token rejected", page.inner_text("#policy-result"))
        assert client.get("/v1/policy").json() == before


def test_the_page_keeps_polling_across_an_orchestrator_restart(page, dso_service):
    dso_service.stop()
    page.wait_for_selector('#status[data-state="unavailable"]', timeout=30_000)
    assert "503" in page.inner_text("#status")
    fresh = dso_service.orchestrator(POLICY, tasks=TASKS, source=BernoulliRolloutSource(PASS_RATES, seed=1))
    ray.get(fresh.next_batch.remote())
    page.wait_for_selector('#status[data-state="live"]', timeout=30_000)
    wait_refreshes(page)
    with rest(dso_service) as client:
        assert_page_shows(page, client.get("/v1/stats").json())


def test_the_page_and_its_files_come_from_the_service_not_the_internet(dso_service):
    with rest(dso_service) as client:
        r = client.get("/dashboard")
        assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
        assert "script-src 'self'" in r.headers["content-security-policy"]
        files = re.findall(r'(?:src|href)="([^"]+)"', r.text)
        assert files == ["dashboard/uPlot.min.css", "dashboard/dashboard.css", "dashboard/uPlot.iife.min.js",
                         "dashboard/dashboard.js"]
        for name in files:
            f = client.get(f"/{name}")
            assert f.status_code == 200 and f.content, name
            assert not re.search(r"https?://(?!github\.com/leeoniya)", f.text), name  # uPlot's banner names its home
        missing = client.get("/dashboard/secrets.txt")
        assert missing.status_code == 404 and "dashboard file 'secrets.txt' not found" in missing.json()["message"]
