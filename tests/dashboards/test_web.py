"""The operator page of a real `governor serve --demo-traffic` (shipped model, loopback), driven in Debian's headless
Chromium through Playwright: no console errors, charts filling with live data, refused and accepted actions."""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from playwright.sync_api import Page, expect, sync_playwright

from controller.store import Store
from controller.trials.judge import SwitchbackJudge
from policies import JudgePolicy
from tests.controller.test_alerts import _payload
from tests.controller.test_judge import agreeing_blocks
from tests.dashboards.servers import Server, binary, free_port

TOKEN = "web-test-admin-token"
ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic"]
# a window far longer than the module runs: the controller never acts on its own, so every config change the tests
# see is the operator's
QUIET_POLICY = {"window": {"seconds": 3600.0, "checks": 1}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The served process's folder: its policy and its store (governor.db)."""
    return tmp_path_factory.mktemp("web")


@pytest.fixture(scope="module")
def served(folder):
    policy = folder / "policy.yaml"
    policy.write_text(yaml.safe_dump(QUIET_POLICY))
    port = free_port()
    server = Server("governor-web", [sys.executable, "-m", "governor.cli", "serve", "--demo-traffic",
                                     "--port", str(port), "--policy", str(policy),
                                     "--db", f"sqlite:///{folder / 'governor.db'}"], folder,
                    env={**os.environ, "GOVERNOR_ADMIN_TOKEN": TOKEN, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready(f"{url}/health", timeout=180)
        yield url
    finally:
        server.stop()


@pytest.fixture(scope="module")
def browser_context(tmp_path_factory):
    chromium = binary("chromium")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=chromium, headless=True,
            args=CHROMIUM_FLAGS, viewport={"width": 1366, "height": 768})
        yield context
        context.close()


@pytest.fixture(scope="module")
def problems() -> list[str]:
    """Console errors and uncaught exceptions of the page, in order."""
    return []


@pytest.fixture(scope="module")
def page(served, browser_context, problems):
    """The page, opened once for the module."""
    page = browser_context.new_page()
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(served)
    yield page
    page.close()


def _points(page: Page, chart: str, trace: int = 0) -> list:
    """The y values (z for the heatmap) Plotly holds for one trace of a chart, as drawn."""
    return page.evaluate("([id, i]) => { const t = document.getElementById(id).data[i]; return t.z ?? t.y; }",
                         [chart, trace])


def _wait_for_points(page: Page, chart: str, count: int, trace: int = 0) -> None:
    page.wait_for_function("([id, i, n]) => { const d = document.getElementById(id).data;"
                           " return d && d[i] && (d[i].y || []).filter(v => v !== null && v > 0).length >= n; }",
                           arg=[chart, trace, count], timeout=90_000)


def test_charts_fill_with_live_data_and_no_console_errors(page, problems):
    for chart in ("chart-goodput", "chart-latency", "chart-acceptance", "chart-load"):
        _wait_for_points(page, chart, 5)
    goodput = [v for v in _points(page, "chart-goodput") if v]
    assert len(goodput) >= 5 and all(v > 0 for v in goodput)
    ttft_p99 = [v for v in _points(page, "chart-latency", 1) if v is not None]
    assert ttft_p99 and all(v > 0 for v in ttft_p99)                 # milliseconds
    acceptance = [v for v in _points(page, "chart-acceptance") if v is not None]
    assert acceptance and all(0 <= v <= 1 for v in acceptance)
    assert page.evaluate("document.getElementById('chart-acceptance').data.length") >= 2   # overall + positions
    heat = _points(page, "chart-heat")
    assert len(heat) == 4 and all(len(row) == 8 for row in heat)       # governor-moe: 4 layers x 8 experts
    assert all(abs(sum(row) - 1) < 1e-6 for row in heat)
    balancedness = [v for v in _points(page, "chart-balance") if v is not None]
    assert balancedness and all(0 < v <= 1 for v in balancedness)
    expect(page.locator("#speculation")).to_have_text("speculation: on")
    expect(page.locator("#decisions tbody tr").first).to_contain_text("start")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / "dashboard-live.png"))
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")   # no horizontal scroll
    assert problems == []


def test_an_action_without_the_token_is_refused_and_changes_nothing(page, served):
    before = httpx.get(f"{served}/admin/config").json()
    page.fill("#token", "")
    page.select_option("#pin-method", "draft_model")
    page.fill("#pin-draft-len", "2")
    page.click("#pin")
    expect(page.locator("#action-result")).to_contain_text("refused (401): a valid bearer token")
    assert httpx.get(f"{served}/admin/config").json() == before
    assert httpx.get(f"{served}/admin/controller").json()["pin"] is None
    assert httpx.get(f"{served}/admin/decisions", params={"action": "pin"}).json()["decisions"] == []


def test_pin_with_the_token_takes_effect_and_appears_in_the_decision_log(page, served):
    before = httpx.get(f"{served}/admin/config").json()
    page.fill("#token", TOKEN)
    page.select_option("#pin-method", "draft_model")
    page.fill("#pin-draft-len", "2")
    page.fill("#pin-capacity", "1.5")
    page.fill("#pin-schedule", "[[4, 2], [2, 1]]")
    page.click("#pin")
    expect(page.locator("#action-result")).to_contain_text("Pin refused (400): draft_len_schedule")
    assert httpx.get(f"{served}/admin/config").json() == before
    page.fill("#pin-schedule", "[[1, 6], [8, 2]]")
    page.click("#pin")
    expect(page.locator("#action-result")).to_contain_text("Pin: done")
    config = httpx.get(f"{served}/admin/config").json()
    assert (config["draft_len"], config["capacity_factor"]) == (2, 1.5) and config["version"] > before["version"]
    assert config["draft_len_schedule"] == [[1, 6], [8, 2]]
    expect(page.locator("#decisions tbody tr").first).to_contain_text("pin", timeout=10_000)
    expect(page.locator("#config-version")).to_have_text(f"config v{config['version']}", timeout=10_000)
    expect(page.locator("#history tbody tr").first).to_contain_text("draft_len: 4 → 2")
    expect(page.locator("#history tbody tr").first).to_contain_text("draft_len_schedule = b≤1: k6, b≤8: k2")
    expect(page.locator("#config")).to_contain_text("b≤1: k6, b≤8: k2")
    expect(page.locator("#drafter")).to_have_text("draft model · k by batch: b≤1: k6, b≤8: k2")
    expect(page.locator("#calibration")).to_contain_text("what-if calibration")
    page.click("#release")
    expect(page.locator("#action-result")).to_contain_text("Release: done")
    expect(page.locator("#decisions tbody tr").first).to_contain_text("release", timeout=10_000)
    assert httpx.get(f"{served}/admin/controller").json()["pin"] is None


def test_policy_switch_and_search_start_stop_from_the_page(page, served, problems):
    page.fill("#token", TOKEN)
    page.click("#search-start")
    expect(page.locator("#action-result")).to_contain_text("Start search: done")
    expect(page.locator("#policy-name")).to_contain_text("(optuna)", timeout=10_000)
    page.click("#search-start")
    expect(page.locator("#action-result")).to_contain_text("refused (409): an Optuna search is already running")
    page.click("#search-stop")
    expect(page.locator("#action-result")).to_contain_text("Stop search: done")
    expect(page.locator("#policy-name")).to_contain_text("(rules)", timeout=10_000)
    page.select_option("#policy-select", "default")
    page.click("#switch-policy")
    expect(page.locator("#action-result")).to_contain_text("Switch policy: done")
    expect(page.locator("#policy-name")).to_have_text("policy default (rules)", timeout=10_000)
    actions = [d["action"] for d in httpx.get(f"{served}/admin/decisions").json()["decisions"][:3]]
    assert actions == ["policy_switch"] * 3
    page.screenshot(path=str(SCREENSHOTS / "dashboard-after-actions.png"), full_page=True)
    refusals = [p for p in problems if p.startswith("Failed to load resource")]   # Chromium logs refused fetches
    assert [p for p in problems if p not in refusals] == []
    assert [p.rsplit("status of ", 1)[1] for p in refusals] == ["401 (Unauthorized)", "400 (Bad Request)",
                                                                "409 (Conflict)"]


def test_alerts_show_their_state(page, served):
    expect(page.locator("#alerts tbody")).to_contain_text("no alerts received")
    for status in ("firing", "resolved"):
        reply = httpx.post(f"{served}/alerts", json=_payload(status=status, action="notify", name="GovernorWebTest"),
                           headers={"Authorization": f"Bearer {TOKEN}"})
        assert reply.status_code == 200, reply.text
        expect(page.locator("#alerts tbody tr").first).to_contain_text(status, timeout=10_000)
    expect(page.locator("#alerts tbody tr")).to_have_count(2)
    expect(page.locator("#alerts tbody tr").last).to_contain_text("GovernorWebTest")
    expect(page.locator("#alerts tbody td.firing")).to_have_text("firing")
    expect(page.locator("#alerts tbody tr").last).to_contain_text("acted")      # the notify decision was recorded


CONTRAST = """() => {
  const rgb = (c) => c.match(/[\\d.]+/g).map(Number);
  const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; };
  const lum = (c) => c.slice(0, 3).map(channel).reduce((s, v, i) => s + v * [0.2126, 0.7152, 0.0722][i], 0);
  const background = (e) => { for (; e; e = e.parentElement) { const c = getComputedStyle(e).backgroundColor;
    if (rgb(c).length === 3 || rgb(c)[3] > 0) return rgb(c).slice(0, 3); } return [255, 255, 255]; };
  const low = [];
  const texts = "h1, h2, figcaption, label, button, input, select, dt, dd, td, th, p, span";
  for (const e of document.querySelectorAll(texts)) {
    if (!e.textContent.trim() && !e.value) continue;
    const [a, b] = [lum(rgb(getComputedStyle(e).color)), lum(background(e))];
    const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
    if (ratio < 4.5) low.push(`${e.tagName}#${e.id} "${e.textContent.trim().slice(0, 30)}" ${ratio.toFixed(2)}`);
  }
  return low;
}"""


def test_text_meets_wcag_aa_contrast(page):
    assert page.evaluate(CONTRAST) == []


def test_every_control_is_labelled_and_keyboard_reachable(page):
    unlabelled = page.evaluate("[...document.querySelectorAll('input, select')]"
                               ".filter(e => !document.querySelector(`label[for='${e.id}']`)).map(e => e.id)")
    assert unlabelled == []
    reached = set()
    page.locator("#token").focus()
    for _ in range(30):
        reached.add(page.evaluate("document.activeElement.id"))
        page.keyboard.press("Tab")
    assert {"token", "pin-method", "pin-draft-len", "pin-capacity", "pin", "release", "rollback", "policy-select",
            "switch-policy", "search-start", "search-stop"} <= reached
    page.locator("#rollback").focus()
    outline = page.evaluate("(s => [s.outlineStyle, s.outlineWidth])(getComputedStyle(document.activeElement))")
    assert outline[0] != "none" and outline[1] != "0px"                  # visible focus


def test_a_decision_with_non_finite_statistics_leaves_every_endpoint_and_the_page_strict_json(page, served, folder,
                                                                                                problems):
    """A judgment from 8 tied block pairs at 99% has the interval (0, inf), and rows an older version stored hold Infinity and
    NaN: every admin and dashboard endpoint still answers 200 with strict JSON, the event stream too, and the page
    takes the events without a console error."""
    earlier_problems = len(problems)
    judge = SwitchbackJudge(JudgePolicy(confidence=0.99, min_samples=8, max_blocks=16, margin=0.03), 1.0)
    judge.add(agreeing_blocks(8, 1.5, tied=True))
    judgment = judge.look()
    assert judgment.comparison.high == math.inf
    store = Store(f"sqlite:///{folder / 'governor.db'}")
    store.record_decision("trial", judgment.reason, inputs=judgment.evidence())
    older = store.record_decision("trial", "written by an older version", inputs={})
    with store.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE governor_decisions SET inputs = '{\"interval\": [0.0, Infinity], "
                                   f"\"p\": NaN}}' WHERE id = {older}")
    store.close()
    for path in ("/admin/decisions", "/admin/trials", "/admin/history", "/admin/alerts", "/admin/controller",
                 "/admin/config", "/admin/policy", "/admin/window", "/dashboard/state", "/health", "/ready"):
        reply = httpx.get(f"{served}{path}", timeout=30)
        # the quiet policy may not have closed a window yet: /admin/window then answers 404, in strict JSON too
        assert reply.status_code == 200 or (path, reply.status_code) == ("/admin/window", 404), (path, reply.text)
        json.loads(reply.text, parse_constant=_no_constant)
    decisions = {d["reason"]: d for d in httpx.get(f"{served}/admin/decisions", params={"limit": 20}).json()["decisions"]}
    assert decisions["written by an older version"]["inputs"] == {"interval": [0.0, None], "p": None}
    assert decisions[judgment.reason]["inputs"]["comparison"]["interval"] == [None, None]
    with httpx.stream("GET", f"{served}/dashboard/stream", timeout=30) as stream:
        event = next(line for line in stream.iter_lines() if line.startswith("data: "))
    state = json.loads(event.removeprefix("data: "), parse_constant=_no_constant)
    assert any(d["reason"] == "written by an older version" for d in state["decisions"])
    expect(page.locator("#decisions tbody")).to_contain_text("written by an older version", timeout=15_000)
    page.wait_for_timeout(3000)                                     # a few more events
    assert problems[earlier_problems:] == []


def _no_constant(name: str):
    raise AssertionError(f"{name} is not JSON")
