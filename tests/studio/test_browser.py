"""The studio in a real headless Chromium, on a real run folder made by a short `tiny` launcher run.

The first test runs while the run is live (the launcher's own studio child): the run page must update
without a reload, and the experience search must go through the live experience manager. The rest run
on the finished folder with a fresh `python -m studio --runs`: every page, the links from run to
trajectory to experience, and what the pages show against the run's own files (step labels, loss-mask
colouring, experience flags, funnel, pool). Screenshots go to the test artifacts folder.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Iterator
from html import escape
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
import yaml
from starlette.testclient import TestClient

from studio.app import COOKIE, build_app
from studio.settings import StudioSettings
from tests.helpers import ServiceProcess, run_service

pytestmark = pytest.mark.slow

MASK1_COLOR = "rgb(187, 247, 208)"
MASK0_COLOR = "rgb(229, 231, 235)"


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_live_run_page_updates_without_reload_and_search_uses_the_live_pool(launched_run, browser, artifacts):
    base = f"{launched_run.studio_url}/runs/{launched_run.name}"
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto(base)
    live = page.locator("#live")
    assert live.get_attribute("data-status") == "live"
    first = int(live.get_attribute("data-records"))
    page.evaluate("window.__notReloaded = true")
    # The trainer logs the held-out evaluation (step 0) and then each step; the page must show them by itself.
    page.wait_for_function(f"Number(document.querySelector('#live').dataset.steps) >= 1 && "
                           f"Number(document.querySelector('#live').dataset.records) > {first}", timeout=240_000)
    assert page.evaluate("window.__notReloaded") is True
    assert page.locator("#live polyline").count() >= 1
    page.screenshot(path=str(artifacts / "run-live.png"), full_page=True)

    # After step 1 the pool holds the step's distilled experiences: the search box asks the live service.
    search = browser.new_page()
    response = search.goto(f"{base}/experiences?q={quote('Book a seat on a flight for a passenger')}")
    assert response.status == 200
    assert "live experience manager" in search.content()
    assert search.locator(".found .hit").count() >= 1  # min_similarity -1 in the run config: every query hits
    search.screenshot(path=str(artifacts / "experiences-search-live.png"), full_page=True)
    search.close()
    page.close()


@pytest.fixture(scope="module")
def studio(finished_run) -> Iterator[ServiceProcess]:
    with run_service("studio", ["--runs", str(finished_run.runs_dir), "--page-size", "5"]) as service:
        yield service


def test_pages_and_links_match_the_run_files(finished_run, studio, browser, artifacts):
    run_dir = finished_run.run_dir
    trainer_dir = run_dir / "trainer"
    index = read_jsonl(trainer_dir / "rollouts" / "index.jsonl")
    metrics = read_jsonl(trainer_dir / "metrics.jsonl")
    summary = json.loads((trainer_dir / "summary.json").read_text())
    assert len(index) == 3 * 2 * 2  # steps x tasks per step x n
    page = browser.new_page(viewport={"width": 1300, "height": 900})

    # Runs: the finished run with its status and steps.
    page.goto(studio.url + "/")
    row = page.locator(f"tr[data-run='{finished_run.name}']")
    assert row.locator(".status").inner_text() == "finished"
    page.screenshot(path=str(artifacts / "runs.png"), full_page=True)
    row.locator("a").click()

    # Run: counters are the last logged values, the before/after table is summary.json's.
    page.wait_for_selector("#live")
    assert page.locator("#live").get_attribute("data-status") == "finished"
    assert int(page.locator("#live").get_attribute("data-steps")) == 3
    counters = dict(zip(page.locator(".counters td:first-child").all_inner_texts(),
                        page.locator(".counters td.n").all_inner_texts(), strict=False))
    assert float(counters["judge/steps_labelled"]) == metrics[-1]["judge/steps_labelled"]
    assert float(counters["experience/injected_rollouts"]) == metrics[-1]["experience/injected_rollouts"]
    assert page.locator("table.eval tbody tr, table.eval tr:has(td)").count() == len(summary["eval"]["rows"])
    assert page.locator("figure.chart polyline[data-series='rollout/reward_mean']").get_attribute(
        "data-points") == "3"
    page.screenshot(path=str(artifacts / "run.png"), full_page=True)
    page.locator("#rollouts-link").click()

    # Rollouts: newest first, five a page (--page-size 5).
    page.wait_for_selector("table.rollouts")
    shown = page.locator("table.rollouts tr[data-trajectory]").all()
    assert [r.get_attribute("data-trajectory") for r in shown] == [e["trajectory_id"] for e in index[::-1][:5]]
    assert page.locator(".pager").get_attribute("data-pages") == "3"

    # Trajectory: a rollout that was given experience, reached by clicking through the list.
    flagged = next(e for e in reversed(index) if e["experience_flag"] and e["experience_ids"])
    position = index[::-1].index(flagged)
    if position >= 5:
        page.goto(f"{studio.url}/runs/{finished_run.name}/rollouts?page={position // 5 + 1}")
    page.locator(f"tr[data-trajectory='{flagged['trajectory_id']}'] a").click()
    page.wait_for_selector("article.trajectory")
    record = json.loads(_record_bytes(trainer_dir / "rollouts", flagged))
    article = page.locator("article.trajectory")
    assert article.get_attribute("data-experience-flag") == "true"
    labels = {label["step"]: label for label in record["labels"]}
    turns = page.locator(".turn[data-step]")
    assert turns.count() == len(record["steps"]) and len(labels) == len(record["steps"])
    for i in range(turns.count()):
        turn = turns.nth(i)
        step = int(turn.get_attribute("data-step"))
        assert turn.get_attribute("data-label") == labels[step]["label"]
        if labels[step]["reason"]:
            assert labels[step]["reason"] in turn.locator(".reason").inner_text()
        else:  # judgments only (`max_analysis_chars: 0`): no empty reason line
            assert turn.locator(".reason").count() == 0
    # Tokens coloured by loss mask: one span per response token, its class and colour from the mask.
    mask = Counter(record["loss_mask"])
    assert page.locator(".turn .t.m1").count() == mask[1] > 0
    assert page.locator(".turn .t.m0").count() == mask[0]
    color = page.locator(".turn .t.m1").first.evaluate("e => getComputedStyle(e).backgroundColor")
    assert color == MASK1_COLOR
    if mask[0]:
        assert page.locator(".turn .t.m0").first.evaluate("e => getComputedStyle(e).backgroundColor") == MASK0_COLOR
    group = [e for e in index if e["group_id"] == flagged["group_id"] and e["step"] == flagged["step"]]
    assert page.locator("aside.group tr:has(a)").count() == len(group) == 2
    injected = page.locator(".injected[data-experience]")
    assert [injected.nth(i).get_attribute("data-experience") for i in range(injected.count())] == \
        flagged["experience_ids"]
    # The exact experience text the policy saw, as the trainer recorded it.
    assert record["experience_text"]
    assert page.locator("pre.experience-text").inner_text().strip() == record["experience_text"].strip()
    page.screenshot(path=str(artifacts / "trajectory.png"), full_page=True)

    # ... then to the experience that was injected.
    experience_id = flagged["experience_ids"][0]
    injected.first.locator("a").click()
    page.wait_for_selector("article.experience")
    pool = _pool_from_journal(run_dir)
    assert page.locator("article.experience").get_attribute("data-experience") == experience_id
    assert page.locator("td.when").inner_text() == pool[experience_id]["when_to_use"]
    users = [e["trajectory_id"] for e in index if experience_id in e["experience_ids"]]
    shown_users = page.locator("table.rollouts tr[data-trajectory]")
    assert sorted(shown_users.nth(i).get_attribute("data-trajectory") for i in range(shown_users.count())) == \
        sorted(users)
    page.screenshot(path=str(artifacts / "experience.png"), full_page=True)

    # Experiences: the pool replayed from the experience manager's journal; search explains it needs a live run.
    page.goto(f"{studio.url}/runs/{finished_run.name}/experiences?q=flight")
    assert page.locator(".search-error").inner_text().startswith("search calls the experience manager")
    assert f"{len(pool)} experience(s)" in page.locator("p.muted").first.inner_text()
    page.screenshot(path=str(artifacts / "experiences.png"), full_page=True)

    # A rollout without experience says so.
    plain = next(e for e in index if not e["experience_flag"])
    page.goto(f"{studio.url}/runs/{finished_run.name}/rollouts/{plain['trajectory_id']}")
    assert page.locator(".experience-box.off").count() == 1

    # Tasks: the funnel and the tasks are the task manager's store; no reference solution on the page.
    page.goto(f"{studio.url}/runs/{finished_run.name}/tasks")
    store = _task_store(run_dir)
    funnel = dict(zip(page.locator("table.funnel td:first-child").all_inner_texts(),
                      page.locator("table.funnel td.n").all_inner_texts(), strict=True))
    assert int(funnel["kept"]) == store["kept"] > 0 and int(funnel["proposed"]) == store["proposed"]
    assert f"Tasks ({store['count']})" in page.content()  # synthetic ones and originals with pass rates
    shown_rates = dict(zip(page.locator("table.tasks tr[data-task] td:first-child").all_inner_texts(),
                           page.locator("table.tasks tr[data-task] td.n:nth-last-child(2)").all_inner_texts(),
                           strict=True))
    expected = {task: f"{store['rates'][f'flights/{task}']:.4g}" if f"flights/{task}" in store["rates"] else "-"
                for task in shown_rates}
    assert shown_rates == expected and any(rate != "-" for rate in shown_rates.values())
    html = page.content()
    assert store["reference_actions"]
    for action in store["reference_actions"]:
        assert action not in html and escape(action) not in html
    page.screenshot(path=str(artifacts / "tasks.png"), full_page=True)
    page.close()


def test_bad_input_gets_a_4xx_page_never_a_traceback(finished_run, studio, browser):
    name = finished_run.name
    first = read_jsonl(finished_run.run_dir / "trainer" / "rollouts" / "index.jsonl")[0]["trajectory_id"]
    cases = {
        "/runs/no-such-run": 404,
        "/runs/..%2F..%2Fetc%2Fpasswd": 404,
        f"/runs/{name}/logs/..%2Fmanifest.json": 404,
        f"/runs/{name}/logs/..%2F..%2F{name}%2Fconfig.yaml": 404,
        f"/runs/{name}/logs/no-such.log": 404,
        f"/runs/{name}/rollouts/traj_does_not_exist": 404,
        f"/runs/{name}/rollouts/{first}..": 404,
        f"/runs/{name}/experiences/exp_does_not_exist": 404,
        f"/runs/{name}/rollouts?page=999": 404,
        f"/runs/{name}/rollouts?page=99999999999999999999999": 400,
        f"/runs/{name}/rollouts?page=0": 400,
        f"/runs/{name}/rollouts?page=abc": 400,
        "/?page=-1": 400,
        "/no/such/page": 404,
    }
    with httpx.Client(base_url=studio.url) as client:
        for path, status in cases.items():
            response = client.get(path)
            assert response.status_code == status, (path, response.text[:300])
            assert response.headers["content-type"].startswith("text/html")
            assert "Traceback" not in response.text and f"<h1>{status}:" in response.text, path
    page = browser.new_page()
    response = page.goto(f"{studio.url}/runs/{name}/rollouts/traj_does_not_exist")
    assert response.status == 404 and "rollout not found" in page.locator("h1").inner_text()
    page.close()


def test_a_token_is_asked_once_and_kept_in_a_cookie(finished_run):
    app = build_app(StudioSettings(runs=str(finished_run.runs_dir)), token="s3cret-token")
    with TestClient(app) as client:
        response = client.get(f"/runs/{finished_run.name}", follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"].startswith("/login?next=")
        assert client.get("/healthz").status_code == 200
        wrong = client.post("/login", content="token=nope&next=/", follow_redirects=False,
                            headers={"content-type": "application/x-www-form-urlencoded"})
        assert wrong.status_code == 401 and "not the services" in wrong.text
        # An absolute URL as `next` must not turn the form into an open redirect.
        right = client.post("/login", content="token=s3cret-token&next=//evil.example/", follow_redirects=False,
                            headers={"content-type": "application/x-www-form-urlencoded"})
        assert right.status_code == 303 and right.headers["location"] == "/"
        assert COOKIE in right.cookies or COOKIE in client.cookies
        assert client.get(f"/runs/{finished_run.name}").status_code == 200


def test_the_launcher_planned_and_stopped_its_studio(finished_run):
    config = yaml.safe_load((finished_run.run_dir / "config.yaml").read_text())
    assert config["launcher"]["studio"]["enabled"] is True
    manifest = json.loads((finished_run.run_dir / "manifest.json").read_text())
    studio_child = next(c for c in manifest["children"] if c["name"] == "studio")
    assert studio_child["argv"][1:4] == ["-m", "studio", "--runs"]
    # the launcher names its own interpreter, which the studio was started with
    assert f"browse it: {studio_child['argv'][0]} -m studio --runs" in finished_run.output()
    with pytest.raises(httpx.ConnectError):
        httpx.get(finished_run.studio_url + "/healthz", timeout=2)


def _record_bytes(directory: Path, entry: dict) -> bytes:
    with (directory / entry["shard"]).open("rb") as f:
        f.seek(entry["offset"])
        return f.read(entry["length"])


def _pool_from_journal(run_dir: Path) -> dict[str, dict]:
    pool: dict[str, dict] = {}
    for record in read_jsonl(run_dir / "experience_store" / "journal.jsonl"):
        for write in record.get("writes") or []:
            if "upsert" in write:
                pool[write["upsert"]["experience_id"]] = write["upsert"]
            elif "delete" in write:
                pool.pop(write["delete"], None)
    return pool


def _task_store(run_dir: Path) -> dict:
    db = sqlite3.connect(run_dir / "task_manager" / "tasks.sqlite")
    try:
        jobs = [json.loads(row[0]) for row in db.execute("SELECT progress FROM jobs")]
        references = [json.loads(row[0]) for row in db.execute("SELECT reference FROM tasks WHERE reference IS NOT NULL")]
        stored = {f"{env}/{task}" for env, task in db.execute("SELECT env_type, task_id FROM tasks")}
        rates = {key: sum(json.loads(recent)) / len(json.loads(recent))
                 for key, recent in db.execute("SELECT task_id, recent FROM pass_rates")}
        count = len(stored) + sum(key not in stored for (key,) in db.execute("SELECT task_id FROM pass_rates"))
    finally:
        db.close()
    return {"kept": sum(j.get("kept", 0) for j in jobs), "proposed": sum(j.get("proposed", 0) for j in jobs),
            "count": count, "rates": rates, "reference_actions": [a for r in references for a in r["actions"]]}
