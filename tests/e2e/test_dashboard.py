"""The dashboard in a real browser (issue #18): Debian's chromium driven by
Playwright, against real services. Stalled jobs show (and the warning) the
moment their leases lapse, before any reaper acts, and go when a reaper
requeues them; the re-run job's page tells why it ran twice; retry works
with actions on; a payload holding <script> is shown as text. With
JOBQ_TEST_SCREENSHOTS=docs/screenshots they make the README's screenshots."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from harness.helpers import (
    Procs,
    SyncDB,
    free_port,
    http,
    publish,
    set_queue,
    wait_http,
    wait_until,
)

# Playwright's sync API keeps an event loop running in this thread: the
# harness's own asyncio calls (publish, SyncDB, process start-up) go to
# another thread.
_pool = ThreadPoolExecutor(1)


def bg(fn: Any, *args: Any, **kw: Any) -> Any:
    return _pool.submit(fn, *args, **kw).result()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    """Where screenshots go: JOBQ_TEST_SCREENSHOTS when set (the README's were
    made with JOBQ_TEST_SCREENSHOTS=docs/screenshots), else the test's tmp_path."""
    where = Path(os.environ.get("JOBQ_TEST_SCREENSHOTS") or tmp_path)
    where.mkdir(parents=True, exist_ok=True)
    return where
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "test-token-not-a-secret"


@pytest.fixture
def browser(dashboard: str) -> Iterator[Any]:
    """Started after every other fixture (and stopped before them): their
    set-up and tear-down use asyncio.run, which Playwright's loop forbids."""
    if not os.path.exists(CHROMIUM):
        pytest.skip("no chromium: install Debian's chromium package (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"])
        yield b
        b.close()


@pytest.fixture
def dashboard(procs: Procs, db: SyncDB) -> str:
    port = free_port()
    d = procs.start("dashboard", "--port", str(port), "--refresh", "1", "--allow-actions",
                    JOBQ_DASHBOARD_TOKEN=TOKEN)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/workers", 20, f"the dashboard to answer; log:\n{d.log()}")
    return url


def test_stalled_jobs_show_before_any_reaper_and_the_timeline_says_why(
        browser: Any, dashboard: str, db: SyncDB, procs: Procs, settings: Any,
        shots: Path) -> None:
    from playwright.sync_api import expect

    bg(set_queue, db, "work", lease_s=2)
    a = procs.consumer("--queue", "work")
    a_id = bg(a.worker_id)
    ids = bg(publish, settings, "work", [{"sleep_first": 30} for _ in range(3)])
    page = browser.new_page(viewport={"width": 1280, "height": 640})
    page.goto(dashboard + "/")
    row = page.locator('tr[data-queue="work"]')
    expect(row.locator("td").nth(4)).to_have_text("3", timeout=15000)  # running
    a.signal(signal.SIGKILL)  # no reaper yet: the leases lapse and nobody requeues them
    expect(row.locator("td.stalled")).to_have_text("3", timeout=15000)
    expect(page.locator("#stalled-warning")).to_contain_text("3 job(s) stalled right now")
    page.screenshot(path=str(shots / "queues-stalled.png"))
    page.goto(dashboard + "/stalled")
    expect(page.locator("#stalled tr")).to_have_count(4)  # header + 3
    page.screenshot(path=str(shots / "stalled.png"))

    page.goto(dashboard + "/")
    procs.reaper()
    b = procs.consumer("--queue", "work")
    b_id = bg(b.worker_id)
    expect(row.locator("td.stalled")).to_have_text("0", timeout=15000)
    bg(wait_until, lambda: db.val("SELECT count(*) FROM jobq.job WHERE status = 'completed'")
       == 3, 20, "B to complete the three")

    page.goto(f"{dashboard}/job/{ids[0]}")
    timeline = page.locator("#timeline")
    expect(page.locator("#status")).to_have_text("completed")
    expect(page.locator("#why-twice")).to_contain_text("It ran 2 times: 1× a lapsed lease")
    text = timeline.inner_text()
    order = [text.index(f"claimed by {a_id}"), text.index("stalled"),
             text.index(f"claimed by {b_id}"), text.index("completed")]
    assert order == sorted(order), text
    assert "while it held 3 jobs" in text  # why it was not charged: a witness
    expect(page.locator(".badge")).to_contain_text("witnessed 1")
    page.screenshot(path=str(shots / "job-timeline.png"), full_page=True)
    page.goto(dashboard + "/workers")
    expect(page.locator("#workers")).to_contain_text(b_id)
    expect(page.locator("#reapers tr")).to_have_count(2)
    page.screenshot(path=str(shots / "workers.png"))
    page.close()


def test_retry_from_the_failed_page_and_payloads_shown_as_text(
        browser: Any, dashboard: str, db: SyncDB, procs: Procs, settings: Any,
        shots: Path) -> None:
    from playwright.sync_api import expect

    bg(set_queue, db, "work", max_attempts=1)
    bg(procs.consumer("--queue", "work").worker_id)
    procs.reaper()
    evil = "<script>document.title='owned'</script><b>bold?</b>"
    (jid,) = bg(publish, settings, "work", [{"fail_times": 1, "note": evil}])
    bg(wait_until, lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", jid) == "failed",
       15, "the job to fail")
    page = browser.new_page(viewport={"width": 1280, "height": 560})
    dialogs: list[str] = []
    def dismissed(d: Any) -> None:
        dialogs.append(d.message)
        d.dismiss()
    page.on("dialog", dismissed)

    page.goto(f"{dashboard}/job/{jid}")
    assert evil in page.locator("#payload").inner_text()  # as text, not markup
    assert page.locator("#payload script, #payload b").count() == 0
    assert page.title() != "owned" and not dialogs
    # Where it failed (issue #50): the last failure's traceback, as text.
    tb = page.locator("#traceback").inner_text()
    assert "in _work" in tb and tb.rstrip().endswith("RuntimeError: boom on attempt 1"), tb

    # No retry without signing in, nor from another origin (CSRF).
    assert page.locator("button.retry").count() == 0
    assert http(f"{dashboard}/job/{jid}/retry", timeout=5, data=b"csrf=x")[0] == 403

    page.goto(dashboard + "/signin")
    page.fill('input[name="name"]', "alice")
    page.fill('input[name="token"]', TOKEN)
    page.click('button[type="submit"]')
    expect(page.locator(f'tr[data-job="{jid}"]')).to_be_visible()
    page.screenshot(path=str(shots / "failed.png"))
    page.locator(f'tr[data-job="{jid}"] button.retry').click()
    expect(page.locator("#message")).to_contain_text("retried")
    expect(page.locator("#status")).to_have_text("completed", timeout=15000)
    history = bg(db.fetch, "SELECT event, detail FROM jobq.job_event WHERE job_id = $1", jid)
    assert ("retried", "by alice (dashboard)") in [(h["event"], h["detail"]) for h in history]
    assert bg(db.val, "SELECT status FROM jobq.job WHERE id = $1", jid) == "completed"
    page.close()


def test_lookup_box_and_drained_consumers_apart_from_vanished_ones(
        browser: Any, dashboard: str, db: SyncDB, procs: Procs, settings: Any) -> None:
    """Issue #33: a box finds a job by id (an unknown id is a 404 page), and a
    consumer stopped by SIGTERM shows as drained while a SIGKILLed one shows
    red as vanished."""
    from playwright.sync_api import expect

    drained = procs.consumer("--queue", "work")
    drained_id = bg(drained.worker_id)
    killed = procs.consumer("--queue", "work")
    killed_id = bg(killed.worker_id)
    procs.reaper()
    (jid,) = bg(publish, settings, "work", [{}])
    drained.signal(signal.SIGTERM)
    killed.signal(signal.SIGKILL)
    bg(wait_until, lambda: db.val("SELECT count(*) FROM jobq.worker WHERE vanished_at "
                                  "IS NOT NULL") == 2, 20, "both consumers to be gone")
    page = browser.new_page()
    page.goto(dashboard + "/workers")
    expect(page.locator("td.drained")).to_have_count(1)
    expect(page.locator("td.vanished")).to_have_count(1)
    rows = page.locator("#workers tr")
    assert "drained" in rows.filter(has_text=drained_id).inner_text()
    assert "vanished" in rows.filter(has_text=killed_id).inner_text()

    # From a page that does not refresh itself: on a loaded machine the
    # workers page's 5 s refresh could land between the fill and the Enter.
    page.goto(dashboard + "/find?id=none")
    page.fill("#find", str(jid))
    page.press("#find", "Enter")
    expect(page.locator("#status")).to_be_visible()
    assert page.url.endswith(f"/job/{jid}")
    assert http(f"{dashboard}/find?id=00000000-0000-0000-0000-000000000000")[0] == 404
    assert http(f"{dashboard}/find?id=nonsense")[0] == 404
    assert http(f"{dashboard}/job/00000000-0000-0000-0000-000000000000")[0] == 404
    page.close()


def test_a_waiting_jobs_page_says_what_it_waits_for(
        browser: Any, dashboard: str, db: SyncDB, procs: Procs, settings: Any) -> None:
    bg(procs.consumer("--queue", "waits").worker_id)
    procs.reaper()
    (jid,) = bg(publish, settings, "waits", [{"signal": "approval"}])
    bg(wait_until, lambda: db.val("SELECT wake_on FROM jobq.job WHERE id = $1", jid)
       == "approval", 15, "the job parked for its signal")
    page = browser.new_page()
    page.goto(f"{dashboard}/job/{jid}")
    assert page.locator("#wake_on td").inner_text().strip() == "approval"
    assert page.locator("#joining").count() == 0
    since = page.locator("#suspended_since td").inner_text().strip()  # issue #52.6
    assert since.startswith(str(bg(db.val, "SELECT suspended_at::date FROM jobq.job "
                                           "WHERE id = $1", jid))), since
    assert page.locator("#wakes_at").count() == 0  # no timeout: no clock wakes it
    page.close()


def test_a_jobs_page_shows_its_streamed_output_deadline_and_key_hold(
        browser: Any, dashboard: str, db: SyncDB, procs: Procs, settings: Any) -> None:
    bg(procs.consumer("--queue", "emits").worker_id)
    procs.reaper()

    def publish_one() -> Any:
        from harness.helpers import publish_jobs
        from jobq.newjob import NewJob

        return publish_jobs(settings, [NewJob("emits", {"chunks": 3}, expires_in_s=600,
                                              idempotency_key="k1",
                                              idempotency_while_live=True)])[0]

    jid = bg(publish_one)
    bg(wait_until, lambda: db.val("SELECT status FROM jobq.job WHERE id = $1", jid)
       == "completed", 20, "the job's end")
    page = browser.new_page()
    page.goto(f"{dashboard}/job/{jid}")
    rows = page.locator("#output tr")
    assert rows.count() == 3
    assert rows.first.locator("td").first.inner_text().strip() == "3"  # newest first
    assert '"i": 2' in rows.first.inner_text() or '"i":2' in rows.first.inner_text()
    assert page.locator("#idempotency_scope td").inner_text().strip() == "live"
    assert page.locator("#expires_at").count() == 1
    page.close()


def test_a_queues_jobs_filtered_and_paged_short_ids_and_the_favicon(
        browser: Any, dashboard: str, db: SyncDB, settings: Any, env: dict[str, str]) -> None:
    """Issue #50.6: a queue's job list by status and key, 50 a page, every job
    once across the pages; the short ids the pages print found by the box and
    by jobq inspect; cancelled jobs counted on the queues page; a favicon."""
    from playwright.sync_api import expect

    from harness.helpers import publish_jobs, run_cli
    from jobq.newjob import NewJob

    ids = bg(publish_jobs, settings, [NewJob("browse", {"n": i}, key="a" if i % 2 else "b")
                                      for i in range(120)])
    bg(db.execute, "UPDATE jobq.job SET status = 'failed', finished_at = now(), "
                   "last_error = 'boom' WHERE id = ANY($1)", ids[:5])
    bg(db.execute, "UPDATE jobq.job SET status = 'cancelled', finished_at = now() "
                   "WHERE id = ANY($1)", ids[5:8])
    bg(db.execute, "UPDATE jobq.queue SET key_policy = 'fifo', priority_aging_s = 30 "
                   "WHERE name = 'browse'")
    page = browser.new_page()
    page.goto(dashboard + "/")
    row = page.locator("#queues tr[data-queue=browse]")
    assert row.locator("td.cancelled").inner_text().strip() == "3"
    # its key policy and priority aging, as badges (#51)
    assert row.locator(".badge.policy").inner_text() == "keys: fifo"
    assert row.locator(".badge.aging").inner_text() == "aging 30 s"
    row.locator("a", has_text="browse").first.click()
    seen: list[str] = []
    while True:  # every page, newest first, until there is no older one
        expect(page.locator("#jobs")).to_be_visible()
        seen += page.locator("#jobs tr[data-job]").evaluate_all(
            "rows => rows.map(r => r.dataset.job)")
        if page.locator("#older").count() == 0:
            break
        page.locator("#older").click()
    assert len(seen) == 120 and set(seen) == {str(i) for i in ids}, len(seen)
    page.goto(f"{dashboard}/queue/browse?status=failed")
    assert page.locator("#jobs tr[data-job]").count() == 5
    page.select_option("#f-status", "")
    page.fill("#f-key", "a")
    page.click("#f-go")
    expect(page.locator("#older")).to_be_visible()  # 60 of key a: two pages
    assert page.locator("#jobs tr[data-job]").count() == 50
    assert http(f"{dashboard}/queue/browse?status=nope")[0] == 400

    short = str(ids[10])[:8]
    page.goto(dashboard + "/find?id=none")
    page.fill("#find", short)
    page.press("#find", "Enter")
    expect(page.locator("#status")).to_be_visible()
    assert page.url.endswith(f"/job/{ids[10]}")
    assert http(f"{dashboard}/find?id=ffffffff-ffff")[0] == 404  # starts no id here
    out = bg(run_cli, env, "inspect", short)
    assert out.returncode == 0 and str(ids[10]) in out.stdout, out.stderr
    status, body = http(dashboard + "/favicon.ico")
    assert status == 200 and body.startswith(b"<svg")
    page.close()


def test_an_idle_consumer_is_idle_and_a_killed_one_is_not_alive_while_no_reaper_runs(
        browser: Any, dashboard: str, db: SyncDB, procs: Procs) -> None:
    """Issue #50.6: no reaper runs, so nothing marks a killed consumer
    vanished; the page reads its session itself. An idle consumer has no
    lease to renew: "idle", not "last renewal 756 s ago"."""
    from playwright.sync_api import expect

    idle = procs.consumer("--queue", "work")
    idle_id = bg(idle.worker_id)
    killed = procs.consumer("--queue", "work")
    killed_id = bg(killed.worker_id)
    killed.signal(signal.SIGKILL)
    bg(wait_until, lambda: not killed.alive(), 10, "the consumer killed")
    page = browser.new_page()
    page.goto(dashboard + "/workers")
    rows = page.locator("#workers tr")
    expect(rows.filter(has_text=killed_id).locator("td.vanished")).to_have_count(1)
    assert bg(db.val, "SELECT vanished_at FROM jobq.worker WHERE worker_id = $1",
              killed_id) is None  # no reaper said so: the page did
    mine = rows.filter(has_text=idle_id)
    assert mine.locator("td.alive").count() == 1
    assert "idle" in mine.locator("td.renewal").inner_text()
    page.close()


def test_a_workflow_is_drawn_as_a_graph_whose_boxes_open_their_jobs(
        browser: Any, dashboard: str, db: SyncDB) -> None:
    """Issue #50.6: parents left of the jobs that wait for them, each box a link;
    a child a step spawned (#52.6: its step 'spawn:<name>') right of it, dashed."""
    import uuid

    from playwright.sync_api import expect

    wid = uuid.uuid4()
    first = bg(db.val, "SELECT jobq.enqueue('wf', workflow_id => $1)", wid)
    second = bg(db.val, "SELECT jobq.enqueue('wf', after => ARRAY[$1]::uuid[], "
                        "workflow_id => $2)", first, wid)
    child = bg(db.val, "SELECT jobq.enqueue('work')")
    bg(db.execute, "INSERT INTO jobq.job_step (job_id, name, fn, result, attempt) VALUES "
                   "($1, 'spawn:c0', 'jobq.spawn', to_jsonb($2::text), 1)", second, str(child))
    page = browser.new_page()
    page.goto(f"{dashboard}/workflow/{wid}")
    nodes = page.locator("#graph a.node")
    expect(nodes).to_have_count(3)
    left = {n.get_attribute("data-job"): n.locator("rect").bounding_box()["x"]
            for n in nodes.all()}
    assert left[str(first)] < left[str(second)] < left[str(child)], left
    expect(page.locator("#graph line.spawned")).to_have_count(1)
    assert page.locator(f'tr[data-job="{child}"] a.spawned-by').get_attribute(
        "href") == f"/job/{second}"
    page.locator(f'#graph a[data-job="{second}"]').click()
    expect(page.locator("#status")).to_be_visible()
    assert page.url.endswith(f"/job/{second}")
    page.close()
